"""A Jinja sandbox whose renderings are bounded in time, loop steps and size.

Jinja's ``ImmutableSandboxedEnvironment`` keeps a template away from Python's internals, but
not from ``{% for a in range(99999) %}{% for b in range(99999) %}`` (hours) or from
``{{ 'a' * 10**10 }}`` (10 GB). Here a template's syntax tree is rewritten before it is
compiled (``guard``): every loop steps through a counter, every ``{{ }}`` is counted (also
where it is kept for later: a block, a macro, a ``{% set %}``), every ``~`` and every list,
tuple and dict literal is checked. The environment's hooks check every call, filter and
operator (``*``, ``**``, ``%``, ``+``): a str method or filter that could make far more
than it is given is estimated before it runs, every result measured after. ``render``
counts the output as it streams. The limits and the sizes are ``chat_budget``'s.

Filters no chat template uses, whose output is not bounded by their input (``pprint``,
``urlize``, ``wordwrap``, and the ``lipsum`` global), are removed. ``jinja2`` is imported
only when an environment is built (it is an optional dependency).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from functools import lru_cache, wraps
from typing import Any

from glassformer.data.tokenizers.chat_budget import (
    FILTER_SIZES,
    METHOD_SIZES,
    Budget,
    check_numbers,
    check_operator,
    format_size,
    joined_size,
)

REMOVED_FILTERS = ("pprint", "urlize", "wordwrap")
_BUDGET: ContextVar[Budget] = ContextVar("chat_template_budget")


def render(template: Any, context: dict[str, Any], limit: int) -> str:
    """``template`` (compiled by ``environment()`` from a ``guard``-ed tree) rendered
    with ``context``, within the time and loop steps of a ``Budget`` and ``limit`` characters.

    Raises:
        TemplateLimitError: a limit was passed (anything else the template raises passes
            through).
    """
    budget = Budget.start(limit)
    token = _BUDGET.set(budget)
    stream = template.generate(**context)
    try:
        parts, size = [], 0
        for part in stream:
            budget.tick()
            size += len(part)
            budget.allow(size, "the output")
            parts.append(part)
        return "".join(parts)
    finally:
        stream.close()
        _BUDGET.reset(token)


def guard(env: Any, tree: Any) -> Any:
    """The template's syntax tree with every loop's iterable, ``{{ }}``, ``~`` and literal
    list, tuple and dict passed through the environment's ``glassformer_*`` functions (which
    templates cannot name): they count, and their calls go through the sandbox's ``call``
    hook, which measures the results."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def call(name: str, args: list[Any], at: Any) -> Any:
        target = nodes.EnvironmentAttribute(name, lineno=at.lineno)
        return nodes.Call(target, args, [], None, None, lineno=at.lineno)

    class Guard(NodeTransformer):
        def loop(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.iter = call("glassformer_steps", [node.iter], node)
            return node

        def output(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.nodes = [
                n if isinstance(n, nodes.TemplateData) else call("glassformer_output", [n], n)
                for n in node.nodes
            ]
            return node

        def concat(self, node: Any) -> Any:
            node = self.generic_visit(node)
            return call("glassformer_concat", node.nodes, node)

        def literal(self, node: Any) -> Any:
            node = self.generic_visit(node)
            if isinstance(node, nodes.Tuple) and node.ctx != "load":  # assigned to: a, b = ...
                return node
            return call("glassformer_literal", [node], node)

        # NodeTransformer calls visit_<node class> for each node.
        visit_For, visit_Output, visit_Concat = loop, output, concat  # noqa: N815
        visit_List = visit_Tuple = visit_Dict = literal  # noqa: N815

    return Guard().visit(tree).set_environment(env)


@lru_cache(maxsize=1)
def environment() -> Any:
    """The bounded sandbox (one per process: the budget is per rendering, in a ContextVar)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+"})
        concat = staticmethod(_bounded_join)  # the bodies of blocks, macros, {% set %}
        glassformer_steps = staticmethod(_steps)
        glassformer_concat = staticmethod(_concat)
        glassformer_literal = staticmethod(_literal)
        glassformer_output = staticmethod(_output)

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            budget = _BUDGET.get()
            budget.tick()
            args = _check_method(budget, obj, args, kwargs)
            return budget.checked(super().call(context, obj, *args, **kwargs), "a value made")

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = _BUDGET.get()
            budget.tick()
            check_operator(budget, operator, left, right)
            result = super().call_binop(context, operator, left, right)
            return budget.checked(result, f"'{operator}'")

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            format_ = super().wrap_str_format(value)
            return None if format_ is None else _bounded_format(value.__self__, format_)

    class BoundedNamespace(Namespace):
        def __repr__(self) -> str:  # its values are bounded one by one, not together
            return "<Namespace>"

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    del env.globals["lipsum"]
    env.globals["namespace"] = BoundedNamespace
    for name in REMOVED_FILTERS:
        del env.filters[name]
    env.filters.update({name: _bounded_filter(name, f) for name, f in env.filters.items()})
    return env


def _steps(iterable: Iterable[Any]) -> Iterable[Any]:
    budget = _BUDGET.get()
    for item in iterable:
        budget.step()
        yield item


def _concat(*parts: Any) -> str:
    """``a ~ b``: Jinja's ``str_join`` (this environment does not autoescape), bounded."""
    budget = _BUDGET.get()
    budget.allow(sum(budget.text_size(p) for p in parts), "'~'")
    return "".join(map(str, parts))


def _output(value: Any) -> Any:
    """A ``{{ }}`` about to be written, counted wherever it goes: the output, or the body
    of a block, macro or ``{% set %}`` (whose pieces are only joined at its end)."""
    budget = _BUDGET.get()
    budget.written += budget.text_size(value)
    budget.allow(budget.written, "what it wrote")
    return value


def _literal(value: Any) -> Any:
    return value  # the call hook measures it


def _bounded_join(parts: Iterable[str]) -> str:
    parts = list(parts)
    _BUDGET.get().allow(sum(map(len, parts)), "a block's output")
    return "".join(parts)


def _check_method(budget: Budget, obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Refuse a call of a str, bytes or int method that would make too much; the
    arguments to call it with (``join``'s iterable made a list, to be measured)."""
    owner = getattr(obj, "__self__", None)
    if not isinstance(owner, (str, bytes, int)):
        return args
    name = f"{type(owner).__name__}.{getattr(obj, '__name__', '')}"  # str.center
    check_numbers(budget, [*args, *kwargs.values()], name)
    method = name.partition(".")[2]
    if method == "join" and args:
        args = (list(args[0]), *args[1:])
        budget.allow(joined_size(budget, args[0], owner), name)
    elif method in METHOD_SIZES:
        budget.allow(METHOD_SIZES[method](budget, owner, args, kwargs), name)
    return args


def _bounded_format(fmt: str, format_: Callable[..., str]) -> Callable[..., str]:
    """``fmt.format`` / ``fmt.format_map`` (the sandbox's own), refused when too large."""

    def bounded(*args: Any, **kwargs: Any) -> str:
        budget = _BUDGET.get()
        values = [*args, *kwargs.values()]
        if len(args) == 1 and isinstance(args[0], Mapping):  # format_map
            values += list(args[0].values())
        budget.allow(format_size(budget, fmt, values), "str.format")
        return format_(*args, **kwargs)

    return bounded


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """Filter ``f``, its numbers checked, its result estimated first where it can be
    larger than its input, and measured after."""
    estimate = FILTER_SIZES.get(name)
    # A filter marked pass_context / pass_eval_context / pass_environment gets that first.
    lead = 1 if hasattr(f, "jinja_pass_arg") else 0

    @wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _BUDGET.get()  # outside a rendering (constant folding): LookupError
        budget.tick()
        passed, value, rest = args[:lead], args[lead], args[lead + 1 :]
        if name in ("join", "sum") and not isinstance(value, (str, list, tuple)):
            value = list(value)  # a generator, counted before it is joined
        if name != "format":  # format's arguments are the values it formats
            check_numbers(budget, [*rest, *kwargs.values()], f"the {name} filter")
        if estimate is not None:
            budget.allow(estimate(budget, value, rest, kwargs), f"the {name} filter")
        return budget.checked(f(*passed, value, *rest, **kwargs), f"the {name} filter")

    return bounded

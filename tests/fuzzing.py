"""The fuzzing harness (issue 49): each fuzzed input is read in a forked child under a memory
cap and a time cap, and either loads or is refused in one line.

A fork server (this file run as a script) imports glassformer and torch once, with one
thread, and forks a child per case; a reader's first call (seconds of lazy imports and set-up)
is made in the server on a seed (``Server.warm``), so every child starts warm. The child
lowers its address-space limit (``RLIMIT_AS``: what it had plus ``memory_mb``) and its CPU
time, and runs a reader (a function a test module ``register``s) on the case's folder; the
server kills it, with what it started, past ``seconds`` of wall clock. The outcome:

- ``loaded``: the reader returned;
- ``refused``: it raised what the CLI prints as one line (``ValueError``, ``TypeError``,
  ``OSError``, ``FloatingPointError``), one line of at most ``LONGEST`` characters that
  names the file (while reading; a decoding step after a load does not know it);
- ``failed``: anything else: another exception type, a message of several lines, none, a
  very long one, one that names no file; a ``MemoryError`` (or a refusal that hides one); a
  signal; the time cap; a ``Violation`` (a rule broken without an exception); and, for a
  reader of a cache, any exception or a second warning (a cache is bypassed with one).

"Which check refused it" is the function that raised inside glassformer (of the first
exception in the chain: a caller adding the path does not hide the check) and the message's
first words, paths, quoted values and numbers taken out (``check_of``). ``Report`` counts
each reader's outcomes and checks, keeps the failures (their folders and tracebacks) and the
largest peak RSS (``ru_maxrss`` from ``wait4``), RSS growth and time of any case, and prints
them in pytest's terminal summary (and ``summary.txt`` beside the cases).

``fuzz`` drives ``examples`` cases of a reader with hypothesis (seeded per reader and count:
the same cases every run), never shrinking: each failing case is kept as it was, with what
was done to it, and the test fails listing each kind of failure once. ``$GLASSFORMER_FUZZ_DIR``
keeps the cases outside pytest's temporary folders, ``$GLASSFORMER_FUZZ_SCALE`` multiplies
every count, ``$GLASSFORMER_FUZZ_KEEP`` keeps the cases that passed too.

Replay one case by hand, with its traceback (in this process, no caps):
``python tests/fuzzing.py replay MODULE READER PATH``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ALLOWED = (ValueError, TypeError, OSError, FloatingPointError)  # what the CLI prints in a line
MEMORY_MB = int(os.environ.get("GLASSFORMER_FUZZ_MEMORY_MB", "1024"))  # address space, per case
SECONDS = float(os.environ.get("GLASSFORMER_FUZZ_SECONDS", "20"))  # wall clock, per case
SCALE = float(os.environ.get("GLASSFORMER_FUZZ_SCALE", "1"))  # times each test's case count
KEEP = bool(os.environ.get("GLASSFORMER_FUZZ_KEEP"))  # keep every case, not only failures
FILE_MB = 64  # what a case may write (RLIMIT_FSIZE)
LONGEST = 1000  # characters in a refusal's line (a value echoed whole is no use to anyone)
OUT_OF_MEMORY = ("MemoryError", "Cannot allocate memory", "can't allocate memory", "out of memory")


# ---- readers: what a user's command does with a kind of file (the test modules register them)

STAGE = ["read"]  # which part of a reader is running (``stage`` moves it on)


class Violation(Exception):  # noqa: N818 (a broken rule, not an error of the code)
    """A rule a reader broke without raising (a planted library ran): always a failure."""


@dataclass(frozen=True)
class Reader:
    """``read(case)`` (what it returns, if a string, says how it went); whether it may refuse
    a file (a cache may not: it is bypassed with a warning), whether a refusal while reading
    must name the file, and how many warnings it may give."""

    read: Any
    module: str  # the test module that registers it (the server imports it to find it)
    may_refuse: bool = True
    names_file: bool = True
    max_warnings: int | None = None


READERS: dict[str, Reader] = {}


def register(name: str, read: Any, **rules: Any) -> str:
    """Make ``read`` the reader ``name`` (called by a test module as it is imported)."""
    READERS[name] = Reader(read, sys._getframe(1).f_globals["__name__"], **rules)
    return name


def stage(name: str) -> None:
    """Say which part of a reader runs now (a failure is reported with it)."""
    STAGE[0] = name


def _warm_up() -> None:
    """What every reader needs, imported once in the server with one thread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch

    torch.set_num_threads(1)
    import glassformer  # noqa: F401


def _reader(request: dict[str, Any]) -> Reader:
    """The reader a request names, its test module imported (in the server: once)."""
    if request["reader"] not in READERS:
        importlib.import_module(request["module"])
    return READERS[request["reader"]]


# ---- the child: one case -------------------------------------------------------------------


def _vm_size() -> int:
    """This process's address space now, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _limit(memory_mb: int, seconds: float) -> None:
    import resource

    cap = _vm_size() + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    cpu = int(seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_MB * 2**20, FILE_MB * 2**20))


def where_raised(error: BaseException) -> str:
    """The innermost frame inside glassformer (else the innermost) of the traceback of the
    first exception raised: the check, where a caller re-raised it with the path added."""
    while error.__context__ is not None and error.__context__ is not error:
        error = error.__context__
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "/glassformer/" in f.filename] or frames
    if not ours:
        return "?"
    f = ours[-1]
    return f"{Path(f.filename).stem}.{f.name}"


def judge(reader: Reader, error: BaseException | None, case: Path) -> str | None:
    """Why the case failed (None: it did not), from what the reader raised."""
    if error is None:
        return None
    text = str(error)
    if isinstance(error, MemoryError) or any(w in text for w in OUT_OF_MEMORY):
        return "over the memory cap"
    if isinstance(error, Violation):
        return f"violation: {text}"
    if not isinstance(error, ALLOWED):
        return f"traceback: {type(error).__name__}"
    if not reader.may_refuse:
        return f"a cache stopped the command ({type(error).__name__}) instead of being bypassed"
    if not text.strip():
        return f"empty message ({type(error).__name__})"
    if "\n" in text.strip():
        return f"multi-line message ({type(error).__name__})"
    if len(text) > LONGEST:
        return f"a message of {len(text)} characters ({type(error).__name__})"
    if reader.names_file and STAGE[0] == "read" and not _names_file(text, case):
        return "the message names no file"
    return None


def _names_file(text: str, case: Path) -> bool:
    names = {p.name for p in case.rglob("*")} | {case.name}
    return str(case) in text or any(name in text for name in names if len(name) > 3)


def _child(request: dict[str, Any], out_fd: int) -> None:
    """Run one case and write its outcome to ``out_fd``; never returns."""
    try:
        os.setpgid(0, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(request.get("env", {}))
        tempfile.tempdir = None  # found again from $TMPDIR, where a case sets it
        case = Path(request["path"])
        os.chdir(case.parent)
        result = _run_reader(request, case, out_fd)
        os.write(out_fd, json.dumps(result).encode())
    finally:
        os._exit(0)


def _run_reader(request: dict[str, Any], case: Path, out_fd: int) -> dict[str, Any]:
    """The reader's outcome; first, on a line of its own, the RSS it starts from (said at
    once: a child killed later has no outcome to say it in)."""
    import resource
    import warnings

    reader = READERS[request["reader"]]
    stage("read")
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    os.write(out_fd, b"%d\n" % start_rss)
    _limit(request["memory_mb"], request["seconds"])
    error: BaseException | None = None
    detail = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            detail = reader.read(case)
        except BaseException as e:  # noqa: BLE001 (judged below: that is the point)
            error = e
    said = [str(w.message).splitlines()[0] if str(w.message) else "" for w in caught]
    failure = judge(reader, error, case)
    if failure is None and reader.max_warnings is not None and len(said) > reader.max_warnings:
        failure = f"{len(said)} warnings (a bad cache is bypassed with one)"
    result: dict[str, Any] = {
        "outcome": "failed" if failure else ("refused" if error else "loaded"),
        "failure": failure,
        "stage": STAGE[0],
        "warnings": said[:3],
        "detail": detail if isinstance(detail, str) else None,
    }
    if error is not None:
        result["error"] = type(error).__name__
        result["message"] = str(error)[:2000]
        result["where"] = where_raised(error)
        if failure:
            result["traceback"] = "".join(traceback.format_exception(error))[-4000:]
    return result


# ---- the server ------------------------------------------------------------------------------


def serve() -> None:
    """Answer one request (a JSON line on stdin) after another with a JSON line on stdout."""
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    _warm_up()
    answers.write("ready\n")
    answers.flush()
    for line in requests:
        request = json.loads(line)
        try:
            reader = _reader(request)  # its module imported here, before the fork: once
        except Exception as e:  # noqa: BLE001 (said to the client)
            result = {"outcome": "failed", "failure": f"no reader: {e!r}", "seconds": 0.0}
        else:
            result = _warm(reader, request) if request.get("warm") else _one_case(request)
        answers.write(json.dumps(result) + "\n")
        answers.flush()


def _warm(reader: Reader, request: dict[str, Any]) -> dict[str, Any]:
    """Run a reader in the server itself, unlimited: what it imports and initialises on its
    first call (seconds, for a model and a tokenizer) is then done before every fork."""
    start = time.perf_counter()
    try:
        reader.read(Path(request["path"]))
    except Exception as e:  # noqa: BLE001 (the seed is checked again in a child)
        return {"outcome": "refused", "error": type(e).__name__, "message": str(e)[:500]}
    return {"outcome": "loaded", "seconds": time.perf_counter() - start}


def _one_case(request: dict[str, Any]) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(request, write_fd)
    os.close(write_fd)
    data, timed_out = _read_until(read_fd, start + request["seconds"])
    if timed_out:  # the child's group: what it started too (a compiler)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):  # (in case it had not made its group yet)
            os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    os.close(read_fd)
    elapsed = time.perf_counter() - start
    start_rss, _, said = data.partition(b"\n")
    try:
        result = json.loads(said) if said else {}
    except ValueError:
        result = {}
    if timed_out or not result:
        result = {**result, "outcome": "failed", "failure": _death(status, timed_out)}
    if start_rss.isdigit():
        result["start_rss_kb"] = int(start_rss)
    result.update(seconds=elapsed, cpu_seconds=usage.ru_utime + usage.ru_stime)
    result["rss_kb"] = usage.ru_maxrss
    return result


def _death(status: int, timed_out: bool) -> str:
    if timed_out:
        return "over the time cap"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return "over the time cap (CPU)"
        return f"killed by {signal.Signals(sig).name}"
    return f"exited with status {os.WEXITSTATUS(status)} and no outcome"


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """What the child writes until it closes the pipe, and whether the deadline passed."""
    chunks = []
    while True:
        left = deadline - time.perf_counter()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b"".join(chunks), True
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)


# ---- the client, in pytest's process -----------------------------------------------------------


class Server:
    """The fork server, started once (``start``), asked one case at a time (``run``)."""

    def __init__(self, log: Path) -> None:
        self.log, self.process = log, None

    def start(self) -> Server:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env["TOKENIZERS_PARALLELISM"] = "false"  # no thread pool before a fork
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, __file__, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log, "ab"),  # noqa: SIM115 (the server's, for its lifetime)
            text=True,
            env=env,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fuzz server did not start; see {self.log}")
        return self

    def run(
        self,
        reader: str,
        path: Path,
        *,
        env: dict[str, str] | None = None,
        seconds: float = SECONDS,
        memory_mb: int = MEMORY_MB,
    ) -> dict[str, Any]:
        return self._ask(reader, path, env=env or {}, seconds=seconds, memory_mb=memory_mb)

    def warm(self, reader: str, path: Path) -> dict[str, Any]:
        """Run ``reader`` on the seed ``path`` in the server (never a cache's reader: what it
        caches in memory every child would inherit)."""
        return self._ask(reader, path, env={}, seconds=SECONDS, memory_mb=MEMORY_MB, warm=True)

    def _ask(self, reader: str, path: Path, **options: Any) -> dict[str, Any]:
        request = dict(reader=reader, module=READERS[reader].module, path=str(path), **options)
        request["log"] = str(path.parent / f"{path.name}.log")
        if self.process is None or self.process.poll() is not None:
            self.start()
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            self.process = None
            return {"outcome": "failed", "failure": "the fuzz server died", "seconds": 0.0}
        return json.loads(answer)

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()  # the server's loop ends
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


# ---- what the cases showed ---------------------------------------------------------------------


def check_of(result: dict[str, Any], case: Path) -> str:
    """Which check refused (or failed) a case: where it raised and the message's first words,
    with paths, quoted values and numbers taken out; for a cache, the warning it gave."""
    if "error" in result:
        return f"{result['error']} in {result.get('where', '?')}: {_gist(result, case)}"
    if result.get("failure"):
        return result["failure"]
    said = [result["detail"]] if result.get("detail") else []
    said += [f"warned: {_gist({'message': w}, case)}" for w in result.get("warnings", [])[:1]]
    return "; ".join(said) or "loaded"


def _gist(result: dict[str, Any], case: Path) -> str:
    text = result.get("message", "").splitlines()[0] if result.get("message") else ""
    text = text.replace(str(case), "<case>").replace(str(case.parent), "<folder>")
    text = re.sub(r"(?<![\w>])(/[\w.+-]+)+", "<path>", text)  # (after <case>: kept)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", text)[:70]


@dataclass
class Report:
    """Every case's outcome, by reader."""

    outcomes: dict[str, Counter] = field(default_factory=dict)
    checks: dict[str, Counter] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    largest: dict[str, tuple[float, str]] = field(default_factory=dict)
    seconds: Counter = field(default_factory=Counter)
    slowest: dict[str, tuple[float, str]] = field(default_factory=dict)

    def add(self, reader: str, case: Path, what: str, result: dict[str, Any]) -> bool:
        """Record a case; True when it failed."""
        outcome = result["outcome"]
        self.outcomes.setdefault(reader, Counter())[outcome] += 1
        self.seconds[reader] += result.get("seconds", 0.0)
        if result.get("seconds", 0.0) > self.slowest.get(reader, (-1.0, ""))[0]:
            self.slowest[reader] = (result.get("seconds", 0.0), what)
        check = check_of(result, case)
        self.checks.setdefault(reader, Counter())[f"{outcome}: {check}"] += 1
        start = result.get("start_rss_kb", result.get("rss_kb", 0))  # (unknown: killed early)
        growth_mb = (result.get("rss_kb", 0) - start) / 1024
        for name, value in [
            ("peak RSS of a child (MB)", result.get("rss_kb", 0) / 1024),
            ("RSS growth of a case (MB)", growth_mb),
            ("wall time of a case (s)", result.get("seconds", 0.0)),
            ("CPU time of a case (s)", result.get("cpu_seconds", 0.0)),
        ]:
            if value > self.largest.get(name, (-1.0, ""))[0]:
                self.largest[name] = (value, f"{reader}: {what}")
        if outcome == "failed":
            self.failures.append({"reader": reader, "case": str(case), "what": what, **result})
        return outcome == "failed"

    def lines(self) -> list[str]:
        out = []
        for reader, counts in self.outcomes.items():
            n = sum(counts.values())
            mean = self.seconds[reader] / n
            slowest, what = self.slowest[reader]
            out.append(f"{reader}: {n} cases, {dict(counts)}; {mean:.2f} s on average")
            out.append(f"  the slowest {slowest:.2f} s: {what[:150]}")
            for check, n in self.checks[reader].most_common():
                out.append(f"  {n:5d}  {check}")
        for name, (value, what) in self.largest.items():
            out.append(f"largest {name}: {value:.2f} ({what[:150]})")
        return out

    def failure_summary(self, since: int = 0) -> list[str]:
        """One entry per kind of failure (its first case) from the ``since``-th on."""
        seen: dict[str, dict[str, Any]] = {}
        for f in self.failures[since:]:
            where = f": {f['error']} in {f.get('where')}" if "error" in f else ""
            seen.setdefault(f"{f['failure']} @ {f.get('stage')}{where}", f)
        return [
            f"{key}\n      e.g. {f['what'][:300]}\n      said: {f.get('message', '')[:200]!r}"
            f"\n      kept in {f['case']}"
            for key, f in seen.items()
        ]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """pytest calls this (the report is registered as a plugin)."""
        if self.outcomes:
            terminalreporter.write_sep("=", "fuzzing: outcomes and which check refused each")
            for line in self.lines():
                terminalreporter.write_line(line)


# ---- driving cases with hypothesis ---------------------------------------------------------------


@dataclass
class Session:
    """The one fork server and report of a pytest session, and where its cases are written."""

    server: Server
    report: Report
    root: Path
    count: Counter = field(default_factory=Counter)

    def folder(self, reader: str) -> Path:
        """A fresh folder for a case of ``reader`` (the case itself goes in ``case/``)."""
        self.count[reader] += 1
        folder = self.root / re.sub(r"\W+", "-", reader) / str(self.count[reader])
        folder.mkdir(parents=True)
        return folder

    def try_seed(self, reader: str, fill: Any, **run: Any) -> dict[str, Any]:
        """A seed read as a case (``fill``: a folder to copy, or ``fill(case)`` writes it),
        its reader first run on it in the server (``Server.warm``): the seed fixtures call
        this, so that a fuzzing test's children start warm whichever tests run."""
        import shutil

        case = self.folder(reader) / "case"
        if callable(fill):
            case.mkdir()
            fill(case)
        else:
            shutil.copytree(fill, case, symlinks=True)
        self.server.warm(reader, case)
        return self.server.run(reader, case, **run)


_SESSION: list[Session] = []


def session(request: Any, tmp_path_factory: Any) -> Session:
    """The session's fuzzing state, started on first use: the server (closed at the end) and
    the report (printed in pytest's terminal summary)."""
    if not _SESSION:
        where = os.environ.get("GLASSFORMER_FUZZ_DIR")  # else pytest's: it keeps three runs
        root = Path(tempfile.mkdtemp(dir=where)) if where else tmp_path_factory.mktemp("fuzz")
        s = Session(Server(root / "server.log").start(), Report(), root)
        request.config.pluginmanager.register(s.report, "glassformer-fuzz-report")
        request.config.add_cleanup(s.server.close)
        request.config.add_cleanup(_SESSION.clear)
        _SESSION.append(s)
    return _SESSION[0]


def one_in(data: Any, n: int, label: str) -> bool:
    """True about once in ``n`` draws (hypothesis draws an integer's bounds far more often than
    the rest; a sampled element is near uniform)."""
    from hypothesis import strategies as st

    return data.draw(st.sampled_from(range(n)), label=label) == n // 2


def index(data: Any, items: Any, label: str) -> int:
    """An index into ``items``, near uniform."""
    from hypothesis import strategies as st

    return data.draw(st.sampled_from(range(len(items))), label=label)


def fuzz(s: Session, reader: str, make_case: Any, examples: int, **run: Any) -> None:
    """Run ``examples`` cases of ``reader``: ``make_case(data, folder)`` writes one into
    ``folder / "case"`` and returns (what it did, environment for the reader). A case that
    did not fail is removed; the test fails listing each kind of failure once."""
    import shutil

    examples = max(1, round(examples * SCALE))
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    @seed(zlib.crc32(f"{reader} {examples}".encode()))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def one(data: Any) -> None:
        folder = s.folder(reader)
        what, env = make_case(data, folder)
        expect = (env or {}).pop("FUZZ_EXPECT", None)  # a case that must load, not be refused
        result = s.server.run(reader, folder / "case", env=env, **run)
        if expect and result["outcome"] != expect and not result.get("failure"):
            result.update(outcome="failed", failure=f"{result['outcome']}, expected {expect}")
        (folder / "outcome.json").write_text(json.dumps({"what": what, **result}, indent=1))
        if not s.report.add(reader, folder / "case", what, result) and not KEEP:
            shutil.rmtree(folder, ignore_errors=True)

    before = len(s.report.failures)
    one()
    (s.root / "summary.txt").write_text("\n".join(s.report.lines()) + "\n")
    failures = s.report.failure_summary(before)
    assert not failures, f"{reader}: {len(failures)} kinds of failure:\n" + "\n".join(failures)


def replay(module: str, reader: str, path: str) -> None:
    """Run one case in this process, with the traceback (for a reader's owner)."""
    _warm_up()
    _reader({"reader": reader, "module": module}).read(Path(path))
    print("loaded")


if __name__ == "__main__":  # the server (``serve``), or ``replay MODULE READER PATH``
    sys.path.insert(0, str(Path(__file__).parent))
    import fuzzing  # this file as the module the test modules import: one READERS

    if sys.argv[1:2] == ["serve"]:
        fuzzing.serve()
    elif sys.argv[1:2] == ["replay"]:
        fuzzing.replay(*sys.argv[2:5])

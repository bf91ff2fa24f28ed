"""Circuit: which edges between heads and MLPs does a task need, and how much do they keep?

Makes the task's clean/corrupted pairs (--task ioi, greater-than or capitals, tokenised for
--model, or --pairs FILE.csv with the columns clean, corrupt, answer, wrong), says how often
the model does the task, scores every edge with EAP-IG (--ig-steps points of the path from
the corrupted inputs to the clean ones; --ig-steps 1 is plain EAP) and, beside it, plain EAP
and random scores, then measures each one's circuits at MIB's ten sizes: the clean pairs run
with every edge outside the circuit carrying the corrupted run's write. It prints the
faithfulness curves (the share of the metric's way from corrupted to clean each circuit
keeps), MIB's CPR (area under the curve of the signed scores' circuits; higher is better)
and CMD (area under |1 − f| of the |score| circuits; lower is better), the smallest circuit
keeping --goal of the metric, and its components. --out writes the offline page: the
circuit as a graph of heads and MLPs, a slider over its size.

    glassformer circuit --model SmolLM2-135M-Instruct --task ioi --n 100 --out ioi.html
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassformer.inspect.tasks import Pairs
    from glassformer.models.gpt import GPT

HELP = "circuit discovery (EAP-IG) and its faithfulness, MIB's CPR and CMD"
EXAMPLE = "glassformer circuit --model SmolLM2-135M-Instruct --task ioi --n 100 --out ioi.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a language model: SmolLM2-135M-Instruct")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", choices=("ioi", "greater-than", "capitals"),
                       help="pairs made for the model")  # fmt: skip
    which.add_argument("--pairs", help="a CSV of pairs: clean, corrupt, answer, wrong")
    p.add_argument("--n", type=int, default=100, help="pairs made for --task")
    p.add_argument("--seed", type=int, default=0, help="the pairs' and the random baseline's")
    p.add_argument("--ig-steps", type=int, default=5, help="EAP-IG's steps (1: plain EAP)")
    p.add_argument("--ig-over", choices=("inputs", "activations"), default="inputs",
                   help="the path: of the embeddings, or of each sub-layer's output")  # fmt: skip
    p.add_argument("--goal", type=float, default=0.8, help="the faithfulness a circuit keeps")
    p.add_argument("--batch-size", type=int, default=16, help="pairs per pass")
    p.add_argument("--out", default="circuit.html", help="the page (.html)")
    p.add_argument("--json", help="also write the curves and the top edges as JSON")


def run(args: argparse.Namespace) -> int:

    from glassformer.inference import load_run
    from glassformer.inspect.circuits import (
        CircuitRuns,
        faithfulness,
        random_scores,
        scores_with_eap,
    )
    from glassformer.inspect.tasks import pairs_from_csv, task_pairs

    if args.n < 1 or args.batch_size < 1 or args.ig_steps < 1:
        raise ValueError("--n, --batch-size and --ig-steps must be positive integers")
    if not 0 < args.goal <= 1:
        raise ValueError(f"--goal must be in (0, 1], got {args.goal}")
    if Path(args.out).suffix != ".html":
        raise ValueError(f"--out must name an .html file, got {args.out}")
    started = time.perf_counter()
    model, tokenizer = load_run(args.model)
    if model.kind != "gpt":
        raise ValueError(f"{args.model} holds a {model.kind!r} model; circuits read a GPT's")
    pairs = (pairs_from_csv(args.pairs, tokenizer) if args.pairs
             else task_pairs(args.task, tokenizer, n=args.n, seed=args.seed))  # fmt: skip
    print(f"{pairs.task}: {len(pairs)} pairs, e.g. {pairs.texts[0][0]!r} / {pairs.texts[0][1]!r}")
    runs = CircuitRuns(model, pairs, batch_size=args.batch_size)
    _print_task(model, pairs, args.batch_size)
    clock = time.perf_counter()
    ig, eap = scores_with_eap(model, pairs, ig_steps=args.ig_steps, ig_over=args.ig_over,
                              batch_size=args.batch_size)  # fmt: skip
    seconds = time.perf_counter() - clock
    print(f"EAP-IG ({args.ig_steps} steps, over the {args.ig_over}) scored "
          f"{int(ig.edges.sum())} edges in {seconds:.1f} s (EAP: its first step)")  # fmt: skip
    methods = [(f"EAP-IG ({args.ig_steps} steps)", ig)]
    if args.ig_steps > 1:
        methods.append(("EAP", eap))
    found: list[tuple[str, Any, Any]] = []
    for name, scores in methods:
        clock = time.perf_counter()
        found.append((name, scores, faithfulness(runs, scores)))
        print(f"{name}: its circuits evaluated in {time.perf_counter() - clock:.1f} s")
    baseline = random_scores(found[0][1], seed=args.seed)  # its own generator
    found.append(("random", baseline, faithfulness(runs, baseline)))
    _print_curves(found, args.goal)
    main_scores, main_curve = found[0][1], found[0][2]
    from glassformer.viz.circuit_page import circuit_data, circuit_html

    footer = (
        f"{args.model} · {pairs.task}, {len(pairs)} pairs · metric: {pairs.measure} "
        f"difference · clean {main_curve.clean:.3f}, corrupted {main_curve.corrupt:.3f}"
    )
    data = circuit_data(main_scores, [(n, c) for n, _, c in found], goal=args.goal,
                        subtitle=f"{pairs.task} on {args.model}", footer=footer)  # fmt: skip
    path = circuit_html(data).save(args.out)
    print(f"wrote {path}")
    if args.json:
        _write_json(args.json, data)
        print(f"wrote {args.json}")
    print(f"wall time {time.perf_counter() - started:.0f} s")
    return 0


def _print_task(model: GPT, pairs: Pairs, batch_size: int) -> None:
    import torch

    clean, corrupt = [], []
    with torch.no_grad():
        for rows, a, b in pairs.batches(batch_size):
            clean += pairs.values(model(a).logits, rows).tolist()
            corrupt += pairs.values(model(b).logits, rows).tolist()
    right, n = sum(v > 0 for v in clean), len(clean)
    print(f"the model does the task: clean {pairs.measure} difference > 0 on {right} of "
          f"{n} pairs ({right / n:.0%}); mean clean {sum(clean) / n:.3f}, "
          f"corrupted {sum(corrupt) / n:.3f}")  # fmt: skip


def _print_curves(found: list[tuple[str, Any, Any]], goal: float) -> None:
    curve = found[0][2]
    names = [name for name, *_ in found]
    print("\nfaithfulness of the top-|score| circuits (MIB's sizes):")
    print(f"{'edges':>8} {'share':>7} " + " ".join(f"{n:>18}" for n in names))
    for i, size in enumerate(curve.sizes):
        values = " ".join(f"{c.absolute[i]:>18.3f}" for _, _, c in found)
        print(f"{size:>8} {curve.fractions[i]:>7.1%} {values}")
    for name, _, c in found:
        print(f"{name}: CPR {c.cpr:.3f}, CMD {c.cmd:.3f}")
    scores = found[0][1]
    reached = [i for i, f in enumerate(curve.absolute) if f >= goal]
    if not reached:
        print(f"no circuit of MIB's sizes keeps {goal:.0%} of the metric")
        return
    i = reached[0]
    print(
        f"the smallest keeping ≥ {goal:.0%}: {curve.sizes[i]} edges "
        f"({curve.fractions[i]:.1%}), faithfulness {curve.absolute[i]:.3f}"
    )
    from glassformer.inspect.circuits import Circuit

    circuit = Circuit.top(scores, curve.sizes[i])
    total = scores.scores.sum(2)
    weight: dict[str, float] = {}
    for w, r in circuit.edges.nonzero().tolist():
        name = scores.writers[w]
        weight[name] = weight.get(name, 0.0) + abs(float(total[w, r]))
    top = sorted(weight, key=weight.get, reverse=True)[:12]  # type: ignore[arg-type]
    print("its components, by the |scores| of their edges out: "
          + ", ".join(f"{n} {weight[n]:.2f}" for n in top))  # fmt: skip


def _write_json(path: str, data: dict[str, Any]) -> None:
    from glassformer.atomic import write_atomic

    keep = {k: data[k] for k in ("fractions", "sizes", "real", "methods", "footer")}
    nodes = data["nodes"]
    keep["edges"] = [{"writer": nodes[w]["id"], "reader": f"{nodes[r]['id']}.{x}"
                      if x in "qkv" else nodes[r]["id"], "score": s}
                     for w, r, x, s in data["edges"][:500]]  # fmt: skip
    write_atomic(Path(path), json.dumps(keep, indent=1).encode())

"""Fuzzing run directories and SAELens folders (issue 49).

Runs: the real runs kept for the resume tests (``tests/data/runs_7a7e08c``, ``legacy_runs``:
every task, old layouts and new), one file mutated (``test_fuzz_json``'s mutations) and read
as the command that reads it does: ``run.json`` as ``RunConfig.from_run`` (``train
--resume``), the checkpoint (config, weights, tokenizer, image processor) by
``glassformer.load_run``, ``labels.json`` by ``read_labels``, ``metrics.jsonl`` drawn and cut
back as a resumed run does.

SAELens: folders of ``cfg.json`` and ``sae_weights.safetensors`` as glassformer writes them
for SAELens (each architecture), ``cfg.json`` (d_in, d_sae, k, architecture, the metadata)
and the weights' header mutated, opened by ``glassformer.load_checkpoint``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from fuzzing import fuzz, register, session, stage
from hypothesis import strategies as st
from test_fuzz_json import load_directory, mutate_file

FAST = {"run": 35, "run.json": 25, "labels.json": 10, "metrics.jsonl": 20, "saelens": 30}
SLOW = {name: n * 6 for name, n in FAST.items()}
DATA = Path(__file__).parent / "data"
RUNS = sorted(
    [*(DATA / "runs_7a7e08c" / "runs").iterdir(), *(DATA / "legacy_runs" / "runs").iterdir()]
)


# ---- the readers -------------------------------------------------------------------------------


def load_run_dir(case: Path) -> None:
    """``glassformer.load_run(run)``: the checkpoint and its tokenizer, then a round trip."""
    from glassformer import load_run

    _, tokenizer = load_run(case)
    if hasattr(tokenizer, "encode"):
        stage("tokenize")
        tokenizer.decode(tokenizer.encode("the cat sat"))


def read_run_json(case: Path) -> None:
    """What ``glassformer train --resume`` reads first: run.json as a ``RunConfig``."""
    from glassformer import RunConfig

    RunConfig.from_run(case)


def read_labels(case: Path) -> None:
    from glassformer.inference import read_labels

    read_labels(case)


def read_metrics(case: Path) -> None:
    """A resumed run's metrics.jsonl: drawn (at its end), and cut back to its checkpoint."""
    from glassformer.training.run import MetricsLog, plot_loss

    plot_loss(case / "metrics.jsonl", case / "loss.png")
    stage("truncate")
    MetricsLog(case / "metrics.jsonl").truncate_after(3)


READ_BY = {  # the file mutated → the reader that reads it
    "run.json": register("run.json", read_run_json),
    "metrics.jsonl": register("metrics.jsonl", read_metrics),
    "checkpoint/labels.json": register("labels.json", read_labels),
}
RUN = register("run", load_run_dir)
SAELENS = register("saelens", load_directory)


def _copy_run(data: Any, folder: Path, having: str) -> tuple[Path, str]:
    runs = [r for r in RUNS if (r / having).is_file()]
    run = data.draw(st.sampled_from(runs), label="run")
    case = Path(shutil.copytree(run, folder / "case", ignore=shutil.ignore_patterns("*.pt")))
    return case, f"{run.parent.parent.name}/{run.name}"


def run_file_case(name: str) -> Any:
    """The cases for the reader of the run file ``name``: it alone mutated."""

    def make_case(data: Any, folder: Path) -> tuple[str, None]:
        case, seed = _copy_run(data, folder, name)
        return f"{seed}: {mutate_file(data, case / name)}", None

    return make_case


def make_checkpoint_case(data: Any, folder: Path) -> tuple[str, None]:
    """A run whose checkpoint has one or two files mutated (or taken away)."""
    case, seed = _copy_run(data, folder, "checkpoint/config.json")
    files = sorted(p.name for p in (case / "checkpoint").iterdir() if p.name != "labels.json")
    done = [seed]
    for _ in range(data.draw(st.integers(1, 2), label="files")):
        file = case / "checkpoint" / data.draw(st.sampled_from(files), label="file")
        if file.is_file():
            done.append(mutate_file(data, file))
    return "; ".join(done), None


# ---- SAELens ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saelens_seeds(tmp_path_factory) -> list[Path]:
    """SAELens folders (cfg.json, sae_weights.safetensors) of each architecture."""
    from glassformer import SAEConfig, SparseAutoencoder, save_checkpoint

    folders = []
    for arch in ("topk", "standard", "jumprelu"):
        config = SAEConfig(d_in=16, d_sae=32, architecture=arch, k=4, model_name="lm",
                           hook_name="blocks.0.hook_resid_post", context_size=16)  # fmt: skip
        folder = save_checkpoint(SparseAutoencoder(config), tmp_path_factory.mktemp(arch) / "sae")
        for name in ("config.json", "model.safetensors"):
            (folder / name).unlink()
        folders.append(folder)
    return folders


def saelens_case(seeds: list[Path]) -> Any:
    def make_case(data: Any, folder: Path) -> tuple[str, None]:
        seed = data.draw(st.sampled_from(seeds), label="seed")
        case = Path(shutil.copytree(seed, folder / "case"))
        names = ["cfg.json", "cfg.json", "cfg.json", "sae_weights.safetensors"]
        done = [seed.parent.name]
        for _ in range(data.draw(st.integers(1, 2), label="files")):
            file = case / data.draw(st.sampled_from(names), label="file")
            if file.is_file():
                done.append(mutate_file(data, file))
        return "; ".join(done), None

    return make_case


# ---- the tests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzer(request, tmp_path_factory):
    return session(request, tmp_path_factory)


@pytest.fixture(scope="module")
def seeds_load(fuzzer, saelens_seeds) -> None:
    """Each seed, unchanged, loads (each reader warmed up on it in the server)."""
    cases = [(RUN, run) for run in RUNS] + [(SAELENS, s) for s in saelens_seeds]
    cases += [(reader, run) for run in RUNS[:1] for reader in READ_BY.values()]
    cases += [(READ_BY["checkpoint/labels.json"], run) for run in RUNS if "classify" in run.name]
    for reader, seed in cases:
        result = fuzzer.try_seed(reader, seed)
        assert result["outcome"] == "loaded", (reader, seed, result)


def _cases(reader: str, saelens_seeds: list[Path]) -> Any:
    if reader == RUN:
        return make_checkpoint_case
    if reader == SAELENS:
        return saelens_case(saelens_seeds)
    return run_file_case(next(name for name, r in READ_BY.items() if r == reader))


@pytest.mark.parametrize("reader", sorted(FAST))
def test_fuzzed_runs_and_saelens_folders_load_or_are_refused_in_one_line(
    fuzzer, saelens_seeds, seeds_load, reader
):
    fuzz(fuzzer, reader, _cases(reader, saelens_seeds), FAST[reader])


@pytest.mark.slow
@pytest.mark.parametrize("reader", sorted(FAST))
def test_fuzzed_runs_and_saelens_folders_many(fuzzer, saelens_seeds, seeds_load, reader):
    fuzz(fuzzer, reader, _cases(reader, saelens_seeds), SLOW[reader])

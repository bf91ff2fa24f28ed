"""glassformer.precision: bf16 or fp32 chosen by timing the model's own matrix products, once
per machine (cached), and what `train --bf16 auto|on|off` does with the answer."""

from __future__ import annotations

import json
import random
import time

import pytest
import torch

from glassformer import precision
from glassformer.precision import Measurement, bf16_measurement, resolve_bf16

SHAPES = [(64, 32, 96), (64, 32, 128)]
NOW = time.time()
FASTER = Measurement(177.0, 1000.0, 0.03, 0.04, NOW)
SLOWER = Measurement(276.0, 147.0, 0.02, 0.05, NOW)


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Stub the timing with ``measured.result``; ``measured.calls`` counts timings."""

    class Stub:
        result = FASTER
        calls = 0

    def fake(shapes, device, seconds, linear=False):
        Stub.calls += 1
        return Stub.result

    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "_measure", fake)
    return Stub


def test_auto_takes_bf16_only_where_it_measures_faster(measured):
    measured.result = SLOWER
    assert resolve_bf16("auto", SHAPES, cache_dir=None) == (False, SLOWER, None)
    measured.result = FASTER
    assert resolve_bf16("auto", [(8, 8, 8)]) == (True, FASTER, None)  # other shapes: timed anew


def test_bf16_on_where_it_measures_slower_warns_with_both_figures(measured):
    measured.result = SLOWER
    use, _, warning = resolve_bf16(True, SHAPES)
    assert use is True
    assert "slower than fp32" in warning and "147" in warning and "276" in warning
    measured.result = FASTER
    assert resolve_bf16(True, [(8, 8, 8)]) == (True, FASTER, None)


def test_off_measures_nothing(measured):
    assert resolve_bf16(False, SHAPES) == (False, None, None)
    assert measured.calls == 0


def test_the_measurement_is_cached_per_machine_and_shapes(measured, tmp_path):
    first = bf16_measurement(SHAPES)
    again = bf16_measurement(SHAPES)
    assert first == FASTER and again == Measurement(177.0, 1000.0, 0.03, 0.04, NOW, cached=True)
    assert measured.calls == 1 and "cached from" in again.describe()
    bf16_measurement(SHAPES[:1])
    assert measured.calls == 2
    (key,) = [k for k in json.loads((tmp_path / "precision.json").read_text()) if "64x32x96 " in k]
    assert "threads" in key and "torch" in key


def test_an_unreadable_cache_is_measured_again(measured, tmp_path):
    (tmp_path / "precision.json").write_text("{not json")
    assert bf16_measurement(SHAPES) == FASTER and measured.calls == 1


def test_bad_settings_and_shapes_are_one_line():
    with pytest.raises(ValueError, match="bf16 must be True, False or 'auto', got 'fast'"):
        resolve_bf16("fast", SHAPES)
    with pytest.raises(
        ValueError, match=r"\(m, k, n\) triples of positive sizes, got \[\(0, 2, 2\)\]"
    ):
        bf16_measurement([(0, 2, 2)])


def test_the_real_timing_gives_both_throughputs(tmp_path):
    m = bf16_measurement([(256, 128, 256)], seconds=0.05, cache_dir=tmp_path)
    assert m.fp32_gflops > 0 and m.bf16_gflops > 0
    assert m.speedup == pytest.approx(m.bf16_gflops / m.fp32_gflops)


def test_linear_layout_is_measured_and_cached_apart(tmp_path, monkeypatch):
    """Decoding times its products as linear layers run them, F.linear(x, w) with w stored
    (n, k): bf16 speed can differ by layout, so the two are separate cache entries."""
    import json

    calls = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(
        torch.nn.functional, "linear", lambda x, w: calls.append(tuple(w.shape)) or real(x, w)
    )
    shapes = [(2, 3, 5)]  # k = 3, n = 5: a (k, n) weight would not fit F.linear
    bf16_measurement(shapes, cache_dir=tmp_path, seconds=0.01, linear=True)
    assert calls and set(calls) == {(5, 3)}
    bf16_measurement(shapes, cache_dir=tmp_path, seconds=0.01)
    keys = list(json.loads((tmp_path / "precision.json").read_text()))
    assert len(keys) == 2 and sum(k.endswith("; linear") for k in keys) == 1


# ---- a measurement that noise cannot fool -----------------------------------------------


def busy_machine(fp32_s: float, bf16_s: float, seed: int, share: float = 0.5):
    """A ``_round_timer`` stub for a machine doing other work: each round of either dtype is
    slowed, with probability ``share``, by a random factor of 1.5 to 25."""
    rng = random.Random(seed)

    def timer(shapes, device, linear):
        def one_round(dtype):
            base = bf16_s if dtype == torch.bfloat16 else fp32_s
            return base * (rng.uniform(1.5, 25) if rng.random() < share else 1.0)

        return one_round

    return timer


@pytest.mark.parametrize("bf16_s, choice", [(1e-3, True), (1.9e-3, False)])
def test_disturbed_timings_are_never_cached_and_do_not_flip_the_choice(
    monkeypatch, tmp_path, bf16_s, choice
):
    """fp32 rounds take 2 ms; bf16 1 ms (bf16's choice) or 1.9 ms (fp32's: inside the margin).
    On a quiet machine that is measured, trusted and cached; with half the rounds slowed at
    random, 20 different disturbances each give the quiet choice and cache nothing."""
    monkeypatch.setattr(precision, "_round_timer", busy_machine(2e-3, bf16_s, 0, share=0))
    quiet = bf16_measurement(SHAPES, seconds=0, cache_dir=tmp_path / "quiet")
    assert quiet.trusted and quiet.bf16_faster is choice
    assert quiet.fp32_spread == quiet.bf16_spread == 0
    assert (tmp_path / "quiet" / "precision.json").exists()
    for seed in range(20):
        monkeypatch.setattr(precision, "_round_timer", busy_machine(2e-3, bf16_s, seed))
        noisy = bf16_measurement(SHAPES, seconds=0, cache_dir=tmp_path)
        assert noisy.bf16_faster is choice, (seed, noisy)
        assert (
            not noisy.trusted and max(noisy.fp32_spread, noisy.bf16_spread) > precision.MAX_SPREAD
        )
        assert "too noisy to cache" in noisy.describe()
        assert not (tmp_path / "precision.json").exists()


def test_an_implausible_figure_never_chooses_bf16_and_is_not_cached(monkeypatch, tmp_path):
    """The figures a busy machine once wrote for good: bf16 0.2 against fp32 4.2 GFLOP/s,
    steadily. bf16 twenty times slower than fp32 is not this hardware (nor twenty times
    faster): measured again on each use, never cached; fp32 for the run. A plausible 11x
    faster is bf16's."""
    flops = 2 * sum(m * k * n for m, k, n in SHAPES)
    timer = busy_machine(flops / 4.2e9, flops / 0.2e9, 0, share=0)
    monkeypatch.setattr(precision, "_round_timer", timer)
    m = bf16_measurement(SHAPES, seconds=0, cache_dir=tmp_path)
    assert (m.fp32_gflops, m.bf16_gflops) == (4.2, 0.2)
    assert not m.plausible and not m.trusted and not m.bf16_faster
    assert not (tmp_path / "precision.json").exists()
    monkeypatch.setattr(precision, "_round_timer", busy_machine(2e-2, 1e-3, 0, share=0))
    too_fast = bf16_measurement(SHAPES, seconds=0, cache_dir=tmp_path)  # 20x: not this CPU
    assert too_fast.speedup == pytest.approx(20) and not too_fast.bf16_faster
    assert not (tmp_path / "precision.json").exists()
    monkeypatch.setattr(precision, "_round_timer", busy_machine(1.2e-2, 1.05e-3, 0, share=0))
    fast = bf16_measurement(SHAPES, seconds=0, cache_dir=tmp_path)
    assert fast.plausible and fast.bf16_faster and (tmp_path / "precision.json").exists()


def write_entry(tmp_path, **fields):
    key = precision._cache_key(SHAPES, torch.device("cpu"))
    (tmp_path / "precision.json").write_text(json.dumps({key: fields}))
    return key


@pytest.mark.parametrize(
    "entry",
    [
        dict(fp32_gflops=177.0, bf16_gflops=1000.0),  # an older glassformer's: no spread, no date
        dict(fp32_gflops=177.0, bf16_gflops=1000.0, measured_at=NOW - 31 * 86400),  # expired
        dict(fp32_gflops=4.2, bf16_gflops=0.2, measured_at=NOW),  # implausible
        dict(fp32_gflops=177.0, bf16_gflops=1000.0, fp32_spread=0.6, measured_at=NOW),  # noisy
        dict(fp32_gflops=177.0, bf16_gflops=1000.0, measured_at=NOW + 86400),  # from the future
        dict(fp32_gflops="fast", bf16_gflops=1000.0, measured_at=NOW),  # edited by hand
    ],
    ids=["old-format", "expired", "implausible", "noisy", "future", "garbled"],
)
def test_an_expired_implausible_or_noisy_entry_is_measured_again(measured, tmp_path, entry):
    key = write_entry(tmp_path, **entry)
    assert bf16_measurement(SHAPES) == FASTER and measured.calls == 1
    saved = json.loads((tmp_path / "precision.json").read_text())[key]
    assert saved["measured_at"] == NOW and saved["shapes"] == [[64, 32, 96, 1], [64, 32, 128, 1]]


def test_a_fresh_trusted_entry_is_used_until_refreshed(measured, tmp_path):
    write_entry(
        tmp_path,
        fp32_gflops=276.0,
        bf16_gflops=147.0,
        measured_at=NOW - 86400,
        fp32_spread=0.02,
        bf16_spread=0.02,
        shapes=[[64, 32, 96, 1], [64, 32, 128, 1]],
    )
    assert bf16_measurement(SHAPES).cached and measured.calls == 0
    ((key, old, new),) = precision.refresh()
    assert measured.calls == 1 and old.bf16_gflops == 147.0 and new == FASTER
    assert precision.cached() == [(key, Measurement(**{**vars(FASTER), "cached": True}))]


def test_refresh_leaves_other_machines_entries_alone(measured, tmp_path):
    other = {"AMD EPYC, 2 threads; torch 2.13.0; 64x32x96; linear": {"fp32_gflops": 1.0}}
    (tmp_path / "precision.json").write_text(json.dumps(other))
    assert precision.refresh() == [] and measured.calls == 0
    assert json.loads((tmp_path / "precision.json").read_text()) == other


def test_bench_precision_prints_each_entry_and_the_choice(measured, tmp_path, capsys):
    from glassformer.cli import main

    bf16_measurement(SHAPES, linear=True)
    assert main(["bench", "precision"]) == 0
    out = capsys.readouterr().out
    assert "64x32x96 and 1 other shapes as linear layers: bf16 (bf16 1,000 ±4% vs fp32 177" in out
    assert "cached from" in out
    measured.result = SLOWER
    assert main(["bench", "precision", "--refresh"]) == 0
    out = capsys.readouterr().out
    assert ": fp32 (bf16 147 ±5% vs fp32 276 ±2% GFLOP/s (0.53x), measured here; was bf16" in out
    assert main(["bench", "precision", "attention"]) == 2
    assert "precision runs alone; name no other benchmark" in capsys.readouterr().err


def test_refresh_skips_an_entry_whose_shapes_cannot_be_read(measured, tmp_path):
    key = write_entry(tmp_path, fp32_gflops=1.0, bf16_gflops=1.0, shapes=[[64, 32, 96]])
    assert precision.refresh() == [] and measured.calls == 0
    assert key in json.loads((tmp_path / "precision.json").read_text())

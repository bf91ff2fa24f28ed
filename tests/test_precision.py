"""glassformer.kernels.precision: bf16 or fp32 chosen by timing the model's own matrix
products, once per machine (cached), and what `train --bf16 auto|on|off` does with the answer."""

from __future__ import annotations

import json
import os
import random
import re
import time

import pytest
import torch

from glassformer.kernels import precision
from glassformer.kernels.precision import Measurement, bf16_measurement, resolve_bf16

pytestmark = pytest.mark.measures_this_machine  # each test measures, or stubs the measure

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
    with pytest.warns(UserWarning, match="precision.json cannot be used \\(not JSON"):
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
    # timings that noise made too spread are never cached: this test is about the keys
    monkeypatch.setattr(Measurement, "trusted", property(lambda self: True))
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
    ],
    ids=["old-format", "expired", "implausible", "noisy", "future"],  # garbled: further down
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


# ---- a garbled cache is measured again, never a crash ----------------------------------


@pytest.mark.parametrize(
    "value, shown",
    [
        (0, "fp32_gflops is 0, expected a finite number > 0"),
        (-3.0, "fp32_gflops is -3.0"),
        (float("nan"), "fp32_gflops is nan"),
        (float("inf"), "fp32_gflops is inf"),
        (10**400, "fp32_gflops is 1000000000000000000000000000000000000..."),
        (True, "fp32_gflops is True"),
        ([177.0], "fp32_gflops is a JSON array"),
        ({"a": {"b": 1}}, "fp32_gflops is a JSON object"),
        ("fast", "fp32_gflops is 'fast'"),
    ],
    ids=["zero", "negative", "nan", "infinity", "huge", "bool", "list", "nested", "string"],
)
def test_a_garbled_entry_is_one_warning_then_measured_again_and_overwritten(
    measured, tmp_path, value, shown
):
    """``fp32_gflops: 0`` once divided by zero in every default run until the file was
    deleted; now each garbled field is named (with its value) in one warning."""
    key = write_entry(tmp_path, fp32_gflops=value, bf16_gflops=1000.0, measured_at=NOW)
    with pytest.warns(UserWarning) as caught:
        assert bf16_measurement(SHAPES) == FASTER and measured.calls == 1
    assert len(caught) == 1 and shown in str(caught[0].message)
    assert str(tmp_path / "precision.json") in str(caught[0].message)
    saved = json.loads((tmp_path / "precision.json").read_text())[key]
    assert saved["fp32_gflops"] == 177.0 and saved["measured_at"] == NOW


@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ('{"k": ' + "[" * 500 + "]" * 500 + "}", "JSON nested more than 8 deep"),
        ("[1, 2]", "a JSON list, expected an object"),
        ('"fp32_gflops"', "a JSON str, expected an object"),
        ("\udcff{}", "not JSON"),
        ("{not json", "not JSON"),
        ('{"k": "' + "x" * (4 << 20) + '"}', "larger than 4,194,304 bytes"),
    ],
    ids=["nested-arrays", "nested-objects", "nested-entry", "list", "string", "not-utf8"]
    + ["not-json", "too-large"],
)
def test_a_garbled_file_is_one_warning_then_measured_again_and_overwritten(
    measured, tmp_path, text, why
):
    """Deeply nested JSON once ended every default run in a RecursionError."""
    (tmp_path / "precision.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.warns(UserWarning) as caught:
        assert bf16_measurement(SHAPES) == FASTER and measured.calls == 1
    assert len(caught) == 1 and why in str(caught[0].message)
    assert list(json.loads((tmp_path / "precision.json").read_text())) == [
        precision._cache_key(SHAPES, torch.device("cpu"))
    ]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_cache_that_is_not_a_regular_file_is_one_warning(measured, tmp_path, kind):
    """A directory in the cache's place once ended the run in IsADirectoryError (os.fdopen
    refused it before the regular-file check); a FIFO must not hang the run."""
    cache = tmp_path / "precision.json"
    cache.mkdir() if kind == "directory" else os.mkfifo(cache)
    with pytest.warns(UserWarning) as caught:
        assert bf16_measurement(SHAPES) == FASTER and measured.calls == 1
    assert len(caught) == 1 and "not a regular file" in str(caught[0].message)
    assert str(cache) in str(caught[0].message)


def test_bench_precision_lists_what_it_can_and_names_what_it_skipped(measured, tmp_path, capsys):
    from glassformer.cli import main

    here = precision._this_machine()
    good = dict(fp32_gflops=177.0, bf16_gflops=1000.0, measured_at=NOW, shapes=[[1, 2, 3, 1]])
    entries = {
        here + "1x2x3; linear": good,
        here + "4x5x6": {**good, "fp32_gflops": 0},
        here + "7x8x9": {**good, "measured_at": NOW - 40 * 86400},
        here: [[[]]],  # a key with no shapes in it, an entry not an object
        here + "10x11x12": {**good, "shapes": [[10**5, 10**5, 10**5, 1]]},
    }
    (tmp_path / "precision.json").write_text(json.dumps(entries))
    assert main(["bench", "precision"]) == 0
    out = capsys.readouterr().out
    assert "  1x2x3 as linear layers: bf16 (bf16 1,000" in out
    assert "  skipped 4x5x6: fp32_gflops is 0, expected a finite number > 0" in out
    assert "  skipped 7x8x9: measured 40 days ago, expected 0 to 30" in out
    assert f"  skipped {here[:60]!r}: an entry is a JSON array, expected an object" in out
    assert "  skipped 10x11x12: cannot be measured again: shapes need" in out
    assert main(["bench", "precision", "--refresh"]) == 0  # the three it can measure
    assert measured.calls == 3 and "an entry is a JSON array" in capsys.readouterr().out
    (tmp_path / "precision.json").write_text("[" * 100_000)
    assert main(["bench", "precision"]) == 0
    assert "  skipped the whole file: JSON nested too deeply" in capsys.readouterr().out


@pytest.mark.parametrize(
    "rows, why",
    [
        ([[64, 32, 96, 10**6]], "more than 65536 products"),
        ([[10**5, 10**5, 10**5, 1]], "GiB of operands, more than half"),
        ([[64, 32, 96, 0]], "expected 4 integers 1..1048576"),
        ([[64, 32, 2**21, 1]], "expected 4 integers 1..1048576"),
        ([[64, 32, 96.5, 1]], "expected 4 integers"),
        ([], "expected a list of (m, k, n, count) rows"),
    ],
    ids=["too-many", "too-much-memory", "zero", "too-wide", "float", "empty"],
)
def test_refresh_skips_shapes_past_sane_limits_before_allocating(measured, tmp_path, rows, why):
    """A --refresh measures an entry's products again, allocating their operands: a count,
    side or total that no measurement here could have had is refused first."""
    key = write_entry(tmp_path, fp32_gflops=1.0, bf16_gflops=1.0, shapes=rows)
    assert precision.refresh() == [] and measured.calls == 0
    from glassformer.kernels import precision_cache

    with pytest.raises(ValueError, match=re.escape(why)):
        precision_cache.shapes({"shapes": rows})
    assert key in json.loads((tmp_path / "precision.json").read_text())

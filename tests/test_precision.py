"""glassformer.precision: bf16 or fp32 chosen by timing the model's own matrix products, once
per machine (cached), and what `train --bf16 auto|on|off` does with the answer."""

from __future__ import annotations

import json

import pytest
import torch

from glassformer import precision
from glassformer.precision import Measurement, bf16_measurement, resolve_bf16

SHAPES = [(64, 32, 96), (64, 32, 128)]
FASTER = Measurement(fp32_gflops=177.0, bf16_gflops=1000.0)
SLOWER = Measurement(fp32_gflops=276.0, bf16_gflops=147.0)


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
    assert first == again == FASTER and measured.calls == 1
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

"""glassformer.kernels.gguf_choice: from how many rows of input a GGUF product of rows
interleaved decodes its weight instead, measured on this machine: the choice its figures
make, a cache per machine that a hostile file cannot steer, a busy machine that cannot flip
the choice or write it down, the forced count, and the path each product then takes."""

from __future__ import annotations

import json
import random

import pytest
import torch

from glassformer.kernels import gguf_choice, gguf_linear
from glassformer.kernels.gguf_blocks import Q4_1, Q8_0
from glassformer.kernels.gguf_choice import CANDIDATES, Crossover, crossover, many_rows


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Measured, not forced, with the cache in a folder of its own."""
    monkeypatch.delenv(gguf_choice.FORCE_ENV, raising=False)
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path))
    monkeypatch.setattr(gguf_choice, "_CHOSEN", {})
    return tmp_path


def machine(decoded_fixed: float, seed: int = 0, share: float = 0.0):
    """A ``_round_timer`` stub: a product from the interleaved rows takes 10 us a row, from
    the decoded weight ``decoded_fixed`` seconds plus 5 us a row; each timing slowed, with
    probability ``share``, by a random factor of 1.5 to 25 (a busy machine)."""
    rng = random.Random(seed)

    def timer(kind, rounded):
        def one_round(how):
            base = [
                (1e-5 * n) if how == "interleaved" else decoded_fixed + 5e-6 * n for n in CANDIDATES
            ]
            return [t * (rng.uniform(1.5, 25) if rng.random() < share else 1.0) for t in base]

        return one_round

    return timer


@pytest.mark.parametrize("decoded_fixed, rows", [(1e-3, 256), (4e-4, 96), (3e-3, None)])
def test_the_choice_is_the_fewest_rows_from_which_decoding_stays_faster(
    monkeypatch, measuring, decoded_fixed, rows
):
    """Decoding overtakes the interleaved rows past decoded_fixed / 5 us rows: 200 → 256,
    80 → 96, 600 → never within 512; cached, then read back without measuring."""
    monkeypatch.setattr(gguf_choice, "_round_timer", machine(decoded_fixed))
    measured = crossover(Q8_0, rounded=True)
    assert measured.trusted and measured.rows == rows and measured.spread == 0
    entries = json.loads((measuring / "kernels.json").read_text())
    assert list(entries) == [gguf_choice.cache_key(Q8_0, True)]
    monkeypatch.setattr(gguf_choice, "_round_timer", None)  # measuring again would fail
    assert crossover(Q8_0, rounded=True) == measured and many_rows(Q8_0, True) == rows


def test_a_busy_machine_keeps_the_quiet_choice_and_caches_nothing(monkeypatch, measuring):
    """Half of all timings slowed at random, 20 different ways: each measurement makes the
    quiet machine's choice, is called too noisy, and nothing is written."""
    for seed in range(20):
        monkeypatch.setattr(gguf_choice, "_round_timer", machine(1e-3, seed, share=0.5))
        noisy = crossover(Q8_0, rounded=False)
        assert noisy.rows == 256, seed
        assert not noisy.trusted and noisy.spread > gguf_choice.MAX_SPREAD
        assert "too noisy to cache" in noisy.describe()
        assert not (measuring / "kernels.json").exists()


@pytest.mark.parametrize(
    "entry",
    [
        "fast",
        {"interleaved_s": [0.0] * 7, "decoded_s": ["0"] * 7, "spread": 0, "measured_at": 0},
        {"interleaved_s": [1.0] * 3, "decoded_s": [0.0] * 3, "spread": 0, "measured_at": 0},
        {"interleaved_s": [1.0] * 7, "decoded_s": [-1.0] * 7, "spread": 0, "measured_at": 0},
        {"interleaved_s": [1.0] * 7, "decoded_s": [0.0] * 7, "spread": 0.9, "measured_at": 0},
        {"interleaved_s": [1.0] * 7, "decoded_s": [0.0] * 7, "spread": 0, "measured_at": 9e11},
    ],
    ids=["not-an-object", "a-string", "too-few", "negative", "too-noisy", "in-the-future"],
)
def test_a_cache_entry_that_is_not_a_measurement_is_measured_again(monkeypatch, measuring, entry):
    key = gguf_choice.cache_key(Q8_0, True)
    (measuring / "kernels.json").write_text(json.dumps({key: entry}))
    monkeypatch.setattr(gguf_choice, "_round_timer", machine(4e-4))
    assert crossover(Q8_0, rounded=True).rows == 96  # measured, not the file's
    assert json.loads((measuring / "kernels.json").read_text())[key]["decoded_s"][0] > 0


def test_a_forced_count_is_used_unmeasured_and_a_bad_one_is_one_line(monkeypatch, measuring):
    monkeypatch.setattr(gguf_choice, "_round_timer", None)  # measuring would fail
    monkeypatch.setenv(gguf_choice.FORCE_ENV, "300")
    assert many_rows(Q8_0, True) == 300 and many_rows(Q4_1, False) == 300
    monkeypatch.setenv(gguf_choice.FORCE_ENV, "never")
    assert many_rows(Q8_0, True) is None
    monkeypatch.setenv(gguf_choice.FORCE_ENV, "-5")
    with pytest.raises(ValueError, match=r"GLASSFORMER_MANY_ROWS='-5': expected a count"):
        many_rows(Q8_0, True)


def test_the_choice_decides_which_path_a_prompts_product_takes(monkeypatch):
    """100 rows of a layer kept interleaved: from the rows where the choice is 'never' or
    above 100, decoded where it is 72 or less; both equal the readable product (1e-5); a
    layer kept as blocks decodes from 72 rows whatever the choice."""
    from test_gguf_blocks import random_blocks

    from glassformer.kernels.gguf_blocks import Q5_K

    taken = []
    for name in ("_from_rows", "_from_decoded"):
        real = getattr(gguf_linear, name)
        spy = lambda *a, _real=real, _name=name: taken.append(_name) or _real(*a)  # noqa: E731
        monkeypatch.setattr(gguf_linear, name, spy)
    layer = gguf_linear.GGUFLinear([(Q8_0, random_blocks(Q8_0, 32, 64))], in_features=64)
    blocks = gguf_linear.GGUFLinear([(Q5_K, random_blocks(Q5_K, 32, 256))], in_features=256)
    x = torch.randn(100, 64)
    reference = x.double() @ layer.dequantized().double().t()
    for forced, path in (("never", "_from_rows"), ("101", "_from_rows"), ("72", "_from_decoded")):
        monkeypatch.setenv(gguf_choice.FORCE_ENV, forced)
        taken.clear()
        y = layer(x)
        assert taken == [path], forced
        assert ((y - reference).norm() / reference.norm()).item() < 1e-5
        taken.clear()
        blocks(torch.randn(100, 256))
        assert taken == ["_from_decoded"], forced


def test_this_machine_measures_a_choice_that_the_cache_then_lists(measuring):
    """A real measurement here (about a second a precision): a count of CANDIDATES or
    never, its figures positive, listed by ``cached()`` where it was trusted."""
    measured = crossover(Q8_0, rounded=True)
    assert measured.rows in (*CANDIDATES, None)
    assert all(t > 0 for t in measured.interleaved_s + measured.decoded_s)
    listed = dict(gguf_choice.cached())
    if measured.trusted:
        assert listed[gguf_choice.cache_key(Q8_0, True)] == measured
    assert isinstance(measured, Crossover) and "ms interleaved/decoded" in measured.describe()


def test_a_layer_of_several_types_decodes_where_any_of_its_types_does(monkeypatch):
    """Each type has its own count (a 5-bit type's rows cost more): a q/k/v of Q8_0 and Q5_0
    rows decodes 100 rows where Q5_0 decodes from 80, though Q8_0 never does."""
    from test_gguf_blocks import random_blocks

    from glassformer.kernels.gguf_blocks import Q5_0

    counts = {Q8_0: None, Q5_0: 80}
    monkeypatch.setattr(gguf_choice, "many_rows", lambda kind, rounded: counts[kind])
    taken = []
    real = gguf_linear._from_decoded
    monkeypatch.setattr(
        gguf_linear, "_from_decoded", lambda *a: taken.append("decoded") or real(*a)
    )
    mixed = [(Q8_0, random_blocks(Q8_0, 32, 64)), (Q5_0, random_blocks(Q5_0, 16, 64))]
    gguf_linear.GGUFLinear(mixed, in_features=64, rounded=True)(torch.randn(100, 64))
    assert taken == ["decoded"]
    taken.clear()
    alone = gguf_linear.GGUFLinear(mixed[:1], in_features=64, rounded=True)
    alone(torch.randn(100, 64))
    assert taken == []


def test_bench_kernels_prints_each_types_choice_and_refreshes_it(monkeypatch, measuring, capsys):
    """``glassformer bench kernels``: every type a layer interleaves, exact and gguf-q8, its
    choice and figures (measured where not cached); ``--refresh`` measures again; it runs
    alone."""
    from glassformer.cli import main

    calls = []

    def timer(kind, rounded):
        calls.append((kind, rounded))
        return machine(1e-3)(kind, rounded)

    monkeypatch.setattr(gguf_choice, "_round_timer", timer)
    assert main(["bench", "kernels"]) == 0
    out = capsys.readouterr().out
    # exact and gguf-q8 each: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K
    assert out.count("weight decoded from 256 rows; ms interleaved/decoded at 72: 0.72/") == 14
    assert "Q4_K gguf-q8:" in out and "Q6_K gguf:" in out
    assert len(calls) == 14
    assert main(["bench", "kernels"]) == 0 and len(calls) == 14  # cached: nothing measured
    capsys.readouterr()
    assert main(["bench", "kernels", "--refresh"]) == 0 and len(calls) == 28
    assert main(["bench", "kernels", "attention"]) == 2
    assert "kernels runs alone; name no other benchmark" in capsys.readouterr().err

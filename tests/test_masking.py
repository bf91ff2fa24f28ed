"""BERT's masking: 15% of the real tokens chosen, 80/10/10 replaced by [MASK] / a random
token / kept, labels only where chosen, whole words together, the same masks on resume."""

import pytest
import torch

from glassformer.data.masking import IGNORE, MaskedLMBatches, mask_tokens

SPECIALS = [0, 1, 2, 3]  # pad, bos, eos, unk
MASK, V = 4, 500


def batch(seed=0, rows=64, length=256):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (rows, length), generator=g)
    ids[:, -20:] = 0  # padding
    ids[:, 0] = 1  # a [CLS]-like start
    return ids


def test_masking_statistics_over_many_batches_are_berts():
    g = torch.Generator().manual_seed(0)
    chosen = real = as_mask = as_random = kept = 0
    for seed in range(20):
        ids = batch(seed)
        inputs, labels = mask_tokens(
            ids, mask_id=MASK, vocab_size=V, special_ids=SPECIALS, generator=g
        )
        picked = labels != IGNORE
        chosen += int(picked.sum())
        real += int((ids > 3).sum())
        as_mask += int((inputs[picked] == MASK).sum())
        kept += int((inputs[picked] == ids[picked]).sum())
        as_random += int(((inputs[picked] != MASK) & (inputs[picked] != ids[picked])).sum())
        assert torch.equal(labels[picked], ids[picked])  # labels: the original ids
        assert torch.equal(inputs[~picked], ids[~picked])  # nothing else changes
        assert not picked[ids <= 3].any()  # padding and specials are never chosen
        assert not torch.isin(inputs[picked & (inputs != MASK)], torch.tensor(SPECIALS)).any()
    assert chosen / real == pytest.approx(0.15, abs=0.003)  # ~300k tokens
    assert as_mask / chosen == pytest.approx(0.80, abs=0.01)
    # a random replacement equals the original 1 time in ~495; it counts as kept then
    assert as_random / chosen == pytest.approx(0.10, abs=0.01)
    assert kept / chosen == pytest.approx(0.10, abs=0.01)


def test_every_row_gets_at_least_one_masked_token():
    ids = torch.full((200, 6), 0)
    ids[:, 0] = 7  # a single real token per row: 15% would often choose none
    _, labels = mask_tokens(ids, mask_id=MASK, vocab_size=V, special_ids=SPECIALS)
    assert ((labels != IGNORE).sum(1) == 1).all() and (labels[:, 0] == 7).all()


def test_whole_word_masking_chooses_all_pieces_of_a_word_or_none():
    g = torch.Generator().manual_seed(1)
    ids = batch(3)
    continues = torch.rand(ids.shape, generator=g) < 0.4
    continues[:, 0] = False
    _, labels = mask_tokens(
        ids, mask_id=MASK, vocab_size=V, special_ids=SPECIALS, word_continues=continues,
        generator=g,
    )  # fmt: skip
    picked, real = labels != IGNORE, ids > 3
    word = torch.cumsum(~continues, dim=1)
    for row in range(len(ids)):
        for w in word[row].unique():
            pieces = picked[row][(word[row] == w) & real[row]]
            assert pieces.all() or not pieces.any()
    share = picked.sum() / real.sum()
    assert 0.10 < share < 0.20  # still about 15% of the tokens


def test_masks_are_reproducible_and_resume_where_they_stopped():
    stream = torch.randint(5, V, (5000,), generator=torch.Generator().manual_seed(0))
    options = dict(mask_id=MASK, vocab_size=V, special_ids=SPECIALS, seed=7)
    a = MaskedLMBatches(stream, 32, 4, **options)
    first = [next(a) for _ in range(3)]
    state = a.state_dict()
    after = [next(a) for _ in range(3)]
    b = MaskedLMBatches(stream, 32, 4, **options)
    assert all(
        torch.equal(x[0], y[0]) for x, y in zip(first, [next(b) for _ in range(3)], strict=True)
    )
    c = MaskedLMBatches(stream, 32, 4, **options)
    c.load_state_dict(state)
    for (xi, xl), (yi, yl) in zip(after, [next(c) for _ in range(3)], strict=True):
        assert torch.equal(xi, yi) and torch.equal(xl, yl)


def test_a_bad_probability_is_one_line():
    with pytest.raises(ValueError, match="masking probability must be in"):
        mask_tokens(batch(), mask_id=MASK, vocab_size=V, prob=1.5)

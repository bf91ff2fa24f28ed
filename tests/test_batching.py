"""Batching: LM windows, length buckets, collation, sharding, and exact resume."""

import io
import random

import pytest
import torch

from glassformer.data.batching import (
    BucketBatches,
    LMBatches,
    collate_labelled,
    collate_pairs,
    eval_batches,
    pad_batch,
)


def saved_and_loaded(state):
    """A state through torch.save / torch.load(weights_only=True), as checkpoints keep it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_pad_batch():
    assert pad_batch([[1, 2, 3], [4]], pad_id=0).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad_batch([[1, 2, 3], [4]], pad_id=9, max_len=2).tolist() == [[1, 2], [4, 9]]
    assert pad_batch([torch.tensor([5, 6]), [7]]).dtype == torch.long
    with pytest.raises(ValueError, match="empty batch"):
        pad_batch([])


def test_lm_windows_are_slices_of_the_stream_and_their_continuation():
    ids = torch.randint(0, 1000, (500,), generator=torch.Generator().manual_seed(0))
    x, y = next(LMBatches(ids.to(torch.int32), 8, 4, seed=0))
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    for row_x, row_y in zip(x, y, strict=True):
        starts = [i for i in range(len(ids) - 8) if torch.equal(ids[i : i + 8], row_x)]
        assert starts and torch.equal(ids[starts[0] + 1 : starts[0] + 9], row_y)


def test_lm_windows_reach_both_ends_of_a_short_stream():
    ids = torch.arange(10)
    batches = LMBatches(ids, 9, 8, seed=0)
    firsts = {int(x[i, 0]) for x, _ in (next(batches) for _ in range(5)) for i in range(8)}
    assert firsts == {0}  # 10 tokens hold exactly one (x, y) window of 9
    with pytest.raises(ValueError, match="at least block_size \\+ 1 = 11 tokens"):
        LMBatches(ids, 10, 2)


def test_lm_batches_resume_exactly():
    ids = torch.randint(0, 50, (1000,))
    a = LMBatches(ids, 16, 4, seed=3)
    for _ in range(5):
        next(a)
    state = saved_and_loaded(a.state_dict())
    expected = [next(a) for _ in range(5)]
    b = LMBatches(ids, 16, 4, seed=999)
    b.load_state_dict(state)
    assert b.batches_drawn == 5
    for (x1, y1), (x2, y2) in zip(expected, [next(b) for _ in range(5)], strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_lm_ranks_share_out_the_global_batch():
    ids = torch.arange(1000)
    whole = LMBatches(ids, 8, 6, seed=1)
    ranks = [LMBatches(ids, 8, 3, seed=1, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        x, _ = next(whole)
        parts = [next(r)[0] for r in ranks]
        assert torch.equal(torch.cat(parts), x)


def test_eval_windows_cover_the_split_in_order():
    ids = torch.arange(101)
    batches = list(eval_batches(ids, 10, 4))
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    xs, ys = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    assert torch.equal(xs.flatten(), torch.arange(100))
    assert torch.equal(ys.flatten(), torch.arange(1, 101))
    spread = list(eval_batches(ids, 10, 2, max_batches=1))
    assert [x[:, 0].tolist() for x, _ in spread] == [[0, 90]]
    assert [len(list(eval_batches(ids, 10, 4))) for _ in range(2)] == [3, 3]  # repeatable


def examples(n=500, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(4, 100)] * rng.randint(1, 80) for _ in range(n)]


def padding(batches):
    return sum(max(map(len, b)) * len(b) - sum(map(len, b)) for b in batches)


def test_buckets_hold_every_example_once_per_epoch():
    data = examples()
    buckets = BucketBatches(data, 16, seed=1, bucket_size_multiplier=4)
    assert len(buckets) == 32  # ceil(500 / 16)
    for _ in range(3):
        epoch = list(buckets)
        assert len(epoch) == 32
        assert sorted(id(e) for b in epoch for e in b) == sorted(id(e) for e in data)
    dropped = BucketBatches(data, 16, seed=1, drop_last=True)
    assert len(dropped) == 31 and all(len(b) == 16 for b in dropped)


def test_buckets_pad_much_less_than_random_batches():
    data = examples()
    bucketed = padding(list(BucketBatches(data, 16, seed=1)))
    shuffled = random.Random(1).sample(data, len(data))
    plain = padding([shuffled[i : i + 16] for i in range(0, len(shuffled), 16)])
    assert bucketed < 0.2 * plain, (bucketed, plain)


def test_epochs_differ_and_the_plan_is_seeded():
    data = examples()
    a = BucketBatches(data, 16, seed=1)
    first, second = a.batch_indices(0), a.batch_indices(1)
    assert first != second
    assert BucketBatches(data, 16, seed=1).batch_indices(1) == second
    assert BucketBatches(data, 16, seed=2).batch_indices(0) != first
    fixed = BucketBatches(data, 16, seed=1, shuffle=False)
    assert fixed.batch_indices(0) == fixed.batch_indices(1)


def test_buckets_resume_mid_epoch_and_across_epochs():
    data = examples()
    a = BucketBatches(data, 16, seed=2)
    list(a)  # a whole epoch
    it = iter(a)
    for _ in range(5):
        next(it)
    state = saved_and_loaded(a.state_dict())
    assert state == {"epoch": 1, "position": 5, "batches": len(a)}
    rest = list(it) + list(a)  # the rest of epoch 1, then epoch 2
    b = BucketBatches(data, 16, seed=2)
    b.load_state_dict(state)
    assert list(b) + list(b) == rest
    with pytest.raises(ValueError, match="cannot resume at epoch 0, batch 99"):
        b.load_state_dict({"epoch": 0, "position": 99})


def test_a_token_budget_bounds_padded_tokens():
    data = examples()
    buckets = BucketBatches(data, max_tokens=400, seed=0)
    epoch = list(buckets)
    assert len(epoch) == len(buckets)
    assert all(len(b) * max(map(len, b)) <= 400 for b in epoch)
    assert sorted(id(e) for b in epoch for e in b) == sorted(id(e) for e in data)
    capped = list(BucketBatches(data, 8, max_tokens=400, seed=0))
    assert max(map(len, capped)) == 8 and all(len(b) * max(map(len, b)) <= 400 for b in capped)
    alone = list(BucketBatches([[1] * 50, [1] * 3], max_tokens=10, shuffle=False))
    assert [len(b) for b in alone] == [1, 1]  # too long for the budget: a batch of its own


def test_ranks_take_disjoint_equal_shares():
    data = examples(n=330)  # 21 batches of 16: 20 shared out, 1 left over
    whole = BucketBatches(data, 16, seed=4).batch_indices(0)
    shards = [BucketBatches(data, 16, seed=4, rank=r, world_size=4) for r in range(4)]
    plans = [s.batch_indices(0) for s in shards]
    assert [len(p) for p in plans] == [5, 5, 5, 5] and all(len(s) == 5 for s in shards)
    assert sorted(map(tuple, sum(plans, []))) == sorted(map(tuple, whole[:20]))
    with pytest.raises(ValueError, match="rank=4, world_size=4"):
        BucketBatches(data, 16, rank=4, world_size=4)


def test_bad_bucket_settings():
    with pytest.raises(ValueError, match="no examples"):
        BucketBatches([], 4)
    with pytest.raises(ValueError, match="batch_size, max_tokens, or both"):
        BucketBatches([[1]])
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        BucketBatches([[1]], 0)
    with pytest.raises(ValueError, match="make no batches"):
        BucketBatches([[1], [2]], 4, drop_last=True)


def test_collation_places_bos_and_eos():
    src, tgt_in, labels = collate_pairs([([5, 6, 7], [8, 9]), ([5], [8, 9, 10])], 0, 1, 2)
    assert src.tolist() == [[5, 6, 7], [5, 0, 0]]
    assert tgt_in.tolist() == [[1, 8, 9, 0], [1, 8, 9, 10]]
    assert labels.tolist() == [[8, 9, 2, 0], [8, 9, 10, 2]]
    shifted, real = tgt_in[:, 1:], tgt_in[:, 1:] != 0
    assert torch.equal(shifted[real], labels[:, :-1][real])  # labels are tgt_in shifted left
    ids, y = collate_labelled([[4, 5, 6], [6]], [1, 0], max_len=2)
    assert ids.tolist() == [[4, 5], [6, 0]] and y.tolist() == [1, 0] and y.shape == (2,)
    with pytest.raises(ValueError, match="2 sequences but 1 labels"):
        collate_labelled([[4], [5]], [1])

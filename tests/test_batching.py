"""Batching: LM windows, length buckets, collation, and exact resume."""

import torch

from glassformer.data.batching import (
    BucketBatches,
    LMBatches,
    collate_labelled,
    collate_pairs,
    eval_batches,
    pad_batch,
)


def test_pad_batch():
    assert pad_batch([[1, 2, 3], [4]], pad_id=0).tolist() == [[1, 2, 3], [4, 0, 0]]


def test_lm_windows_are_the_stream_and_its_continuation():
    ids = torch.arange(100)
    x, y = next(LMBatches(ids, 8, 4, seed=0))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)  # the stream is 0..99, so the next token is x + 1
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)


def test_lm_batches_resume_exactly():
    ids = torch.randint(0, 50, (1000,))
    a = LMBatches(ids, 16, 4, seed=3)
    for _ in range(5):
        next(a)
    state = a.state_dict()
    expected = [next(a) for _ in range(5)]
    b = LMBatches(ids, 16, 4, seed=999)
    b.load_state_dict(state)
    for (x1, y1), (x2, y2) in zip(expected, [next(b) for _ in range(5)], strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_eval_windows_cover_the_split_in_order():
    ids = torch.arange(101)
    batches = list(eval_batches(ids, 10, 4))
    xs = torch.cat([x for x, _ in batches])
    assert xs.shape == (10, 10) and torch.equal(xs.flatten(), torch.arange(100))
    spread = list(eval_batches(ids, 10, 2, max_batches=1))
    assert [x[:, 0].tolist() for x, _ in spread] == [[0, 90]]


def examples(n=200):
    g = torch.Generator().manual_seed(0)
    return [list(range(int(torch.randint(1, 60, (1,), generator=g)))) for _ in range(n)]


def test_buckets_hold_every_example_once_per_epoch_and_pad_less():
    data = examples()
    ids = {id(e) for e in data}
    buckets = BucketBatches(data, 16, seed=1, bucket_size_multiplier=4)
    epoch = list(buckets)
    assert sorted(id(e) for b in epoch for e in b) == sorted(ids)
    assert len(epoch) == len(buckets) == 13

    def padding(batches):
        return sum(max(map(len, b)) * len(b) - sum(map(len, b)) for b in batches)

    random_batches = [data[i : i + 16] for i in range(0, len(data), 16)]
    assert padding(epoch) < 0.5 * padding(random_batches)
    second = list(buckets)
    assert second != epoch  # a new epoch, a new order


def test_buckets_resume_mid_epoch():
    data = examples()
    a = BucketBatches(data, 16, seed=2)
    it = iter(a)
    for _ in range(5):
        next(it)
    state = a.state_dict()
    rest = list(it)
    b = BucketBatches(data, 16, seed=2)
    b.load_state_dict(state)
    assert list(b) == rest and state == {"epoch": 0, "position": 5}


def test_collation_places_bos_and_eos():
    src, tgt_in, labels = collate_pairs([([5, 6, 7], [8, 9]), ([5], [8, 9, 10])], 0, 1, 2)
    assert src.tolist() == [[5, 6, 7], [5, 0, 0]]
    assert tgt_in.tolist() == [[1, 8, 9, 0], [1, 8, 9, 10]]
    assert labels.tolist() == [[8, 9, 2, 0], [8, 9, 10, 2]]
    ids, y = collate_labelled([[4, 5], [6]], [1, 0])
    assert ids.tolist() == [[4, 5], [6, 0]] and y.tolist() == [1, 0]

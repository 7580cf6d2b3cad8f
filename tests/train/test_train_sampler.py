"""The epoch order: a permutation fixed by (seed, epoch), optionally length-grouped so a batch
pads to similar lengths while batch order stays random."""

from __future__ import annotations

import random

from headstart.train.data import EpochSampler


def _padding(order: list[int], lengths: list[int], batch: int) -> int:
    batches = [order[i : i + batch] for i in range(0, len(order) - len(order) % batch, batch)]
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_grouped_order_is_a_fixed_permutation_with_far_less_padding():
    rng = random.Random(0)
    lengths = [rng.randint(20, 400) for _ in range(1000)]
    plain = EpochSampler(1000, seed=3)
    grouped = EpochSampler(1000, seed=3, lengths=lengths, batch_size=8, group=16)
    for sampler in (plain, grouped):
        sampler.set_epoch(2)
        first, again = list(sampler), list(sampler)
        assert first == again and sorted(first) == list(range(1000))  # resumable: same order
    assert _padding(list(grouped), lengths, 8) < 0.2 * _padding(list(plain), lengths, 8)
    grouped.set_epoch(3)
    epoch3 = list(grouped)
    grouped.set_epoch(2)
    assert epoch3 != list(grouped)  # a new order every epoch


def test_batch_order_is_shuffled_not_sorted():
    lengths = list(range(512))
    sampler = EpochSampler(512, seed=0, lengths=lengths, batch_size=4, group=8)
    order = list(sampler)
    firsts = [lengths[order[i]] for i in range(0, 512, 4)]
    assert firsts != sorted(firsts)


def test_a_short_last_batch_stays_last():
    lengths = [5] * 10
    order = list(EpochSampler(10, seed=1, lengths=lengths, batch_size=4, group=2))
    assert sorted(order) == list(range(10)) and len(order) == 10

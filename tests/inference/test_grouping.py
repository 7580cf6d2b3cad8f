"""Prefill groups: the split of length-sorted prompts that costs the fewest padded tokens plus a
fixed cost per forward, within the token budget (checked against every split of small inputs)."""

from __future__ import annotations

import itertools
import random

import pytest

from headstart.inference.grouping import prefill_overhead_tokens, split_sorted


def cost(lengths, sizes, overhead):
    total, start = 0, 0
    for size in sizes:
        total += lengths[start + size - 1] * size + overhead
        start += size
    return total


def every_split(n):
    for cuts in itertools.product([False, True], repeat=n - 1):
        sizes, size = [], 1
        for cut in cuts:
            if cut:
                sizes.append(size)
                size = 1
            else:
                size += 1
        yield [*sizes, size]


def fits(lengths, sizes, budget):
    start = 0
    for size in sizes:
        if size > 1 and lengths[start + size - 1] * size > budget:
            return False
        start += size
    return True


@pytest.mark.parametrize("seed", range(40))
def test_the_split_is_the_cheapest_that_fits(seed):
    rng = random.Random(seed)
    lengths = sorted(rng.randint(1, 300) for _ in range(rng.randint(1, 9)))
    budget, overhead = rng.choice([256, 600, 2048]), rng.choice([0, 8, 32, 500])
    sizes = split_sorted(lengths, budget, overhead)
    assert sum(sizes) == len(lengths) and fits(lengths, sizes, budget)
    best = min(cost(lengths, s, overhead) for s in every_split(len(lengths)) if fits(lengths, s, budget))
    assert cost(lengths, sizes, overhead) == best


def test_padding_is_cut_where_it_costs_more_than_a_forward():
    # eleven short prompts and one long: together 12 x 240 padded tokens, apart 11 x 20 + 240
    assert split_sorted([20] * 11 + [240], budget=4096, overhead=32) == [11, 1]
    assert split_sorted([20] * 11 + [240], budget=4096, overhead=10**6) == [12]  # forwards dear: one
    assert split_sorted([500, 600], budget=256, overhead=0) == [1, 1]  # over budget: each alone
    assert split_sorted([], budget=256, overhead=0) == []


def test_lengths_must_be_sorted_and_devices_have_overheads():
    with pytest.raises(ValueError, match="ascending"):
        split_sorted([5, 3], budget=100, overhead=0)
    assert prefill_overhead_tokens("cpu") < prefill_overhead_tokens("cuda:0")


def test_prefill_groups_cut_the_items_as_split_sorted_says():
    from headstart.inference.grouping import prefill_groups

    items = ["a", "b", "c", "long"]
    assert prefill_groups(items, [20, 20, 20, 240], budget=4096, overhead=32) == [["a", "b", "c"], ["long"]]
    assert prefill_groups([], [], budget=10, overhead=0) == []


@pytest.mark.parametrize("seed", range(30))
def test_without_a_budget_the_split_is_the_cheapest_and_fast_on_equal_lengths(seed):
    rng = random.Random(seed)
    lengths = sorted(rng.choice([5, 9, 40, 41, 300]) for _ in range(rng.randint(1, 10)))
    overhead = rng.choice([0, 8, 32, 500])
    sizes = split_sorted(lengths, None, overhead)
    assert sum(sizes) == len(lengths)
    assert cost(lengths, sizes, overhead) == min(
        cost(lengths, s, overhead) for s in every_split(len(lengths))
    )
    assert split_sorted([5] * 12_000, None, 32) == [12_000]  # one run: no quadratic programme

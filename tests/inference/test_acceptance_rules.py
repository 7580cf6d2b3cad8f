"""Acceptance rules on fake logits: always-, never- and sometimes-accept paths, and exact tree
rejection sampling checked statistically (rows of one batched call are independent samples)."""

from __future__ import annotations

import pytest
import torch
from chisq import chisquare_pvalue

from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import order_without_replacement, probabilities
from headstart.inference.trees.draft import DraftTree
from headstart.inference.trees.static import build_tree
from headstart.inference.verify import accept_greedy, accept_sampling, accept_typical

V = 6
TREE = build_tree([[0], [1], [0, 0], [0, 1], [1, 0]])  # root -> a, b; a -> c, d; b -> e
ALPHA = 1e-3  # chi-square p-value threshold, fixed before looking at any result
GREEDY = SamplingConfig(temperature=0.0)


def one_hot_logits(best: list[int], batch: int = 1) -> torch.Tensor:
    logits = torch.zeros(batch, TREE.size, V)
    logits[:, torch.arange(TREE.size), torch.tensor(best)] = 10.0
    return logits


def static_tree(tokens: list[int], batch: int = 1) -> DraftTree:
    toks = torch.tensor(tokens).expand(batch, -1).clone()
    return DraftTree.from_static(TREE, toks, torch.ones_like(toks, dtype=torch.bool), None)


# node ids: 0 root, 1 a(rank0), 2 b(rank1), 3 c, 4 d, 5 e
TOKENS = [0, 1, 2, 3, 4, 5]


def test_greedy_always_accepts_the_matching_path():
    acc = accept_greedy(static_tree(TOKENS), one_hot_logits([1, 3, 5, 5, 0, 0]))  # root->a(1), a->c(3)
    assert acc.path.tolist() == [[0, 1, 3]] and acc.lengths.tolist() == [3]
    assert acc.bonus.tolist() == [5]  # the target's argmax after c


def test_greedy_never_accepts_a_wrong_tree():
    acc = accept_greedy(static_tree(TOKENS), one_hot_logits([4, 1, 1, 1, 1, 1]))
    assert acc.lengths.tolist() == [1] and acc.bonus.tolist() == [4]
    assert acc.path.tolist() == [[0, 0, 0]]  # padded to the tree's depth + 1: a static width, no host sync


def test_greedy_sometimes_accepts_a_second_sibling():
    acc = accept_greedy(static_tree(TOKENS), one_hot_logits([2, 0, 0, 0, 0, 0]))  # root->b, b->? (e=5 no)
    assert acc.path.tolist() == [[0, 2, 2]] and acc.lengths.tolist() == [2] and acc.bonus.tolist() == [0]


def test_greedy_batched_rows_accept_different_lengths():
    logits = torch.cat([one_hot_logits([1, 3, 5, 5, 0, 0]), one_hot_logits([4, 1, 1, 1, 1, 1])])
    acc = accept_greedy(static_tree(TOKENS, 2), logits)
    assert acc.lengths.tolist() == [3, 1]
    assert acc.path.tolist() == [[0, 1, 3], [0, 0, 0]]  # short rows repeat their last node


def test_invalid_candidates_are_never_accepted():
    tree = static_tree(TOKENS)
    tree.valid[0, 1] = False
    acc = accept_greedy(tree, one_hot_logits([1, 3, 5, 5, 0, 0]))
    assert acc.lengths.tolist() == [1] and acc.bonus.tolist() == [1]


def test_sampling_accepts_when_draft_equals_target():
    """q == p and a point-mass target: every draft is accepted (ratio 1), deterministically."""
    logits = one_hot_logits([1, 3, 5, 5, 0, 0], batch=64) * 10
    tree = static_tree(TOKENS, 64)
    tree.draft_probs = probabilities(logits, SamplingConfig(temperature=1.0))
    acc = accept_sampling(tree, logits, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert (acc.lengths == 3).all() and (acc.bonus == 5).all()


def test_sampling_never_accepts_tokens_the_target_excludes():
    logits = one_hot_logits([4, 1, 1, 1, 1, 1], batch=64) * 10  # p(root) is a point mass on 4
    acc = accept_sampling(
        static_tree(TOKENS, 64), logits, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0)
    )
    assert (acc.lengths == 1).all() and (acc.bonus == 4).all()


def test_typical_acceptance_is_lossy_but_accepts_likely_tokens():
    logits = one_hot_logits([1, 3, 5, 5, 0, 0], batch=4)
    acc = accept_typical(
        static_tree(TOKENS, 4),
        logits,
        SamplingConfig(temperature=1.0),
        generator=torch.Generator().manual_seed(0),
    )
    assert (acc.lengths == 3).all()


def _draw_tree(q: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Children of every node drawn without replacement from q (n, V), per row -> tokens (B, n)."""
    tokens = torch.zeros(batch, TREE.size, dtype=torch.long)
    for node in range(TREE.size):
        kids = TREE.children[node]
        kids = kids[kids >= 0]
        if kids.numel():
            draws, ok = order_without_replacement(q[node].expand(batch, V), kids.numel(), gen)
            assert ok.all()
            tokens[:, kids] = draws
    return tokens


def _check_exact(acc, tree_tokens: torch.Tensor, p: torch.Tensor) -> list[float]:
    """p-values: first token ~ p[root]; given the first token is child c, the second ~ p[c]."""
    first = torch.where(acc.lengths > 1, tree_tokens.gather(1, acc.path[:, 1:2])[:, 0], acc.bonus)
    counts = torch.bincount(first, minlength=V).double()
    pvalues = [chisquare_pvalue(counts, p[0])]
    for child in (1, 2):  # a and b: their second tokens are accepted grandchildren or residual bonuses
        rows = (acc.lengths > 1) & (acc.path[:, 1] == child)
        second = torch.where(
            acc.lengths[rows] > 2, tree_tokens[rows].gather(1, acc.path[rows][:, 2:3])[:, 0], acc.bonus[rows]
        )
        # the child token differs per row when children are drawn: condition on the node, whose
        # target distribution p[child] is the same in every row
        pvalues.append(chisquare_pvalue(torch.bincount(second, minlength=V), p[child]))
    return pvalues


SAMPLINGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["plain", "warped"])
@pytest.mark.parametrize("proposal", ["draft", "point"])
def test_tree_rejection_sampling_is_exact(sampling, proposal):
    gen = torch.Generator().manual_seed(1234)
    batch = 40_000
    target_logits = torch.randn(TREE.size, V, generator=gen) * 1.5
    draft_logits = target_logits + torch.randn(TREE.size, V, generator=gen)  # a decent, imperfect draft
    p = probabilities(target_logits, sampling)
    q = probabilities(draft_logits, sampling)
    if proposal == "draft":
        tokens = _draw_tree(q, batch, gen)
        draft_probs = q.expand(batch, -1, -1)
    else:  # deterministic children (the draft's top-k), one-point proposals
        tokens = torch.zeros(batch, TREE.size, dtype=torch.long)
        for node in range(TREE.size):
            kids = TREE.children[node][TREE.children[node] >= 0]
            tokens[:, kids] = draft_logits[node].topk(kids.numel()).indices
        draft_probs = None
    tree = DraftTree.from_static(TREE, tokens, torch.ones_like(tokens, dtype=torch.bool), draft_probs)
    acc = accept_sampling(tree, target_logits.expand(batch, -1, -1), sampling, gen)
    assert min(_check_exact(acc, tokens, p)) > ALPHA
    accepted = (acc.lengths > 1).float().mean()
    assert 0.2 < accepted < 0.95  # the test exercises both acceptance and rejection


def test_rejection_sampling_test_detects_a_biased_draft_claim():
    """Power check: children drawn from q' but verified as if drawn from q must fail the test."""
    gen = torch.Generator().manual_seed(99)
    batch, sampling = 40_000, SamplingConfig(temperature=1.0)
    target_logits = torch.randn(TREE.size, V, generator=gen) * 1.5
    q = probabilities(torch.randn(TREE.size, V, generator=gen) * 1.5, sampling)
    q_wrong = probabilities(torch.randn(TREE.size, V, generator=gen) * 1.5, sampling)
    tokens = _draw_tree(q_wrong, batch, gen)
    tree = DraftTree.from_static(
        TREE, tokens, torch.ones_like(tokens, dtype=torch.bool), q.expand(batch, -1, -1)
    )
    acc = accept_sampling(tree, target_logits.expand(batch, -1, -1), sampling, gen)
    assert min(_check_exact(acc, tokens, probabilities(target_logits, sampling))) < ALPHA


def test_warping_matches_transformers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from headstart.inference.sampling import warp_logits

    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(3)) * 3
    cfg = SamplingConfig(temperature=0.7, top_k=20, top_p=0.8)
    ref = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(20)(None, TemperatureLogitsWarper(0.7)(None, logits)))
    torch.testing.assert_close(warp_logits(logits, cfg), ref)

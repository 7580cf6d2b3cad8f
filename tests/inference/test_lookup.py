"""The prompt-lookup branch: what it proposes, how it joins the tree, and that it gets accepted."""

from __future__ import annotations

import pytest
import torch
from random_heads import RandomEagle

from headstart.errors import HeadstartError
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.trees.draft import DraftTree
from headstart.inference.trees.lookup import Lookup, extend_with_lookup, split_lookup
from headstart.inference.trees.static import build_tree, chain
from headstart.inference.verify import accept_greedy
from headstart.targets import load_target


def test_propose_takes_the_latest_longest_match():
    look = Lookup(tokens=3, max_ngram=2)
    # the last bigram (7, 8) occurred twice; the latest is followed by 4, 5, 6
    ctx = torch.tensor([7, 8, 1, 2, 9, 7, 8, 4, 5, 6, 7, 8])
    assert look.propose(ctx) == [4, 5, 6]
    # no bigram match: the unigram 3 matches, continuation cut at the end of the context
    assert look.propose([1, 3, 9, 2, 3]) == [9, 2, 3]
    assert look.propose(torch.tensor([1, 2, 3])) == []  # nothing repeats
    tokens, found = look.propose_rows([torch.tensor([5, 6, 5]), torch.tensor([1, 2])])
    assert tokens.tolist() == [[6, 5, 0], [0, 0, 0]] and found.tolist() == [[True, True, False], [False] * 3]


def test_split_lookup():
    assert split_lookup("chain:1+lookup:4") == ("chain:1", Lookup(tokens=4))
    assert (
        split_lookup("dynamic:depth=3,top_k=2,total_tokens=4+lookup:2")[0]
        == "dynamic:depth=3,top_k=2,total_tokens=4"
    )
    assert split_lookup("chain:2") == ("chain:2", None)
    with pytest.raises(HeadstartError, match="bad lookup"):
        split_lookup("chain:1+lookup:x")


def _chain_tree(root: int, drafts: list[int]) -> DraftTree:
    buffers = build_tree(chain(len(drafts)))
    tokens = torch.tensor([[root, *drafts]])
    return DraftTree.from_static(buffers, tokens, torch.ones_like(tokens, dtype=torch.bool), None)


def test_extended_tree_accepts_the_branch_the_target_agrees_with():
    tree = extend_with_lookup(
        _chain_tree(1, [2]), torch.tensor([[5, 6, 7]]), torch.tensor([[True, True, False]])
    )
    assert tree.tokens.tolist() == [[1, 2, 5, 6, 7]]
    assert tree.parents.tolist() == [[0, 0, 0, 2, 3]] and tree.depths.tolist() == [[0, 1, 1, 2, 3]]
    assert tree.visible[0, 4].tolist() == [True, False, True, True, True]
    assert tree.children[0, 0].tolist() == [1, 2] and tree.children[0, 2, 0] == 3
    assert tree.valid.tolist() == [[True, True, True, True, False]]
    # the target's argmax after each node: root -> 5, then 6, then 7 (but node 4 is not valid)
    best = torch.tensor([5, 9, 6, 7, 3])
    logits = torch.nn.functional.one_hot(best, 10).float()[None]
    acc = accept_greedy(tree, logits)
    assert acc.path.tolist() == [[0, 2, 3, 3]] and acc.lengths.tolist() == [3] and acc.bonus.tolist() == [7]


def test_a_drawn_tree_refuses_the_branch():
    tree = _chain_tree(1, [2])
    tree.draft_probs = torch.zeros(1, 2, 10)
    with pytest.raises(HeadstartError, match="dynamic"):
        extend_with_lookup(tree, torch.tensor([[5]]), torch.tensor([[True]]))


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def test_branch_is_accepted_and_output_stays_exact(target):
    """A prompt that asks the target to continue a repeated pattern: the lookup branch commits
    several tokens per step even under useless random heads, and greedy output stays exact."""
    ids = target.chat.user_prompt_ids("a b c d e f a b c d e f a b c d e f a b c d e f")
    ref = target.model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(ids):].tolist()  # fmt: skip
    heads = RandomEagle(target.model, seed=3)
    plain = SpeculativeDecoder(target, heads, tree="chain:1").generate(
        [ids], max_new_tokens=40, eos_token_id=None
    )
    looked = SpeculativeDecoder(target, heads, tree="chain:1+lookup:4").generate(
        [ids], max_new_tokens=40, eos_token_id=None
    )
    assert plain.token_ids[0] == ref and looked.token_ids[0] == ref
    assert looked.stats.tau > plain.stats.tau  # the branch was accepted (the tiny model loops)


def test_sampling_with_a_static_tree_and_lookup_is_refused(target):
    decoder = SpeculativeDecoder(target, RandomEagle(target.model), tree="chain:1+lookup:2")
    with pytest.raises(HeadstartError, match="dynamic tree"):
        decoder.generate([[1, 2, 3]], max_new_tokens=4, do_sample=True)

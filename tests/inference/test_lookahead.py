"""Lookahead decoding (inference/trees/lookahead.py, inference/drafters/lookahead.py): its Jacobi
window and n-gram pool propose a trie that the one tree verifier checks, so greedy output equals
the target's `generate` on every family of the suite and sampling keeps the target's distribution
(the chi-square test of test_sampling_exactness); the window, the pool and the trie do what the
paper and llama.cpp's example describe."""

from __future__ import annotations

import pytest
import torch
from test_greedy_exactness import PROMPTS, reference
from test_sampling_exactness import ALPHA, CONFIGS, run_check, small_vocab_target
from tiny import FAMILIES, make_target_dir

from headstart.errors import HeadstartError
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.drafters.lookahead import Lookahead, LookaheadDrafter
from headstart.inference.plain import SamplingConfig
from headstart.inference.trees.lookahead import LookaheadTree, parse_lookahead, trie
from headstart.speculator import load_speculator
from headstart.targets import load_target

SIZES = [
    LookaheadTree(),
    LookaheadTree(window=3, ngram=2, guesses=2),
    LookaheadTree(window=2, ngram=5, guesses=0),
]


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def _check_greedy(target, sizes: LookaheadTree, prompts, max_new: int = 24, **decoder_args):
    decoder = SpeculativeDecoder(target, Lookahead(sizes), tree=sizes, **decoder_args)
    out = decoder.generate(prompts, max_new_tokens=max_new, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, max_new, eos=False)
    if decoder.captured is not None:  # the verify ran as the captured graph
        assert decoder.captured.steps >= 1
    return out


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: s.text)
def test_lookahead_is_exact_batched(target, sizes):
    """Left-padded rows of different lengths, each with its own window and pool."""
    out = _check_greedy(target, sizes, [target.chat.user_prompt_ids(p) for p in PROMPTS], max_new=32)
    took_more = out.stats.target_forwards < out.stats.new_tokens + out.stats.prefills
    assert took_more  # some steps committed more than one token


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lookahead_is_exact_on_every_family(tiny_root, family):
    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    _check_greedy(target, LookaheadTree(window=3, ngram=3, guesses=2),
                  [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]], max_new=16)  # fmt: skip


def test_lookahead_takes_repeats_from_its_pool(target):
    """A prompt that repeats itself: the n-grams the window saw (and the prompt-lookup match) get
    accepted, several tokens a forward."""
    ids = target.chat.user_prompt_ids("a b c d e f a b c d e f a b c d e f a b c d")
    out = _check_greedy(target, LookaheadTree(window=4, ngram=4, guesses=4), [ids], max_new=48)
    assert out.stats.tau > 1.3


def test_lookahead_through_the_captured_verify(target):
    out = _check_greedy(target, LookaheadTree(window=3, ngram=3, guesses=2),
                        [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]], max_new=16,
                        compile=True, compile_backend="aot_eager")  # fmt: skip
    assert out.stats.new_tokens == 32


@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampling_with_lookahead_preserves_target_distribution(config):
    target = small_vocab_target()
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    sizes = LookaheadTree(window=3, ngram=3, guesses=3)
    assert run_check(target, Lookahead(sizes), sizes, sampling, samples=12_000) > ALPHA


def test_the_trie_merges_shared_prefixes():
    tree, ends = trie([[[5, 6, 7], [5, 6, 8], [9], []]], [1], size=8, depth=3, device=torch.device("cpu"))
    assert tree.tokens[0, :6].tolist() == [1, 5, 6, 7, 8, 9]
    assert tree.parents[0, :6].tolist() == [0, 0, 1, 2, 2, 0]
    assert tree.depths[0, :6].tolist() == [0, 1, 2, 3, 3, 1]
    assert tree.valid[0].tolist() == [True] * 6 + [False] * 2
    assert ends == [[3, 4, 5, 0]]
    assert tree.children[0, 0, :2].tolist() == [1, 5] and tree.children[0, 2, :2].tolist() == [3, 4]
    assert tree.visible[0, 4].tolist() == [True, True, True, False, True, False, False, False]


def test_the_window_moves_and_fills_the_pool():
    """llama.cpp's update: levels move up, the outputs become the last level, each column's
    trajectory (first token, deeper levels, output) enters the pool under its first token."""
    drafter = LookaheadDrafter(LookaheadTree(window=3, ngram=3, guesses=2))
    drafter.contexts, drafter.pools = [[1, 2, 3]], [{}]
    drafter.levels = [[[0, 10, 11], [20, 21, 22]]]
    drafter.roots = [3]
    drafter._advance(0, [30, 31, 32], accepted=1)
    assert drafter.levels[0] == [[20, 21, 22], [30, 31, 32]]
    assert drafter.pools[0] == {3: [(20, 30)], 10: [(21, 31)], 11: [(22, 32)]}
    drafter._advance(0, [40, 41, 42], accepted=3)  # two tokens more: the frame moves two columns
    assert [level[:1] for level in drafter.levels[0]] == [[32], [42]]
    assert all(len(level) == 3 for level in drafter.levels[0])
    for _ in range(3):  # at most `guesses` n-grams per first token, the newest kept
        drafter.levels[0] = [[0, 10, 11], [20, 21, 22]]
        drafter._advance(0, [50 + _, 51, 52], accepted=1)
    assert drafter.pools[0][3] == [(20, 51), (20, 52)]


def test_the_speculator_takes_lookahead(target):
    speculator = load_speculator(target, draft_model="lookahead:window=3,ngram=3,guesses=2")
    assert speculator.tree.text == "lookahead:window=3,ngram=3,guesses=2" and "lookahead" in speculator.mode
    sampled = speculator.new_decoder(greedy=False)  # every node deterministic: sampling keeps the tree
    assert isinstance(sampled.tree, LookaheadTree)
    with pytest.raises(HeadstartError, match="--tree does not apply"):
        load_speculator(target, tree="chain:2", draft_model="lookahead")


@pytest.mark.parametrize("spec", ["lookahead:window=0", "lookahead:size=3", "lookahead:ngram=x",
                                  "lookahead:window=64,ngram=16"])  # fmt: skip
def test_bad_lookahead_sizes_are_refused(spec):
    with pytest.raises(HeadstartError) as err:
        parse_lookahead(spec)
    assert "\n" not in err.value.what

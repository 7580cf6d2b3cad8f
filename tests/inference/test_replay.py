"""The replay drafter (inference/drafters/replay.py, `--draft-model replay:accept=P`): it drafts
the target's own greedy continuation with each draft wrong with probability 1 - P, for measuring
the decode loop without trained heads. Greedy output equals the target's `generate` on every
family of the suite and every tree syntax; tau follows P (1 + P + ... + P^D for a chain of D, by a
seeded draw: within the binomial noise of the draws made); sampling keeps the target's
distribution (the chi-square test of test_sampling_exactness)."""

from __future__ import annotations

import math
import re

import pytest
from test_greedy_exactness import PROMPTS, reference
from test_sampling_exactness import ALPHA, CONFIGS, run_check, small_vocab_target
from tiny import FAMILIES, make_target_dir

from headstart.errors import HeadstartError
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.drafters.replay import Replay, parse_replay
from headstart.inference.plain import SamplingConfig
from headstart.speculator import load_speculator
from headstart.targets import load_target

TREES = [
    "chain:3",
    "[[0],[1],[0,0],[0,1],[0,0,0]]",
    "dynamic:depth=3,top_k=2,total_tokens=6",
    "chain:2+lookup:3",
]


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def _greedy(target, spec: str, tree: str, prompts, max_new: int = 24):
    decoder = SpeculativeDecoder(target, Replay(target, parse_replay(spec)), tree=tree)
    out = decoder.generate(prompts, max_new_tokens=max_new, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, max_new, eos=False)
    return out


@pytest.mark.parametrize("tree", TREES)
def test_replay_is_exact_batched_on_every_tree(target, tree):
    out = _greedy(target, "replay:accept=0.7", tree, [target.chat.user_prompt_ids(p) for p in PROMPTS])
    assert out.stats.tau > 1.3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replay_is_exact_on_every_family(tiny_root, family):
    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    out = _greedy(
        target, "replay:accept=0.8", "chain:3", [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]], 16
    )
    assert out.stats.tau > 1.3


@pytest.mark.parametrize("accept", [1.0, 0.8, 0.5])
def test_tau_follows_p(target, accept):
    """A chain of 3 at P: tau = 1 + P + P^2 + P^3 expected; one draw per row, depth and step, so
    the measured tau sits within ~4 standard errors of it (the accepted length of a round has a
    variance below 3 tokens^2: over ~60 rounds, s.e. < 0.25)."""
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    out = _greedy(target, f"replay:accept={accept},seed=5", "chain:3", prompts, max_new=48)
    expected = sum(accept**d for d in range(4))
    se = math.sqrt(3.0 / max(1, out.stats.row_steps))
    assert abs(out.stats.tau - expected) < 4 * se + 1e-9, (out.stats.tau, expected)
    if accept == 1.0:
        assert out.stats.tau == pytest.approx(4.0, abs=0.2)  # every draft right (bar a stream's end)


def test_the_stream_is_extended_past_its_horizon(target):
    """A horizon of 4 tokens on a 40-token decode: extended as it goes, still exact and accepting."""
    prompts = [target.chat.user_prompt_ids(PROMPTS[0])]
    out = _greedy(target, "replay:accept=1,horizon=4", "chain:3", prompts, max_new=40)
    assert out.stats.tau > 3.0


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_sampling_with_replay_preserves_target_distribution(config):
    target = small_vocab_target()
    sampling = SamplingConfig(max_new_tokens=3, seed=1234, **CONFIGS[config])
    p_value = run_check(
        target, Replay(target, parse_replay("replay:accept=0.9,horizon=8")), "chain:2", sampling, 4000
    )
    assert p_value > ALPHA, f"sampled distribution differs from the target's (p={p_value:.2e})"


@pytest.mark.parametrize(
    ("spec", "words"),
    [("replay:accept=0", "not in (0, 1]"), ("replay:accept=1.5", "not in (0, 1]"), ("replay:accept=x", "bad option"),
     ("replay:accept=0.8,,seed=1", "empty option"), ("replay:horizon=0", "not in 1..")],
)  # fmt: skip
def test_bad_replay_specs_are_one_line(target, spec, words):
    with pytest.raises(HeadstartError, match=re.escape(words)):
        load_speculator(target, draft_model=spec)


def test_the_speculator_takes_replay_by_name(target):
    speculator = load_speculator(target, draft_model="replay:accept=0.6")
    assert (
        speculator.tree.text == "chain:4" and "replay of the target's greedy continuation" in speculator.mode
    )

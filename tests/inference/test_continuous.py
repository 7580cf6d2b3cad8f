"""Continuous batching (headstart.inference.continuous): every reply equals the target's own
`generate` for that prompt alone, whatever else shared the batch, through refills, compactions
and follow-up requests; sampled replies depend on their seed only."""

from __future__ import annotations

import pytest
import torch

from headstart.inference.continuous import ContinuousBatcher, Request
from headstart.inference.plain import SamplingConfig
from headstart.target import load_target

TEXTS = [
    "hello there",
    "What is the capital of France? Answer briefly.",
    "a",
    "Write a poem about the sea, with many long lines and rhymes about waves",
    "1 2 3 4",
    "Explain",
    "Tell me a story about a dragon who learned to code in Python and C",
    "ok",
    "Why is the sky blue?",
]


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def _generate(target, ids: list[int], max_new: int) -> tuple[list[int], bool]:
    x = torch.tensor([ids])
    out = target.model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
        eos_token_id=list(target.eos_token_ids), pad_token_id=0, temperature=None, top_p=None, top_k=None,
    )  # fmt: skip
    new = out[0, len(ids) :].tolist()
    stops = set(target.eos_token_ids)
    cut = next((j for j, t in enumerate(new) if t in stops), None)
    return (new if cut is None else new[:cut]), cut is not None


def _run(target, requests, **kwargs):
    replies = {}

    def done(request, reply):
        replies[request.key] = reply

    stats = ContinuousBatcher(target, **kwargs).run(requests, done)
    return replies, stats


@pytest.mark.parametrize(
    "max_batch, admit_every, prefill_tokens",
    [(1, 1, 2048), (3, 1, 2048), (4, 2, 2048), (16, 4, 2048), (8, 8, 60)],
)
def test_greedy_replies_equal_generate_alone(target, max_batch, admit_every, prefill_tokens):
    """Prompts of different lengths share padded prefills (split at `prefill_tokens`) and decode steps."""
    greedy = [SamplingConfig(max_new_tokens=n) for n in (5, 40, 17)]
    requests = [
        Request(key=i, prompt=target.chat.user_prompt_ids(t), sampling=greedy[i % 3])
        for i, t in enumerate(TEXTS)
    ]
    replies, stats = _run(
        target, requests, max_batch=max_batch, admit_every=admit_every, prefill_tokens=prefill_tokens
    )
    assert sorted(replies) == list(range(len(TEXTS)))
    for r in requests:
        ids, finished = _generate(target, r.prompt, r.sampling.max_new_tokens)
        assert replies[r.key].token_ids == ids, r.key
        assert replies[r.key].finished == finished
    assert stats.replies == len(TEXTS)
    assert stats.row_steps / stats.decode_steps <= max_batch


def test_compaction_and_growth_keep_replies_exact(target):
    """Long and short prompts alternate through two slots: the cache grows on the left for long
    newcomers and is compacted as dead columns pile up."""
    texts = [TEXTS[3] * 3, "hi", TEXTS[6] * 2, "yo", TEXTS[1], TEXTS[0]]
    short, long = SamplingConfig(max_new_tokens=4), SamplingConfig(max_new_tokens=60)
    requests = [
        Request(key=i, prompt=target.chat.user_prompt_ids(t), sampling=short if len(t) > 40 else long)
        for i, t in enumerate(texts)
    ]
    replies, stats = _run(target, requests, max_batch=2, admit_every=1, compact_slack=0.0, compact_min=0)
    assert stats.compactions > 0
    for r in requests:
        assert replies[r.key].token_ids == _generate(target, r.prompt, r.sampling.max_new_tokens)[0]


def test_follow_up_requests_run_first_and_exactly(target):
    """A conversation's next turn (returned by the callback) is answered like any prompt."""
    greedy = SamplingConfig(max_new_tokens=12)
    order, replies = [], {}

    def done(request, reply):
        order.append(request.key)
        replies[request.key] = reply
        if isinstance(request.key, int):
            nxt = request.prompt + reply.token_ids + target.chat.user_prompt_ids("and then?")
            return [Request(key=(request.key, 2), prompt=nxt, sampling=greedy)]
        return None

    first = [
        Request(key=i, prompt=target.chat.user_prompt_ids(t), sampling=greedy)
        for i, t in enumerate(TEXTS[:5])
    ]
    ContinuousBatcher(target, max_batch=2, admit_every=1).run(first, done)
    assert len(replies) == 10
    for key, reply in replies.items():
        if isinstance(key, tuple):
            prompt = (
                first[key[0]].prompt + replies[key[0]].token_ids + target.chat.user_prompt_ids("and then?")
            )
            assert reply.token_ids == _generate(target, prompt, 12)[0]
    # follow-ups jump the queue: the second turn of request 0 comes before request 4's first turn
    assert order.index((0, 2)) < order.index(4)


def test_sampled_replies_depend_on_their_seed_only(target):
    hot = SamplingConfig(max_new_tokens=20, temperature=1.0)
    prompts = [target.chat.user_prompt_ids(t) for t in TEXTS[:6]]
    alone, _ = _run(target, [Request(key=0, prompt=prompts[0], sampling=hot, seed=7)], max_batch=1)
    crowd, _ = _run(
        target, [Request(key=i, prompt=p, sampling=hot, seed=7 if i == 0 else i) for i, p in enumerate(prompts)],
        max_batch=4,
    )  # fmt: skip
    assert crowd[0].token_ids == alone[0].token_ids
    other, _ = _run(target, [Request(key=0, prompt=prompts[0], sampling=hot, seed=8)], max_batch=1)
    assert len({tuple(other[0].token_ids), tuple(alone[0].token_ids)}) == 2


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_sliding_window_targets_batch_exactly(tiny_root, family):
    """The distill engine's batcher on windowed targets (all layers sliding; mixed): the window
    (8) slides inside every reply, columns move through refills and compactions, replies equal
    `generate` alone."""
    from test_families import FAMILIES
    from tiny import make_target_dir

    windowed = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    sampling = SamplingConfig(max_new_tokens=30)
    requests = [
        Request(key=i, prompt=windowed.chat.user_prompt_ids(t), sampling=sampling)
        for i, t in enumerate(TEXTS)
    ]
    replies, _ = _run(windowed, requests, max_batch=3, admit_every=2, prefill_tokens=60)
    for r in requests:
        assert replies[r.key].token_ids == _generate(windowed, r.prompt, 30)[0], (family, r.key)


@pytest.mark.parametrize("max_batch, admit_every", [(16, 4), (3, 1)])
def test_a_shared_prefix_runs_once_and_replies_stay_exact(target, max_batch, admit_every):
    """Prompts opening with the same system text: the prefix runs once (batch 1), its entries are
    copied to every row, and each reply still equals `generate` on that prompt alone; a prompt
    without the prefix in the stream is run whole."""
    system = "You are a careful assistant. Answer in one short paragraph. "
    texts = [system + t for t in TEXTS] + ["no system text here"]
    greedy = [SamplingConfig(max_new_tokens=n) for n in (5, 30, 17)]
    requests = [
        Request(key=i, prompt=target.chat.user_prompt_ids(t), sampling=greedy[i % 3])
        for i, t in enumerate(texts)
    ]
    replies, stats = _run(target, requests, max_batch=max_batch, admit_every=admit_every)
    for r in requests:
        assert replies[r.key].token_ids == _generate(target, r.prompt, r.sampling.max_new_tokens)[0], r.key
    assert stats.prefix_reused >= len(TEXTS) * len(system)  # byte-level: a token per character
    off, off_stats = _run(target, requests, max_batch=max_batch, admit_every=admit_every, min_shared_prefix=0)
    assert off_stats.prefix_reused == 0
    assert {k: r.token_ids for k, r in off.items()} == {k: r.token_ids for k, r in replies.items()}

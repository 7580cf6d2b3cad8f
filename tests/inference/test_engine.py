"""The continuous engine: requests that join a running batch at different steps, and leave it
at different steps, get exactly the greedy output they get alone, with every head kind and tree
kind; seeded sampled requests are reproducible whoever shares their steps."""

from __future__ import annotations

import pytest
import torch
from random_heads import RandomEagle, RandomMedusa

from headstart.heads import HeadSpec, build_head
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.engine import Engine, Job
from headstart.inference.plain import SamplingConfig
from headstart.inference.stops import StopRule
from headstart.targets import load_target

PROMPTS = ["hello there", "What is the capital of France? Answer briefly.", "a", "Write a poem about the sea",
           "count from one to twenty, slowly please, and then say the alphabet"]  # fmt: skip


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def heads_of(kind: str, target):
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    if kind == "medusa":
        return RandomMedusa(target.hidden_size, target.vocab_size, num_heads=3)
    if kind == "eagle3":
        return RandomEagle(target.model, draft_vocab=100, layers=(0, 1))
    if kind == "early-exit":  # a draft model (headstart/drafts.py): the target's first layer
        from headstart.drafts import early_exit

        return early_exit(target, 1)
    if kind == "dflash":
        return build_head(
            HeadSpec(kind="dflash", block_size=5, draft_vocab_size=100), target, token_counts=counts
        )
    return None  # plain decoding through the same engine


def alone(target, heads, tree, ids, max_new):
    out = SpeculativeDecoder(target, heads, tree=tree).generate(
        [ids], max_new_tokens=max_new, eos_token_id=None
    )
    return out.token_ids[0]


@pytest.mark.parametrize("kind", ["medusa", "eagle3", "dflash", "early-exit", "none"])
@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8", "chain:2+lookup:3"])
def test_requests_joining_and_leaving_get_their_greedy_output(target, kind, tree):
    heads = heads_of(kind, target)
    if heads is None and tree != "static":
        pytest.skip("plain decoding has no tree")
    decoder = SpeculativeDecoder(target, heads, tree=tree if heads is not None else None)
    engine = Engine(decoder, SamplingConfig(max_new_tokens=64))
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    lengths = [30, 12, 41, 7, 25]  # rows leave at different steps
    joins = {0: [0, 1], 2: [2], 3: [3, 4]}  # step -> prompts joining before it
    jobs = {}
    step = 0
    while step < 200 and (engine.live or any(s >= step for s in joins)):
        if step in joins:
            new = [Job(key=i, prompt=prompts[i], rule=StopRule(lengths[i])) for i in joins[step]]
            jobs.update({job.key: job for job in new})
            engine.add(new)
        engine.step()
        step += 1
    assert len(jobs) == len(PROMPTS) and not engine.live
    for i, job in jobs.items():
        assert job.emitted == alone(
            target, heads, tree if heads is not None else None, prompts[i], lengths[i]
        ), (kind, tree, i)
        assert job.finish == "length"


def test_cancelled_rows_leave_and_the_others_go_on(target):
    heads = heads_of("eagle3", target)
    engine = Engine(SpeculativeDecoder(target, heads, tree="static"), SamplingConfig(max_new_tokens=64))
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:3]]
    jobs = [Job(key=i, prompt=p, rule=StopRule(30)) for i, p in enumerate(prompts)]
    engine.add(jobs)
    engine.step()
    jobs[1].cancelled = True  # a client went away
    finished = engine.step()
    assert jobs[1] in finished and jobs[1].finish == "cancelled" and engine.live == 2
    while engine.live:
        engine.step()
    for i in (0, 2):
        assert jobs[i].emitted == alone(target, heads, "static", prompts[i], 30)


def test_seeded_sampled_requests_do_not_depend_on_their_batch(target):
    """Per-row generators: the same seed gives the same reply alone and beside other requests."""
    heads = heads_of("dflash", target)
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.9, top_p=0.95)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]

    def run(indices, join_late=()):
        engine = Engine(SpeculativeDecoder(target, heads, tree="dynamic:depth=3,top_k=3,total_tokens=8"), sampling,
                        row_seeds=True)  # fmt: skip
        jobs = [Job(key=i, prompt=prompts[i], rule=StopRule(24), seed=100 + i) for i in indices]
        engine.add([j for j in jobs if j.key not in join_late])
        engine.step()
        engine.add([j for j in jobs if j.key in join_late])
        while engine.live:
            engine.step()
        return {j.key: j.emitted for j in jobs}

    solo = run([1])[1]
    assert run([1])[1] == solo  # reproducible
    together = run([0, 1, 2, 3], join_late=(2, 3))
    assert together[1] == solo
    assert len({tuple(v) for v in together.values()}) > 1  # different seeds, different replies


def _generate_reply(target, prompt: list[int], max_new: int) -> tuple[list[int], bool]:
    """transformers' greedy `generate` for one request, as a Reply's (ids without the end id, finished)."""
    eos = set(target.eos_token_ids)
    x = torch.tensor([prompt])
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                                eos_token_id=sorted(eos), pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
    ended = next((i for i, t in enumerate(out) if t in eos), None)
    return (out[:ended], True) if ended is not None else (out, False)


def test_the_engine_batcher_answers_a_request_stream_like_generate(target):
    """Distillation's interface on the engine: every reply (follow-up turns first) is transformers'
    greedy `generate` of its request, with and without heads, shared prefix or not."""
    from headstart.inference.batcher import EngineBatcher
    from headstart.inference.requests import Request

    prompts = [target.chat.user_prompt_ids(f"question {i} " + "x" * (i % 7)) for i in range(12)]

    def run(batcher):
        got = {}

        def on_reply(request, reply):
            got[request.key] = (reply.token_ids, reply.finished)
            if isinstance(request.key, int) and request.key % 4 == 0:  # a second turn, answered first
                return [Request(key=(request.key, 2), prompt=request.prompt + reply.token_ids[:3],
                                sampling=SamplingConfig(max_new_tokens=9))]  # fmt: skip
            return None

        requests = [
            Request(key=i, prompt=p, sampling=SamplingConfig(max_new_tokens=20 + i))
            for i, p in enumerate(prompts)
        ]
        stats = batcher.run(requests, on_reply)
        return got, stats

    reference = {}
    for i, prompt in enumerate(prompts):
        reference[i] = _generate_reply(target, prompt, 20 + i)
        if i % 4 == 0:
            reference[(i, 2)] = _generate_reply(target, prompt + reference[i][0][:3], 9)
    for heads in (None, heads_of("dflash", target)):
        got, stats = run(EngineBatcher(target, heads=heads, max_batch=5, admit_every=2))
        assert got == reference
        assert stats.replies == len(reference) and stats.decode_steps > 0
        # admissions prefill the prompts' shared opening once (a drafter reads the kept features)
        assert stats.prefix_reused > 0
    unshared, _ = run(EngineBatcher(target, max_batch=5, admit_every=2, shared_prefix=0))
    assert unshared == reference


def test_a_big_batch_steps_plainly_and_a_small_one_speculates(target):
    """`speculate_up_to`: past that many verify tokens a step is plain (the drafter still
    observes); the output is the same either way, and speculation resumes when rows leave."""
    from scripted import ScriptedDrafter

    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:3]]
    lengths = [40, 8, 12]
    refs = [ids + alone(target, None, None, ids, 60) for ids in prompts]
    heads = ScriptedDrafter(refs, target.vocab_size)  # drafts mostly right: long accepted paths
    decoder = SpeculativeDecoder(target, heads, tree="static")
    engine = Engine(decoder, SamplingConfig(max_new_tokens=64), speculate_up_to=decoder.verify_nodes)
    jobs = [
        Job(key=i, prompt=p, rule=StopRule(n)) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    engine.add(jobs)
    while engine.live:
        engine.step()
    assert 0 < engine.plain_steps < engine.target_forwards - 1  # plain with 3 rows, speculative with 1
    assert jobs[0].committed > jobs[0].steps  # the lone row committed more than one token a step
    for job, ids, n in zip(jobs, prompts, lengths, strict=True):
        assert job.emitted == alone(target, None, None, ids, n)


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "early-exit", "none"])
def test_newcomers_of_mixed_lengths_prefill_in_length_groups(target, kind):
    """A wave of one long and several short prompts is cut into length groups (padding the short
    ones to the long one costs more than another forward); every reply is still its greedy one."""
    heads = heads_of(kind, target)
    tree = "static" if heads is not None else None
    long = target.chat.user_prompt_ids(" ".join(["a long prompt about the sea and the sky"] * 12))
    short = [target.chat.user_prompt_ids(p) for p in ("hello there", "a", "hi you")]
    prompts = [short[0], long, short[1], short[2]]
    engine = Engine(SpeculativeDecoder(target, heads, tree=tree), SamplingConfig(max_new_tokens=64))
    jobs = [Job(key=i, prompt=p, rule=StopRule(9)) for i, p in enumerate(prompts)]
    engine.add(jobs)
    lengths = sorted(len(p) for p in prompts)
    assert engine.prefills == 2, lengths  # the long prompt alone, the short ones together
    while engine.live:
        engine.step()
    for i, job in enumerate(jobs):
        assert job.emitted == alone(target, heads, tree, prompts[i], 9), (kind, i)


def test_a_seeded_batch_drawn_over_several_prefills_does_not_repeat_its_draws(target):
    """`generate`'s one seeded generator for the batch: each prefill group goes on drawing from it
    (a fresh one per group, seeded alike, gave every group the same first tokens)."""
    prompt = target.chat.user_prompt_ids("hello there")
    decoder = SpeculativeDecoder(target, heads_of("eagle3", target), tree="static")
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, seed=3)
    engine = Engine(decoder, sampling, prefill_tokens=2 * len(prompt))
    jobs = [Job(key=i, prompt=prompt, rule=StopRule(4)) for i in range(8)]
    engine.add(jobs)
    assert engine.prefills == 4
    firsts = {(jobs[i].emitted[0], jobs[i + 1].emitted[0]) for i in range(0, 8, 2)}
    assert len(firsts) > 1, firsts


@pytest.mark.parametrize("kind", ["eagle3", "dflash", "early-exit", "none"])
def test_a_chunked_prefill_gives_the_same_replies(target, kind, monkeypatch):
    """A server's engine (abortable) prefills long prompts in chunks over the growing cache; the
    replies are the ones a one-forward prefill gives, padded groups and drafters' features too."""
    from headstart.inference import steps as steps_module

    monkeypatch.setattr(steps_module, "prefill_chunk", lambda device: 8)
    heads = heads_of(kind, target)
    tree = "static" if heads is not None else None
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    calls = []
    forward = steps_module.forward
    monkeypatch.setattr(
        steps_module, "forward", lambda *a, **k: calls.append(a[1].shape[1]) or forward(*a, **k)
    )
    engine = Engine(
        SpeculativeDecoder(target, heads, tree=tree), SamplingConfig(max_new_tokens=64), abortable=True
    )
    jobs = [Job(key=i, prompt=p, rule=StopRule(12)) for i, p in enumerate(prompts)]
    engine.add(jobs)
    while engine.live:
        engine.step()
    assert max(calls) <= 8 + 1 + 16  # chunks of 8 (verifies: a tree's nodes)
    for i, job in enumerate(jobs):
        assert job.emitted == alone(target, heads, tree, prompts[i], 12), (kind, i)


def test_a_prefill_stops_when_its_clients_leave(target, monkeypatch):
    """Every client of a prefilling group leaves after its first chunk: the prefill stops there,
    the jobs end 'cancelled', and the engine goes on with the next requests."""
    from headstart.inference import steps as steps_module

    monkeypatch.setattr(steps_module, "prefill_chunk", lambda device: 8)
    engine = Engine(SpeculativeDecoder(target, heads_of("eagle3", target), tree="static"),
                    SamplingConfig(max_new_tokens=64), abortable=True)  # fmt: skip
    long = target.chat.user_prompt_ids(PROMPTS[4])
    leaving = Job(key=0, prompt=long, rule=StopRule(12))
    chunks = []
    forward = steps_module.forward

    def counted(*args, **kwargs):
        chunks.append(args[1].shape[1])
        leaving.cancelled = True  # the client disconnects while its first chunk runs
        return forward(*args, **kwargs)

    monkeypatch.setattr(steps_module, "forward", counted)
    done = engine.add([leaving])
    assert done == [leaving] and leaving.finish == "cancelled" and not leaving.emitted
    assert chunks == [8] and len(long) > 16 and not engine.live
    monkeypatch.setattr(steps_module, "forward", forward)
    staying = Job(key=1, prompt=long, rule=StopRule(12))
    engine.add([staying])
    while engine.live:
        engine.step()
    assert staying.emitted == alone(target, heads_of("eagle3", target), "static", long, 12)

"""The shared prefix (inference/prefix.py) in the engine's plain admissions, as distillation runs
them: rows whose prompts open with the same chat-template text prefill it once, the padding then
sits between it and each row's rest, and every reply still equals `generate` alone, on every
family of the suite (sliding windows included: the prompts are longer than the window)."""

from __future__ import annotations

import pytest
import torch

from headstart.inference.batcher import EngineBatcher
from headstart.inference.plain import SamplingConfig
from headstart.inference.prefix import common_prefix
from headstart.inference.requests import Request
from headstart.targets import load_target
from tests.tiny import FAMILIES, make_target_dir

CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CASES = [(family, "cpu") for family in sorted(FAMILIES)] + [
    pytest.param(family, "cuda", marks=CUDA) for family in ("llama", "mistral", "gemma3_text")
]  # on CUDA in float32: distillation's settings (scripts/gpu/distill.sh), logic not bf16 noise


@pytest.mark.parametrize(("family", "device"), CASES)
def test_replies_after_a_shared_prefix_equal_generate_alone(family, device, tmp_path):
    path = make_target_dir(tmp_path, family, seed=11, **FAMILIES[family])
    target = load_target(str(path), device=device, dtype="float32")
    prompts = [target.chat.user_prompt_ids(f"question number {i} " + "x" * (3 * i % 11)) for i in range(7)]
    alone = {}
    for i, p in enumerate(prompts):
        ids = torch.tensor([p], device=target.device)
        out = target.model.generate(ids, max_new_tokens=18, min_new_tokens=18, do_sample=False)
        alone[i] = out[0, len(p) :].tolist()
    got = {}
    requests = [
        Request(key=i, prompt=p, sampling=SamplingConfig(max_new_tokens=18)) for i, p in enumerate(prompts)
    ]
    stats = EngineBatcher(target, max_batch=4, admit_every=2).run(
        requests, lambda request, reply: got.__setitem__(request.key, reply.token_ids)
    )
    assert stats.prefix_reused > 0  # the path under test ran
    for i, reference in alone.items():
        assert got[i] == reference[: len(got[i])], i  # a reply may stop early at an end token


def test_common_prefix():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix([[5], [6]]) == 0
    assert common_prefix([[1, 2], [1, 2]]) == 2


def test_a_prompt_without_the_prefix_does_not_stop_the_others_sharing_it(tmp_path):
    """An admission group in which one prompt lacks the shared prefix prefills that one apart
    (a second forward) and the rest after the prefix, and every reply still equals `generate`."""
    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    prompts = [target.chat.user_prompt_ids(f"question number {i} " + "y" * (5 * i % 7)) for i in range(6)]
    prompts.insert(2, list(range(40, 61)))  # raw ids: no chat template
    alone = {}
    for i, p in enumerate(prompts):
        out = target.model.generate(torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
        alone[i] = out[0, len(p) :].tolist()
    got = {}
    requests = [
        Request(key=i, prompt=p, sampling=SamplingConfig(max_new_tokens=12)) for i, p in enumerate(prompts)
    ]
    batcher = EngineBatcher(target, max_batch=8, admit_every=8, prefill_tokens=4096)
    stats = batcher.run(requests, lambda request, reply: got.__setitem__(request.key, reply.token_ids))
    shared = common_prefix([p for i, p in enumerate(prompts) if i != 2])
    assert shared * 6 > 32  # the split pays on the CPU (grouping.prefill_overhead_tokens)
    assert stats.prefix_reused >= 6 * 8  # the six chat prompts shared their opening
    for i, reference in alone.items():
        assert got[i] == reference[: len(got[i])], i


def test_the_kept_prefix_is_learnt_from_lone_prompts_and_reused_in_part(tmp_path):
    """A server admits one request at a time: the previous prompt is the witness a lone one needs
    to find the opening they share; later prompts that share only part of the kept prefix take
    its first entries (no forward); prompts sharing more among themselves get a new one."""
    from headstart.inference.prefix import SharedPrefix

    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    prefix = SharedPrefix(target, min_tokens=4)
    runs = []
    real_run = prefix._run
    prefix._run = lambda ids, start=0: runs.append(list(ids)) or real_run(ids, start)
    opening = list(range(10, 30))
    assert prefix.pick([[*opening, 1, 2, 3]]) == []  # nothing to compare with yet
    # the previous prompt is the witness
    assert prefix.pick([[*opening, 1, 7]]) == [*opening, 1] and len(runs) == 1
    assert prefix.pick([[*opening[:6], 99, 98]]) == opening[:6] and len(runs) == 1  # in part: no forward
    other = list(range(40, 60))
    assert prefix.pick([[*other, 5], [*other, 6]]) == other and len(runs) == 2  # another opening
    assert prefix.pick([[*other[:3], 1, 2, 3]]) == []  # under min_tokens in common: none
    rows = prefix.rows(6, 2)
    assert rows.layers[0].keys.shape[2] == 6  # the first 6 entries of the kept 20, per row


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "dflash", "medusa", "early-exit"])
def test_a_drafter_after_a_shared_prefix_sees_the_whole_prompt(tmp_path, kind):
    """With draft heads the target runs only each prompt's rest after the kept prefix, and the
    drafter still observes the whole prompt: its first drafts equal those after whole-prompt
    prefills (the prefix's last token paired with each row's own next token, not the padding
    between them), and every reply is `generate`'s alone."""
    from random_heads import RandomEagle, RandomMedusa

    from headstart.heads import HeadSpec, build_head
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.engine import Engine, Job
    from headstart.inference.stops import StopRule

    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    if kind == "medusa":
        heads = RandomMedusa(target.hidden_size, target.vocab_size, num_heads=3)
    elif kind == "early-exit":  # a draft model (headstart/drafts.py): it reads the prompt's tokens
        from headstart.drafts import early_exit

        heads = early_exit(target, 1)
    elif kind == "dflash":
        counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
        heads = build_head(
            HeadSpec(kind="dflash", block_size=4, draft_vocab_size=100), target, token_counts=counts
        )
    else:
        heads = RandomEagle(target.model, draft_vocab=100 if kind == "eagle3" else None,
                            layers=(0, 1) if kind == "eagle3" else ())  # fmt: skip
    opening = "Please answer the following question carefully: "
    prompts = [target.chat.user_prompt_ids(opening + q) for q in ("why?", "what is the sea", "say hi twice")]

    def first_drafts(shared_prefix: int) -> tuple[torch.Tensor, Engine, list[Job]]:
        engine = Engine(SpeculativeDecoder(target, heads, tree="static"), SamplingConfig(max_new_tokens=8),
                        shared_prefix=shared_prefix, prefill_tokens=10_000)  # fmt: skip
        jobs = [Job(key=i, prompt=p, rule=StopRule(10)) for i, p in enumerate(prompts)]
        engine.add(jobs)
        if hasattr(engine.drafter, "before_draft"):  # early exit: its root read over the target's cache
            engine.drafter.before_draft(engine.state)
        return engine.drafter.root_logits().clone(), engine, jobs

    shared, engine, jobs = first_drafts(4)
    whole, other, _ = first_drafts(0)
    assert engine.prefix_reused > 0 and other.prefix_reused == 0 and engine.prefills == 1
    torch.testing.assert_close(shared, whole, rtol=1e-4, atol=1e-4)
    engine.step()
    reused = engine.prefix_reused
    late = Job(key=3, prompt=target.chat.user_prompt_ids("Please answer this: why not?"), rule=StopRule(10))
    engine.add([late])  # opens with part of the kept prefix only: its first entries serve
    assert engine.prefix_reused > reused
    jobs.append(late)
    while engine.live:
        engine.step()
    for job in jobs:
        alone = SpeculativeDecoder(target, heads, tree="static").generate([job.prompt], max_new_tokens=10,
                                                                          eos_token_id=None)  # fmt: skip
        assert job.emitted == alone.token_ids[0], job.key


def test_a_drafter_object_takes_its_prompts_in_one_prefill_whatever_they_share(tmp_path):
    """A drafter object (not a head module) keeps its own rows and takes one prefill: the prefix
    cache, which may split a group into the prompts with and without the opening, stays off."""
    from scripted import ScriptedDrafter

    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.engine import Engine, Job
    from headstart.inference.stops import StopRule

    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    opening = list(range(40, 80))
    prompts = [[*opening, 1, 2], [*opening, 3], [*opening, 4, 5, 6], list(range(100, 130))]
    drafter = ScriptedDrafter([p + [0] * 20 for p in prompts], target.vocab_size)
    engine = Engine(SpeculativeDecoder(target, drafter, tree="static"), SamplingConfig(max_new_tokens=8),
                    shared_prefix=8)  # fmt: skip
    engine.add([Job(key=i, prompt=p, rule=StopRule(8)) for i, p in enumerate(prompts)])
    assert engine.prefills == 1 and engine.prefix is None


@pytest.mark.parametrize("kind", ["none", "eagle3"])
def test_a_chat_s_next_turn_extends_the_kept_prefix_and_replies_as_generate(tmp_path, kind):
    """One request at a time, each turn's prompt opening with the last turn's: the new prefix runs
    only what it adds to the kept one (the kept entries and features are copied), and every reply
    is still `generate`'s alone, with and without a draft head."""
    from random_heads import RandomEagle

    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.inference.engine import Engine, Job
    from headstart.inference.prefix import SharedPrefix
    from headstart.inference.stops import StopRule

    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    heads = RandomEagle(target.model, draft_vocab=100, layers=(0, 1)) if kind == "eagle3" else None
    tree = "static" if heads is not None else None
    layers = SpeculativeDecoder(target, heads, tree=tree).feature_layers
    prefix = SharedPrefix(target, 4, layers=layers)
    starts = []
    real_run = prefix._run
    prefix._run = lambda ids, start=0: starts.append((len(ids), start)) or real_run(ids, start)
    turns = [list(range(10, 40))]
    for extra in (list(range(50, 70)), list(range(80, 95)), list(range(100, 110))):
        turns.append(turns[-1] + extra)
    for prompt in turns:
        engine = Engine(
            SpeculativeDecoder(target, heads, tree=tree), SamplingConfig(max_new_tokens=6), prefix=prefix
        )
        job = Job(key=0, prompt=prompt, rule=StopRule(6))
        engine.add([job])
        if heads is not None:  # the drafter read the copied features as if the prompt ran whole
            whole = Engine(SpeculativeDecoder(target, heads, tree=tree), SamplingConfig(max_new_tokens=6))
            whole.add([Job(key=0, prompt=prompt, rule=StopRule(6))])
            drafts = engine.drafter.root_logits(), whole.drafter.root_logits()
            torch.testing.assert_close(*drafts, rtol=1e-4, atol=1e-4)
        while engine.live:
            engine.step()
        alone = SpeculativeDecoder(target, heads, tree=tree).generate(
            [prompt], max_new_tokens=6, eos_token_id=None
        )
        assert job.emitted == alone.token_ids[0], len(prompt)
    # turn 2 learns turn 1's prompt from scratch; turns 3 and 4 run only what they add
    assert starts == [(30, 0), (50, 30), (65, 50)], starts

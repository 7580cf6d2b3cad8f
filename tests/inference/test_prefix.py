"""The shared prefix (inference/prefix.py) in the engine's plain admissions, as distillation runs
them: rows whose prompts open with the same chat-template text prefill it once, the padding then
sits between it and each row's rest, and every reply still equals `generate` alone, on every
family of the suite (sliding windows included: the prompts are longer than the window)."""

from __future__ import annotations

import pytest
import torch

from headstart.inference.continuous import Request
from headstart.inference.engine import EngineBatcher
from headstart.inference.plain import SamplingConfig
from headstart.inference.prefix import common_prefix
from headstart.target import load_target
from tests.tiny import FAMILIES, make_target_dir

CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CASES = [(family, "cpu") for family in sorted(FAMILIES)] + [
    pytest.param(family, "cuda", marks=CUDA) for family in ("llama", "mistral", "gemma3_text")
]  # on CUDA in float32: distillation's settings (scripts/gpu_distill.sh), logic not bf16 noise


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
    prefix._run = lambda ids: runs.append(list(ids)) or real_run(ids)
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

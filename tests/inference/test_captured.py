"""`--compile`: the verify forward as ONE compiled graph (torch.compile fullgraph=True) over a
fixed-size KV buffer, on tiny targets of several families (sliding windows, mixed layers, MoE,
fused qkv, post-norms): no graph break, no recompilation in the steady state (50+ steps of
varying acceptance after warm-up), greedy output identical to `model.generate`. Sampling
through it: test_sampling_exactness.py. Most tests use the aot_eager backend (dynamo's trace
and AOT autograd's functionalisation, without code generation: fast); one runs inductor."""

from __future__ import annotations

import shutil

import pytest
import torch
from scripted import ScriptedDrafter
from tiny import FAMILIES, FC_LAYOUT, make_target_dir
from torch._dynamo.utils import counters

from headstart.heads import HeadSpec, build_head
from headstart.inference.captured import CapturedVerify, wants_capture
from headstart.inference.decoder import SpeculativeDecoder
from headstart.targets import load_target

PROMPTS = ["hello there, how are you doing today?", "a", "Write a poem about the sea and the sky"]
FAMILY_SET = ["llama", "qwen3", "gemma3_text", "mistral", "phi3", "olmo2", "gpt_oss", "qwen3_moe"]


def family_target(tiny_root, family: str):
    return load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))


def generate_ref(target, ids: list[int], max_new: int) -> list[int]:
    x = torch.tensor([ids], device=target.device)
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                                eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(ids) :].tolist()


def record_drafts(monkeypatch, drafter_class, method: str) -> dict[bool, list[torch.Tensor]]:
    """Patch `drafter_class.method` to keep a copy of the logits each call leaves (its return
    value, or `_logits` for observe), keyed by whether the drafter ran captured."""
    seen: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    real = getattr(drafter_class, method)

    def recording(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        seen[self.captured is not None].append((self._logits if out is None else out).clone())
        return out

    monkeypatch.setattr(drafter_class, method, recording)
    return seen


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family", FAMILY_SET)
def test_captured_verify_is_exact_without_graph_breaks(tiny_root, family):
    target = family_target(tiny_root, family)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    layout = "fc" if family in FC_LAYOUT else "reference"
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    eagle = build_head(
        HeadSpec(kind="eagle3", draft_vocab_size=100, layout=layout), target, token_counts=counts
    )
    medusa = build_head(HeadSpec(kind="medusa", draft_vocab_size=0), target)
    for name in ("plain", "medusa", "eagle3", "scripted"):
        for batch in ([0], [0, 1, 2]):
            heads = {"plain": None, "medusa": medusa, "eagle3": eagle}.get(name) or ScriptedDrafter(
                [prompts[i] + refs[i] for i in batch], target.vocab_size
            )
            decoder = SpeculativeDecoder(target, heads, tree="static" if name != "plain" else None,
                                         compile=True, compile_backend="aot_eager")  # fmt: skip
            out = decoder.generate([prompts[i] for i in batch], max_new_tokens=40, eos_token_id=None)
            for i, got in zip(batch, out.token_ids, strict=True):
                assert got == refs[i], (family, name, batch)
            captured = decoder.captured  # every verify ran captured, but the one after a row left
            # (EAGLE-3's greedy rounds ran as one program each: test_captured_round.py)
            rounds = decoder.captured_round.rounds if decoder.captured_round is not None else 0
            assert (
                captured.steps + captured.fallbacks + rounds == out.stats.target_forwards - 1
            )  # but the prefill
            assert captured.fallbacks <= len(batch) - 1, (family, name, batch)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_no_recompilation_in_the_steady_state(tiny_root):
    """After one warm-up generation, 60+ steps over other prompts with varying acceptance (a
    script whose drafts go wrong at irregular places, static and dynamic trees) compile nothing new."""
    target = family_target(tiny_root, "qwen3")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 100) for ids in prompts]

    def script(i: int) -> ScriptedDrafter:
        wrong = [t if k not in (3, 4, 11, 19, 20, 21, 30, 41, 47, 60, 61, 73, 88) else (t + 1) % target.vocab_size
                 for k, t in enumerate(refs[i])]  # fmt: skip
        return ScriptedDrafter([prompts[i] + wrong], target.vocab_size, wrong_every=1000)

    for tree in ("static", "dynamic:depth=3,top_k=3,total_tokens=8"):
        decoder = SpeculativeDecoder(target, script(0), tree=tree, compile=True, compile_backend="aot_eager")
        assert decoder.generate([prompts[0]], max_new_tokens=100, eos_token_id=None).token_ids[0] == refs[0]
        steps = decoder.captured.steps
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i in (1, 2, 0, 1, 2):
                decoder.heads = script(i)
                out = decoder.generate([prompts[i]], max_new_tokens=100, eos_token_id=None)
                assert out.token_ids[0] == refs[i]
                assert len(out.stats.accept_lengths) > 1  # acceptance varied from step to step
        assert decoder.captured.steps - steps >= 50 and decoder.captured.fallbacks == 0


def test_rows_leaving_fall_back_to_eager_and_stay_exact(tiny_root):
    """Rows that stop early leave the batch (fresh cache tensors): those steps run eagerly."""
    target = family_target(tiny_root, "llama")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 30) for ids in prompts]
    stop = next(t for t in refs[1][3:] if t not in refs[0] + refs[2])  # row 1 alone ends early
    want = [r[: r.index(stop)] if stop in r else r for r in refs]
    decoder = SpeculativeDecoder(target, None, compile=True, compile_backend="aot_eager")
    out = decoder.generate(prompts, max_new_tokens=30, eos_token_id=stop)
    got = [ids[:-1] if ids and ids[-1] == stop else ids for ids in out.token_ids]
    assert got == want
    assert decoder.captured.steps >= 1 and decoder.captured.fallbacks >= 1


def _inductor_builds() -> bool:
    """Inductor's CPU code needs a C++ compiler and Python's headers: try a one-line graph."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return False
    try:
        return bool(torch.compile(lambda x: x * 2 + 1, backend="inductor")(torch.ones(3)).eq(3).all())
    except Exception:  # noqa: BLE001 - any toolchain failure means: cannot test it here
        return False


def test_inductor_codegen_is_exact(tiny_root):
    """The real backend (inductor's generated C++ on a CPU, Triton and CUDA graphs on a GPU)."""
    if not _inductor_builds():
        pytest.skip("inductor cannot build CPU code here (no C++ compiler or Python headers)")
    target = family_target(tiny_root, "llama")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:1]]
    refs = [generate_ref(target, ids, 30) for ids in prompts]
    script = ScriptedDrafter([prompts[0] + refs[0]], target.vocab_size)
    decoder = SpeculativeDecoder(target, script, tree="static", compile=True)
    assert decoder.generate(prompts, max_new_tokens=30, eos_token_id=None).token_ids[0] == refs[0]
    assert decoder.captured.steps > 0 and not counters["graph_break"]


def test_the_compile_choice():
    assert wants_capture("on", torch.device("cpu")) and not wants_capture("auto", torch.device("cpu"))
    assert wants_capture("auto", torch.device("cuda")) and not wants_capture("off", torch.device("cuda"))
    with pytest.raises(Exception, match="--compile must be one of"):
        wants_capture("yes", torch.device("cpu"))
    assert CapturedVerify.capacity_for(1) == CapturedVerify.capacity_for(512) == 512


def test_the_buffers_stay_put_across_generations(tiny_root):
    """A CUDA graph replays on fixed addresses: the second generation (another prompt length)
    decodes in the first one's buffers."""
    target = family_target(tiny_root, "llama")
    decoder = SpeculativeDecoder(target, None, compile=True, compile_backend="aot_eager")
    seen = []
    for text in PROMPTS[:2]:
        decoder.generate([target.chat.user_prompt_ids(text)], max_new_tokens=10, eos_token_id=None)
        seen.append([t.data_ptr() for t in decoder.captured.pool[0] + decoder.captured.pool[1]])
    assert seen[0] == seen[1] and decoder.captured.fallbacks == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_cuda_graphs_are_exact(tiny_root, family):
    """On CUDA the captured verify is inductor's code replayed as a CUDA graph (mode
    reduce-overhead); greedy output still equals `generate`, the buffers stay put."""
    target = family_target(tiny_root, family)
    target.model.to("cuda")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    eagle = build_head(HeadSpec(kind="eagle3", draft_vocab_size=100), target, token_counts=counts).to("cuda")
    for heads in (None, eagle):
        decoder = SpeculativeDecoder(
            target, heads, tree="static" if heads is not None else None, compile=True
        )
        for i, ids in enumerate(prompts):
            assert decoder.generate([ids], max_new_tokens=40, eos_token_id=None).token_ids[0] == refs[i]
        assert decoder.captured.steps > 0 and decoder.captured.fallbacks == 0


@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8"])
def test_eagle_head_steps_are_captured_and_draft_what_eager_drafts(tiny_root, tree, monkeypatch):
    """--compile also runs an EAGLE-3 head's steps (observe and every expand) as graphs over a
    kept buffer: the child logits they give equal the eager head's (float noise aside), and only
    the prompt-sized observe of each generation runs eagerly."""
    from headstart.inference.drafters.eagle import EagleDrafter

    target = family_target(tiny_root, "qwen3")
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    head = build_head(HeadSpec(kind="eagle3", draft_vocab_size=100), target, token_counts=counts)
    seen = record_drafts(monkeypatch, EagleDrafter, "expand")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    outs = {}
    for compiled in (False, True):
        decoder = SpeculativeDecoder(target, head, tree=tree, compile=compiled, compile_backend="aot_eager")
        decoder.captured_round = None  # the steps one by one (sampling's path; the round program:
        # test_captured_round.py)
        outs[compiled] = [
            decoder.generate([p], max_new_tokens=30, eos_token_id=None).token_ids[0] for p in prompts
        ]
    assert outs[True] == outs[False]
    assert len(seen[True]) == len(seen[False]) > 30
    for eager, graph in zip(seen[False], seen[True], strict=True):
        torch.testing.assert_close(graph, eager, atol=1e-4, rtol=1e-4)
    captured_head = decoder.captured_head
    assert captured_head.steps > len(seen[True]) and captured_head.fallbacks == len(prompts)


@pytest.mark.parametrize("vocab", [0, 64])
def test_medusa_heads_are_captured_and_draft_what_eager_drafts(tiny_root, vocab, monkeypatch):
    """Full vocabulary and a draft vocabulary (the shipped heads': its rows come from a Python
    cache, handed to the graph)."""
    from headstart.inference.drafters.medusa import MedusaDrafter

    target = family_target(tiny_root, "llama")
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    heads = build_head(HeadSpec(kind="medusa", draft_vocab_size=vocab), target, token_counts=counts)
    seen = record_drafts(monkeypatch, MedusaDrafter, "observe")
    prompt = target.chat.user_prompt_ids(PROMPTS[0])
    outs = {}
    for compiled in (False, True):
        decoder = SpeculativeDecoder(
            target, heads, tree="static", compile=compiled, compile_backend="aot_eager"
        )
        decoder.captured_round = None  # the steps one by one (the round program: test_captured_round.py)
        outs[compiled] = decoder.generate([prompt], max_new_tokens=30, eos_token_id=None).token_ids[0]
    assert outs[True] == outs[False] and len(seen[True]) == len(seen[False]) > 10
    for eager, graph in zip(seen[False], seen[True], strict=True):
        torch.testing.assert_close(graph, eager, atol=1e-4, rtol=1e-4)
    assert decoder.captured_head.steps == len(seen[True])


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_dflash_steps_are_captured_and_draft_what_eager_drafts(tiny_root, family, monkeypatch):
    """A DFlash head's context update and block forward as graphs: the same block logits as
    the eager head's, the same output (the round program off: its steps are what is tested)."""
    from headstart.inference.drafters.dflash import DFlashDrafter

    target = family_target(tiny_root, family)
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    heads = build_head(
        HeadSpec(kind="dflash", draft_vocab_size=100, block_size=5), target, token_counts=counts
    )
    seen = record_drafts(monkeypatch, DFlashDrafter, "observe")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]]
    refs = [generate_ref(target, ids, 30) for ids in prompts]
    for compiled in (False, True):
        decoder = SpeculativeDecoder(
            target, heads, tree="static", compile=compiled, compile_backend="aot_eager"
        )
        decoder.captured_round = None  # the compiled steps (the round program: test_captured_round.py)
        for ids, ref in zip(prompts, refs, strict=True):
            assert decoder.generate([ids], max_new_tokens=30, eos_token_id=None).token_ids[0] == ref
    assert len(seen[True]) == len(seen[False]) > 20
    for eager, graph in zip(seen[False], seen[True], strict=True):
        torch.testing.assert_close(graph, eager, atol=1e-4, rtol=1e-4)
    # every block ran captured; the context of each prefill (prompt-sized) ran eagerly
    assert decoder.captured_head.steps >= 2 * len(seen[True]) - len(prompts)
    assert decoder.captured_head.fallbacks == len(prompts)

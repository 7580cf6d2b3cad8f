"""The steady-state decoding loop reads the device back at most once per step (the committed
tokens and their counts), whatever the heads, tree, batch or sampling: on a GPU every other read
would stall the launch queue. On CPU a counting shim wraps the tensor methods that read values
back to the host; on CUDA (marked gpu) torch.cuda.set_sync_debug_mode("error") fails any sync."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from random_heads import RandomEagle, RandomMedusa

from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.prompts import Prompts
from headstart.targets import load_target

TREES = ["static", "dynamic:depth=4,top_k=3,total_tokens=10", "chain:3", "chain:1+lookup:4"]
PROMPTS = ["hello there", "What is the capital of France? Answer briefly.", "a"]
# the reads a device tensor can do back to the host from Python
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def heads_of(kind: str, target):
    if kind == "medusa":
        return RandomMedusa(target.hidden_size, target.vocab_size, num_heads=3)
    if kind == "eagle":
        return RandomEagle(target.model)
    return RandomEagle(target.model, draft_vocab=100, layers=(0, 1))


class ReadCounter:
    """Counts host reads per decoding step: a step starts at each `draft` call; reads before the
    first draft (prefill, first token) and after the loop (the output's assembly) are not counted."""

    def __init__(self) -> None:
        self.steps: list[list[str]] = []
        self.closed = False

    def read(self, name: str) -> None:
        if self.steps and not self.closed:
            self.steps[-1].append(name)


@contextlib.contextmanager
def counting_reads(decoder: SpeculativeDecoder) -> Iterator[ReadCounter]:
    counter = ReadCounter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}
    original_getitem, original_nonzero, original_draft = (
        torch.Tensor.__getitem__,
        torch.nonzero,
        decoder.draft,
    )
    original_sequences = Prompts.sequences

    def wrap(name: str):
        def counted(self, *args, **kwargs):
            counter.read(name)
            return originals[name](self, *args, **kwargs)

        return counted

    def getitem(self, index):  # a boolean mask index reads its count back (nonzero)
        parts = index if isinstance(index, tuple) else (index,)
        if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
            counter.read("bool-index")
        return original_getitem(self, index)

    def nonzero(*args, **kwargs):
        counter.read("torch.nonzero")
        return original_nonzero(*args, **kwargs)

    def draft(*args, **kwargs):
        counter.steps.append([])
        return original_draft(*args, **kwargs)

    original_round = decoder.round_unread

    def round_unread(
        *args, **kwargs
    ):  # a round as one program (inference/captured_round.py) starts a step too
        counter.steps.append([])
        report = original_round(*args, **kwargs)
        if report is None:  # not run: the steps follow, and their draft starts the step
            assert not counter.steps.pop()
        return report

    def sequences(*args, **kwargs):  # the loop is over
        counter.closed = True
        return original_sequences(*args, **kwargs)

    try:
        for name in READS:
            setattr(torch.Tensor, name, wrap(name))
        torch.Tensor.__getitem__, torch.nonzero = getitem, nonzero
        decoder.draft, decoder.round_unread, Prompts.sequences = draft, round_unread, sequences
        yield counter
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
        torch.Tensor.__getitem__, torch.nonzero = original_getitem, original_nonzero
        del decoder.draft, decoder.round_unread
        Prompts.sequences = original_sequences


def test_the_shim_sees_a_read(target):
    """The test below cannot pass vacuously: the shim counts an added read inside a step."""
    decoder = SpeculativeDecoder(target, heads_of("medusa", target), tree="chain:3")
    accept = decoder.accept

    def accept_and_peek(tree, feats, sampling, generator=None):
        acc = accept(tree, feats, sampling, generator)
        int(acc.lengths.max())  # the kind of read this PR removed
        return acc

    decoder.accept = accept_and_peek
    ids = target.chat.user_prompt_ids(PROMPTS[0])
    with counting_reads(decoder) as counter:
        decoder.generate([ids], max_new_tokens=12, eos_token_id=None)
    assert counter.steps and all(step == ["__int__", "tolist"] for step in counter.steps), counter.steps


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("sample", [False, True])
def test_at_most_one_host_read_per_step(target, kind, tree, sample):
    if sample and "lookup" in tree:
        tree = "dynamic:depth=3,top_k=2,total_tokens=6+lookup:3"  # lookup + sampling needs a dynamic tree
    decoder = SpeculativeDecoder(target, heads_of(kind, target), tree=tree)
    batch = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    for prompts in (batch[:1], batch):
        with counting_reads(decoder) as counter:  # a fresh count per generate
            # EOS on: rows finish at different steps and leave the batch
            out = decoder.generate(prompts, max_new_tokens=24, do_sample=sample, seed=0)
        assert counter.steps and len(counter.steps) == out.stats.target_forwards - out.stats.prefills
        assert max(len(step) for step in counter.steps) <= 1, counter.steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
@pytest.mark.parametrize("tree", TREES)
def test_no_sync_but_the_step_read_on_cuda(tiny_llama, kind, tree):
    """CUDA: every sync raises, except the one read per step (`_read_step`), allowed below."""
    target = load_target(str(tiny_llama), device="cuda", dtype="bfloat16")
    decoder = SpeculativeDecoder(target, heads_of(kind, target).to("cuda", torch.bfloat16), tree=tree)
    generate_raising_on_syncs(decoder, target.chat.user_prompt_ids(PROMPTS[1]))


def generate_raising_on_syncs(decoder: SpeculativeDecoder, ids: list[int]) -> None:
    """One generation in which every CUDA sync raises from the first step on (prefill may sync),
    except the step's one read (`_read_step`)."""
    read, draft = decoder._read_step, decoder.draft

    def read_allowed(values):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return read(values)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    def draft_checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        return draft(*args, **kwargs)

    decoder._read_step, decoder.draft = read_allowed, draft_checked
    try:
        decoder.generate([ids], max_new_tokens=24, eos_token_id=None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        del decoder._read_step, decoder.draft


@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
@pytest.mark.parametrize("tree", ["static", "dynamic:depth=4,top_k=3,total_tokens=10"])
def test_the_captured_steps_add_no_host_read(target, kind, tree):
    """--compile: the compiled verify and drafts read nothing back either (the write column is a
    device view, the buffers are checked by address)."""
    decoder = SpeculativeDecoder(
        target, heads_of(kind, target), tree=tree, compile=True, compile_backend="aot_eager"
    )
    ids = target.chat.user_prompt_ids(PROMPTS[1])
    decoder.generate([ids], max_new_tokens=8, eos_token_id=None)  # compiles
    with counting_reads(decoder) as counter:
        out = decoder.generate([ids], max_new_tokens=24, eos_token_id=None)
    assert counter.steps and len(counter.steps) == out.stats.target_forwards - out.stats.prefills
    assert max(len(step) for step in counter.steps) <= 1, counter.steps
    assert decoder.captured.steps + decoder.captured_round.rounds > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["medusa", "eagle3"])
def test_no_sync_but_the_step_read_on_cuda_captured(tiny_llama, kind):
    """CUDA graphs (--compile): after a warm-up generation, every sync but the step's read raises."""
    target = load_target(str(tiny_llama), device="cuda", dtype="bfloat16")
    decoder = SpeculativeDecoder(target, heads_of(kind, target).to("cuda", torch.bfloat16), tree="static",
                                 compile=True)  # fmt: skip
    ids = target.chat.user_prompt_ids(PROMPTS[1])
    decoder.generate([ids], max_new_tokens=24, eos_token_id=None)  # compiles and records the graphs
    generate_raising_on_syncs(decoder, ids)
    assert decoder.captured.steps > 0

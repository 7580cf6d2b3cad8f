"""`--compile` with a fixed tree and greedy decoding: the whole round (every draft level, the
verify, acceptance, the KV commit and the head's observation) as ONE compiled program
(inference/captured_round.py). Exact against `model.generate` on the suite's families, with
drafts that accept long paths (a scripted draft inside the program) and with a real EAGLE-3 head
whose in-program drafts equal the eager steps'; rows leaving fall back to the steps and come back."""

from __future__ import annotations

import pytest
import torch
from test_captured import PROMPTS, family_target, fresh_dynamo, generate_ref  # noqa: F401 - the fixture
from tiny import FC_LAYOUT
from torch._dynamo.utils import counters

from headstart.heads import HeadSpec, build_head
from headstart.inference.captured_round import RoundShape, capacity_mask
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.drafters.eagle import CapturedHead, RoundParts
from headstart.inference.plain import SamplingConfig
from headstart.inference.prompts import prepare_prompts
from headstart.inference.trees.spec import choose_tree
from headstart.inference.trees.static import static_plan

FAMILY_SET = ["llama", "qwen3", "gemma3_text", "mistral", "phi3", "olmo2", "gpt_oss", "qwen3_moe"]


class ScriptedParts(RoundParts):
    """The round's draft from a script (each row's reference sequence, a device table), not the
    head: node j at depth d and rank r under its parent drafts the true token at the root's
    position + d for rank 0, except where that position is a multiple of `every` (there rank 1
    holds the truth), so paths of every length are accepted. The head still observes."""

    def __init__(self, parts: RoundParts, table: torch.Tensor, every: int = 4) -> None:
        super().__init__(parts.heads, parts.to_target, parts.vocab)
        self.table, self.every = table, every

    def round_draft(self, shape, fixed, root, head):
        _, _, _, _, _, root_pos = head
        depths = fixed["depths"][None]  # (1, n)
        ranks = torch.tensor(_ranks(shape), device=root.device)[None]
        at = (root_pos[:, None] + depths).clamp(max=self.table.shape[1] - 1)
        truth = self.table.gather(1, at)
        special = (at % self.every) == 0
        wrong = (truth + ranks + 1) % self.vocab
        tokens = torch.where(ranks == torch.where(special, 1, 0), truth, wrong)
        return torch.where(depths == 0, root[:, None], tokens)


def _ranks(shape: RoundShape) -> list[int]:
    ranks = [0] * shape.size
    for kids in shape.children:
        for r, child in enumerate(kids):
            if child >= 0:
                ranks[child] = r
    return ranks


def scripted(monkeypatch, sequences: list[list[int]], every: int = 4) -> None:
    width = 256  # one width for every script: a new table shape would recompile the program
    assert max(map(len, sequences)) <= width
    table = torch.tensor([s + [3] * (width - len(s)) for s in sequences])
    real = CapturedHead.round_parts

    def parts(self, drafter):
        base = real(self, drafter)
        if not isinstance(base, ScriptedParts):
            self._parts = ScriptedParts(base, table, every)
        return self._parts

    monkeypatch.setattr(CapturedHead, "round_parts", parts)


def eagle3(target):
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    layout = "fc" if target.model.config.model_type in FC_LAYOUT else "reference"
    return build_head(
        HeadSpec(kind="eagle3", draft_vocab_size=100, layout=layout), target, token_counts=counts
    )


@pytest.mark.parametrize("family", FAMILY_SET)
def test_the_round_program_is_exact_on_long_accepted_paths(tiny_root, family, monkeypatch):
    target = family_target(tiny_root, family)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    head = eagle3(target)
    for tree in ("chain:3", "static"):
        scripted(monkeypatch, [p + r for p, r in zip(prompts, refs, strict=True)])
        decoder = SpeculativeDecoder(target, head, tree=tree, compile=True, compile_backend="aot_eager")
        out = decoder.generate(prompts, max_new_tokens=40, eos_token_id=None)
        assert out.token_ids == refs, (family, tree)
        accepted = sorted(out.stats.accept_lengths)
        assert accepted[-1] >= 3, accepted  # long paths were accepted (compaction moved entries)
        assert decoder.captured_round.rounds >= 8 and decoder.captured_round.fallbacks == 0
        assert decoder.captured.steps == 0  # no verify ran outside the program
        monkeypatch.undo()
    assert not counters["graph_break"]


def test_the_program_drafts_what_the_eager_steps_draft(tiny_root):
    """A real (random) EAGLE-3 head: the program's draft, run eagerly over the same state, gives
    the eager draft's tokens; and generation with the program equals generation without it."""
    target = family_target(tiny_root, "qwen3")
    head = eagle3(target)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    decoder = SpeculativeDecoder(target, head, tree="static", compile=True, compile_backend="aot_eager")
    sampling = SamplingConfig(max_new_tokens=8)
    prepared = prepare_prompts(prompts, None, 0, 1, None, False, target.device)
    from headstart.inference.drafters import make_drafter

    drafter = make_drafter(head, target.vocab_size)
    state = decoder.prefill(prepared, sampling, drafter)
    round_program = decoder.captured_round
    inputs = drafter.round_inputs(round_program.shape)
    fixed = round_program.shape.tensors(target.device)
    drafted = inputs.parts.round_draft(round_program.shape, fixed, state.root, inputs.tensors)
    eager = decoder.draft(state, sampling, drafter)
    drafter.end_step()
    assert torch.equal(drafted, eager.tokens)
    outs = {}
    for program in (True, False):
        decoder = SpeculativeDecoder(target, head, tree="static", compile=True, compile_backend="aot_eager")
        if not program:
            decoder.captured_round = None
        outs[program] = decoder.generate(prompts, max_new_tokens=30, eos_token_id=None).token_ids
    assert outs[True] == outs[False] == [generate_ref(target, p, 30) for p in prompts]


def test_rows_leaving_take_the_steps_then_the_program_again(tiny_root, monkeypatch):
    target = family_target(tiny_root, "llama")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    stop = next(t for t in refs[1][3:] if t not in refs[0] + refs[2])  # row 1 alone ends early
    want = [r[: r.index(stop)] if stop in r else r for r in refs]
    scripted(monkeypatch, [p + r for p, r in zip(prompts, refs, strict=True)])
    decoder = SpeculativeDecoder(
        target, eagle3(target), tree="chain:3", compile=True, compile_backend="aot_eager"
    )
    out = decoder.generate(prompts, max_new_tokens=40, eos_token_id=stop)
    got = [ids[:-1] if ids and ids[-1] == stop else ids for ids in out.token_ids]
    assert got == want
    program = decoder.captured_round
    assert program.fallbacks >= 1 and program.rounds >= 4  # the steps once, the program on both sides


def test_no_recompilation_in_the_steady_state(tiny_root, monkeypatch):
    target = family_target(tiny_root, "qwen3")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 60) for ids in prompts]
    head = eagle3(target)
    decoder = SpeculativeDecoder(target, head, tree="chain:3", compile=True, compile_backend="aot_eager")
    scripted(monkeypatch, [prompts[0] + refs[0]])
    assert decoder.generate([prompts[0]], max_new_tokens=60, eos_token_id=None).token_ids[0] == refs[0]
    rounds = decoder.captured_round.rounds
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in (1, 2):
            monkeypatch.undo()
            scripted(monkeypatch, [prompts[i] + refs[i]])
            decoder.captured_head._parts = None  # the new script (the same program: one shape)
            assert (
                decoder.generate([prompts[i]], max_new_tokens=60, eos_token_id=None).token_ids[0] == refs[i]
            )
    assert decoder.captured_round.rounds - rounds >= 20


def test_the_capacity_mask():
    seen = torch.tensor([[True, False, True, True, False, False, False, False]])
    tree = torch.tensor([[True, False], [True, True]])[None]
    mask = capacity_mask(seen, torch.tensor(3), tree, torch.float32)
    sees = mask[0, 0] == 0
    assert sees.tolist() == [
        [True, False, True, True, False, False, False, False],
        [True, False, True, True, True, False, False, False],
    ]


def test_only_fixed_trees_with_round_parts_get_a_program(tiny_root):
    target = family_target(tiny_root, "llama")
    head = eagle3(target)
    made = {
        tree: SpeculativeDecoder(
            target, head, tree=tree, compile=True, compile_backend="aot_eager"
        ).captured_round
        for tree in ("chain:3", "static", "dynamic:depth=3,top_k=3,total_tokens=8", "static+lookup:3")
    }
    assert made["chain:3"] is not None and made["static"] is not None
    assert made["dynamic:depth=3,top_k=3,total_tokens=8"] is None and made["static+lookup:3"] is None
    assert SpeculativeDecoder(target, head, tree="chain:3").captured_round is None  # not compiled
    plan = choose_tree("chain:3").resolve(None).fixed_plan(target.device)
    assert plan is static_plan(plan.tree, target.device)  # built once per tree and device
    assert RoundShape.of(plan).path_width == 4 and RoundShape.of(plan).drafted == 2


def test_the_next_round_is_queued_before_a_round_is_read(tiny_root, monkeypatch):
    """Reading ahead (on a GPU by default; asked for here): round k + 1 runs before round k's
    report is read, every round; stops act a round late and what lies past them is dropped, so
    each row's output is still the target's, with rows ending at different rounds."""
    target = family_target(tiny_root, "llama")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 40) for ids in prompts]
    stop = next(t for t in refs[1][3:] if t not in refs[0] + refs[2])  # row 1 alone ends early
    want = [r[: r.index(stop) + 1] if stop in r else r for r in refs]
    scripted(monkeypatch, [p + r for p, r in zip(prompts, refs, strict=True)])
    outs, orders = {}, {}
    for ahead in (True, False):
        decoder = SpeculativeDecoder(
            target, eagle3(target), tree="chain:3", compile=True, compile_backend="aot_eager"
        )
        decoder.read_ahead = ahead
        events: list[str] = []
        run, read = decoder.captured_round.run, decoder._read_step

        def run_logged(*args, run=run, events=events):
            out = run(*args)
            events.append("q" if out is not None else "eager")
            return out

        def read_logged(values, read=read, events=events):
            events.append("r")
            return read(values)

        decoder.captured_round.run, decoder._read_step = run_logged, read_logged
        outs[ahead] = decoder.generate(prompts, max_new_tokens=40, eos_token_id=stop).token_ids
        orders[ahead] = events
    assert outs[True] == outs[False] == want
    at_once = [e for e in orders[False] if e != "eager"]
    assert at_once[:6] == ["q", "r"] * 3
    ahead = orders[True]
    assert ahead[:5] == ["q", "q", "r", "q", "r"], ahead
    steady = ahead[: ahead.index("eager")] if "eager" in ahead else ahead
    assert all(steady[: i + 1].count("q") > steady[: i + 1].count("r") for i in range(len(steady) - 1))

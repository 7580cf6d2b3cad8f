"""`--compile` with a fixed tree and greedy decoding: the whole round (every draft level, the
verify, acceptance, the KV commit and the head's observation) as ONE compiled program
(inference/captured_round.py). Exact against `model.generate` on the suite's families, with
drafts that accept long paths (a scripted draft inside the program) and with a real EAGLE-3 head
whose in-program drafts equal the eager steps'; rows leaving fall back to the steps and come back."""

from __future__ import annotations

import pytest
import torch
from test_captured import PROMPTS, family_target, fresh_dynamo, generate_ref  # noqa: F401 - the fixture
from test_sampling_exactness import ALPHA, CONFIGS, PROMPT, joint_pvalue, small_vocab_target
from tiny import FC_LAYOUT
from torch._dynamo.utils import counters

from headstart.heads import HeadSpec, build_head
from headstart.inference.captured_round import capacity_mask, warp_of
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.drafters.eagle import CapturedHead, RoundParts
from headstart.inference.engine import Engine, Job
from headstart.inference.plain import SamplingConfig
from headstart.inference.prompts import prepare_prompts
from headstart.inference.sampling import PreDrawn
from headstart.inference.stops import StopRule

FAMILY_SET = ["llama", "qwen3", "gemma3_text", "mistral", "phi3", "olmo2", "gpt_oss", "qwen3_moe"]


class ScriptedParts(RoundParts):
    """The round's drafts from a script (each row's reference sequence, a device table), not the
    head's logits: a child at position p drafts the true token first, except where p is a
    multiple of `every` (there the truth is ranked second), so paths of every length are
    accepted. The head still runs every step and observes."""

    def __init__(self, parts: RoundParts, table: torch.Tensor, every: int = 4) -> None:
        super().__init__(parts.heads, parts.to_target, parts.vocab)
        self.table, self.every = table, every

    def draft_logits(self, g, positions):
        at = positions.clamp(max=self.table.shape[1] - 1)
        truth = self.table.gather(1, at)[..., None]  # (B, k, 1)
        wrong = (truth + 1) % self.vocab
        logits = torch.zeros(*positions.shape, self.vocab, device=g.device)
        logits.scatter_(2, truth, 10.0)
        return logits.scatter(2, wrong, torch.where((at % self.every == 0)[..., None], 11.0, 0.0))


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
    for tree in ("chain:3", "static", "dynamic:depth=3,top_k=3,total_tokens=8"):
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


@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8"])
def test_the_program_drafts_what_the_eager_steps_draft(tiny_root, tree):
    """A real (random) EAGLE-3 head: the program's draft, run eagerly over the same state, gives
    the eager draft's tree; and generation with the program equals generation without it."""
    target = family_target(tiny_root, "qwen3")
    head = eagle3(target)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    decoder = SpeculativeDecoder(target, head, tree=tree, compile=True, compile_backend="aot_eager")
    sampling = SamplingConfig(max_new_tokens=8)
    prepared = prepare_prompts(prompts, None, 0, 1, None, False, target.device)
    from headstart.inference.drafters import make_drafter

    drafter = make_drafter(head, target.vocab_size)
    state = decoder.prefill(prepared, sampling, drafter)
    plan = decoder.captured_round.plan
    inputs = drafter.round_inputs(plan)
    drafted = plan.draft(inputs.parts.drafter(inputs.tensors), state.root, warp_of(sampling), None)
    eager = decoder.draft(state, sampling, drafter)
    drafter.end_step()
    for name in ("tokens", "parents", "depths", "visible", "children", "valid"):
        assert torch.equal(getattr(drafted, name), getattr(eager, name)), name
    # under sampling over the same pre-drawn uniforms (a static tree draws its children from q)
    warm = SamplingConfig(max_new_tokens=8, temperature=0.7, top_k=20, seed=1)
    draws = torch.rand(len(prompts), decoder.captured_round.draws, generator=torch.Generator().manual_seed(2))
    drafted = plan.draft(inputs.parts.drafter(inputs.tensors), state.root, warp_of(warm), PreDrawn(draws))
    eager = decoder.draft(state, warm, drafter, generator=PreDrawn(draws.clone()))
    drafter.end_step()
    for name in ("tokens", "parents", "depths", "visible", "children", "valid"):
        assert torch.equal(getattr(drafted, name), getattr(eager, name)), name
    assert (drafted.draft_probs is None) == (tree != "static")  # q recorded where children are drawn from it
    if drafted.draft_probs is not None:
        torch.testing.assert_close(drafted.draft_probs, eager.draft_probs)
    outs = {}
    for program in (True, False):
        decoder = SpeculativeDecoder(target, head, tree=tree, compile=True, compile_backend="aot_eager")
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


def test_trees_drafted_from_the_heads_alone_get_a_program(tiny_root):
    target = family_target(tiny_root, "llama")
    head = eagle3(target)
    trees = ("chain:3", "static", "dynamic:depth=3,top_k=3,total_tokens=8", "static+lookup:3")
    made = {
        tree: SpeculativeDecoder(
            target, head, tree=tree, compile=True, compile_backend="aot_eager"
        ).captured_round
        for tree in trees
    }
    assert made["static+lookup:3"] is None  # the lookup branch reads each row's context on the host
    assert made["chain:3"].plan.path_width == 4 and made["chain:3"].plan.drafted == 2
    dynamic = made["dynamic:depth=3,top_k=3,total_tokens=8"].plan
    assert (dynamic.size, dynamic.path_width, dynamic.drafted) == (9, 4, 6)
    assert SpeculativeDecoder(target, head, tree="chain:3").captured_round is None  # not compiled
    assert SpeculativeDecoder(target, None, compile=True, compile_backend="aot_eager").captured_round is None


@pytest.mark.parametrize("tree", ["chain:4", "dynamic:depth=5,top_k=10,total_tokens=60"])
def test_the_replay_drafter_runs_as_the_program(tiny_root, tree):
    """`--draft-model replay:accept=P` (the GPU check's loop measure at the 8B shape) drafts inside
    the program too: exact, every steady round one program run, and its acceptance follows P."""
    from headstart.inference.drafters.replay import Replay, ReplaySpec

    target = family_target(tiny_root, "llama")
    prompt = target.chat.user_prompt_ids(PROMPTS[0])
    want = generate_ref(target, prompt, 60)
    taus = {}
    for accept in (0.3, 1.0):
        decoder = SpeculativeDecoder(target, Replay(target, ReplaySpec(accept=accept, horizon=64)), tree=tree,
                                     compile=True, compile_backend="aot_eager")  # fmt: skip
        out = decoder.generate([prompt], max_new_tokens=60, eos_token_id=None)
        assert out.token_ids[0] == want
        assert (
            decoder.captured_round.rounds >= out.stats.target_forwards - 2
        )  # all but the prefill (and a fallback)
        taus[accept] = out.stats.tau
    assert taus[1.0] == pytest.approx(decoder.captured_round.path_width, abs=0.5)  # every draft right
    assert taus[0.3] < taus[1.0] - 1


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_moe"])
def test_medusa_heads_run_as_the_program(tiny_root, family):
    """Medusa's heads (full and draft vocabulary) inside the program: its draft reads the
    per-depth logits, its observe runs the heads at the last accepted feature; exact, and the
    steady rounds are program runs."""
    target = family_target(tiny_root, family)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 30) for ids in prompts]
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    for vocab in (0, 100):
        medusa = build_head(HeadSpec(kind="medusa", draft_vocab_size=vocab), target,
                            token_counts=counts if vocab else None)  # fmt: skip
        decoder = SpeculativeDecoder(target, medusa, tree="static", compile=True, compile_backend="aot_eager")
        out = decoder.generate(prompts, max_new_tokens=30, eos_token_id=None)
        assert out.token_ids == refs, (family, vocab)
        program = decoder.captured_round  # every round but those after a row left (fresh caches)
        assert program.rounds + program.fallbacks == out.stats.target_forwards - 1 and program.fallbacks <= 2


SLOW = pytest.mark.slow  # ~20-30 s each on one core: the default run keeps one config per tree kind


@pytest.mark.parametrize(
    ("tree", "config"),
    [
        ("chain:3", "T0.8-topk5-topp0.9"),
        ("dynamic:depth=3,top_k=3,total_tokens=8", "T1"),
        pytest.param("static", "T0.8-topk5-topp0.9", marks=SLOW),
        pytest.param("static", "T1", marks=SLOW),
        pytest.param("chain:3", "T1", marks=SLOW),
        pytest.param("dynamic:depth=3,top_k=3,total_tokens=8", "T0.8-topk5-topp0.9", marks=SLOW),
    ],
)
def test_sampling_inside_the_program_preserves_the_targets_distribution(tree, config, monkeypatch):
    """Exact sampling inside the program (a static tree's children drawn from q, a dynamic tree's
    deterministic; tree rejection sampling; its uniforms drawn before it): 12,000 copies of one
    prompt as ONE batch, whose first rounds all run as the program at B = 12,000 (no row ends
    before its second round); the first three tokens' joint against the warped target's, by
    enumeration (test_sampling_exactness)."""
    target = small_vocab_target()
    head = build_head(HeadSpec(kind="eagle3", draft_vocab_size=0), target)
    assert program_pvalue(target, head, tree, config, monkeypatch) > ALPHA


def program_pvalue(target, heads, tree: str, config: str, monkeypatch) -> float:
    """12,000 copies of one prompt decoded as ONE batch with --compile, whose first rounds run as
    the program at B = 12,000: the first three tokens' chi-square p-value against the target's."""
    from headstart.inference import captured

    monkeypatch.setattr(captured, "CAPACITY_STEP", 32)  # 12,000 rows: a small buffer
    decoder = SpeculativeDecoder(target, heads, tree=tree, compile=True, compile_backend="aot_eager")
    # one token past what the prefill and a first round can commit: no row ends before round 2
    sampling = SamplingConfig(max_new_tokens=decoder.captured_round.path_width + 2, seed=7, **CONFIGS[config])
    out = decoder.generate([PROMPT] * 12_000, sampling=sampling, eos_token_id=None)
    assert decoder.captured_round.rounds >= 2 and out.stats.tau > 1.05  # drafts were accepted in it
    return joint_pvalue(target, out.token_ids, sampling)


def test_a_seeded_sampled_row_reads_ahead_as_at_once(tiny_root):
    """Under sampling the program reads ahead too (a row's own generator: what it draws past its
    stop is its own): a seeded row's tokens are the same read ahead or at once, a seed repeats,
    and another seed gives other tokens."""
    target = family_target(tiny_root, "llama")
    prompt = target.chat.user_prompt_ids(PROMPTS[0])
    decoder = SpeculativeDecoder(
        target, eagle3(target), tree="chain:3", compile=True, compile_backend="aot_eager"
    )
    sampling = SamplingConfig(max_new_tokens=40, temperature=0.9, top_k=20)
    outputs = []
    for flag, seed in ((False, 5), (True, 5), (True, 5), (True, 6)):
        rounds = decoder.captured_round.rounds
        engine = Engine(decoder, sampling, row_seeds=True, read_ahead=flag)
        job = Job(key=0, prompt=prompt, rule=StopRule(23), seed=seed)
        engine.add([job])
        while engine.live:
            engine.step()
        assert decoder.captured_round.rounds - rounds >= 3 and len(job.emitted) == 23
        outputs.append(job.emitted)
    assert outputs[0] == outputs[1] == outputs[2] != outputs[3]


@pytest.mark.parametrize(
    "family", ["llama", pytest.param("qwen3", marks=SLOW), pytest.param("gemma3_text", marks=SLOW)]
)
def test_dflash_blocks_run_as_the_program(tiny_root, family):
    """DFlash (full and draft vocabulary) inside the program: the observe adds the committed path
    to the head's context at its device-held column and runs the next block over it; exact,
    chain and static trees, and the steady rounds are program runs."""
    target = family_target(tiny_root, family)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = [generate_ref(target, ids, 30) for ids in prompts]
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    for vocab, tree in ((0, "chain:3"), (100, "static")):
        dflash = build_head(HeadSpec(kind="dflash", block_size=5, num_layers=1, draft_vocab_size=vocab), target,
                            token_counts=counts if vocab else None)  # fmt: skip
        decoder = SpeculativeDecoder(target, dflash, tree=tree, compile=True, compile_backend="aot_eager")
        out = decoder.generate(prompts, max_new_tokens=30, eos_token_id=None)
        assert out.token_ids == refs, (family, vocab)
        program = decoder.captured_round  # every round but those after a row left (fresh caches)
        assert program.rounds >= 6 and program.rounds + program.fallbacks == out.stats.target_forwards - 1


def test_the_programs_dflash_context_is_the_steps_context(tiny_root):
    """The block the program drafts over its context (the committed paths added at a device-held
    column, padding unseen) is the block the steps draft: one row decoded both ways, the
    same rounds and every block's logits equal."""
    target = family_target(tiny_root, "qwen3")
    prompt = target.chat.user_prompt_ids(PROMPTS[1])
    # a head with the target's own layer accepts drafts on this prompt (27 forwards for 40 tokens)
    spec = HeadSpec(kind="dflash", block_size=5, num_layers=1, init_layers="target", feature_layers=[0])
    dflash = build_head(spec, target)
    runs = {}
    for program in (True, False):
        decoder = SpeculativeDecoder(target, dflash, tree="static", compile=True, compile_backend="aot_eager")
        if not program:
            decoder.captured_round = None
        engine = Engine(decoder, SamplingConfig(max_new_tokens=40))
        job = Job(key=0, prompt=prompt, rule=StopRule(40))
        engine.add([job])
        blocks = []
        while engine.live:
            engine.step()
            if engine.live:
                blocks.append(engine.drafter._logits)  # the next round's block, drafted in this one
        runs[program] = (job.emitted, engine.target_forwards, torch.stack(blocks))
        assert program is False or decoder.captured_round.rounds >= 10
    assert runs[True][0] == runs[False][0] == generate_ref(target, prompt, 40)
    assert runs[True][1] == runs[False][1] < 39  # drafts accepted, in the same rounds
    torch.testing.assert_close(runs[True][2], runs[False][2], rtol=1e-4, atol=1e-4)

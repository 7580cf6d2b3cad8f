"""Draft models (headstart/drafts.py): a separate causal LM and the target's own early exit draft
for the one tree verifier. Greedy output equals the target's `generate` token for token (every
family of the suite, batched with left padding, chains and trees); sampling keeps the target's
distribution (the chi-square test of test_sampling_exactness); bad pairs are refused in one line."""

from __future__ import annotations

import pytest
import torch
from test_greedy_exactness import PROMPTS, reference
from test_sampling_exactness import ALPHA, CONFIGS, run_check, small_vocab_target
from tiny import FAMILIES, make_target_dir

from headstart.drafts import DraftModel, early_exit, load_draft_model
from headstart.errors import HeadstartError
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.drafters.draft_model import DraftModelDrafter
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


@pytest.fixture(scope="module")
def sibling(tiny_root, target, tiny_llama):
    """A separate model directory sharing the target's tokenizer: the target cut to its first layer
    and saved (what a truncated, later fine-tuned, copy starts as), so its drafts get accepted."""
    from transformers import AutoTokenizer

    path = tiny_root / "sibling-1-layer"
    if not (path / "config.json").is_file():
        early_exit(target, 1).model.save_pretrained(path)
        AutoTokenizer.from_pretrained(str(tiny_llama)).save_pretrained(path)
    return path


def _check_greedy(target, draft, tree: str, max_new: int = 24) -> SpeculativeDecoder:
    decoder = SpeculativeDecoder(target, draft, tree=tree)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    out = decoder.generate(prompts, max_new_tokens=max_new, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, max_new, eos=False)
    assert out.stats.tau > 1.0  # drafts were accepted: the speculative path ran
    return decoder


@pytest.mark.parametrize("tree", TREES)
def test_separate_draft_model_is_exact(target, sibling, tree):
    _check_greedy(target, load_draft_model(str(sibling), target), tree)


@pytest.mark.parametrize("tree", TREES)
def test_early_exit_is_exact(target, tree):
    _check_greedy(target, early_exit(target, 1), tree)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_early_exit_is_exact_on_every_family(tiny_root, family):
    """Every family of the suite (sliding windows, MoE, softcaps, no-RoPE layers): its first layer
    as the draft, batched, greedy, identical to generate."""
    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    draft = early_exit(target, 1)
    assert len(draft.model.get_decoder().layers) == 1 and draft.model.config.num_hidden_layers == 1
    assert target.model.config.num_hidden_layers > 1  # the target is untouched
    decoder = SpeculativeDecoder(target, draft, tree="chain:3")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]]
    out = decoder.generate(prompts, max_new_tokens=16, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, 16, eos=False)
    # the drafter's logits are the draft model's own (Gemma's soft-cap, Cohere's scale included);
    # checked on a draft keeping its own cache (early exit reads the target's: below)
    drafter = DraftModelDrafter(DraftModel(draft.model, "cut", pack_model=target.model), target.vocab_size)
    ids = torch.tensor([prompts[0]])
    steps = ids.shape[1] - 1
    drafter.start(ids[:, 0])
    drafter.observe(None, {}, ids[:, 1:], torch.arange(steps)[None], torch.ones(1, steps, dtype=torch.bool),
                    torch.tensor([steps - 1]))  # fmt: skip
    expected = draft.model(ids).logits[0, -1].float()
    assert torch.allclose(drafter.root_logits()[0], expected, atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_early_exit_reads_the_targets_cache_and_drafts_as_its_own_would(tiny_root, family, monkeypatch):
    """Early exit keeps no cache: its layers' entries for committed tokens are the target's
    (OverTarget reads them), so `observe` runs nothing and each draft runs the root and the
    tree's nodes only. Its drafts are the same as the same layers keeping a cache of their own
    (the same tau, step by step), on every family (sliding windows, no-RoPE layers, soft-caps),
    batched and left-padded; replies identical to generate."""
    from headstart.drafts import truncated

    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:3]]
    runs, tokens = {}, []
    real = DraftModelDrafter._forward
    monkeypatch.setattr(
        DraftModelDrafter, "_forward", lambda self, t, *a: tokens.append(t.numel()) or real(self, t, *a)
    )
    k = target.num_layers - 1  # the deepest exit: drafts a random tiny target accepts
    for name, draft in (("shared", early_exit(target, k)),
                        ("own", DraftModel(truncated(target.model, k), "cut", pack_model=target.model))):  # fmt: skip
        tokens.clear()
        out = SpeculativeDecoder(target, draft, tree="chain:3").generate(
            prompts, max_new_tokens=16, eos_token_id=None
        )
        for ids, got in zip(prompts, out.token_ids, strict=True):
            assert got == reference(target, ids, 16, eos=False), name
        runs[name] = (out.stats.tau, sum(tokens))
    assert runs["shared"][0] == runs["own"][0], runs
    assert runs["shared"][0] > 1.0 or family == "olmo2", runs  # olmo2's tiny random layers: none accepted
    assert runs["shared"][1] < runs["own"][1]  # no forward over the prompts and committed tokens


def test_early_exit_shares_the_targets_weights(target):
    draft = early_exit(target, 1)
    ours = {id(p) for p in draft.model.parameters()}
    assert ours <= {id(p) for p in target.model.parameters()}
    assert draft.model.lm_head is target.model.lm_head


def test_the_draft_reads_the_prompts_first_token(target, sibling, monkeypatch):
    """After each prefill (the engine groups prompts; a group may be left-padded) the draft's root
    logits equal the draft model's own logits over prompt + the target's first token: its cache
    holds every prompt token, the first included, at its position."""
    draft = load_draft_model(str(sibling), target)
    decoder = SpeculativeDecoder(target, draft, tree="chain:2")
    seen = []
    original = SpeculativeDecoder.prefill

    def prefill(self, prompts_, sampling, drafter, prefix=None, abort=None, generator=None):
        state = original(self, prompts_, sampling, drafter, prefix, abort, generator)
        rows = [row[m].tolist() for row, m in zip(prompts_.host_ids, prompts_.host_valid, strict=True)]
        seen.append((rows, state.root.clone(), drafter.root_logits().clone()))
        return state

    monkeypatch.setattr(SpeculativeDecoder, "prefill", prefill)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    decoder.generate(prompts, max_new_tokens=2, eos_token_id=None)
    checked = 0
    for rows, roots, logits in seen:
        for row, ids in enumerate(rows):
            expected = draft.model(torch.tensor([[*ids, int(roots[row])]])).logits[0, -1]
            assert torch.allclose(logits[row], expected, atol=1e-4)
            checked += 1
    assert checked == len(PROMPTS)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("tree", ["chain:2", "dynamic:depth=3,top_k=3,total_tokens=8"])
def test_sampling_with_a_draft_model_preserves_target_distribution(config, tree):
    target = small_vocab_target()
    other = small_vocab_target(seed=3)  # a different random model over the same 12 tokens
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    assert run_check(target, DraftModel(other.model, "other"), tree, sampling, samples=12_000) > ALPHA


def test_sampling_with_early_exit_preserves_target_distribution():
    target = small_vocab_target()
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS["T1"])
    assert run_check(target, early_exit(target, 1), "chain:2", sampling, samples=12_000) > ALPHA


def test_the_speculator_takes_a_draft_model(target, sibling):
    speculator = load_speculator(target, draft_model="early-exit:1")
    assert speculator.tree.text == "chain:4" and "early exit after layer 1" in speculator.mode
    with pytest.raises(HeadstartError, match="cannot be combined with --heads"):
        load_speculator(target, heads="x", draft_model=str(sibling))


@pytest.mark.parametrize("spec", ["early-exit:0", "early-exit:2", "early-exit:x", " "])
def test_bad_early_exit_is_refused(target, spec):
    with pytest.raises(HeadstartError) as err:
        load_draft_model(spec, target)
    assert "\n" not in err.value.what


def test_a_draft_with_another_vocabulary_is_refused(target, tiny_root):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    path = tiny_root / "other-vocab"
    if not path.is_dir():
        vocab = {chr(97 + i): i for i in range(20)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="a"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        AutoModelForCausalLM.from_pretrained(str(make_target_dir(tiny_root, "llama", seed=5, num_hidden_layers=1,
                                                                 hidden_size=32, intermediate_size=64))).save_pretrained(path)  # fmt: skip
        PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    with pytest.raises(HeadstartError, match="another vocabulary than the target"):
        load_draft_model(str(path), target)


def test_a_draft_not_smaller_than_the_target_needs_the_flag(target, tiny_llama, caplog):
    with pytest.raises(HeadstartError, match="is not smaller than the target"):
        load_draft_model(str(tiny_llama), target)
    draft = load_draft_model(str(tiny_llama), target, allow_larger=True)
    assert "not smaller" in caplog.text
    _check_greedy(target, draft, "chain:3", max_new=8)


def test_a_missing_draft_model_says_so(target, tmp_path):
    with pytest.raises(HeadstartError, match="draft model"):
        load_draft_model(str(tmp_path / "nothing-here"), target)


@pytest.mark.parametrize("which", ["sibling", "early-exit"])
def test_a_draft_model_through_the_captured_verify(target, sibling, which):
    """--compile: a separate draft model's rounds run as the round program; early exit's verify as
    the captured graph, the draft eagerly over the captured verify's own cache buffers; exact."""
    draft = load_draft_model(str(sibling), target) if which == "sibling" else early_exit(target, 1)
    decoder = SpeculativeDecoder(target, draft, tree="chain:3", compile=True, compile_backend="aot_eager")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]]
    out = decoder.generate(prompts, max_new_tokens=16, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, 16, eos=False)
    ran = decoder.captured_round.rounds if which == "sibling" else decoder.captured.steps
    assert ran >= 1 and out.stats.tau > 1.0


def test_a_draft_model_head_starts_from_a_sibling(target, sibling, tiny_llama, tmp_path):
    """head.draft_from: the draft_model kind starts as a separate model (the sibling-pair recipe's
    Llama-3.2-1B for Llama-3.1-8B), its own tensors, recorded in the checkpoint; it then drafts
    exactly. Not a sibling (another kind, a model not smaller) is refused in one line."""
    from transformers import AutoModelForCausalLM

    from headstart.heads import HeadSpec, build_head, load_heads

    head = build_head(HeadSpec(kind="draft_model", draft_from=str(sibling)), target)
    assert head.config.draft_from == str(sibling.resolve()) and head.config.num_layers == 1
    assert head.config.portable().draft_from == sibling.name  # no local path leaves the machine
    theirs = AutoModelForCausalLM.from_pretrained(sibling).state_dict()
    for name, tensor in head.model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    head.save_pretrained(tmp_path / "from-sibling")
    loaded = load_heads(tmp_path / "from-sibling", target)
    assert "started from" in loaded.describe
    _check_greedy(target, loaded, "chain:3")
    with pytest.raises(HeadstartError, match="not smaller than the target"):
        build_head(HeadSpec(kind="draft_model", draft_from=str(tiny_llama)), target)
    with pytest.raises(HeadstartError, match="a sibling brings its own depth"):
        build_head(HeadSpec(kind="draft_model", draft_from=str(sibling), num_layers=2), target)
    with pytest.raises(HeadstartError, match="head.draft_from is an option of draft_model"):
        HeadSpec(kind="eagle3", draft_from=str(sibling))


@pytest.fixture(scope="module")
def broken_drafts(tiny_root, tiny_llama):
    """Draft folders a user might pass by mistake (issue 67): the target's tokenizer with 1,000
    output rows; a model without tokenizer files; a model with no layers."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tiny_root / "broken-drafts"
    made = {}
    for name, overrides in (("rows", dict(vocab_size=1000)), ("notokenizer", {}), ("nolayers", {})):
        path = root / name
        made[name] = path
        if (path / "config.json").is_file():
            continue
        source = make_target_dir(root / "src", "llama", seed=7, num_hidden_layers=1, hidden_size=32,
                                 intermediate_size=64, **overrides)  # fmt: skip
        model = AutoModelForCausalLM.from_pretrained(str(source))
        if name == "nolayers":
            model.config.num_hidden_layers = 0
        model.save_pretrained(path)
        if name != "notokenizer":
            AutoTokenizer.from_pretrained(str(tiny_llama)).save_pretrained(path)
        shutil.rmtree(root / "src")
    return made


BROKEN = {"rows": "has 1000 output rows, the target 288", "notokenizer": "holds no tokenizer files",
          "nolayers": "has no decoder layers"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_draft_model_is_refused_when_loaded(target, broken_drafts, name):
    with pytest.raises(HeadstartError) as err:
        load_draft_model(str(broken_drafts[name]), target)
    assert BROKEN[name] in err.value.what and "\n" not in err.value.one_line()


@pytest.mark.parametrize("command", ["generate", "tune", "bench", "serve"])
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_every_command_refuses_a_broken_draft_model_in_one_line(tiny_llama, broken_drafts, tmp_path, capsys,
                                                                name, command):  # fmt: skip
    """generate, tune, bench and serve (which then does not start) give the line training gives."""
    from headstart.cli import main

    draft, target = str(broken_drafts[name]), str(tiny_llama)
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\n')
    args = {
        "generate": ["generate", "--target", target, "--draft-model", draft, "--prompt", "hi", "--max-new-tokens", "4"],
        "tune": ["tune", "--target", target, "--draft-model", draft, "--limit", "1", "--max-new-tokens", "4",
                 "--dry-run"],
        "bench": ["bench", "--target", target, "--draft-model", draft, "--questions", str(questions), "--limit",
                  "1", "--max-new-tokens", "4", "--output", str(tmp_path / "bench")],
        "serve": ["serve", "--target", target, "--draft-model", draft, "--port", "0"],
    }[command]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert BROKEN[name] in err and "Traceback" not in err and len(err.strip().splitlines()) >= 1
    assert err.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize(
    "tree", ["chain:3", "[[0],[1],[0,0],[0,1],[0,0,0]]", "dynamic:depth=3,top_k=2,total_tokens=6"]
)
def test_a_separate_draft_model_runs_inside_the_round_program(target, sibling, tree):
    """--compile: the draft model's observe and every level's forward run inside the round program
    (one compiled call a round, from the first round on; a row leaving costs one eager round), and
    the output is generate's."""
    draft = load_draft_model(str(sibling), target)
    decoder = SpeculativeDecoder(target, draft, tree=tree, compile=True, compile_backend="aot_eager")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    out = decoder.generate(prompts, max_new_tokens=24, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, 24, eos=False)
    assert out.stats.tau > 1.0
    assert decoder.captured_round.rounds >= 6 and decoder.captured_round.fallbacks < len(prompts)
    # the program drafts what the steps draft: the same rounds, accepted lengths and all (a
    # draft that went wrong inside it would still be exact, with fewer tokens accepted)
    steps = SpeculativeDecoder(target, draft, tree=tree, compile=True, compile_backend="aot_eager")
    steps.captured_round = None
    again = steps.generate(prompts, max_new_tokens=24, eos_token_id=None)
    assert again.token_ids == out.token_ids and again.stats.per_row_steps == out.stats.per_row_steps
    assert again.stats.accept_lengths == out.stats.accept_lengths


def test_early_exit_keeps_its_rounds_in_the_steps_under_compile(target):
    """Early exit reads the target's own cache: no round program for it, the compiled steps run."""
    decoder = SpeculativeDecoder(
        target, early_exit(target, 1), tree="chain:2", compile=True, compile_backend="aot_eager"
    )
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:2]]
    out = decoder.generate(prompts, max_new_tokens=12, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, 12, eos=False)
    assert decoder.captured_round is None and decoder.captured.steps > 0


FAMILY_SET = ["llama", "qwen3", "gemma3_text", "mistral", "phi3", "olmo2", "gpt_oss", "qwen3_moe"]


@pytest.mark.parametrize(
    "family",
    [f if f in ("llama", "gemma3_text") else pytest.param(f, marks=pytest.mark.slow) for f in FAMILY_SET],
)
def test_a_draft_model_in_the_round_program_is_exact_on_every_family(tiny_root, family):
    """The program's draft-model forwards on each family (sliding windows, soft-caps, MoE): a
    truncated copy of the target keeping its own cache, batched and left-padded, identical to generate."""
    from headstart.drafts import truncated

    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    draft = DraftModel(truncated(target.model, target.num_layers - 1), "cut", pack_model=target.model)
    decoder = SpeculativeDecoder(target, draft, tree="chain:3", compile=True, compile_backend="aot_eager")
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:3]]
    out = decoder.generate(prompts, max_new_tokens=16, eos_token_id=None)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, 16, eos=False)
    # (tau: a random tiny family's truncated copy may have no draft accepted; the llama test above
    # checks long accepted paths)
    assert decoder.captured_round.rounds >= 4


@pytest.mark.parametrize(
    "tree",
    ["[[0],[1],[0,0],[0,1]]", pytest.param("dynamic:depth=3,top_k=3,total_tokens=8", marks=pytest.mark.slow)],
)
def test_sampling_with_a_draft_model_in_the_round_program_preserves_target_distribution(tree, monkeypatch):
    """12,000 copies of one prompt as ONE batch, whose first rounds run as the program at
    B = 12,000 (no row ends before its second round): the first three tokens' joint is the warped
    target's (chi-square, test_sampling_exactness), for a static tree (children drawn from q inside
    the program) and a dynamic one."""
    from test_captured_round import program_pvalue

    target = small_vocab_target()
    draft = DraftModel(small_vocab_target(seed=3).model, "other")  # another random model, same 12 tokens
    assert program_pvalue(target, draft, tree, "T0.8-topk5-topp0.9", monkeypatch) > ALPHA


def test_the_programs_draft_model_observes_what_the_steps_observe(target, sibling):
    """One row decoded with and without the round program in lockstep: after every round the
    draft model's root logits and the root's position are the eager steps' (a draft that went
    wrong inside the program would still be exact, only slower: the outputs cannot tell)."""
    from headstart.inference.engine import Engine, Job
    from headstart.inference.stops import StopRule

    ids = target.chat.user_prompt_ids(PROMPTS[1])
    draft = load_draft_model(str(sibling), target)
    engines = []
    for program in (True, False):
        decoder = SpeculativeDecoder(target, draft, tree="chain:3", compile=True, compile_backend="aot_eager")
        if not program:
            decoder.captured_round = None
        engine = Engine(decoder, SamplingConfig(max_new_tokens=20))
        engine.add([Job(key=0, prompt=ids, rule=StopRule(20))])
        engines.append(engine)
    for _ in range(5):
        for engine in engines:
            engine.step()
        ours, theirs = (engine.drafter for engine in engines)
        assert torch.equal(ours.root_pos, theirs.root_pos)
        torch.testing.assert_close(ours.root, theirs.root, rtol=1e-4, atol=1e-4)
    assert engines[0].decoder.captured_round.rounds == 5
    assert engines[0].jobs[0].emitted == engines[1].jobs[0].emitted

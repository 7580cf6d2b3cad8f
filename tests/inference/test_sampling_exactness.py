"""Speculative sampling preserves the target's distribution, end to end through the decoder.

A tiny target with a 12-token vocabulary; 12,000 copies of one prompt decoded as ONE batch give
12,000 independent samples of the first three new tokens. Their joint counts are compared with
the target's exact joint distribution (enumerated: p(t1) p(t2|t1) p(t3|t1,t2), warped the same
way) by Pearson's chi-square; the test fails when p < ALPHA, fixed up front. Seeds are fixed, so
the outcome is deterministic.
"""

from __future__ import annotations

import pytest
import torch
from chisq import chisquare_pvalue
from random_heads import RandomEagle, RandomMedusa
from tiny import make_tokenizer

from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.plain import SamplingConfig
from headstart.inference.sampling import probabilities
from headstart.targets import Chat, Target
from headstart.targets.layer_kinds import layer_kinds

VOCAB = 12
ALPHA = 1e-3
PROMPT = [1, 5, 7, 3, 9]


def small_vocab_target(seed: int = 0, family: str = "llama", **extra) -> Target:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(family, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  tie_word_embeddings=False, **{"attn_implementation": "sdpa", **extra})  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # moderately peaked conditionals, like a trained model
    tok = make_tokenizer()
    return Target(model=model, tokenizer=tok, chat=Chat(tok), spec="small-vocab", fingerprint={}, load_s=0.0)


def exact_joint(target: Target, sampling: SamplingConfig) -> torch.Tensor:
    """P(t1, t2, t3) (V, V, V) under the warped target, by enumeration."""
    model, v = target.model, VOCAB
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))  # (V*V, 2)
    ids = torch.cat([torch.tensor(PROMPT).expand(v * v, -1), pairs], dim=1).to(target.device)
    logits = model(ids).logits  # (V*V, T+2, V)
    n = len(PROMPT)
    p1 = probabilities(logits[0, n - 1], sampling)  # (V,)
    p2 = probabilities(logits[::v, n, :], sampling)  # (V, V): row t1
    p3 = probabilities(logits[:, n + 1], sampling).reshape(v, v, v)  # (t1, t2, V)
    return (p1[:, None, None] * p2[:, :, None] * p3).cpu()


def run_check(
    target: Target, heads, tree: str, sampling: SamplingConfig, samples: int, **decoder_args
) -> float:
    decoder = SpeculativeDecoder(target, heads, tree=tree, **decoder_args)
    out = decoder.generate([PROMPT] * samples, sampling=sampling, eos_token_id=None)
    tokens = torch.tensor(out.token_ids)  # (samples, 3)
    assert tokens.shape == (samples, 3)
    assert out.stats.tau > 1.05  # drafts do get accepted: the speculative path is exercised
    if decoder.captured is not None:  # every row's first verify ran through the compiled graph
        assert decoder.captured.steps >= 1
    return joint_pvalue(target, out.token_ids, sampling)


def joint_pvalue(target: Target, rows: list[list[int]], sampling: SamplingConfig) -> float:
    """The chi-square p-value of the rows' first three tokens against the warped target's joint
    (`exact_joint`, by enumeration)."""
    tokens = torch.tensor([ids[:3] for ids in rows])
    cells = (tokens[:, 0] * VOCAB + tokens[:, 1]) * VOCAB + tokens[:, 2]
    counts = torch.bincount(cells, minlength=VOCAB**3)
    return chisquare_pvalue(counts, exact_joint(target, sampling).flatten())


CONFIGS = {
    "T1": dict(temperature=1.0),
    "T0.8-topk5-topp0.9": dict(temperature=0.8, top_k=5, top_p=0.9),
}


@pytest.fixture(scope="module")
def target():
    return small_vocab_target()


@pytest.fixture(scope="module")
def cuda_target():
    """The same target on CUDA (fp32: the distribution test is about the sampler, not bf16)."""
    target = small_vocab_target()
    target.model.to("cuda")
    return target


# runs on every device: "cuda" only where one exists, marked gpu (`pytest -m gpu` on a GPU machine)
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
    ),
]


@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("device", DEVICES)
def test_sampling_preserves_target_distribution(request, target, tree, config, device):
    if device != "cpu":
        target = request.getfixturevalue("cuda_target")
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    heads = RandomEagle(target.model, seed=1).to(target.device)
    assert run_check(target, heads, tree, sampling, samples=12_000) > ALPHA


@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampling_through_the_captured_verify_preserves_target_distribution(
    target, tree, config, monkeypatch
):
    """--compile: the verify as a compiled graph over a fixed buffer samples the target's
    distribution (every row's first verify runs captured; once rows have left the batch, the
    rest run eagerly, as designed)."""
    from headstart.inference import captured

    monkeypatch.setattr(captured, "CAPACITY_STEP", 32)  # 12,000 rows: a small buffer
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    heads = RandomEagle(target.model, seed=1)
    decoder_args = dict(compile=True, compile_backend="aot_eager")
    assert run_check(target, heads, tree, sampling, samples=12_000, **decoder_args) > ALPHA


MIXED = ["full_attention", "sliding_attention"]
WINDOWED = {  # windows of 3 slide inside the 8 tokens sampled over (5 prompt + 3 new)
    "qwen2-mixed": ("qwen2", dict(use_sliding_window=True, sliding_window=3, max_window_layers=1), MIXED),
    "mistral-sliding": ("mistral", dict(sliding_window=3), ["sliding_attention"] * 2),
    "gemma2-softcap-eager": ("gemma2", dict(sliding_window=3, head_dim=8, attn_implementation="eager"), None),
    "gpt_oss-sinks-moe": (
        "gpt_oss",
        dict(
            sliding_window=3,
            head_dim=8,
            layer_types=MIXED,
            num_local_experts=4,
            num_experts_per_tok=2,
            attn_implementation="eager",
        ),
        MIXED,
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(WINDOWED))
def test_sampling_over_a_sliding_window_preserves_target_distribution(case):
    """Sliding and mixed targets (soft-capping, sinks and MoE routing among them) whose window
    slides inside the sampled tokens: tree verification with windowed masks keeps the distribution."""
    family, extra, kinds = WINDOWED[case]
    target = small_vocab_target(family=family, **extra)
    if kinds is not None:
        assert list(layer_kinds(target.model).kinds) == kinds
    sampling = SamplingConfig(max_new_tokens=3, seed=7, temperature=1.0)
    heads = RandomEagle(target.model, seed=1)
    assert (
        run_check(target, heads, "dynamic:depth=3,top_k=3,total_tokens=8", sampling, samples=12_000) > ALPHA
    )


@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampling_with_a_lookup_branch_preserves_target_distribution(target, config):
    """Looked-up tokens join the root's top-k drafts as one-point proposals. 100,000 samples: the
    branch adds only ~0.02 to tau here (1.117 against 1.100 without it), so a bias it caused would
    be small and need the larger sample to show (at 12,000 samples one seed gave p = 8e-4; at 100,000 three seeds gave
    0.09, 0.07 and 0.84, no sign of bias)."""
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    heads = RandomEagle(target.model, seed=1)
    tree = "dynamic:depth=2,top_k=2,total_tokens=3+lookup:2"
    assert run_check(target, heads, tree, sampling, samples=100_000) > ALPHA


@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampling_with_a_medusa_draft_vocabulary_preserves_target_distribution(target, config):
    """Medusa heads drafting over 8 of the 12 tokens: q is 0 outside the draft vocabulary, and
    the acceptance rule sees exactly that q."""
    from headstart.heads import HeadSpec, build_head

    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    counts = torch.arange(VOCAB, dtype=torch.float64).flip(0)  # tokens 0..7 are the most frequent
    heads = build_head(HeadSpec(kind="medusa", num_heads=2, draft_vocab_size=8), target, token_counts=counts)
    torch.manual_seed(3)
    for block in heads.heads:
        block[0].linear.weight.data.normal_(0, 0.5)
    assert heads.draft_ids().tolist() == list(range(8))
    assert run_check(target, heads, "static", sampling, samples=12_000) > ALPHA


@pytest.mark.parametrize(
    ("tree", "vocab"), [("static", 0), ("dynamic:depth=3,top_k=3,total_tokens=8", 0), ("static", 8)]
)
def test_sampling_with_a_dflash_block_preserves_target_distribution(target, tree, vocab):
    """A DFlash block's per-depth distributions as the tree's proposals (static: drawn without
    replacement per depth; dynamic: top-k one-point proposals), also over a draft vocabulary of 8
    of the 12 tokens."""
    from headstart.heads import HeadSpec, build_head

    sampling = SamplingConfig(max_new_tokens=3, seed=7, temperature=1.0)
    counts = torch.arange(VOCAB, dtype=torch.float64).flip(0)
    spec = HeadSpec(kind="dflash", block_size=4, num_layers=1, draft_vocab_size=vocab)
    heads = build_head(spec, target, token_counts=counts)
    assert run_check(target, heads, tree, sampling, samples=12_000) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8"])
def test_sampling_preserves_target_distribution_heavy(target, kind, tree):
    sampling = SamplingConfig(max_new_tokens=3, seed=11, temperature=0.7, top_k=8, top_p=0.95)
    if kind == "medusa":
        heads = RandomMedusa(32, VOCAB, num_heads=3, seed=2)
    else:
        heads = RandomEagle(
            target.model,
            seed=2,
            draft_vocab=8 if kind == "eagle3" else None,
            layers=(0, 1) if kind == "eagle3" else (),
        )
    assert run_check(target, heads, tree, sampling, samples=100_000) > ALPHA


def test_the_check_has_power_against_a_wrong_residual(target, monkeypatch):
    """Negative control: drawing the bonus from p instead of the residual max(p - q, 0) must fail."""
    from headstart.inference import verify

    monkeypatch.setattr(verify, "_renormalise", lambda x, fallback: fallback)
    sampling = SamplingConfig(max_new_tokens=3, seed=7, temperature=1.0)
    assert run_check(target, RandomEagle(target.model, seed=1), "static", sampling, samples=12_000) < ALPHA

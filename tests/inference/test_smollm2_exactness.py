"""SLOW: on SmolLM2-135M, greedy speculative decoding equals `model.generate(do_sample=False)`
token for token on 20 MT-bench first turns, for every head kind and tree kind (static, dynamic, a
lookup branch), batch 1 and batch 4. Uses trained heads found under runs/ (a head directory holds
config.json with a headstart kind + model.safetensors) or, for kinds without trained heads, fresh
untrained heads: exactness must hold whatever the draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT.parent / "shared" / "data" / "eval" / "mt_bench" / "question.jsonl"
PROMPTS, MAX_NEW = 20, 32


def trained_heads(kind: str) -> Path | None:
    """The newest trained head directory of `kind` under runs/, if any."""
    found = []
    for config in (ROOT / "runs").glob("**/config.json"):
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        if data.get("kind") == kind and (config.parent / "model.safetensors").is_file():
            found.append(config.parent)
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@pytest.fixture(scope="module")
def smollm2():
    from headstart.targets import load_target

    return load_target("smollm2")


@pytest.fixture(scope="module")
def references(smollm2):
    if not QUESTIONS.is_file():
        pytest.skip(f"{QUESTIONS} not found")
    questions = [json.loads(line) for line in QUESTIONS.read_text().splitlines()[:PROMPTS]]
    prompts = [smollm2.chat.user_prompt_ids(q["turns"][0]) for q in questions]
    refs = []
    for ids in prompts:
        x = torch.tensor([ids])
        out = smollm2.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW, do_sample=False,
                                     eos_token_id=list(smollm2.eos_token_ids), pad_token_id=smollm2.tokenizer.pad_token_id)  # fmt: skip
        refs.append(out[0, len(ids) :].tolist())
    return prompts, refs


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("tree", ["static", "dynamic", "[[0],[0,0],[1]]+lookup:4"])
def test_smollm2_greedy_is_exact(smollm2, references, kind, tree):
    from headstart.heads import HeadSpec, build_head, load_heads
    from headstart.inference.decoder import SpeculativeDecoder

    path = trained_heads(kind)
    heads = load_heads(path, smollm2) if path else build_head(HeadSpec(kind=kind), smollm2)
    decoder = SpeculativeDecoder(smollm2, heads.eval(), tree=tree)
    prompts, refs = references
    for i, (ids, ref) in enumerate(zip(prompts, refs, strict=True)):
        assert decoder.generate(ids, max_new_tokens=MAX_NEW).token_ids[0] == ref, f"prompt {i}"
    batched = decoder.generate(prompts[:4], max_new_tokens=MAX_NEW)
    assert batched.token_ids == refs[:4]

"""The heads shipped in the package for the embedded SmolLM2 target."""

from __future__ import annotations

import json

import pytest

from headstart.heads.defaults import DEFAULT_HEADS_DIR, default_heads, shipped_heads

SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_shipped_heads_fit_the_embedded_target_and_the_size_cap():
    heads = shipped_heads("smollm2")
    assert set(heads) == {"smollm2-eagle3", "smollm2-medusa"}
    assert default_heads("smollm2") == heads["smollm2-eagle3"]  # EAGLE-3 preferred
    total = 0
    for path in heads.values():
        config = json.loads((path / "config.json").read_text())
        assert config["target"]["sha256"] == SMOLLM2_GGUF_SHA256
        assert (path / "README.md").is_file()
        total += sum(f.stat().st_size for f in path.iterdir())
    assert total <= 50 * 2**20


def test_no_shipped_heads_for_other_targets(tmp_path):
    assert shipped_heads(str(tmp_path)) == {} and default_heads("org/other") is None
    assert DEFAULT_HEADS_DIR.name == "default_heads"


@pytest.mark.slow
def test_shipped_heads_load_onto_smollm2_and_decode_exactly():
    import torch

    from headstart.heads import load_heads
    from headstart.inference.decoder import SpeculativeDecoder
    from headstart.targets import load_target

    target = load_target("smollm2")
    ids = target.chat.user_prompt_ids("Name three primary colours.")
    reference = target.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids) :]
    for path in shipped_heads("smollm2").values():
        out = SpeculativeDecoder(target, load_heads(path, target)).generate([ids], max_new_tokens=32)
        assert out.token_ids[0] == reference.tolist()

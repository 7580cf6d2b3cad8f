"""A drafter with nothing to train is a registered draft kind too (headstart.kinds.DraftKind):
one registration line, and `--draft-model NAME[:OPTIONS]` decodes with it through the one
engine, `headstart tune --draft-model NAME` compares its candidates, and bench measures it as a
baseline of its own, with no switch on its name anywhere else (tests/kinds/test_kind_names.py)."""

from __future__ import annotations

import pytest
import torch

from headstart import kinds
from headstart.errors import HeadstartError

LOADED: list[str] = []


def load_toy(target, spec, tree, greedy):
    """`toy-exit[:K]`: the target's first K layers drafting (1 by default), a chain of 2."""
    from headstart.drafts import early_exit
    from headstart.inference.trees.spec import choose_tree

    _, _, layers = spec.partition(":")
    if layers and not layers.isdigit():
        raise HeadstartError(f"bad toy-exit '{spec}'", "use toy-exit:K")
    LOADED.append(spec)
    choice = choose_tree(tree or "chain:2")
    return early_exit(target, int(layers or 1)), choice if greedy else choice.for_sampling()


def toy_candidates(target):
    return ["toy-exit:1", "toy-exit:2"]


def toy_default(target):
    return "toy-exit:1"


@pytest.fixture
def toy_draft_registered():
    kinds.register_draft(kinds.DraftKind("toy-exit", f"{__name__}:load_toy", f"{__name__}:toy_candidates", f"{__name__}:toy_default", "toy_exit"))  # the one line  # fmt: skip
    LOADED.clear()
    yield
    kinds.DRAFT_KINDS.pop("toy-exit", None)


def test_a_registered_draft_kind_decodes_exactly_by_name(toy_draft_registered, tiny_llama):
    from headstart.speculator import load_speculator
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    speculator = load_speculator(target, draft_model="toy-exit:2")
    assert LOADED == ["toy-exit:2"] and speculator.tree.text == "chain:2"
    prompts = [[1, 5, 9, 13], [1, 7, 3]]
    out = speculator.decoder.generate(prompts, max_new_tokens=10, eos_token_id=None)
    for prompt, got in zip(prompts, out.token_ids, strict=True):
        x = torch.tensor([prompt])
        ref = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=10, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
        assert got == ref
    with pytest.raises(HeadstartError, match="bad toy-exit 'toy-exit:x'"):
        load_speculator(target, draft_model="toy-exit:x")


def test_tune_and_bench_find_a_registered_draft_kind(toy_draft_registered, tiny_llama):
    from headstart.bench.runner import is_drafting
    from headstart.bench.session import baselines
    from headstart.bench.tune import draft_candidates
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    assert draft_candidates(target, "toy-exit") == ["toy-exit:1", "toy-exit:2"]
    assert draft_candidates(target, "toy-exit:2") == ["toy-exit:2"]  # a full spec is itself
    assert "toy_exit" in baselines() and is_drafting("toy_exit") and not is_drafting("plain")
    kinds.DRAFT_KINDS.pop("toy-exit")
    assert "toy_exit" not in baselines() and not is_drafting("toy_exit")

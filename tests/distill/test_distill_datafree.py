"""Data-free prompts: template prefix, the filter, dedupe, and the whole path on a tiny target."""

from __future__ import annotations

import pytest

from headstart.distill import DatafreeConfig, load_distilled, read_meta
from headstart.distill.datafree import PromptStats, dedupe_key, reject_reason, user_turn_prefix, write_prompts
from headstart.errors import HeadstartError
from headstart.targets import Chat


def test_user_turn_prefix_is_cut_at_the_user_content():
    from tiny import make_tokenizer

    chat = Chat(make_tokenizer())
    assert user_turn_prefix(chat) == "<|im_start|>user\n"
    assert user_turn_prefix(chat, system="S") == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n"


@pytest.mark.parametrize(
    ("text", "finished", "reason"),
    [
        ("How do I bake sourdough bread at home?", True, None),
        ("How do I bake sourdough bread at home?", False, "too long (no end of turn)"),
        ("Hi", True, "too short"),
        (
            "\u00b6\u00a7\u00a4 \u2592\u2593 \u2588\u2591\u2592 \u00bf\u00a8",
            True,
            "garbage (non-text characters)",
        ),
        ("what is \ufffd this thing here", True, "garbage (non-text characters)"),
        ("the cat sat the cat sat the cat sat the cat sat the cat sat", True, "repetitive"),
        ("Explain aaaaaaaaaaaaaaaaaaaaaaaaaaaa please now", True, "repetitive"),
    ],
)
def test_filter_reasons(text, finished, reason):
    assert reject_reason(text, finished, DatafreeConfig()) == reason


def test_dedupe_key_ignores_case_space_and_punctuation():
    assert dedupe_key("What is  AI?") == dedupe_key("what is ai") != dedupe_key("what is ml")


def test_write_prompts_counts_and_dedupes(distill_target):
    cfg = DatafreeConfig(filter=False, max_prompt_tokens=12, batch_size=4, max_attempts=3)
    stats = PromptStats()
    prompts = write_prompts(distill_target, 5, cfg, seed=1, stats=stats)
    assert 0 < len(prompts) <= 5 and len({dedupe_key(p) for p in prompts}) == len(prompts)
    assert stats.accepted == len(prompts) and stats.sampled == stats.accepted + sum(stats.rejected.values())
    # the full filter rejects the tiny random model's byte soup: a clear error, not an empty data set
    with pytest.raises(HeadstartError, match="no usable prompt"):
        write_prompts(
            distill_target, 2, DatafreeConfig(max_prompt_tokens=12, batch_size=4, max_attempts=2), seed=1
        )


def test_datafree_end_to_end_and_resume(distill_target, make_cfg):
    from headstart.distill.pipeline import run_distill

    cfg = make_cfg(num=3, datafree={"filter": False, "max_prompt_tokens": 12, "batch_size": 4})
    summary = run_distill(cfg, target=distill_target, quiet=True)
    assert summary["records_total"] == 3 and summary["datafree_prompts"]["accepted"] == 3
    data = load_distilled(cfg.out)
    assert len(data) == 3 and all(
        m[0]["role"] == "user" and m[1]["role"] == "assistant" for m in data["messages"]
    )
    assert read_meta(cfg.out)["settings"]["datafree"]["filter"] is False
    # more records later: the saved prompts are reused and topped up, nothing is regenerated
    again = run_distill(
        make_cfg(num=5, datafree={"filter": False, "max_prompt_tokens": 12, "batch_size": 4}),
        target=distill_target,
        quiet=True,
    )
    assert again["records_written"] == 2 and sorted(load_distilled(cfg.out)["index"]) == [0, 1, 2, 3, 4]

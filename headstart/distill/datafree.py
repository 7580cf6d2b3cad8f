"""Data-free prompts: the target writes the user turns itself, then answers them.

We render the chat template up to the START of a user turn (derived generically: render a
conversation whose user content is a sentinel and cut at the sentinel) and sample from the target
until it closes the turn. Candidates are filtered (unfinished/too long, too short, repetitive,
non-text garbage) and deduplicated on a normalised form.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from headstart.distill.config import DatafreeConfig
from headstart.distill.replies import Sampling, generate_batch
from headstart.errors import HeadstartError
from headstart.targets import Chat, Target

SENTINEL = "\u2063HEADSTART_SENTINEL\u2063"
PUNCTUATION = set(".,;:!?'\"()[]{}-_/\\%$&*+=<>@#`~|^\u2019\u201c\u201d\u2013\u2014")


def user_turn_prefix(
    chat: Chat, system: str | None = None, history: list[dict[str, str]] | None = None
) -> str:
    """The template's text right before a user message's content (system turn included), after
    `history` when given (a self-conversation's next turn; its system turn is history's)."""
    opening = (
        history
        if history is not None
        else [{"role": "system", "content": system}]
        if system is not None
        else []
    )
    messages = [*opening, {"role": "user", "content": SENTINEL}]
    text = chat.render(messages, add_generation_prompt=False)
    if SENTINEL not in text:
        raise HeadstartError(
            "the chat template drops the user's message", "use a target with a standard chat template"
        )
    return text[: text.index(SENTINEL)]


def reject_reason(text: str, finished: bool, cfg: DatafreeConfig) -> str | None:
    """Why a candidate prompt is rejected (None = keep)."""
    if not finished:
        return "too long (no end of turn)"
    words = text.split()
    if len(words) < cfg.min_words:
        return "too short"
    texty = sum(ch.isalnum() or ch.isspace() or ch in PUNCTUATION for ch in text)
    if "\ufffd" in text or texty < cfg.min_text_ratio * len(text):
        return "garbage (non-text characters)"
    grams = list(zip(words, words[1:], words[2:], strict=False))
    if len(grams) >= 3 and 1 - len(set(grams)) / len(grams) > cfg.max_repeat_ratio:
        return "repetitive"
    if re.search(r"(.)\1{15,}", text):
        return "repetitive"
    return None


def dedupe_key(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


@dataclass
class PromptStats:
    sampled: int = 0
    batches: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)

    @property
    def rejection_rate(self) -> float:
        return 1 - self.accepted / self.sampled if self.sampled else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "sampled": self.sampled,
            "batches": self.batches,
            "accepted": self.accepted,
            "rejection_rate": round(self.rejection_rate, 4),
            "rejected": dict(self.rejected),
        }


def write_prompts(
    target: Target,
    count: int,
    cfg: DatafreeConfig,
    *,
    system: str | None = None,
    seed: int = 0,
    existing: Iterable[str] = (),
    stats: PromptStats | None = None,
    on_batch: Callable[[list[str], PromptStats], None] | None = None,
) -> list[str]:
    """`count` new, filtered, deduplicated user prompts sampled from the target.

    Batches are seeded from `seed` and the number sampled so far, so a resumed run that passes its
    earlier `stats` continues the same random stream. `on_batch(new_prompts, stats)` lets the caller
    persist progress after every batch.
    """
    stats = stats or PromptStats()
    seen = {dedupe_key(p) for p in existing}
    prefix = target.tokenizer(user_turn_prefix(target.chat, system), add_special_tokens=False)["input_ids"]
    sampling = Sampling(max_new_tokens=cfg.max_prompt_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    budget = stats.sampled + cfg.max_attempts * count
    out: list[str] = []
    while len(out) < count and stats.sampled < budget:
        size = min(cfg.batch_size, budget - stats.sampled)
        replies = generate_batch(target, [prefix] * size, sampling, seed=seed * 1_000_003 + stats.batches)
        stats.batches += 1
        fresh: list[str] = []
        for reply in replies:
            if len(out) + len(fresh) >= count:
                break  # leftovers of the last batch are neither counted nor kept
            stats.sampled += 1
            text = target.tokenizer.decode(reply.token_ids, skip_special_tokens=True).strip()
            reason = (
                reject_reason(text, reply.finished, cfg) if cfg.filter else (None if text else "too short")
            )
            key = dedupe_key(text)
            if reason is None and key in seen:
                reason = "duplicate"
            if reason is not None:
                stats.rejected[reason] += 1
                continue
            seen.add(key)
            fresh.append(text)
        stats.accepted += len(fresh)
        out.extend(fresh)
        if on_batch is not None:
            on_batch(fresh, stats)
    if not out and count:
        raise HeadstartError(
            f"the target wrote no usable prompt in {stats.sampled} tries ({dict(stats.rejected)})",
            "pass --prompts FILE, or relax the filter (datafree.filter=false, datafree.min_text_ratio=...)",
        )
    return out

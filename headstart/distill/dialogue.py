"""One conversation being distilled: its user turns are asked one at a time, each after the
target's OWN earlier replies, and the finished conversation becomes a training record."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headstart.distill.config import DistillConfig
from headstart.distill.masks import assistant_spans, loss_mask
from headstart.distill.plan import Item
from headstart.inference.plain import SamplingConfig
from headstart.inference.requests import Reply, Request
from headstart.targets import Target


@dataclass
class Dialogue:
    item: Item
    cfg: DistillConfig
    target: Target
    history: list[dict[str, str]] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    generated: list[list[int]] = field(default_factory=list)
    turn: int = 0
    cut: bool = False  # a later turn was past --max-prompt-tokens: the conversation ends before it
    unanswered: bool = False  # --engine dataset: a turn without a reply in the data ended it

    def __post_init__(self) -> None:
        if self.item.system is not None:
            self.history = [{"role": "system", "content": self.item.system}]

    @property
    def turns(self) -> int:
        wanted = len(self.item.conversation.turns)
        return min(wanted, self.cfg.max_turns) if self.cfg.max_turns else wanted

    def next_request(self) -> Request | None:
        """The request for the next user turn, or None when the conversation is complete."""
        if self.turn >= self.turns:
            return None
        messages = self.history + [{"role": "user", "content": self.item.conversation.turns[self.turn]}]
        ids = self.target.chat.prompt_ids(messages)
        if len(ids) > self.cfg.max_prompt_tokens:  # earlier turns stay; the conversation ends here
            self.cut = True
            return None
        replies = self.item.conversation.replies
        reference = replies[self.turn] if self.turn < len(replies) else None
        if self.cfg.engine == "dataset" and reference is None:  # nothing to train on past here
            self.unanswered = True
            return None
        cfg = self.cfg
        sampling = SamplingConfig(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k)
        # Seeded by row and turn: a resumed run regenerates the same sampled reply.
        seed = cfg.seed * 1_000_003 + self.item.index * 131 + self.turn
        return Request(
            key=self, prompt=ids, sampling=sampling, seed=seed, messages=messages, reference=reference
        )

    def answer(self, reply: Reply) -> None:
        """Record the target's reply to the current turn."""
        text = self.target.tokenizer.decode(reply.token_ids, skip_special_tokens=True)
        self.history += [
            {"role": "user", "content": self.item.conversation.turns[self.turn]},
            {"role": "assistant", "content": text},
        ]
        self.finished.append(reply.finished)
        self.generated.append(reply.token_ids)
        self.turn += 1

    def record(self, engine: str) -> tuple[dict[str, Any], int]:
        """(the training record, replies whose stored ids differ from the generated ids)."""
        cfg, target = self.cfg, self.target
        ids, spans = assistant_spans(target.chat, self.history, target.eos_token_ids)
        mask = loss_mask(len(ids), spans)
        # The record holds the rendered conversation; flag replies whose decoded text re-encodes to
        # other ids than the target generated (non-canonical BPE splits, a reply cut mid-character).
        exact = [
            ids[b:e] == reply_ids + ids[e - 1 : e]
            for (b, e), reply_ids in zip(spans, self.generated, strict=True)
        ]
        settings = {
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "seed": cfg.seed,
            "system": cfg.system,
            "max_turns": cfg.max_turns,
            "engine": engine,
        }
        record = {
            "index": self.item.index,
            "key": self.item.conversation.key,
            "source_id": self.item.source_id,
            "messages": self.history,
            "input_ids": ids,
            "loss_mask": mask,
            "turns_finished": self.finished,
            "turns_exact": exact,
            "reply_tokens": sum(mask),
            "settings": settings,
            "fingerprint": target.fingerprint,
        }
        return record, exact.count(False)

"""One conversation being distilled: its user turns are asked one at a time, each after the
target's OWN earlier replies, and the finished conversation becomes a training record.

A self-conversation (`followups`): once the conversation's own turns are answered, the target
writes the next user turn itself (the chat template rendered up to a user message's content after
the history, sampled with the data-free settings until it closes the turn, filtered like a
data-free prompt), then answers it, `followups` times: histories of 1-2k tokens from one prompt.
A follow-up the filter rejects ends the conversation there (counted by reason).

A long-document task (`documents`, distill/documents.py): before the first turn the target writes
a document on it (not trained on), and that turn becomes the document followed by a task about it."""

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
    written: list[str] = field(default_factory=list)  # the user turns the target wrote (followups)
    writing: bool = False  # the request out is for the target's own next user turn
    rejected: str | None = None  # why a written follow-up was refused (it ended the conversation)
    document: str | None = None  # --documents: the text the target wrote on the first turn
    documenting: bool = False  # the request out is for that document

    def __post_init__(self) -> None:
        if self.item.system is not None:
            self.history = [{"role": "system", "content": self.item.system}]

    @property
    def turns(self) -> int:
        """The conversation's own user turns to answer (then `followups` the target writes)."""
        wanted = len(self.item.conversation.turns)
        return min(wanted, self.cfg.max_turns) if self.cfg.max_turns else wanted

    def user_turn(self) -> str | None:
        """The current user turn: the conversation's own, or one the target wrote; None past them."""
        if self.turn < self.turns:
            own = self.item.conversation.turns[self.turn]
            if self.turn == 0 and self.document:  # an empty document leaves the turn as it was
                from headstart.distill.documents import pick, with_document

                return with_document(self.document, pick(self.cfg.seed, self.item.index)[1])
            return own
        written = self.turn - self.turns
        return self.written[written] if written < len(self.written) else None

    def next_request(self) -> Request | None:
        """The request for the next user turn (or for the target to write it), or None when the
        conversation is complete."""
        if self.cfg.documents and self.document is None:
            return self._document_request()
        turn = self.user_turn()
        if turn is None:
            wanted = self.turn < self.turns + self.cfg.followups and self.rejected is None
            return self._writing_request() if wanted else None
        messages = self.history + [{"role": "user", "content": turn}]
        ids = self.target.chat.prompt_ids(messages)
        if len(ids) > self.cfg.max_prompt_tokens:  # earlier turns stay; the conversation ends here
            self.cut = True
            return None
        replies = self.item.conversation.replies
        reference = replies[self.turn] if self.turn < min(len(replies), self.turns) else None
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

    def _writing_request(self) -> Request | None:
        """The target's own next user turn: the template up to a user message's content after
        the history, sampled with the data-free settings (its own seed per row and turn)."""
        from headstart.distill.datafree import user_turn_prefix

        text = user_turn_prefix(self.target.chat, history=self.history)
        ids = self.target.tokenizer(text, add_special_tokens=False)["input_ids"]
        free = self.cfg.datafree
        if len(ids) + free.max_prompt_tokens > self.cfg.max_prompt_tokens:
            self.cut = True  # the follow-up and its answer would not fit
            return None
        self.writing = True
        sampling = SamplingConfig(free.max_prompt_tokens, free.temperature, free.top_p, 0)
        seed = self.cfg.seed * 1_000_003 + self.item.index * 131 + self.turn + 65_537
        return Request(key=self, prompt=ids, sampling=sampling, seed=seed)

    def _document_request(self) -> Request:
        """The target writes the row's document: its first turn as the subject, a genre picked
        by (seed, row), sampled with the data-free settings up to `documents` tokens."""
        from headstart.distill.documents import instruction, pick

        cfg = self.cfg
        genre = pick(cfg.seed, self.item.index)[0]
        ask = instruction(genre, self.item.conversation.turns[0], cfg.documents)
        ids = self.target.chat.prompt_ids(self.history + [{"role": "user", "content": ask}])
        self.documenting = True
        sampling = SamplingConfig(cfg.documents, cfg.datafree.temperature, cfg.datafree.top_p, 0)
        seed = cfg.seed * 1_000_003 + self.item.index * 131 + 2 * 65_537
        return Request(key=self, prompt=ids, sampling=sampling, seed=seed)

    def answer(self, reply: Reply) -> None:
        """Record the target's reply to the current turn, or the user turn or document it wrote."""
        text = self.target.tokenizer.decode(reply.token_ids, skip_special_tokens=True)
        if self.documenting:  # a document cut at --documents tokens is kept: a pasted text may end anywhere
            self.documenting, self.document = False, text.strip()
            return
        if self.writing:
            self._written(text.strip(), reply.finished)
            return
        turn = self.user_turn()
        assert turn is not None
        self.history += [
            {"role": "user", "content": turn},
            {"role": "assistant", "content": text},
        ]
        self.finished.append(reply.finished)
        self.generated.append(reply.token_ids)
        self.turn += 1

    def _written(self, text: str, finished: bool) -> None:
        """Keep a user turn the target wrote, or end the conversation with the filter's reason."""
        from headstart.distill.datafree import reject_reason

        self.writing = False
        free = self.cfg.datafree
        reason = reject_reason(text, finished, free) if free.filter else (None if text else "too short")
        if reason is None:
            self.written.append(text)
        else:
            self.rejected = reason  # the conversation ends with the turns it has

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
            **({"followups": cfg.followups, "followups_written": len(self.written)} if cfg.followups else {}),
            **({"documents": cfg.documents} if cfg.documents else {}),
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

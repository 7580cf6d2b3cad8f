"""`run_distill(cfg)`: prompts in, the target's own replies out, as resumable shards."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headstart.distill.config import DistillConfig
from headstart.distill.dialogue import Dialogue
from headstart.distill.engines import make_engine
from headstart.distill.features import check_feature_budget, compute_features, parse_feature_layers
from headstart.distill.plan import Item, make_plan
from headstart.distill.sources import describe_source
from headstart.distill.store import (
    META,
    ShardWriter,
    atomic_write_bytes,
    done_indices,
    forget_output,
    lock_output,
    open_output,
    shard_paths,
)
from headstart.errors import HeadstartError, Interrupted
from headstart.inference.requests import Reply, Request
from headstart.interrupts import stop_signals_interrupt
from headstart.outputs import check_output_dir
from headstart.targets import Target


@dataclass
class Summary:
    records_total: int = 0
    records_written: int = 0
    tokens: int = 0  # all tokens of the written records (prompt + replies, template included)
    generated_tokens: int = 0
    replies: int = 0
    truncated_replies: int = 0  # hit --max-new-tokens before the end-of-turn
    retokenized: int = 0  # replies whose stored ids differ from the generated ids (text round trip)
    wall_s: float = 0.0  # the whole run: target load, planning (data-free prompts), generation
    generation_s: float = 0.0  # the reply loop only: what the throughput numbers divide by
    skipped: Counter = field(default_factory=Counter)
    exhausted: bool = False
    datafree: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        gen = max(self.generation_s, 1e-9)
        return {
            "records_total": self.records_total,
            "records_written": self.records_written,
            "tokens": self.tokens,
            "generated_tokens": self.generated_tokens,
            "replies": self.replies,
            "mean_reply_tokens": round(self.generated_tokens / self.replies, 1) if self.replies else 0.0,
            "truncated_replies": self.truncated_replies,
            "retokenized_replies": self.retokenized,
            "replies_per_min": round(60 * self.replies / gen, 2),
            "generated_tokens_per_s": round(self.generated_tokens / gen, 2),
            "generation_s": round(self.generation_s, 2),
            "wall_s": round(self.wall_s, 2),
            "skipped": dict(self.skipped),
            "source_exhausted": self.exhausted,
            "datafree_prompts": self.datafree,
        }


def length_batches(items: list[Item], batch_size: int, window: int = 16) -> list[list[Item]]:
    """Batches in source order, except that items are sorted by prompt length within windows of
    `window` batches: left padding to the longest prompt of a batch otherwise wastes most of the
    prefill (ShareGPT prompts range from 5 to 1000 tokens). Deterministic for a given todo list.
    """
    batches = []
    span = batch_size * window
    for start in range(0, len(items), span):
        chunk = sorted(items[start : start + span], key=lambda it: it.prompt_tokens)
        batches += [chunk[at : at + batch_size] for at in range(0, len(chunk), batch_size)]
    return batches


def endpoint(cfg: DistillConfig) -> Any:
    """The openai engine's server (None for the other engines)."""
    if cfg.engine != "openai":
        return None
    from headstart.distill.api import Endpoint

    assert cfg.base_url and cfg.model  # DistillConfig refuses openai without them
    return Endpoint(cfg.base_url, cfg.model, cfg.api_key, cfg.concurrency, cfg.max_retries)


def run_distill(cfg: DistillConfig, target: Target | None = None, quiet: bool = False) -> dict[str, Any]:
    """Distill until `cfg.out` holds `cfg.num` records (resuming what is there); return the summary."""
    start = time.perf_counter()
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    check_output_dir(cfg.out, "--out")  # before the target loads
    if target is None:
        from headstart.targets import load_target

        # the openai engine's server runs the target: only its config and tokenizer are needed here
        weights = cfg.engine != "openai" or cfg.cache_features
        target = load_target(cfg.target, dtype=cfg.dtype, device=cfg.device, revision=cfg.revision,
                             chat_template=cfg.chat_template, weights=weights)  # fmt: skip
    context = getattr(target.config, "max_position_embeddings", None)
    if context and cfg.max_prompt_tokens + cfg.max_new_tokens > context:
        raise HeadstartError(
            f"--max-prompt-tokens {cfg.max_prompt_tokens} + --max-new-tokens {cfg.max_new_tokens} exceeds the target's context ({context})",
            f"lower them so that they sum to at most {context}",
        )
    names = parse_feature_layers(cfg.feature_layers, target.num_layers) if cfg.cache_features else None
    settings = cfg.identity() | {"prompts": describe_source(cfg.prompts) if cfg.prompts else None}
    out = Path(cfg.out)
    created, new_output = not out.exists(), not (out / META).is_file()
    open_output(cfg.out, {"fingerprint": target.fingerprint, "settings": settings, "feature_layers": names})
    lock = lock_output(cfg.out)  # released when the process exits (or below)
    failed = True
    try:
        with stop_signals_interrupt():  # SIGTERM keeps the finished records, as Ctrl-C does
            result = _distill(target, cfg, names, quiet, start)
        if new_output and not result["records_total"]:  # e.g. --engine dataset on rows without replies
            reasons = ", ".join(f"{k}: {v}" for k, v in result["skipped"].items()) or "no row answered"
            raise HeadstartError(
                f"no record written ({reasons})",
                "check --prompts and --engine (dataset needs rows with the assistant's replies)",
            )
        failed = False
        return result
    except KeyboardInterrupt:
        kept = len(done_indices(cfg.out)) if shard_paths(cfg.out) else 0
        raise Interrupted(
            f"distill interrupted: {kept} records kept in {cfg.out}", "rerun the same command to continue"
        ) from None
    finally:
        lock.close()
        if failed and new_output and not shard_paths(cfg.out):  # nothing written: leave no output
            forget_output(cfg.out, remove_dir=created)  # behind, so the same command can run again


def _distill(
    target: Target, cfg: DistillConfig, names: list[str] | None, quiet: bool, start: float
) -> dict[str, Any]:
    from tqdm.auto import tqdm

    done = done_indices(cfg.out)
    plan = make_plan(target, cfg, done, quiet)
    summary = Summary(skipped=plan.skipped, exhausted=plan.exhausted, datafree=plan.datafree)
    if names and plan.todo:
        _check_budget(target, cfg, plan.todo, names)
    writer = ShardWriter(cfg.out)
    engine = make_engine(cfg.engine, target, cfg.batch_size, endpoint(cfg))
    bar = tqdm(total=len(done) + len(plan.todo), initial=len(done), unit="rec", desc="distill", disable=quiet)
    out = _Records(target, cfg, names, summary, writer, bar, engine.name)
    gen_start = time.perf_counter()

    def requests() -> Iterator[Request]:
        # Length-sorted within windows (length_batches): rows in flight then have similar prompt
        # lengths, so padded prefills and the shared cache width waste little.
        for batch in length_batches(plan.todo, cfg.batch_size):
            for item in batch:
                dialogue = Dialogue(item, cfg, target)
                request = dialogue.next_request()
                if request is None:
                    out.finish(dialogue)
                else:
                    yield request

    def on_reply(request: Request, reply: Reply) -> list[Request] | None:
        dialogue = request.key
        dialogue.answer(reply)
        summary.generated_tokens += len(reply.token_ids) + int(reply.finished)
        summary.replies += 1
        summary.truncated_replies += int(not reply.finished)
        following = dialogue.next_request()
        if following is not None:
            return [following]
        out.finish(dialogue)
        bar.set_postfix(tok_s=f"{summary.generated_tokens / (time.perf_counter() - gen_start):.1f}")
        return None

    try:
        engine.run(requests(), on_reply)
    finally:
        # Finished records are complete: publish them even when interrupted (Ctrl-C, an error).
        out.publish()
        writer.flush()
        bar.close()
    summary.generation_s = time.perf_counter() - gen_start
    summary.records_written = writer.written
    summary.records_total = len(done) + writer.written
    summary.wall_s = time.perf_counter() - start
    result = summary.as_dict()
    atomic_write_bytes(Path(cfg.out) / "summary.json", json.dumps(result, indent=2).encode())
    return result


def _check_budget(target: Target, cfg: DistillConfig, todo: list[Any], names: list[str]) -> None:
    """Refuse before generating when the features of every reply at --max-new-tokens would pass
    --max-feature-gb."""
    turns = [i.conversation.turns[: cfg.max_turns or None] for i in todo]
    later = [t for conv in turns for t in conv[1:]]  # user turns after the first (not in prompt_tokens)
    later_tokens = (
        sum(len(ids) for ids in target.tokenizer(later, add_special_tokens=False)["input_ids"])
        if later
        else 0
    )
    # Every reply at --max-new-tokens, plus a few template tokens per turn: an upper bound
    # (the template's role headers are at most 8 tokens on every template we know).
    n_turns = sum(len(conv) for conv in turns) + cfg.followups * len(todo)
    tokens = (
        sum(i.prompt_tokens for i in todo)
        + later_tokens
        + n_turns * (cfg.max_new_tokens + 8)
        + len(later) * 8
        + cfg.followups * len(todo) * (cfg.datafree.max_prompt_tokens + 8)  # the user turns it writes
        + cfg.documents * len(todo)  # each first turn holds the document written on it
    )
    check_feature_budget(tokens, target.hidden_size, names, cfg.feature_dtype, cfg.max_feature_gb)


class _Records:
    """Finished conversations on their way out: records, their features computed a batch at a
    time, then the shard writer."""

    def __init__(self, target: Target, cfg: DistillConfig, names: list[str] | None, summary: Summary,
                 writer: ShardWriter, bar: Any, engine: str) -> None:  # fmt: skip
        self.target, self.cfg, self.names, self.summary = target, cfg, names, summary
        self.writer, self.bar, self.engine = writer, bar, engine
        self.ready: list[dict[str, Any]] = []  # finished records waiting for their features / the writer
        self.last_flush = time.perf_counter()

    def publish(self) -> None:
        """Hand the finished records (with their features, computed as one batch) to the writer,
        which publishes a shard each time it holds --shard-size of them (or after flush_seconds)."""
        cfg, ready, writer = self.cfg, self.ready, self.writer
        feats = (
            compute_features(self.target, [r["input_ids"] for r in ready], self.names, cfg.feature_dtype)
            if self.names and ready
            else None
        )
        for k in range(len(ready)):
            # out of `ready` before it is the writer's: a Ctrl-C in a flush below must not leave it
            # in both (the `finally` publishes `ready` again: the record was written twice). A
            # Ctrl-C between the two loses it instead, and a resumed run makes it again.
            record = ready.pop(0)
            writer.add(record, feats[k] if feats else None)
            self.summary.tokens += len(record["input_ids"])
            if len(writer) >= cfg.shard_size:
                writer.flush()
                self.last_flush = time.perf_counter()
        if time.perf_counter() - self.last_flush > cfg.flush_seconds:
            writer.flush()
            self.last_flush = time.perf_counter()

    def finish(self, dialogue: Dialogue) -> None:
        """A conversation is done: its record (if it has a reply) joins the batch to publish."""
        skipped = self.summary.skipped
        if dialogue.cut:
            skipped["later turns past --max-prompt-tokens (conversation cut)"] += 1
        if dialogue.rejected is not None:
            skipped[f"follow-up the target wrote rejected: {dialogue.rejected} (conversation ended)"] += 1
        if dialogue.unanswered:
            reason = (
                "turns without a reply in the data (conversation cut)"
                if dialogue.generated
                else "no reply in the data"
            )
            skipped[reason] += 1
        if not dialogue.generated:
            return
        record, retokenized = dialogue.record(self.engine)
        self.summary.retokenized += retokenized
        self.ready.append(record)
        self.bar.update(1)  # per record, as it finishes (features and shards follow in batches)
        # features are computed for a batch of records at once; without them, nothing waits
        if len(self.ready) >= (self.cfg.batch_size if self.names else 1):
            self.publish()

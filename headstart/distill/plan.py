"""What a distill run has to do: the ordered conversations still missing from the output.

Prompts are taken in the source's order and keyed by their row index, so a rerun of the same
command finds exactly the same work and skips what is already on disk. Data-free prompts are saved
to OUT/datafree_prompts.jsonl after every sampled batch, so they are written only once.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from headstart.distill.config import DistillConfig
from headstart.distill.datafree import PromptStats, write_prompts
from headstart.distill.shapes import Conversation, Skip, to_conversation
from headstart.distill.sources import BadRow, read_rows
from headstart.distill.store import DATAFREE_PROMPTS, DATAFREE_STATS, atomic_write_bytes
from headstart.errors import HeadstartError
from headstart.targets import Target


@dataclass
class Item:
    index: int  # row index in the source (the resume key)
    conversation: Conversation
    system: str | None  # the row's system message, else the configured one
    source_id: str | None
    prompt_tokens: int  # rendered first-turn prompt length


@dataclass
class Plan:
    todo: list[Item]
    already: int  # records already in the output
    skipped: Counter = field(default_factory=Counter)
    exhausted: bool = False  # the source ran out before `num` usable rows
    datafree: dict[str, object] | None = None


def first_turn_ids(target: Target, conv: Conversation, system: str | None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": conv.turns[0]}
    ]
    return target.chat.prompt_ids(messages)


def _source_conversations(
    cfg: DistillConfig, skipped: Counter
) -> Iterator[tuple[int, Conversation, str | None]]:
    assert cfg.prompts is not None
    for index, row in read_rows(cfg.prompts, cfg.split):
        if index < cfg.skip_rows:
            continue
        if isinstance(row, BadRow):
            skipped[row.reason] += 1
            continue
        try:
            conv = to_conversation(row, cfg.shape, cfg.field)
        except Skip as skip:
            skipped[skip.reason] += 1
            continue
        raw_id = row.get("id", row.get("question_id", row.get("task_id")))
        yield index, conv, None if raw_id is None else str(raw_id)


def datafree_prompts(
    target: Target, cfg: DistillConfig, quiet: bool = False
) -> tuple[list[str], PromptStats]:
    """The saved data-free prompts, topped up to `cfg.num` by sampling the target."""
    out = Path(cfg.out)
    path, stats_path = out / DATAFREE_PROMPTS, out / DATAFREE_STATS
    prompts = [json.loads(line)["prompt"] for line in path.open(encoding="utf-8")] if path.is_file() else []
    stats = PromptStats()
    if stats_path.is_file():
        saved = json.loads(stats_path.read_text())
        stats = PromptStats(
            sampled=saved["sampled"],
            batches=saved["batches"],
            accepted=saved["accepted"],
            rejected=Counter(saved["rejected"]),
        )
    missing = cfg.num - len(prompts)
    if missing <= 0:
        return prompts, stats
    from tqdm.auto import tqdm

    bar = tqdm(total=cfg.num, initial=len(prompts), unit="prompt", desc="data-free prompts", disable=quiet)

    def save(fresh: list[str], now: PromptStats) -> None:
        prompts.extend(fresh)
        # Rewrite both files whole (small) so prompts and the random stream position stay consistent.
        atomic_write_bytes(
            path, "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts).encode()
        )
        atomic_write_bytes(stats_path, json.dumps(now.as_dict() | {"rejected": dict(now.rejected)}).encode())
        bar.update(len(fresh))
        bar.set_postfix(rejected=f"{now.rejection_rate:.0%}")

    existing = list(prompts)
    try:
        write_prompts(
            target,
            missing,
            cfg.datafree,
            system=cfg.system,
            seed=cfg.seed,
            existing=existing,
            stats=stats,
            on_batch=save,
        )
    finally:
        bar.close()  # before any error line: it must not land on the bar's line
    return prompts, stats


def make_plan(target: Target, cfg: DistillConfig, done: dict[int, str | None], quiet: bool = False) -> Plan:
    """The items to generate, in order, until the output holds `cfg.num` records."""
    skipped: Counter = Counter()
    datafree = None
    if cfg.prompts is None:
        texts, stats = datafree_prompts(target, cfg, quiet)
        source = ((i, Conversation((p,)), None) for i, p in enumerate(texts))
        datafree = stats.as_dict()
    else:
        source = _source_conversations(cfg, skipped)
    plan = Plan(todo=[], already=len(done), skipped=skipped, datafree=datafree)
    wanted = cfg.num - len(done)
    for index, conv, source_id in source:
        if len(plan.todo) >= wanted:
            break
        if index in done:
            if done[index] not in (None, conv.key):
                raise HeadstartError(
                    f"{cfg.out} was distilled from a different {cfg.prompts}: row {index} is not the row it answered "
                    "(lines were edited, deleted or reordered)",
                    "restore the prompt file, or use a new --out (appending rows at the end is fine)",
                )
            continue
        system = conv.system if conv.system is not None else cfg.system
        length = len(first_turn_ids(target, conv, system))
        if length > cfg.max_prompt_tokens:
            skipped["too long for --max-prompt-tokens"] += 1
            continue
        if length < cfg.min_prompt_tokens:
            skipped["too short for --min-prompt-tokens"] += 1
            continue
        plan.todo.append(Item(index, conv, system, source_id, length))
    else:
        plan.exhausted = len(plan.todo) < wanted
    if cfg.prompts is not None and not plan.todo and not done and wanted > 0:
        reasons = ", ".join(f"{k}: {v}" for k, v in skipped.most_common()) or "no rows"
        raise HeadstartError(
            f"the prompt set {cfg.prompts} has no usable row ({reasons})",
            "check --prompts, --shape/--field and --max-prompt-tokens/--min-prompt-tokens",
        )
    return plan

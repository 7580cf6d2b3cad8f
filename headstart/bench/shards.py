"""Split a bench over processes or machines (`--shard K/N`) and merge the shards' outputs
(`--merge DIR...`) into one report, as if one run had measured every prompt.

A shard takes every N-th question from the K-th on (a stride, so every category lands in every
shard of an MT-bench-ordered file). Each shard interleaves its methods prompt by prompt, so ratios
stay meaningful; shards must share every setting that changes the figures (checked on merge).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

from headstart.bench.runner import Record
from headstart.errors import HeadstartError

T = TypeVar("T")

SAME = (
    "target",
    "questions",
    "turns",
    "max_new_tokens",
    "temperature",
    "device",
    "dtype",
    "threads",
    "heads",
    "methods",
    "limit",
    "questions_total",
)
"""Config keys every merged shard must agree on (a shard measured with other methods, or over
another --limit of the questions, would average each method over other prompts)."""


def parse_shard(spec: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 1 <= K <= N."""
    part, _, total = spec.partition("/")
    if not (re.fullmatch("[0-9]+", part) and re.fullmatch("[0-9]+", total)) or not 1 <= int(part) <= int(
        total
    ):
        raise HeadstartError(f"bad --shard '{spec}'", "use K/N with 1 <= K <= N, e.g. --shard 1/2")
    return int(part), int(total)


def select_shard(items: list[T], spec: str | None) -> list[T]:
    """Items K-1, K-1+N, K-1+2N, ... of `items` for shard K/N (all items without a spec)."""
    if not spec:
        return items
    index, total = parse_shard(spec)
    chosen = items[index - 1 :: total]
    if not chosen:
        raise HeadstartError(
            f"--shard {spec} selects no question: there are only {len(items)}",
            f"use at most {len(items)} shards (--shard K/{len(items)})",
        )
    return chosen


def read_shard(folder: Path) -> tuple[dict[str, Any], list[Record]]:
    """A finished bench directory's config and records."""
    report, outputs = folder / "report.json", folder / "outputs.jsonl"
    if not report.is_file() or not outputs.is_file():
        raise HeadstartError(
            f"{folder} is not a finished bench run (report.json or outputs.jsonl missing)",
            "merge directories written by `headstart bench --shard K/N`",
        )
    try:
        config = json.loads(report.read_text(encoding="utf-8"))["config"]
        if not isinstance(config, dict):
            raise TypeError("config is not an object")
    except (ValueError, KeyError, TypeError) as err:
        raise HeadstartError(
            f"{report} is damaged ({type(err).__name__}: {err})",
            "measure that shard again into a new directory",
        ) from None
    records = []
    for number, line in enumerate(outputs.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(Record(**json.loads(line)))
        except (ValueError, TypeError) as err:
            raise HeadstartError(
                f"{outputs}:{number} is damaged ({type(err).__name__})",
                "measure that shard again into a new directory",
            ) from None
    return config, records


def merge_configs(configs: list[dict[str, Any]], folders: list[Path]) -> dict[str, Any]:
    """One config for the merged run; shards that differ in a measured setting are refused."""
    first = configs[0]
    for config, folder in zip(configs[1:], folders[1:], strict=True):
        diff = [key for key in (*SAME, "trees") if config.get(key) != first.get(key)]
        if diff:
            raise HeadstartError(
                f"{folder} was measured with other settings than {folders[0]} ({', '.join(diff)})",
                "merge only shards of one bench command",
            )
    shards = sorted(config.get("shard") or "1/1" for config in configs)
    totals = {parse_shard(s)[1] for s in shards}
    if len(totals) != 1 or sorted(parse_shard(s)[0] for s in shards) != list(range(1, totals.pop() + 1)):
        raise HeadstartError(
            f"the shards {shards} are not one complete split",
            "merge shards 1/N .. N/N of one split, once each",
        )
    merged = {key: value for key, value in first.items() if key != "shard"}
    merged["num_prompts"] = sum(int(config["num_prompts"]) for config in configs)
    merged["shards"] = len(configs)
    return merged


def merge(folders: list[Path]) -> tuple[dict[str, Any], list[Record]]:
    """The merged config and all records of the shard directories."""
    read = [read_shard(folder) for folder in folders]
    records = [record for _, rows in read for record in rows]
    return merge_configs([config for config, _ in read], folders), records

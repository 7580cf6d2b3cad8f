"""Prompt sources: rows from local JSON / JSONL / Parquet files or a `datasets` dataset.

`read_rows(source, split)` yields `(index, row)` in the source's own order (the index is what resume
keys on); a row that cannot be parsed is yielded as a `BadRow` so the caller can count it. Turning
rows into conversations is `shapes.py`'s job.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError

FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".json.gz", ".jsonl.gz")


@dataclass(frozen=True)
class BadRow:
    """A row that could not be read (counted in the summary under `reason`)."""

    reason: str


def describe_source(source: str) -> str:
    """A stable identity for the source (absolute path for local files/dirs, else the name)."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def read_rows(source: str, split: str = "train") -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    """Rows of `source`: a local file, a local dataset directory or a Hub dataset name."""
    path = Path(source).expanduser()
    if path.is_file():
        yield from _read_file(path)
    elif path.is_dir() or not source.lower().endswith((*FILE_SUFFIXES, ".gz")):
        yield from _read_dataset(source, split)  # a dataset directory or a Hub name ("org/name")
    else:
        raise HeadstartError(
            f"prompt file not found: {source}",
            "pass an existing .json/.jsonl/.parquet file, a dataset directory or a Hub dataset name",
        )


def _open_text(path: Path) -> Any:
    """utf-8-sig: a byte-order mark (as Windows editors write) is not part of the first row."""
    return (
        gzip.open(path, "rt", encoding="utf-8-sig")
        if path.name.endswith(".gz")
        else path.open(encoding="utf-8-sig")
    )


def _read_file(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        yield from _read_parquet(path)
    elif name.endswith(".jsonl"):
        yield from _read_jsonl(path)
    elif name.endswith(".json"):
        yield from _read_json(path)
    else:
        raise HeadstartError(
            f"unknown prompt file type: {path.name}", f"use one of {', '.join(FILE_SUFFIXES)}"
        )


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    """Rows of a JSON-lines file, decoded line by line: a byte-order mark is ignored and a line
    that is not UTF-8 is one skipped (and counted) row, not a rejected file."""
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as handle:
            index = 0
            for raw in handle:
                try:
                    line = raw.decode("utf-8").removeprefix("\ufeff")
                except UnicodeDecodeError:
                    yield index, BadRow("line is not UTF-8")
                    index += 1
                    continue
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = BadRow("malformed JSON line")
                yield index, row if isinstance(row, dict | BadRow) else BadRow("row is not an object")
                index += 1
    except (OSError, EOFError) as err:
        raise HeadstartError(
            f"cannot read prompt file {path}: {err}", "check the file is JSON lines"
        ) from None


def _read_json(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    try:
        with _open_text(path) as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise HeadstartError(
            f"cannot read prompt file {path}: {err}", "check the file is UTF-8 JSON"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        # Many '.json' files are really JSON lines: try that before giving up.
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1 and lines[0].lstrip().startswith("{"):
            yield from _read_jsonl(path)
            return
        raise HeadstartError(
            f"prompt file {path} is not valid JSON: {err}", "fix the file or convert it to JSON lines"
        ) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        # {"data": [...]} style wrappers hold the rows in their only list; a lone object is one row.
        data = lists[0] if len(lists) == 1 and all(isinstance(x, dict) for x in lists[0]) else [data]
    if not isinstance(data, list):
        raise HeadstartError(
            f"prompt file {path} holds a JSON {type(data).__name__}, not rows", "store a list of objects"
        )
    for index, row in enumerate(data):
        yield index, row if isinstance(row, dict) else BadRow("row is not an object")


def _read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(path)
    except (OSError, ValueError) as err:
        raise HeadstartError(f"cannot read Parquet file {path}: {err}", "check the file is Parquet") from None
    index = 0
    for batch in reader.iter_batches(batch_size=1024):  # streams: a big file never sits in memory
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _read_dataset(name: str, split: str) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except FileNotFoundError as err:
        raise HeadstartError(
            f"dataset '{name}' not found: {str(err).splitlines()[0]}", "check the name, path or your network"
        ) from None
    except (ValueError, KeyError) as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise HeadstartError(
            f"cannot load split '{split}' of dataset '{name}': {msg}", "pass --split with an existing split"
        ) from None
    except Exception as err:  # noqa: BLE001 - datasets raises many types (ConnectionError, DatasetNotFoundError...)
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise HeadstartError(
            f"cannot load dataset '{name}': {msg}", "check the name/path; Hub datasets need network"
        ) from None
    yield from enumerate(data)

"""Training data: conversations (input_ids + loss_mask) from a distilled directory or in memory,
checked against the target before any compute; a held-out split; padding; a resumable order.

The interface to distill is deliberately narrow: rows with `input_ids` and `loss_mask` (and,
offline, cached features readable by `headstart.distill.load_features`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headstart.errors import HeadstartError
from headstart.targets.load import describe, fingerprint_mismatch
from headstart.train.config import DataConfig


@dataclass
class TrainData:
    """Conversations plus where they came from."""

    input_ids: list[list[int]]
    loss_mask: list[list[int]]
    fingerprint: dict[str, Any] | None
    """The target the data was distilled from (None: unchecked in-memory data)."""
    description: str = "in-memory"
    features: Any = None
    """Offline mode: `features(i) -> {'last' | 'layer<i>': (T, H)}` for conversation i."""
    feature_names: list[str] = field(default_factory=list)
    eval_from: int | None = None
    """Conversations from this index on are held-out only (data.eval_path); None: none are."""
    sources: list[str] = field(default_factory=list)
    """Where the conversations' prompts came from (files, Hub datasets; for the model card)."""

    @property
    def train_count(self) -> int:
        """How many conversations may be trained on (the rest are eval_path's)."""
        return len(self) if self.eval_from is None else self.eval_from

    def __len__(self) -> int:
        return len(self.input_ids)


def load_distilled_data(cfg: DataConfig) -> TrainData:
    """Read one or more `headstart distill` output directories (joined in the given order), then
    the `eval_path` ones: conversations from `eval_from` on are for held-out metrics only."""
    if not cfg.path:
        raise HeadstartError(
            "no training data: data.path is empty", "set data.path=DIR (a `headstart distill` output)"
        )
    parts = [_load_one(path, cfg.mode) for path in cfg.path]
    if cfg.max_records:
        for part, keep in zip(parts, _record_counts([len(p) for p in parts], cfg), strict=True):
            part.input_ids, part.loss_mask = part.input_ids[:keep], part.loss_mask[:keep]
    eval_parts = [_load_one(path, cfg.mode) for path in cfg.eval_path]
    everything = parts + eval_parts
    first = parts[0]
    for part in everything[1:]:
        if (
            first.fingerprint
            and part.fingerprint
            and fingerprint_mismatch(first.fingerprint, part.fingerprint)
        ):
            raise HeadstartError(
                f"{first.description} and {part.description} were distilled from different targets "
                f"({describe(first.fingerprint)} vs {describe(part.fingerprint)})",
                "train on data from one target only",
            )
    features = None
    if cfg.mode == "offline" and all(part.features is not None for part in everything):
        features = _joined_reader([(part.features, len(part)) for part in everything])
    names = [set(part.feature_names) for part in everything]
    description = " + ".join(part.description for part in parts)
    if eval_parts:
        description += " (held out: " + " + ".join(part.description for part in eval_parts) + ")"
    return TrainData(
        input_ids=[ids for part in everything for ids in part.input_ids],
        loss_mask=[mask for part in everything for mask in part.loss_mask],
        fingerprint=first.fingerprint,
        description=description,
        features=features,
        feature_names=[n for n in first.feature_names if all(n in have for have in names)],
        eval_from=sum(len(part) for part in parts) if eval_parts else None,
        sources=list(dict.fromkeys(source for part in parts for source in part.sources)),
    )


def _record_counts(sizes: list[int], cfg: DataConfig) -> list[int]:
    """How many conversations data.max_records keeps of each directory (in order)."""
    want = min(cfg.max_records, sum(sizes))
    if cfg.shares:  # the mix asked for: each directory its share of N (at most what it holds)
        exact = [want * share for share in cfg.shares]
        counts = [min(int(x), size) for x, size in zip(exact, sizes, strict=True)]
        order = sorted(range(len(sizes)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
        for i in order[: want - sum(counts)]:
            counts[i] += int(counts[i] < sizes[i])
        short = [i for i, (c, x) in enumerate(zip(counts, exact, strict=True)) if c < int(x)]
        if short:
            raise HeadstartError(
                f"data.shares asks {int(exact[short[0]])} conversations of {cfg.path[short[0]]}, which holds "
                f"{sizes[short[0]]}",
                "lower data.max_records or that directory's share",
            )
        return counts
    if cfg.max_records_from == "first":
        counts, left = [], want
        for size in sizes:
            counts.append(min(size, left))
            left -= counts[-1]
        return counts
    # each: floor of every share, then the remainder to the largest fractions (sums to `want`)
    total = sum(sizes)
    exact = [want * size / total for size in sizes]
    counts = [int(x) for x in exact]
    order = sorted(range(len(sizes)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in order[: want - sum(counts)]:
        counts[i] += 1
    return counts


def _load_one(path: str, mode: str) -> TrainData:
    from headstart.distill import load_distilled, read_meta
    from headstart.distill.pack import MANIFEST, checked_pack

    if (Path(path) / MANIFEST).is_file():
        checked_pack(path)  # a damaged or half-updated pack fails here, not as odd training
    meta = read_meta(path)
    rows = load_distilled(path)
    features = None
    if mode == "offline" and not meta.get("feature_layers"):
        raise HeadstartError(
            f"offline training reads cached features, and {path} has none (distilled without "
            "--cache-features, or packed: packing leaves them behind)",
            "distil with --cache-features, or set data.mode=online",
        )
    if mode == "offline":
        from headstart.distill import load_features

        records = rows.select_columns(
            [c for c in ("index", "features_file") if c in rows.column_names]
        ).to_list()
        features = _feature_reader(path, records, load_features)
    return TrainData(
        input_ids=list(rows["input_ids"]) if len(rows) else [],
        loss_mask=list(rows["loss_mask"]) if len(rows) else [],
        fingerprint=meta.get("fingerprint"),
        description=f"{path} ({len(rows)} conversations)",
        sources=[_source_name((meta.get("settings") or {}).get("prompts"))],
        features=features,
        feature_names=list(meta.get("feature_layers") or []),
    )


def _source_name(prompts: str | None) -> str:
    """A prompt source as a model card should name it: a Hub dataset id as is, a local file by its
    name (an absolute path on the machine that distilled says nothing to a reader)."""
    if not prompts:
        return "data-free (the target's own prompts)"
    path = Path(prompts)
    return path.name if path.is_absolute() or path.exists() else prompts


def _feature_reader(root: str, records: list[dict[str, Any]], load: Any) -> Any:
    def read(i: int) -> dict[str, torch.Tensor]:
        return load(root, records[i])

    return read


def _joined_reader(readers: list[tuple[Any, int]]) -> Any:
    """One reader over several directories' readers, indexed like the joined conversations."""
    if len(readers) == 1:
        return readers[0][0]
    where = [(reader, i) for reader, count in readers for i in range(count)]

    def read(i: int) -> dict[str, torch.Tensor]:
        reader, local = where[i]
        return reader(local)

    return read


def check_data(data: TrainData, target: Any, needed_layers: Sequence[int], mode: str) -> None:
    """Every data problem a user can fix, raised before the first forward."""
    if data.fingerprint is not None:
        diff = fingerprint_mismatch(data.fingerprint, target.fingerprint)
        if diff:
            raise HeadstartError(
                f"data {data.description} was distilled from {describe(data.fingerprint)} but the target is "
                f"{describe(target.fingerprint)} (differs in {', '.join(diff)})",
                "train on the target the data came from, or distil data with this target",
            )
    if len(data) == 0:
        raise HeadstartError(f"training data {data.description} is empty", "distil some conversations first")
    if not any(any(m) for m in data.loss_mask):
        raise HeadstartError(
            f"training data {data.description} has no reply tokens (all loss masks are 0)",
            "check the distilled data",
        )
    for ids, mask in zip(data.input_ids, data.loss_mask, strict=True):
        if len(ids) != len(mask):
            raise HeadstartError(
                f"a conversation in {data.description} has input_ids and loss_mask of different lengths",
                "re-distil the data",
            )
    if mode == "offline":
        want = ["last", *(f"layer{i}" for i in needed_layers)]
        missing = [n for n in want if n not in data.feature_names]
        if data.features is None or missing:
            raise HeadstartError(
                f"offline training needs cached features {want}, the data has {data.feature_names or 'none'}",
                "distil with --cache-features and matching --feature-layers, or set data.mode=online",
            )
    vocab = target.vocab_size
    top = max(max(ids) for ids in data.input_ids if ids)
    if top >= vocab:
        raise HeadstartError(
            f"token id {top} in {data.description} is outside the target vocabulary ({vocab})",
            "re-distil the data with this target",
        )


def split(count: int, holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices), a fixed random split."""
    n_eval = int(round(holdout * count)) if holdout < 1 else int(holdout)
    n_eval = min(n_eval, count - 1)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def token_counts(data: TrainData, indices: Sequence[int], vocab: int) -> torch.Tensor:
    """How often each target token appears as a reply token, (V,) (EAGLE-3's draft vocabulary)."""
    from itertools import chain, compress

    # One bincount over every reply token: a bincount and a (V,) add per conversation ran 30k
    # tiny multi-threaded ops, 6 s at 2 threads here against 1.7 s at 1 (thread start-up per op)
    # and, we believe, the silent start-up of three runs side by side on a 16-core GPU host
    # (2026-11-26) that never reached step 1 in 530 s.
    replies = chain.from_iterable(compress(data.input_ids[i], data.loss_mask[i]) for i in indices)
    flat = torch.tensor(list(replies), dtype=torch.long)
    return torch.bincount(flat, minlength=vocab).to(torch.float64)


class Conversations(torch.utils.data.Dataset):
    """The chosen conversations, truncated to max_length; offline items carry their features."""

    def __init__(self, data: TrainData, indices: Sequence[int], max_length: int) -> None:
        self.data, self.indices, self.max_length = data, list(indices), max_length

    def __len__(self) -> int:
        return len(self.indices)

    def length(self, i: int) -> int:
        return min(len(self.data.input_ids[self.indices[i]]), self.max_length)

    @property
    def lengths(self) -> list[int]:
        """Each item's tokens (what the sampler groups by), as `Packed.lengths` gives its rows'."""
        return [self.length(i) for i in range(len(self))]

    def __getitem__(self, i: int) -> dict[str, Any]:
        j = self.indices[i]
        item: dict[str, Any] = {
            "input_ids": torch.tensor(self.data.input_ids[j][: self.max_length], dtype=torch.long),
            "loss_mask": torch.tensor(self.data.loss_mask[j][: self.max_length], dtype=torch.long),
        }
        if self.data.features is not None:
            item["features"] = {k: v[: self.max_length] for k, v in self.data.features(j).items()}
        return item


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices into `lengths` grouped into rows of at most `capacity` tokens, best-fit decreasing
    (each item, longest first, into the fullest row it fits; O(n log n)); a row's items in index order.
    Chat data packs to ~97% full rows where one conversation a row padded to the batch's longest."""
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row), sorted
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        if lengths[i] > capacity:
            raise HeadstartError(
                f"a conversation of {lengths[i]} tokens does not fit a packed row of {capacity}",
                f"set data.pack>={lengths[i]} or data.max_length<={capacity}",
            )
        at = bisect_left(free, (lengths[i], -1))
        if at == len(free):
            rows.append([i])
            room, row = capacity - lengths[i], len(rows) - 1
        else:
            room, row = free.pop(at)
            rows[row].append(i)
            room -= lengths[i]
        if room > 0:
            insort(free, (room, row))
    return [sorted(row) for row in rows]


class Packed(torch.utils.data.Dataset):
    """`Conversations` packed into rows of `capacity` positions (`pack_rows`, once). A row carries
    `docs` (which of its conversations a position belongs to) and `positions` (the position inside
    that conversation), from which the target's and the head's masks keep each conversation to
    itself. The first `margin` loss marks of every conversation are cleared: an objective that
    scores position t against a label up to `margin` positions ahead (EAGLE-3: 2 + ttt_steps)
    must never pair a query in one conversation with a label in the next (they are prompt tokens in
    chat data, so nothing is lost there)."""

    def __init__(self, conversations: Conversations, capacity: int, margin: int) -> None:
        self.conversations, self.margin = conversations, margin
        self.rows = pack_rows(conversations.lengths, capacity)
        self.lengths = [sum(conversations.length(i) for i in row) for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, r: int) -> dict[str, Any]:
        items = [self.conversations[i] for i in self.rows[r]]
        masks = [it["loss_mask"].clone() for it in items]
        for mask in masks:
            mask[: self.margin] = 0
        row: dict[str, Any] = {
            "input_ids": torch.cat([it["input_ids"] for it in items]),
            "loss_mask": torch.cat(masks),
            "docs": torch.cat([torch.full((len(it["input_ids"]),), k) for k, it in enumerate(items)]),
            "positions": torch.cat([torch.arange(len(it["input_ids"])) for it in items]),
        }
        if "features" in items[0]:
            row["features"] = {
                name: torch.cat([it["features"][name] for it in items]) for name in items[0]["features"]
            }
        return row


def collate(items: list[dict[str, Any]], pad_id: int = 0, plan: Callable[[torch.Tensor], Any] | None = None
            ) -> dict[str, Any]:  # fmt: skip
    """Right-pad to the longest item: causal attention never lets a real token see padding.
    `plan`: called on the padded loss mask, its result kept as batch["plan"] (the EAGLE-3 step's
    host-side indices, headstart.train.objectives.eagle.plan: computed here, on the host, they cost no device sync)."""
    width = max(len(it["input_ids"]) for it in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, it in enumerate(items):
        ids[row, : len(it["input_ids"])] = it["input_ids"]
        mask[row, : len(it["loss_mask"])] = it["loss_mask"]
    lengths = torch.tensor([len(it["input_ids"]) for it in items], dtype=torch.long)
    batch: dict[str, Any] = {"input_ids": ids, "loss_mask": mask, "lengths": lengths}
    if "docs" in items[0]:  # packed rows (`Packed`): padding is a conversation of its own (-1)
        batch["docs"] = torch.full((len(items), width), -1, dtype=torch.long)
        batch["positions"] = torch.zeros((len(items), width), dtype=torch.long)
        for row, it in enumerate(items):
            batch["docs"][row, : len(it["docs"])] = it["docs"]
            batch["positions"][row, : len(it["positions"])] = it["positions"]
    if "features" in items[0]:
        batch["features"] = {}
        for name in items[0]["features"]:
            first = items[0]["features"][name]
            out = torch.zeros((len(items), width, first.shape[-1]), dtype=first.dtype)
            for row, it in enumerate(items):
                out[row, : len(it["features"][name])] = it["features"][name]
            batch["features"][name] = out  # (B, T, H)
    if plan is not None:
        batch["plan"] = plan(mask)
    return batch


class EpochSampler(torch.utils.data.Sampler):
    """A fresh order per epoch from (seed, epoch) alone, so a resumed run replays the same order.

    With `lengths` and `group` > 0 the order is length-grouped: the epoch's permutation is cut
    into groups of `group * batch_size` items, each sorted by length and cut into batches, and the
    batches are shuffled (so a batch pads to similar lengths, and batch order stays random)."""

    def __init__(self, size: int, seed: int, lengths: Sequence[int] | None = None, batch_size: int = 1,
                 group: int = 0) -> None:  # fmt: skip
        self.size, self.seed, self.epoch = size, seed, 0
        self.lengths, self.batch_size, self.group = lengths, batch_size, group

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        if not self.lengths or self.group <= 0 or self.batch_size <= 1:
            return iter(order)
        span = self.group * self.batch_size
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start : start + span], key=lambda i: self.lengths[i])  # stable
            batches += [chunk[at : at + self.batch_size] for at in range(0, len(chunk), self.batch_size)]
        # Full batches in random order; a short last batch stays last (drop_last drops it).
        full = [b for b in batches if len(b) == self.batch_size]
        short = [b for b in batches if len(b) < self.batch_size]
        shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
        return iter([i for batch in shuffled + short for i in batch])

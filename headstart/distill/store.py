"""The on-disk layout of a distilled data set: append-only shards, a meta file, resume state.

    OUT/distill_meta.json              fingerprint of the target + the settings that shaped the data
    OUT/data/shard-00000.jsonl         records (one JSON object per line), readable by `datasets`
    OUT/features/shard-00000.safetensors  optional cached hidden states, keys "<index>/<layer>"

Every file is written under a temporary name starting with "." and renamed into place, so a reader
(or a resumed run) never sees half a shard. The features file of a shard is renamed BEFORE its
records: a records shard on disk is the commit point, and an orphaned features file left by a
crash is simply overwritten when that shard number is written again.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.io import normal_permissions

META = "distill_meta.json"
DATAFREE_PROMPTS = "datafree_prompts.jsonl"
"""Data-free prompts sampled from the target so far (distill/plan.py): kept for a rerun."""
DATAFREE_STATS = "datafree_stats.json"
FORMAT_VERSION = 1


def data_dir(out: str | Path) -> Path:
    return Path(out) / "data"


def features_dir(out: str | Path) -> Path:
    return Path(out) / "features"


def atomic_write_bytes(path: Path, payload: bytes, private: bool = False) -> None:
    """Write `payload` to a hidden temp file in the same directory, fsync, then rename over `path`.
    `private`: the file stays 0600 (mkstemp's), the folder made 0700 (serve --record)."""
    path.parent.mkdir(mode=0o700 if private else 0o777, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    try:
        if not private:
            normal_permissions(tmp)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())  # cost: a disk sync per shard, so the rename publishes real bytes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_meta(out: str | Path) -> dict[str, Any]:
    """The meta of a distilled output directory: fingerprint, settings, feature layers."""
    path = Path(out) / META
    if not Path(out).exists():
        raise HeadstartError(
            f"distilled data {out} does not exist", "check the path, or run `headstart distill --out DIR`"
        )
    if not path.is_file():
        raise HeadstartError(
            f"{out} is not a distilled data set (no {META})", "run `headstart distill --out DIR` first"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise HeadstartError(
            f"cannot read {path}: {err}", "the file is damaged; distill into a new --out"
        ) from None


def shard_paths(out: str | Path) -> list[Path]:
    return sorted(data_dir(out).glob("shard-*.jsonl"))


def packed_paths(out: str | Path) -> list[Path]:
    """The Parquet shards of a packed directory (headstart.distill.pack)."""
    return sorted(data_dir(out).glob("shard-*.parquet"))


def done_indices(out: str | Path) -> dict[int, str | None]:
    """{prompt index: content key} of the records already written (a resumed run skips them and
    checks the source still holds the same rows there; None for records written before keys)."""
    done: dict[int, str | None] = {}
    for path in shard_paths(out):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    record = json.loads(line)
                    done[int(record["index"])] = record.get("key")
                except (ValueError, KeyError, TypeError) as err:  # a shard edited or cut by hand
                    raise HeadstartError(
                        f"{path} is damaged (line {number}: {type(err).__name__}), so a resumed run cannot "
                        "tell which records it holds",
                        f"delete {path.name} (its records are made again), or distil into a new --out",
                    ) from None
    return done


class ShardWriter:
    """Buffers records (and their features) and publishes them as numbered, atomically written shards."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        numbers = [int(p.stem.split("-")[1]) for p in shard_paths(out)]
        self.next_number = max(numbers, default=-1) + 1
        self.records: list[dict[str, Any]] = []
        self.features: dict[str, Any] = {}  # "<index>/<layer>" -> (T, H) tensor
        self.written = 0

    def __len__(self) -> int:
        return len(self.records)

    def add(self, record: dict[str, Any], features: dict[str, Any] | None = None) -> None:
        name = f"shard-{self.next_number:05d}"
        if features:
            record["features_file"] = f"features/{name}.safetensors"
            self.features.update({f"{record['index']}/{k}": v for k, v in features.items()})
        self.records.append(record)

    def flush(self) -> None:
        """Publish the buffered records as the next shard (no-op when empty)."""
        if not self.records:
            return
        name = f"shard-{self.next_number:05d}"
        if self.features:
            from safetensors.torch import save

            payload = save(
                {k: v.contiguous() for k, v in self.features.items()},
                metadata={"format": "headstart-features"},
            )
            atomic_write_bytes(features_dir(self.out) / f"{name}.safetensors", payload)
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records)
        atomic_write_bytes(data_dir(self.out) / f"{name}.jsonl", lines.encode("utf-8"))
        self.written += len(self.records)
        self.records, self.features = [], {}
        self.next_number += 1


def load_distilled(out: str | Path) -> Any:
    """The records of a distilled output directory as a `datasets.Dataset`.

    Columns: index, source_id, messages, input_ids, loss_mask, turns_finished, turns_exact, reply_tokens, settings,
    fingerprint (+ features_file when features were cached).
    """
    import datasets
    import pyarrow as pa
    import pyarrow.json as pa_json

    read_meta(out)
    if packed_paths(out):
        return _load_packed(out)
    files = shard_paths(out)
    if not files:
        raise HeadstartError(
            f"{out} holds no records yet", "run `headstart distill` on it to completion (or resume it)"
        )
    # Each shard's schema is inferred on its own, then promoted to one (datasets' json loader casts
    # every file to the first one's types, so a shard whose source_id is null throughout, as a
    # small shard may well be, failed against one that has ids).
    try:
        options = pa_json.ReadOptions(block_size=1 << 26)  # a block must hold the longest record's line
        tables = [pa_json.read_json(str(path), read_options=options) for path in files]
        return datasets.Dataset(pa.concat_tables(tables, promote_options="permissive"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
        raise HeadstartError(
            f"cannot read the records of {out}: {str(err).splitlines()[0]}",
            "a shard is damaged: move it aside (data/shard-*.jsonl) and rerun `headstart distill` to redo it",
        ) from None


def _load_packed(out: str | Path) -> Any:
    """A packed directory's records, token ids and masks widened back to int64."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pa.concat_tables(
            [pq.read_table(path) for path in packed_paths(out)], promote_options="permissive"
        )
    except (pa.ArrowInvalid, OSError) as err:
        raise HeadstartError(
            f"cannot read the packed records of {out}: {str(err).splitlines()[0]}",
            "a shard is damaged: check it against pack.json's sha256, or pack the distilled run again",
        ) from None
    wide = pa.schema([
        pa.field(f.name, pa.list_(pa.int64()) if f.name in ("input_ids", "loss_mask") else f.type)
        for f in table.schema
    ])  # fmt: skip
    return datasets.Dataset(table.cast(wide))


def load_features(out: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """The cached hidden states of one record: layer name ('layer<i>' or 'last') -> (T, H) tensor."""
    from safetensors import safe_open

    if not record.get("features_file"):
        raise HeadstartError("this record has no cached features", "distill with --cache-features")
    prefix = f"{record['index']}/"
    with safe_open(str(Path(out) / record["features_file"]), framework="pt") as handle:
        return {k[len(prefix) :]: handle.get_tensor(k) for k in handle.keys() if k.startswith(prefix)}


def forget_output(out: str | Path, remove_dir: bool = False) -> None:
    """Undo `open_output` for a run that wrote nothing (no record, no data-free prompt: those are
    kept for the rerun): its meta file, lock and empty directories; `out` itself when this run
    created it and nothing else is there."""
    out = Path(out)
    prompts = out / DATAFREE_PROMPTS
    if prompts.is_file() and prompts.stat().st_size:
        return
    for name in (META, ".lock", DATAFREE_PROMPTS, DATAFREE_STATS, "summary.json"):
        (out / name).unlink(missing_ok=True)
    for directory in (data_dir(out), features_dir(out), *([out] if remove_dir else [])):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def open_output(out: str | Path, meta: dict[str, Any]) -> None:
    """Create `out` with `meta`, or check that an existing `out` was made with the same target and settings.

    `meta` holds `fingerprint`, `settings` (DistillConfig.identity()) and `feature_layers`; mixing
    records of two targets or two settings in one data set would silently poison training.
    """
    from headstart.targets import describe, fingerprint_mismatch

    out = Path(out)
    meta = json.loads(json.dumps({"format_version": FORMAT_VERSION, **meta}))  # tuples -> lists, as on disk
    if not (out / META).is_file():
        if out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):
            raise HeadstartError(
                f"{out} exists, is not empty and is not a distill output", "choose a new or empty --out"
            )
        atomic_write_bytes(out / META, json.dumps(meta, indent=2).encode())
        return
    old = read_meta(out)
    bad = fingerprint_mismatch(old.get("fingerprint", {}), meta["fingerprint"])
    if bad:
        raise HeadstartError(
            f"{out} was distilled from another target ({', '.join(bad)} differ: {describe(old.get('fingerprint', {}))})",
            "use a new --out for this target, or the --target that made this one",
        )
    for key in ("settings", "feature_layers"):
        before, now = old.get(key) or {}, meta.get(key) or {}
        if key == "feature_layers" and before != now:
            raise HeadstartError(
                f"{out} caches feature layers {before}, this run asks for {now}",
                "use the same --feature-layers or a new --out",
            )
        if key == "settings":
            diff = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            if diff:
                shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in diff)
                raise HeadstartError(
                    f"{out} was made with other settings ({shown})",
                    "rerun with the original settings, or use a new --out",
                )


def lock_output(out: str | Path, holder: str = "headstart distill") -> Any:
    """Hold an exclusive lock on `out` for this process's lifetime (two writers would mix shard numbers),
    then remove temp files a killed run left behind (hidden names: never read as records)."""
    from headstart.io import lock_dir

    handle = lock_dir(out, holder)
    for folder in (data_dir(out), features_dir(out), Path(out)):
        for stale in folder.glob(".tmp-*") if folder.is_dir() else []:
            if LEFTOVER.match(stale.name) and stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
    return handle


LEFTOVER = re.compile(
    rf"^\.tmp-(shard-\d{{5}}\.(jsonl|safetensors)|{re.escape(META)}|summary\.json|"
    rf"{re.escape(DATAFREE_PROMPTS)}|{re.escape(DATAFREE_STATS)})-[A-Za-z0-9_]{{8}}$"
)
"""A temp file `atomic_write_bytes` made (its prefix, one of distill's own file names, mkstemp's 8
random characters): what a killed run leaves. Any other hidden name is the user's."""

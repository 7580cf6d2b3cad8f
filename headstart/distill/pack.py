"""A distilled output packed small: Parquet shards (zstd), token ids as uint16 where the
vocabulary fits, the conversation text left out unless asked, each file under a size limit.

Why: a kept data set has to travel (a GPU run returns at most 8 files of 16 MiB; a repository
that carries it is sent whole to every device call) and to live in git. JSON shards spend ~7
bytes a token id; here a token costs ~1.3-1.6 bytes and its loss-mask entry nearly nothing
(measured in tests/distill/test_pack.py). `headstart train` reads a packed directory as it
reads `headstart distill`'s own (`load_distilled` takes both kinds of shards); resuming a distill
into it is not possible (pack the finished run).

    python -m headstart.distill.pack runs/distill-30k data/smollm2-30k [--keep-text] [--max-mb 15]
    python -m headstart.distill.pack --verify data/smollm2-kept/*   # files against pack.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from headstart.distill.store import META, data_dir, load_distilled, read_meta
from headstart.errors import HeadstartError
from headstart.outputs import check_output, publish_dir

DROPPED = ("features_file",)  # features are not packed (recompute them with the target)
TEXT = ("messages",)
MANIFEST = "pack.json"
METADATA = (META, "summary.json")
"""The files beside the shards that training reads (the target's fingerprint, the run's summary):
checksummed in the manifest like the shards."""


def pack(
    src: str | Path, dst: str | Path, keep_text: bool = False, max_bytes: int = 15 * 2**20
) -> dict[str, Any]:
    """Pack the distilled records of `src` into `dst` (new, empty or an earlier pack; written whole
    or not at all); returns the manifest (files, sizes, records, tokens, sha256 per file)."""

    import pyarrow as pa

    meta = read_meta(src)
    table = load_distilled(src).data.table
    table = table.drop_columns(
        [c for c in (*DROPPED, *(() if keep_text else TEXT)) if c in table.column_names]
    )
    vocab = int(meta.get("fingerprint", {}).get("vocab_size") or 0)
    table = _narrow(table, vocab)
    check_output(dst, "DST", owned=lambda p: (p / MANIFEST).is_file(), command="pack", inputs=[src],
                 can_overwrite=False)  # fmt: skip
    manifest: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        shard_dir = data_dir(tmp)
        shard_dir.mkdir(parents=True)
        files = _write_shards(table, shard_dir, max_bytes)
        # the features stay behind, so the meta must not promise them: offline training would pass
        # its checks and then fail on the first batch, after loading the target
        packed_meta = {**meta, "feature_layers": []}
        (tmp / META).write_text(json.dumps(packed_meta, indent=1) + "\n")
        if (Path(src) / "summary.json").is_file():
            shutil.copyfile(Path(src) / "summary.json", tmp / "summary.json")
        manifest.update(
            records=table.num_rows,
            tokens=int(pa.compute.sum(pa.compute.list_value_length(table["input_ids"])).as_py() or 0),
            text=keep_text,
            files={f.name: _entry(f) for f in files},
            metadata={name: _entry(tmp / name) for name in METADATA if (tmp / name).is_file()},
        )
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    publish_dir(dst, write, stale=packed_files(Path(dst)))
    return manifest


def packed_files(dst: Path) -> list[str]:
    """The files an earlier pack wrote into `dst`, from its manifest ([] when there is none): an
    earlier pack's shards beyond this one's count are removed, nothing else."""
    try:
        manifest = json.loads((dst / MANIFEST).read_text())
        shards = [f"{data_dir(Path()).name}/{name}" for name in manifest["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [*shards, MANIFEST, *METADATA]


def _narrow(table: Any, vocab: int) -> Any:
    """input_ids as uint16 (when every id fits), loss_mask as uint8: load_distilled widens them back."""
    import pyarrow as pa

    fields = []
    for field in table.schema:
        kind = field.type
        if field.name == "input_ids" and 0 < vocab <= 65536:
            kind = pa.list_(pa.uint16())
        elif field.name == "loss_mask":
            kind = pa.list_(pa.uint8())
        fields.append(pa.field(field.name, kind))
    return table.cast(pa.schema(fields))


def _write_shards(table: Any, folder: Path, max_bytes: int) -> list[Path]:
    """As few shards as keep every file under `max_bytes` (rows in order; zstd level 19)."""
    import pyarrow.parquet as pq

    count = 1
    while True:
        for old in folder.glob("shard-*.parquet"):
            old.unlink()
        rows = -(-table.num_rows // count)
        files = []
        for i, start in enumerate(range(0, table.num_rows, rows)):
            path = folder / f"shard-{i:05d}.parquet"
            pq.write_table(table.slice(start, rows), path, compression="zstd", compression_level=19)
            files.append(path)
        largest = max(f.stat().st_size for f in files)
        if largest <= max_bytes or rows == 1:
            return files
        count = max(count + 1, int(count * largest / max_bytes) + 1)


def _entry(path: Path) -> dict[str, Any]:
    """A shard's manifest entry: what `verify` checks it against."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def checked_pack(dst: str | Path) -> dict[str, Any]:
    """`verify` as training runs it: a file unchanged (path, size, mtime) since its sha256 was last
    computed is not read again (headstart.targets.gguf.file_sha256's memo)."""
    from headstart.targets.gguf import file_sha256

    return verify(dst, entry=lambda path: {"bytes": path.stat().st_size, "sha256": file_sha256(path)})


def verify(dst: str | Path, entry: Any = None) -> dict[str, Any]:
    """Check a packed directory against its manifest: every listed file (shards and metadata)
    present with its size and sha256, no shard beside them, the record count as listed. Returns
    the manifest. Cost: one read of every file (training's own check, `checked_pack`, skips
    files unchanged since their last check)."""
    import pyarrow.parquet as pq

    from headstart.distill.store import packed_paths

    dst = Path(dst)
    manifest, listed = _listed(dst)
    found = {p.name for p in packed_paths(dst)}
    shards = {name for name in listed if name.startswith(data_dir(Path()).name + "/")}
    if {name.split("/", 1)[1] for name in shards} != found:
        raise HeadstartError(
            f"{dst}: shards {sorted(found)} do not match {MANIFEST}'s {sorted(manifest['files'])}",
            "restore the missing shards (git checkout) or pack the distilled run again",
        )
    for name, expected in listed.items():
        _check(dst / name, expected, entry or _entry)
    counted = sum(pq.ParquetFile(dst / name).metadata.num_rows for name in shards)
    if counted != int(manifest["records"]):
        raise HeadstartError(
            f"{dst} holds {counted} records, {MANIFEST} says {manifest['records']}",
            "pack the distilled run again",
        )
    return manifest


def _listed(dst: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The manifest and every file it lists (relative path -> its entry)."""
    try:
        manifest = json.loads((dst / MANIFEST).read_text())
        listed = {f"{data_dir(Path()).name}/{k}": dict(v) for k, v in dict(manifest["files"]).items()}
        int(manifest["records"])
        metadata = manifest.get("metadata")
        listed.update({k: dict(v) for k, v in dict(metadata or {}).items()})
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HeadstartError(
            f"{dst} has no readable {MANIFEST} ({type(err).__name__}: {err})",
            "pack the distilled run again (python -m headstart.distill.pack SRC DST)",
        ) from None
    if metadata is not None and META not in metadata:
        raise HeadstartError(f"{dst}/{MANIFEST} lists no checksum for {META}", "pack the distilled run again")
    return manifest, listed


def _check(path: Path, expected: dict[str, Any], entry: Any) -> None:
    """One line when `path` is missing or its size or sha256 differs from the manifest's."""
    if not path.is_file():
        raise HeadstartError(
            f"{path} is missing ({MANIFEST} lists it)", "restore it (git checkout) or pack again"
        )
    actual = entry(path)
    if {key: expected.get(key) for key in actual} != actual:
        raise HeadstartError(
            f"{path} differs from {MANIFEST} (sha256 {actual['sha256'][:12]}..., expected "
            f"{str(expected.get('sha256'))[:12]}...)",
            "restore it (git checkout) or pack the distilled run again",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m headstart.distill.pack", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="SRC DST | PACKED",
        help="a finished `headstart distill` directory and the packed one to write "
        "(new or an earlier pack); with --verify, packed directories",
    )
    parser.add_argument("--keep-text", action="store_true", help="keep the conversations' text (messages)")
    parser.add_argument("--max-mb", type=float, default=15.0, help="largest file in MiB (default 15)")
    parser.add_argument("--verify", action="store_true", help="check packed directories against pack.json")
    args = parser.parse_args(argv)
    if args.verify:
        return _verify_all(args.paths)
    if len(args.paths) != 2:
        parser.error("pack takes SRC DST (or --verify PACKED...)")
    args.src, args.dst = args.paths
    try:
        manifest = pack(args.src, args.dst, keep_text=args.keep_text, max_bytes=int(args.max_mb * 2**20))
    except HeadstartError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    total = sum(f["bytes"] for f in manifest["files"].values())
    print(f"{manifest['records']} records, {manifest['tokens']} tokens in {len(manifest['files'])} files, "
          f"{total / 2**20:.1f} MiB: {args.dst}")  # fmt: skip
    return 0


def _verify_all(folders: list[str]) -> int:
    for folder in folders:
        try:
            manifest = verify(folder)
        except HeadstartError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"ok: {folder}: {manifest['records']} records, {len(manifest['files'])} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

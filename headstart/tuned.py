"""The tree `headstart tune` stored for a set of heads: where it lives (next to the heads, or in the
user's cache for shipped and read-only heads), reading it back, and the tree a run decodes with."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headstart import kinds
from headstart.errors import HeadstartError
from headstart.heads.files import TUNED_FILE
from headstart.inference.trees.spec import TreeChoice, choose_tree
from headstart.io import atomic_write_text

log = logging.getLogger(__name__)


def user_tuned_file(heads_path: str | Path) -> Path:
    """Where a tune of heads that must not be written to (the shipped ones, inside the installed
    package, or a read-only directory) is kept: the user's cache, keyed by the heads' path."""
    import hashlib

    from headstart.targets.gguf import cache_root

    key = hashlib.sha256(str(Path(heads_path).resolve()).encode()).hexdigest()[:16]
    return cache_root() / "tuned" / key / TUNED_FILE


def tuned_file(heads_path: str | Path) -> Path:
    """The tuned-tree file of these heads: next to them, unless they are shipped or read-only."""
    import os

    from headstart.heads.defaults import DEFAULT_HEADS_DIR

    folder = Path(heads_path).resolve()
    shipped = folder.is_relative_to(DEFAULT_HEADS_DIR)
    if shipped or not os.access(folder, os.W_OK):
        return user_tuned_file(heads_path)
    return folder / TUNED_FILE


def stored_tune(heads_path: str | Path) -> dict[str, Any] | None:
    """The report `headstart tune` stored for the heads, if any: the newer of the user's cache
    copy (a tune of shipped or read-only heads) and the file next to them. Either may be the
    later tune: heads tuned while read-only, then again once writable, keep an older cache copy."""
    from headstart.records import DamagedFile, parse_record, read_json

    found = [path for path in (user_tuned_file(heads_path), Path(heads_path) / TUNED_FILE) if path.is_file()]
    for path in sorted(found, key=lambda path: path.stat().st_mtime, reverse=True):
        if path.is_file():  # neither for Hub ids: tune after downloading
            try:
                stored = read_json(path, fix="")
                parse_record(stored, StoredTune, path, fix="")  # the fields a run reads, typed
                return stored
            except DamagedFile as err:  # an optimisation only: it must not stop decoding, but it is said
                log.warning(f"warning: {path} is damaged ({err.why}): ignored; rerun `headstart tune`")
    return None


@dataclass
class StoredTune:
    """The fields of `headstart tune`'s report a run reads back (the rest is for people)."""

    tree: str
    machine: str = ""
    threads: int = 0
    device: str = ""
    over_plain: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        speedup = (self.over_plain or {}).get("speedup", 1.0)
        if not isinstance(speedup, int | float) or isinstance(speedup, bool):
            raise ValueError(f"'over_plain.speedup' is {speedup!r}, not a number")


def tuned_tree(heads_path: str | Path) -> str | None:
    """The tree stored by `headstart tune` next to the heads, if any."""
    stored = stored_tune(heads_path)
    return stored["tree"] if stored else None


def tuned_elsewhere(heads_path: str | Path, device: str, threads: int) -> str | None:
    """A warning when the stored tree was tuned on another device or thread count than this run:
    the best tree moves with them (measured: the shipped EAGLE-3 tree, tuned at 1 thread, gave 1.04x
    at 2 threads on 4 prompts, where 1 thread gives 1.2-1.4x, because the draft's small ops
    and the host's per-step work do not speed up with threads while the target's forward does)."""
    stored = stored_tune(heads_path) or {}
    then = (stored.get("device"), stored.get("threads"))
    if then == (device, threads) or None in then:
        return None
    return (
        f"the tree stored with {heads_path} was tuned on {then[0]} at {then[1]} thread(s); this run uses "
        f"{device} at {threads}: run `headstart tune --target TARGET --heads {heads_path} --threads "
        f"{threads}` for the tree that is fastest here, or match --threads"
    )


def tree_for_run(
    explicit: str | TreeChoice | None, heads_path: str | Path | None, device: str, threads: int,
    greedy: bool = True,
) -> TreeChoice | None:  # fmt: skip
    """The tree a run decodes with: `--tree` if given, else the stored tuned one (None: none stored),
    with a note on stderr when that one was tuned for another device or thread count. Sampling
    drops a tuned tree's lookup branch (exact acceptance cannot mix a static tree's drawn drafts
    with looked-up tokens); an explicit `--tree` is taken as given and refused by the decoder."""
    if explicit is not None:
        return choose_tree(explicit)
    if heads_path is None:
        return None
    warning = tuned_elsewhere(heads_path, device, threads)
    if warning:
        log.warning(f"note: {warning}")
    text = tuned_tree(heads_path)
    if text is None:
        return None
    try:
        choice = choose_tree(text)
    except HeadstartError as err:
        log.warning(f"warning: the tuned tree stored with {heads_path} is not a tree ({err.what}): ignored")
        return None
    return choice if greedy else choice.for_sampling()


def save_tuned(report: dict[str, Any], heads_path: str | Path) -> Path:
    """Store the tune where `tuned_file` says: never inside the installed package."""
    path = tuned_file(heads_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(report, indent=2))


def draft_tune_file(target: Any, draft: str) -> Path:
    """Where `headstart tune --draft-model DRAFT` keeps its report for this target: the user's
    cache, keyed by the target and the draft as given (a directory by its resolved path)."""
    import hashlib

    from headstart.targets.gguf import cache_root

    draft = draft.strip()
    name = str(Path(draft).expanduser().resolve()) if Path(draft).expanduser().exists() else draft
    ident = json.dumps([getattr(target, "spec", ""), name])
    return cache_root() / "tuned-drafts" / hashlib.sha256(ident.encode()).hexdigest()[:16] / TUNED_FILE


def stored_draft_tune(target: Any, draft: str) -> dict[str, Any] | None:
    """The report `headstart tune --draft-model` stored for this target and draft, if any (a damaged
    file is said and ignored: the tune is an optimisation)."""
    path = draft_tune_file(target, draft)
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = None
    if (
        isinstance(stored, dict)
        and isinstance(stored.get("draft"), str)
        and isinstance(stored.get("draft_tree"), str)
    ):
        try:  # what it names must parse: a damaged tune is said and ignored, never fatal
            kind = kinds.draft_kind(stored["draft"])
            if kind is not None and kind.check:
                kinds.load(kind.check)(stored["draft"])
            if stored["draft_tree"]:
                choose_tree(stored["draft_tree"])
            return stored
        except HeadstartError:
            pass
    log.warning(
        f"warning: {path} is damaged (not a draft tune): ignored; rerun `headstart tune --draft-model`"
    )
    return None


def save_draft_tune(report: dict[str, Any], target: Any, draft: str) -> Path:
    path = draft_tune_file(target, draft)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(report, indent=2))

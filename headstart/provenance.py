"""What a written report says about where it came from, and what it must not say.

`stamp()`: the headstart version and the git commit of the code that ran (when it runs from a
checkout), for bench and train reports. `portable(value)`: a JSON value without this machine's
absolute paths (under the working directory: relative; elsewhere: `.../parent/name`), for
anything that leaves the machine (reports, exported configs, model cards)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])(?:/[\w.+@-]+){3,}")
"""An absolute path of 3+ parts in free text (a URL's path follows '//host', so never matches)."""


def _shorter(match: re.Match) -> str:
    path = match.group(0)
    try:
        relative = os.path.relpath(path)
    except ValueError:
        relative = ""
    if relative and not relative.startswith(".."):
        return relative
    return ".../" + "/".join(path.split("/")[-2:])


def portable(value: Any) -> Any:
    """`value` (JSON-like) with every absolute path in its strings shortened (see the module)."""
    return json.loads(ABSOLUTE_PATH.sub(_shorter, json.dumps(value)))


def placeheld(text: str, names: dict[str, str]) -> str:
    """`text` (a recorded command) with each folder in `names` written as its name ($OUT, $STAGE:
    a machine's staging folders), then every other absolute path shortened as `portable` does."""
    for folder, name in sorted(names.items(), key=lambda item: -len(item[0])):
        base = re.escape(folder.rstrip("/"))
        if not base:
            continue
        if name:
            text = re.sub(rf"{base}(?=/|\s|$|\])", name, text)
        else:  # relative: the folder and its slash go
            text = re.sub(rf"{base}/", "", text)
    return portable(text)


@functools.cache
def stamp() -> dict[str, Any]:
    """{"headstart": version, "commit": short sha or None, "dirty": bool or None} of the running code."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("headstart")
    except PackageNotFoundError:
        found = None
    root = Path(__file__).resolve().parents[1]
    commit = dirty = None
    if (root / ".git").exists():
        try:
            commit = _git(root, "rev-parse", "--short=12", "HEAD")
            dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no", "--", "headstart"))
        except (OSError, subprocess.SubprocessError):
            pass
    return {"headstart": found, "commit": commit, "dirty": dirty}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                          timeout=10).stdout.strip()  # fmt: skip

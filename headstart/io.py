"""Atomic file writes: a reader never sees a half-written file (temp file + os.replace)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def umask() -> int:
    """The process umask (read without changing it for good)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def normal_permissions(path: str | Path) -> None:
    """mkstemp/mkdtemp create 0600/0700 entries; published files and directories get the
    permissions an ordinary open()/mkdir() would give (0666/0777 minus the umask)."""
    mode = 0o777 if Path(path).is_dir() else 0o666
    os.chmod(path, mode & ~umask())


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temp file in the same directory, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        normal_permissions(tmp)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

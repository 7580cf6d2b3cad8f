"""Files written so that a reader never sees half of one (a hidden temporary sibling renamed into
place), with the permissions an ordinary open() gives; locks and fsync. The rule for output
directories (what a command may replace or delete) is headstart.outputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


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


def lock_dir(path: str | Path, holder: str) -> Any:
    """An exclusive lock on `path` (its `.lock` file) held until the returned handle is closed or
    the process exits; a second `holder` on the same directory is refused."""
    import fcntl

    from headstart.errors import HeadstartError

    Path(path).mkdir(parents=True, exist_ok=True)
    handle = (Path(path) / ".lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise HeadstartError(
            f"another `{holder}` is writing to {path}",
            "wait for it to finish, or use another output directory",
        ) from None
    return handle


def fsync_tree(path: str | Path) -> None:
    """Flush every file under `path` and the directories themselves to disk (a checkpoint that
    survives a power cut, not just a crash). Cost: one fsync per file."""
    root = Path(path)
    for item in [*root.rglob("*"), root]:
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

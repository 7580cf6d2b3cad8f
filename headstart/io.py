"""What every command that writes follows (export, distill, train, bench, tune):

- a reader never sees a half-written file or directory: write a hidden temporary sibling, then
  rename it into place (`atomic_write_text`, `atomic_dir`);
- never delete what the command did not write: an existing output is replaced only when it is an
  earlier output of the same command (`OutputRule.owned`) or the user said so (`--overwrite`), and
  never when it holds the command's own input or the working directory;
- refuse, before any work, an output that cannot be written, in one line naming the flag
  (`check_writable`, `check_output`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
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


def check_writable(path: str | Path, what: str = "output", shown: str | Path | None = None) -> Path:
    """Refuse, before any work, an output directory that cannot be created or written (a run
    that only fails at its first save loses everything before it). The nearest existing ancestor
    is probed by creating (and removing) a temporary directory in it: permission bits say nothing
    for root, and /proc or a read-only mount only fail when written. `shown`: the path the user
    gave, when `path` is a directory derived from it (its parent)."""
    from headstart.errors import HeadstartError

    path = Path(path).expanduser()
    shown = path if shown is None else shown
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("."))
    if not existing.is_dir():
        where = "" if existing == path else f": {existing}"
        raise HeadstartError(f"{what} {shown}{where} is a file", f"choose another {what} directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".headstart-probe-", dir=existing))
    except OSError as err:
        raise HeadstartError(
            f"cannot write the {what} {shown} ({existing}: {err.strerror or err})",
            f"choose a writable {what}",
        ) from None
    return path


def check_output(
    path: str | Path,
    flag: str,
    *,
    owned: Callable[[Path], bool],
    command: str,
    overwrite: bool = False,
    inputs: Iterable[str | Path] = (),
) -> Path:
    """The output rule for a command that replaces a whole directory (`export`): `path` may be
    new, empty, or an earlier output of this command (`owned(path)`); anything else needs
    `overwrite`. Never allowed: a file, the working directory or one of its parents, and a
    directory that holds one of `inputs` (replacing it would delete what is being read).
    Returns the absolute path; raises one line naming `flag` otherwise."""
    from headstart.errors import HeadstartError

    raw = Path(path).expanduser()
    resolved = raw.resolve()
    if raw.exists() and not raw.is_dir():
        raise HeadstartError(f"{flag} {path} is a file", f"give {flag} a directory path (new or empty)")
    for source in inputs:
        source = Path(source).expanduser().resolve()
        if resolved == source or resolved in source.parents:
            raise HeadstartError(
                f"{flag} {path} holds the input {source}: replacing it would delete what {command} reads",
                f"choose an {flag} outside {source}",
            )
    here = Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        raise HeadstartError(
            f"{flag} {path} is the working directory or one of its parents",
            f"name a new directory for {flag}",
        )
    check_writable(resolved.parent, flag, shown=path)
    if raw.is_dir() and any(raw.iterdir()) and not owned(raw) and not overwrite:
        names = sorted(p.name for p in raw.iterdir())
        listing = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise HeadstartError(
            f"{flag} {path} is not empty ({listing}) and is not an earlier output of {command}",
            f"choose a new or empty {flag}, or pass --overwrite to replace the directory",
        )
    return resolved


def atomic_dir(dest: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call `write(tmp_dir)` then move tmp_dir to `dest`, replacing an old `dest` last (the old
    one is renamed aside first and deleted only once the new one is in place). A failure leaves
    `dest` as it was and no temporary directory behind; an OS error is one line naming `dest`."""
    from headstart.errors import HeadstartError

    dest = Path(dest).expanduser().resolve()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as err:
        raise HeadstartError(
            f"cannot write {dest}: {err.strerror or err}", "choose a writable path"
        ) from None
    try:
        normal_permissions(tmp)
        write(tmp)
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as err:
        raise HeadstartError(
            f"cannot write {dest}: {err.strerror or err}", "check the disk space and the permissions"
        ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


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

"""The one rule every command that writes follows (export, push --dry-run, train, distill, pack,
bench, tune): **a command deletes only files it wrote, or that an earlier run of the same command
wrote (recognised by its mark).**

- An output directory that is new, empty or an earlier output of the same command is written
  without a flag; any other non-empty directory needs `--overwrite`, and even then only the files
  the command writes are replaced: every other entry stays where it is, as `save_pretrained`,
  `cp` and `rsync` without `--delete` leave it (`publish_dir`).
- Refused in one line, with or without `--overwrite` (`refuse_protected`, `check_output`): the
  filesystem root, the home directory, system directories, a directory holding `.git`, the
  working directory or one of its parents, a directory holding the command's own input, and a
  directory where a file the command writes would have to replace a foreign directory.
- A reader never sees a half-written file: each file is written to a hidden temporary sibling and
  renamed into place; a failure puts back every file it had replaced and leaves no temporary
  behind.

Every deletion the package makes onto an existing path is listed in DESIGN.md with why it is safe.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headstart.errors import HeadstartError
from headstart.io import normal_permissions

SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin",
                "/sys", "/usr", "/System", "/Library")  # fmt: skip
"""Directories nothing of a user's belongs in, nor anywhere below them."""
SYSTEM_ROOTS = ("/", "/home", "/root", "/tmp", "/var", "/var/tmp", "/opt", "/srv", "/mnt", "/media", "/run",
                "/Users", "/Applications", "/private", "/private/tmp", "/private/var", "/Volumes")  # fmt: skip
"""Directories that hold other people's or other programs' directories: never an output
themselves (a subdirectory of them is fine)."""


def homes() -> set[Path]:
    """The user's home directory, by $HOME and by the password database (a shell that expanded
    `~` before HOME was changed names the other one)."""
    found = {Path(os.path.expanduser("~"))}
    try:
        import pwd

        found.add(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except (ImportError, KeyError):
        pass
    return {p.resolve() for p in found if str(p) not in ("", "/")}


def protected(path: str | Path) -> str | None:
    """Why `path` may never be a command's output directory, or None."""
    resolved = Path(path).expanduser().resolve()
    text = resolved.as_posix()
    if resolved in homes():
        return "is the home directory"
    if text in SYSTEM_ROOTS:
        return "is the filesystem root" if text == "/" else "is a system directory"
    if any(text == tree or text.startswith(tree + "/") for tree in SYSTEM_TREES):
        return "is a system directory"
    if (resolved / ".git").exists():
        return "holds a git repository (.git)"
    if ".git" in resolved.parts:
        return "is inside a git repository's .git folder"
    return None


def refuse_protected(path: str | Path, flag: str) -> None:
    """One line when `path` is the root, the home directory, a system directory or a git checkout."""
    reason = protected(path)
    if reason:
        raise HeadstartError(
            f"{flag} {path} {reason}: headstart never writes its output there, --overwrite or not",
            f"give {flag} a new directory, e.g. {suggested_output(path)}",
        )


def suggested_output(path: str | Path) -> Path:
    """A new directory to offer instead of the protected `path`: one inside it, or beside the
    repository whose .git it lies in, or in the home directory; never one refused in turn."""
    resolved = Path(path).expanduser().resolve()
    if ".git" in resolved.parts:
        resolved = Path(*resolved.parts[: resolved.parts.index(".git")])
    candidates = [resolved / "headstart-output", *(home / "headstart-output" for home in sorted(homes()))]
    fits = (
        c for c in candidates if protected(c) is None and c.parent != Path(c.anchor)
    )  # not /headstart-output
    return next(fits, Path(tempfile.gettempdir()) / "headstart-output")


def check_writable(path: str | Path, what: str = "output", shown: str | Path | None = None) -> Path:
    """Refuse, before any work, an output directory that cannot be created or written (a run
    that only fails at its first save loses everything before it). The nearest existing ancestor
    is probed by creating (and removing) a temporary directory in it: permission bits say nothing
    for root, and /proc or a read-only mount only fail when written. `shown`: the path the user
    gave, when `path` is a directory derived from it (its parent)."""
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


def check_output_dir(path: str | Path, flag: str) -> Path:
    """What every output directory must pass before any work: not protected, writable."""
    refuse_protected(path, flag)
    return check_writable(path, flag)


def check_output(
    path: str | Path,
    flag: str,
    *,
    owned: Callable[[Path], bool],
    command: str,
    overwrite: bool = False,
    inputs: Iterable[str | Path] = (),
    can_overwrite: bool = True,
) -> Path:
    """The rule for a command that writes a set of files into a directory (`export`, `pack`):
    `path` may be new, empty, or an earlier output of this command (`owned(path)`); another
    non-empty directory needs `overwrite` (which replaces only the command's own files). Never
    allowed: a file, a protected directory, the working directory or one of its parents, and a
    directory that holds one of `inputs`. Returns the absolute path; raises one line naming
    `flag` otherwise."""
    raw = Path(path).expanduser()
    resolved = raw.resolve()
    if raw.exists() and not raw.is_dir():
        raise HeadstartError(f"{flag} {path} is a file", f"give {flag} a directory path (new or empty)")
    refuse_protected(path, flag)
    for source in inputs:
        source = Path(source).expanduser().resolve()
        if resolved == source or resolved in source.parents:
            raise HeadstartError(
                f"{flag} {path} holds the input {source}: writing there could replace what {command} reads",
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
            f"choose a new or empty {flag}"
            + (
                f", or pass --overwrite to write {command}'s files there (other files are left as they are)"
                if can_overwrite
                else ""
            ),
        )
    return resolved


def files_under(root: Path) -> list[str]:
    """Every file below `root`, as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir())


def publish_dir(dest: str | Path, write: Callable[[Path], Any], *, stale: Iterable[str] = ()) -> Path:
    """Call `write(tmp)` in a hidden temporary sibling of `dest`, then publish what it wrote:

    Every file and directory published gets the permissions a plain open()/mkdir() gives.

    - `dest` new: the temporary directory is renamed to `dest` (atomic);
    - otherwise each file written replaces its namesake in `dest` (one rename per file), and the
      names in `stale` (files an earlier run of the same command wrote, known from its mark) that
      this run did not write are removed. Nothing else in `dest` is touched.

    Replaced files are moved aside into a fresh `dest/.headstart-old-*` folder until every new file is in
    place, and put back if a rename fails; a file that would have to replace a directory is
    refused before anything moves. A failure leaves `dest` as it was and no temporary behind; an
    OS error is one line naming `dest`. Cost: one rename per file."""
    dest = Path(dest).expanduser().resolve()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(dest)
        tmp = Path(tempfile.mkdtemp(prefix=f"{tmp_prefix(dest)}{os.getpid()}-", dir=dest.parent))
        mark_leftover(tmp)  # what tells a later run this folder is a killed run's, not the user's
    except OSError as err:
        raise HeadstartError(
            f"cannot write {dest}: {err.strerror or err}", "choose a writable path"
        ) from None
    try:
        write(tmp)
        for path in [tmp, *tmp.rglob("*")]:  # some writers (safetensors) make 0600 files
            normal_permissions(path)
        if not dest.exists():  # an existing folder, even empty, keeps its own mode and owner
            os.replace(tmp, dest)
        else:
            _merge(tmp, dest, files_under(tmp), stale)
    except OSError as err:
        raise HeadstartError(
            f"cannot write {dest}: {err.strerror or err}", "check the disk space and the permissions"
        ) from None
    finally:
        if tmp.exists():  # only this function's own temporary directory
            shutil.rmtree(tmp, ignore_errors=True)
        if not tmp.exists():
            unmark_leftover(tmp)
    return dest


def _inside(dest: Path, name: str) -> bool:
    """`dest / name` stays inside `dest`: a plain relative path, no `..`, and no folder on the way
    that is a symlink (a mark is a file anyone can edit; a linked folder would lead outside)."""
    path = Path(name)
    if not name or path.is_absolute() or ".." in path.parts:
        return False
    return not any((dest / parent).is_symlink() for parent in path.parents[:-1])


def _merge(tmp: Path, dest: Path, names: list[str], stale: Iterable[str]) -> None:
    """Move `names` from `tmp` into `dest` and remove `stale` names no longer written, with the
    replaced files kept aside until the end (and put back on a failure)."""
    for name in names:
        if not _inside(dest, name):
            raise HeadstartError(
                f"{dest} holds a symlinked folder on the way to {name}: writing through it would land outside {dest}",
                "replace the link with a folder, or choose another output directory",
            )
        for part in [*reversed(Path(name).parents[:-1]), Path(name)]:
            there = dest / part
            if (there.is_dir() and part == Path(name)) or (there.is_file() and part != Path(name)):
                raise HeadstartError(
                    f"{dest} holds {there} where headstart writes {'a file' if part == Path(name) else 'a directory'}: "
                    "replacing it would delete what headstart did not write",
                    f"move {there} away, or choose another output directory",
                )
    # new and empty: only what is moved here; the pid in its name tells a later run whether it was left
    aside = Path(tempfile.mkdtemp(prefix=f"{ASIDE_PREFIX}{os.getpid()}-", dir=dest))
    mark_leftover(aside)
    moved: list[str] = []
    placed: list[str] = []
    made: list[Path] = []
    gone = [name for name in stale if _inside(dest, name) and name not in names and (dest / name).is_file()]
    try:
        for name in [*gone, *names]:
            if (dest / name).is_file() or (dest / name).is_symlink():
                (aside / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(dest / name, aside / name)
                moved.append(name)
            if name in gone:
                continue
            for parent in reversed(Path(name).parents[:-1]):
                if not (dest / parent).exists():
                    (dest / parent).mkdir()
                    normal_permissions(dest / parent)
                    made.append(dest / parent)
            os.replace(tmp / name, dest / name)
            placed.append(name)
    except BaseException:
        for name in placed:
            (dest / name).unlink(missing_ok=True)
        try:
            for name in moved:
                os.replace(aside / name, dest / name)
        except OSError as err:  # the replaced files are still whole, aside: say where
            raise HeadstartError(
                f"cannot write {dest}, and putting its earlier files back failed ({err.strerror or err})",
                f"they are in {aside}: move them back by hand",
            ) from None
        for folder in [*reversed(made), *sorted(aside.rglob("*"), reverse=True), aside]:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        if not aside.exists():
            unmark_leftover(aside)
        raise
    # `aside` holds only the files moved there above: replaced ones and stale ones
    shutil.rmtree(aside, ignore_errors=True)
    unmark_leftover(aside)


ASIDE_PREFIX = ".headstart-old-"
"""The folder inside an output where `_merge` keeps the files it replaces until the new ones are in."""


def tmp_prefix(dest: Path) -> str:
    """The name start of `publish_dir`'s temporary sibling of `dest` (then the pid, then random)."""
    return f".{dest.name}.tmp-"


LEFTOVER_MARK = ".headstart-leftover"
"""The suffix of the file `publish_dir` writes beside each temporary and aside folder it makes
(`FOLDER.headstart-leftover`, naming its process; beside, not inside: a writer listing its folder
never sees it): a later run removes such a folder only when its mark is there and that process
is gone. A folder merely named like one (`.exp1.tmp-backup`) is the user's."""


@dataclass
class Leftover:
    pid: int


def _mark_of(folder: Path) -> Path:
    return folder.with_name(folder.name + LEFTOVER_MARK)


def mark_leftover(folder: Path) -> None:
    _mark_of(folder).write_text(json.dumps({"pid": os.getpid()}) + "\n")


def unmark_leftover(folder: Path) -> None:
    _mark_of(folder).unlink(missing_ok=True)


def _dead(folder: Path) -> bool:
    """Whether `folder` is a killed run's: it holds `publish_dir`'s mark and the process the mark
    names is gone (SIGKILL, a power cut). Unmarked, damaged or of a live process: left alone."""
    from headstart.records import DamagedFile, read_record

    mark = _mark_of(folder)
    if folder.is_symlink() or not folder.is_dir() or mark.is_symlink() or not mark.is_file():
        return False
    try:
        pid = read_record(mark, Leftover, fix="").pid
    except DamagedFile:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):  # another user's live process; a nonsense pid
        return False
    return False  # alive: a run in progress (or the pid taken again since: left alone, the safe side)


def clean_leftovers(dest: Path) -> list[str]:
    """Remove what a killed run of `publish_dir` into `dest` left (nothing else): its temporary
    sibling (the killed run's partial output only) and, inside `dest`, its aside folder, whose
    files go back where the killed run had not yet placed their replacement (so a kill between
    the two renames loses nothing) and are deleted where it had (the replacement it meant). Folders
    of a live process are left alone. Returns what was done, one line each (logged)."""
    import logging

    done: list[str] = []
    parent = dest.parent
    if parent.is_dir():
        for tmp in parent.glob(f"{glob_escape(tmp_prefix(dest))}*"):
            if _dead(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
                unmark_leftover(tmp)
                done.append(f"removed {tmp} (the partial output of an interrupted run)")
    if dest.is_dir():
        for aside in dest.glob(f"{ASIDE_PREFIX}*"):
            if not _dead(aside):
                continue
            for name in files_under(aside):
                target = dest / name
                if not target.exists() and not target.is_symlink() and _inside(dest, name):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(aside / name, target)
                    done.append(f"put back {target} (an interrupted run had moved it aside)")
            shutil.rmtree(aside, ignore_errors=True)
            unmark_leftover(aside)
            done.append(f"removed {aside} (an interrupted run's replaced files)")
    for line in done:
        logging.getLogger(__name__).warning("note: %s", line)
    return done


def glob_escape(text: str) -> str:
    import glob

    return glob.escape(text)

"""headstart.outputs: the rule every command that writes follows, as units (the commands' own
tests are in tests/test_output_rule.py and tests/test_data_safety.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headstart.errors import HeadstartError
from headstart.outputs import protected, publish_dir


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def _write(files: dict[str, str]):
    def write(tmp: Path) -> None:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)

    return write


def test_a_new_directory_is_renamed_into_place(tmp_path):
    publish_dir(tmp_path / "out", _write({"a.txt": "1", "d/b.txt": "2"}))
    assert _tree(tmp_path / "out") == {"a.txt": b"1", "d": None, "d/b.txt": b"2"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_written_files_replace_their_namesakes_stale_ones_go_and_the_rest_stays(tmp_path):
    out = tmp_path / "out"
    publish_dir(out, _write({"a.txt": "1", "d/old.bin": "x", "gone.txt": "g"}))
    (out / "mine.txt").write_text("mine")
    (out / "d" / "mine.bin").write_text("mine too")
    publish_dir(out, _write({"a.txt": "new", "d/b.txt": "2"}), stale=["d/old.bin", "gone.txt", "never.txt"])
    assert _tree(out) == {
        "a.txt": b"new",
        "d": None,
        "d/b.txt": b"2",
        "d/mine.bin": b"mine too",
        "mine.txt": b"mine",
    }


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", "", "d/../../x"])
def test_stale_names_outside_the_directory_are_never_removed(tmp_path, name):
    """A mark is a file anyone can edit: a name that leaves the directory removes nothing."""
    out = tmp_path / "box" / "out"
    publish_dir(out, _write({"a.txt": "1"}))
    (tmp_path / "box" / "outside.txt").write_text("keep")
    (tmp_path / "x").write_text("keep")
    publish_dir(out, _write({"a.txt": "2"}), stale=[name])
    assert (tmp_path / "box" / "outside.txt").read_text() == "keep" and (tmp_path / "x").read_text() == "keep"


def test_a_failed_rename_puts_every_replaced_file_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    publish_dir(out, _write({"a.txt": "1", "b.txt": "2", "c.txt": "3"}))
    (out / "mine.txt").write_text("mine")
    before = _tree(out)
    real = os.replace
    calls = []

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # a.txt aside and in, b.txt aside, then b.txt in fails
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(HeadstartError, match="No space left on device"):
        publish_dir(out, _write({"a.txt": "new", "b.txt": "new", "c.txt": "new"}), stale=["a.txt"])
    monkeypatch.setattr(os, "replace", real)
    assert _tree(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_file_never_replaces_a_foreign_directory_or_goes_below_a_foreign_file(tmp_path):
    out = tmp_path / "out"
    (out / "a.txt").mkdir(parents=True)
    (out / "d").write_text("a file where a directory would go")
    before = _tree(out)
    for files in ({"a.txt": "1"}, {"d/b.txt": "2"}):
        with pytest.raises(HeadstartError, match="replacing it would delete what headstart did not write"):
            publish_dir(out, _write(files))
        assert _tree(out) == before


def test_protected_directories(tmp_path, monkeypatch):
    import headstart.outputs as outputs

    monkeypatch.setattr(outputs, "homes", lambda: {tmp_path.resolve()})
    assert protected(tmp_path) == "is the home directory"
    assert protected(tmp_path / "sub") is None
    assert protected("/") == "is the filesystem root"
    for path in ("/etc", "/usr/local/x", "/tmp", "/proc/1", "/home"):
        assert protected(path) == "is a system directory", path
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    assert protected(tmp_path / "repo") == "holds a git repository (.git)"
    assert protected(tmp_path / "repo" / "runs") is None  # a folder inside a checkout is fine
    assert protected(tmp_path / "repo" / ".git") == "is inside a git repository's .git folder"
    assert (
        protected(tmp_path / "repo" / ".git" / "objects" / "x") == "is inside a git repository's .git folder"
    )
    os.symlink(tmp_path, tmp_path / "link")
    assert protected(tmp_path / "link") == "is the home directory"  # through a symlink too


def test_a_symlinked_folder_never_leads_a_write_or_a_deletion_outside(tmp_path):
    """A mark is a file anyone can edit, and an output may hold a link: `link/x` where `link`
    points elsewhere is neither written through nor removed."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    out = tmp_path / "out"
    publish_dir(out, _write({"a.txt": "1"}))
    os.symlink(victim, out / "link")
    publish_dir(out, _write({"a.txt": "2"}), stale=["link/precious.txt"])
    assert (victim / "precious.txt").read_text() == "keep"
    with pytest.raises(HeadstartError, match="symlinked folder on the way to link/precious.txt"):
        publish_dir(out, _write({"link/precious.txt": "overwritten"}))
    assert (victim / "precious.txt").read_text() == "keep"


def test_a_killed_runs_aside_folder_is_never_deleted(tmp_path):
    """A run killed mid-merge leaves its aside folder (the user's replaced files) behind: a later
    run, even with the same pid, puts its own aside elsewhere."""
    out = tmp_path / "out"
    publish_dir(out, _write({"a.txt": "1"}))
    left = out / f".headstart-old-{os.getpid()}"
    left.mkdir()
    (left / "model.safetensors").write_text("the user's earlier weights")
    publish_dir(out, _write({"a.txt": "2"}))
    assert (left / "model.safetensors").read_text() == "the user's earlier weights"


def test_an_existing_empty_folder_keeps_its_mode(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    os.chmod(out, 0o700)
    publish_dir(out, _write({"a.txt": "1"}))
    assert (out.stat().st_mode & 0o777) == 0o700 and (out / "a.txt").read_text() == "1"


KILLED = """
import os, sys, time
from pathlib import Path
from headstart import outputs
dest, phase = Path(sys.argv[1]), sys.argv[2]
real = os.replace
def write(tmp):
    for i in range(3):
        (tmp / f"f{i}.bin").write_text(f"new {i}")
    if phase == "write":
        print("ready", flush=True); time.sleep(120)
def replace(a, b):
    real(a, b)
    if ".headstart-old-" in str(b):  # the first file moved aside, its replacement not yet placed
        print("ready", flush=True); time.sleep(120)
outputs.os.replace = replace
outputs.publish_dir(dest, write)
"""


@pytest.mark.parametrize("phase", ["write", "merge"])
def test_a_run_killed_mid_write_leaves_nothing_after_the_next_run(tmp_path, phase):
    """SIGKILL while the files are written (a partial temp sibling) and between moving an old file
    aside and placing its replacement: the next run into the same place removes the leftovers,
    and a file the killed run had moved aside is back if the next run does not replace it."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    publish_dir(out, _write({"f0.bin": "old 0", "f1.bin": "old 1", "notes.txt": "mine"}))
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(out), phase], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    left += [p.name for p in out.iterdir() if p.name.startswith(".headstart-old-")]
    assert left  # the kill left something behind
    if phase == "merge":
        assert not (out / "f0.bin").exists()  # moved aside, not yet replaced
    # the next run writes only notes2.txt: the killed run's aside file goes back
    publish_dir(out, _write({"notes2.txt": "2"}))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
    assert not [p for p in out.iterdir() if p.name.startswith(".headstart-old-")]
    assert _tree(out) == {"f0.bin": b"old 0", "f1.bin": b"old 1", "notes.txt": b"mine", "notes2.txt": b"2"}


@pytest.mark.parametrize("inside", ["", ".git", ".git/objects", ".git/headstart-output"])
def test_the_git_refusal_suggests_a_directory_that_is_not_refused_in_turn(tmp_path, inside):
    """A checkout or a path in its .git is refused; the fix names a path outside the .git folder
    (it named REPO/.git/headstart-output, refused in turn), and that path passes."""
    from headstart.errors import HeadstartError
    from headstart.outputs import protected, refuse_protected

    repo = tmp_path / "repo"
    (repo / ".git" / "objects").mkdir(parents=True)
    with pytest.raises(HeadstartError) as err:
        refuse_protected(repo / inside, "--output")
    suggested = Path(err.value.fix.rsplit("e.g. ", 1)[1])
    assert ".git" not in suggested.parts and protected(suggested) is None


def test_a_folder_merely_named_like_a_leftover_is_the_users(tmp_path):
    """`.exp1.tmp-userbackup` beside `exp1` (and `.headstart-old-1-x` inside it) hold no leftover
    mark: a publish into exp1 leaves them and their files alone (they were deleted as "partial
    output of an interrupted run")."""
    out = tmp_path / "exp1"
    publish_dir(out, _write({"a.txt": "1"}))
    mine = tmp_path / ".exp1.tmp-userbackup"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    inner = out / ".headstart-old-1-backup"
    inner.mkdir()
    (inner / "notes.txt").write_text("mine too")
    damaged = tmp_path / ".exp1.tmp-999999999-x"
    damaged.mkdir()
    (tmp_path / ".exp1.tmp-999999999-x.headstart-leftover").write_text("not json")
    publish_dir(out, _write({"a.txt": "2"}))
    assert (mine / "notes.txt").read_text() == "mine" and (inner / "notes.txt").read_text() == "mine too"
    assert damaged.is_dir() and (out / "a.txt").read_text() == "2"
    assert sorted(p.name for p in out.iterdir()) == [
        ".headstart-old-1-backup",
        "a.txt",
    ]  # no mark left inside

"""Nothing a command did not write is ever deleted: every command that writes runs against a fake
home (dotfiles, a git checkout, a cache) with and without --overwrite, as a new user's shell would
send it (`--output ~`), and into a folder of foreign files. Every foreign file survives, byte for
byte; the home itself is refused outright."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from headstart.cli import main


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_llama):
    """Heads, a finished distill and its pack, questions: made once, outside the fake home."""
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    w = tmp_path_factory.mktemp("safety-inputs")
    target = load_target(str(tiny_llama))
    build_head(
        HeadSpec(kind="eagle3", draft_vocab_size=60), target, token_counts=torch.arange(288.0)
    ).save_pretrained(w / "heads")
    (w / "q.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("hello", "count to three")))
    assert main(["distill", "--target", str(tiny_llama), "--prompts", str(w / "q.jsonl"), "--out", str(w / "d"),
                 "--num", "2", "--max-new-tokens", "6", "--max-prompt-tokens", "64", "-q"]) == 0  # fmt: skip
    return w


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home as a user has it: dotfiles, a cache, a git checkout, a folder of their own files."""
    import headstart.outputs as outputs

    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_secret")
    (home / ".bashrc").write_text("export PATH=$HOME/bin:$PATH\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_bytes(os.urandom(64))
    (home / "project" / ".git").mkdir(parents=True)
    (home / "project" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (home / "project" / "train.py").write_text("print('mine')\n")
    (home / "work").mkdir()
    (home / "work" / "notes.txt").write_text("mine")
    (home / "work" / "config.json").write_text('{"mine": true}')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "hs-cache"))
    monkeypatch.setattr(outputs, "homes", lambda: {home.resolve()})
    monkeypatch.chdir(tmp_path)
    return home


def _recipe(inputs: Path, tiny_llama: Path, out: Path) -> str:
    path = inputs / f"recipe-{abs(hash(str(out)))}.yaml"
    path.write_text(f"target: {tiny_llama}\noutput_dir: {out}\nhead: {{kind: medusa, num_heads: 1}}\n"
                    f"data: {{path: [{inputs / 'd'}], holdout: 0}}\nmax_steps: 1\nsave_every: 1\neval_every: 100\n"
                    "batch_size: 1\ntrackers: []\n")  # fmt: skip
    return str(path)


def commands(inputs: Path, tiny_llama: Path, out: Path) -> dict[str, list[str]]:
    """Every command that writes, with `out` as its output directory."""
    export = ["export", str(inputs / "heads"), "--target", str(tiny_llama), "--output", str(out), "--format"]
    return {
        **{f"export {fmt}": [*export, fmt] for fmt in ("speculators", "eagle", "headstart")},
        "push --dry-run": ["push", str(inputs / "heads"), "--dry-run", str(out)],
        "distill": [
            "distill",
            "--target",
            str(tiny_llama),
            "--prompts",
            str(inputs / "q.jsonl"),
            "--out",
            str(out),
            "--num",
            "2",
            "--max-new-tokens",
            "4",
            "--max-prompt-tokens",
            "64",
            "-q",
        ],  # fmt: skip
        "bench": [
            "bench",
            "--target",
            str(tiny_llama),
            "--heads",
            str(inputs / "heads"),
            "--questions",
            str(inputs / "q.jsonl"),
            "--baselines",
            "vanilla",
            "--max-new-tokens",
            "4",
            "-q",
            "--output",
            str(out),
        ],  # fmt: skip
        "train": ["train", "--recipe", _recipe(inputs, tiny_llama, out)],
        "pack": ["pack", str(inputs / "d"), str(out)],
    }


def _run(argv: list[str]) -> int:
    if argv[0] == "pack":
        from headstart.distill.pack import main as pack_main

        return pack_main(argv[1:])
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


NAMES = [
    "export speculators",
    "export eagle",
    "export headstart",
    "push --dry-run",
    "distill",
    "bench",
    "train",
    "pack",
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "overwrite"])
def test_the_home_directory_is_never_an_output(name, overwrite, inputs, tiny_llama, home, capsys):
    argv = commands(inputs, tiny_llama, home)[name] + (
        ["--overwrite"] if overwrite and name.startswith("export") else []
    )
    before = _tree(home)
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert "is the home directory" in err, err
    assert _tree(home) == before


@pytest.mark.parametrize("name", NAMES)
def test_a_git_checkout_is_never_an_output(name, inputs, tiny_llama, home, capsys):
    project = home / "project"
    before = _tree(home)
    argv = commands(inputs, tiny_llama, project)[name] + (
        ["--overwrite"] if name.startswith("export") else []
    )
    assert _run(argv) == 2
    assert "holds a git repository" in capsys.readouterr().err
    assert _tree(home) == before


@pytest.mark.parametrize("name", NAMES)
def test_a_folder_of_foreign_files_keeps_every_one(name, inputs, tiny_llama, home, capsys):
    """Without --overwrite: refused, nothing touched. With it (export): the command's files are
    written beside the foreign ones, each foreign file byte for byte as it was."""
    work = home / "work"
    before = _tree(home)
    assert _run(commands(inputs, tiny_llama, work)[name]) == 2
    assert _tree(home) == before
    if name.startswith("export"):
        assert _run([*commands(inputs, tiny_llama, work)[name], "--overwrite"]) == 0
        after = _tree(home)
        kept = {k: v for k, v in before.items() if k != "work/config.json"}  # the one name export writes
        assert {k: after[k] for k in kept} == kept
        assert not [k for k in after if ".headstart-old" in k or ".tmp-" in k]


@pytest.mark.parametrize("name", NAMES)
def test_outputs_in_a_new_folder_are_readable_like_any_file(name, inputs, tiny_llama, home):
    """Everything a command publishes (weights included) has the permissions a plain open() or
    mkdir() gives (0666/0777 minus the umask), not mkstemp's 0600."""
    from headstart.io import umask

    out = home / "new" / name.replace(" ", "-")
    assert _run(commands(inputs, tiny_llama, out)[name]) == 0
    if name == "train":  # the report stamps the code that ran and names no path of this machine
        results = (out / "results.json").read_text()
        assert json.loads(results)["provenance"]["headstart"] and str(home) not in results
    for path in [out, *out.rglob("*")]:
        if path.name in (".lock",):
            continue
        want = (0o777 if path.is_dir() else 0o666) & ~umask()
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_export_over_an_earlier_export_keeps_what_the_user_added(inputs, tiny_llama, home):
    out = home / "exports" / "spec"
    argv = commands(inputs, tiny_llama, out)["export speculators"]
    assert _run(argv) == 0
    (out / "my-notes.md").write_text("how I served it")
    shutil.copy(home / ".bashrc", out / ".env")
    assert _run(argv) == 0
    assert (out / "my-notes.md").read_text() == "how I served it" and (out / ".env").is_file()

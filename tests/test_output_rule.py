"""The rule every command that writes follows (headstart.io): never delete what it did not write;
write a temporary sibling and rename it into place; refuse a non-empty target without an explicit
flag. One test per command: export, distill, train, bench, tune. (The refusals, in one line and
with nothing touched, are rows of tests/test_bad_inputs.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from headstart.cli import main
from headstart.errors import HeadstartError


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny_llama):
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    folder = tmp_path_factory.mktemp("rule") / "heads"
    target = load_target(str(tiny_llama))
    build_head(
        HeadSpec(kind="eagle3", draft_vocab_size=60), target, token_counts=torch.arange(288.0)
    ).save_pretrained(folder)
    return folder


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


EXPORTED = [".headstart-export", "README.md", "config.json", "model.safetensors"]


def test_export_writes_its_own_files_and_never_deletes_anything_else(heads, tiny_llama, tmp_path, capsys):
    base = ["export", str(heads), "--target", str(tiny_llama), "--format", "eagle", "--dtype", "float32"]
    out = tmp_path / "out"
    assert main([*base, "--output", str(out)]) == 0
    assert main([*base, "--output", str(out)]) == 0  # an earlier export of this format: replaced
    assert sorted(p.name for p in out.iterdir()) == EXPORTED
    (out / "notes.txt").write_text("mine")  # a file export did not write, beside an earlier export
    assert main([*base, "--output", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    (junk / ".bashrc").write_text("alias x=y")
    (junk / "cache").mkdir()
    (junk / "cache" / "blob").write_bytes(b"\x00" * 10)
    before = _tree(junk)
    assert main([*base, "--output", str(junk)]) == 2  # not an export: refused without --overwrite
    assert "not empty" in capsys.readouterr().err and _tree(junk) == before
    assert main([*base, "--output", str(junk), "--overwrite"]) == 0  # said so: export's files written
    after = _tree(junk)
    assert {k: after[k] for k in before} == before  # every foreign file, byte for byte
    assert sorted(set(after) - set(before)) == EXPORTED
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp or old copy left
    assert not [p for p in junk.iterdir() if p.name.startswith(".headstart-old")]


def test_a_later_export_removes_only_the_files_an_earlier_export_listed(heads, tiny_llama, tmp_path):
    """The earlier export's mark lists its files: those this export does not write (a tuned tree of
    the earlier heads, another format's files) go; a foreign file of the same shape stays."""
    import shutil

    tuned = tmp_path / "tuned"
    shutil.copytree(heads, tuned)
    (tuned / "tuned_tree.json").write_text(json.dumps({"tree": "chain:2", "device": "cpu", "threads": 1}))
    out = tmp_path / "out"
    base = ["--target", str(tiny_llama), "--dtype", "float32", "--output", str(out)]
    assert main(["export", str(tuned), "--format", "eagle", *base]) == 0
    assert (out / "tuned_tree.json").is_file()
    (out / "mine.json").write_text("{}")
    assert main(["export", str(heads), "--format", "eagle", *base]) == 0  # heads without a tuned tree
    assert not (out / "tuned_tree.json").exists() and (out / "mine.json").read_text() == "{}"
    assert main(["export", str(heads), "--format", "speculators", *base, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*EXPORTED, "mine.json"])
    assert json.loads((out / ".headstart-export").read_text())["format"] == "speculators"


@pytest.mark.parametrize("where", ["home", "root", "etc", "git"])
def test_export_never_writes_into_home_root_system_or_git_dirs(
    where, heads, tiny_llama, tmp_path, monkeypatch, capsys
):
    """`export --output ~ --overwrite` once replaced a home directory; these are refused outright."""
    home = tmp_path / "home"
    (home / ".git").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    import headstart.outputs as outputs

    monkeypatch.setattr(outputs, "homes", lambda: {home.resolve()})
    output = {"home": str(home), "root": "/", "etc": "/etc/headstart", "git": str(tmp_path)}[where]
    if where == "git":
        (tmp_path / ".git").mkdir()
    before = _tree(home)
    code = main(["export", str(heads), "--target", str(tiny_llama), "--format", "eagle", "--output", output,
                 "--overwrite"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    reason = {"home": "is the home directory", "root": "is the filesystem root", "etc": "is a system directory",
              "git": "holds a git repository"}[where]  # fmt: skip
    assert reason in err and _tree(home) == before


def test_an_export_never_replaces_a_foreign_directory_with_a_file(heads, tiny_llama, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "config.json").mkdir(parents=True)  # a directory where export writes a file
    (out / "config.json" / "inner").write_text("mine")
    code = main(["export", str(heads), "--target", str(tiny_llama), "--format", "eagle", "--output", str(out),
                 "--overwrite"])  # fmt: skip
    assert code == 2
    assert "replacing it would delete what headstart did not write" in capsys.readouterr().err
    assert _tree(out) == {"config.json": None, "config.json/inner": b"mine"}


def test_export_never_takes_a_trained_head_or_the_target_for_its_own(heads, tiny_llama, tmp_path, capsys):
    """A training run's final/ has an export's file names (config.json, model.safetensors,
    README.md) but not its mark: replacing it needs --overwrite. And --overwrite never deletes
    the --target it reads."""
    import shutil

    final = tmp_path / "run" / "final"
    shutil.copytree(heads, final)
    before = _tree(final)
    base = ["export", str(heads), "--target", str(tiny_llama), "--format", "headstart", "--dtype", "float32"]
    assert main([*base, "--output", str(final)]) == 2
    assert "not an earlier output" in capsys.readouterr().err and _tree(final) == before
    models = tmp_path / "models"
    shutil.copytree(tiny_llama, models / "target")
    inside = ["export", str(heads), "--target", str(models / "target"), "--format", "eagle"]
    assert main([*inside, "--output", str(models), "--overwrite"]) == 2
    assert "holds the input" in capsys.readouterr().err and (models / "target" / "config.json").is_file()


def test_an_export_carries_the_tuned_tree(heads, tiny_llama, tmp_path):
    """The same heads at another dtype or layout decode with the tree `headstart tune` chose."""
    import shutil

    from headstart.tuned import tuned_tree

    tuned = tmp_path / "tuned"
    shutil.copytree(heads, tuned)
    (tuned / "tuned_tree.json").write_text(json.dumps({"tree": "chain:2", "device": "cpu", "threads": 1}))
    out = tmp_path / "own"
    assert (
        main(
            ["export", str(tuned), "--target", str(tiny_llama), "--format", "headstart", "--output", str(out)]
        )
        == 0
    )
    assert tuned_tree(out) == "chain:2"


def test_a_failed_export_leaves_the_earlier_one_whole(heads, tiny_llama, tmp_path, monkeypatch):
    import safetensors.torch

    base = ["export", str(heads), "--target", str(tiny_llama), "--format", "speculators", "--output"]
    out = tmp_path / "out"
    assert main([*base, str(out)]) == 0
    before = _tree(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    assert main([*base, str(out)]) == 2
    assert _tree(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_names_the_path_on_an_os_error(tmp_path):
    from headstart.outputs import publish_dir as atomic_dir

    def fail(tmp):
        (tmp / "half.bin").write_bytes(b"x")
        raise OSError(5, "Input/output error")

    with pytest.raises(HeadstartError, match=f"cannot write {tmp_path / 'x'}: Input/output error"):
        atomic_dir(tmp_path / "x", fail)
    assert list(tmp_path.iterdir()) == []


def test_distill_writes_into_its_own_output_only(tiny_llama, tmp_path):
    from headstart.distill import DistillConfig
    from headstart.distill.pipeline import run_distill
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    source = tmp_path / "p.jsonl"
    source.write_text('{"prompt": "hello"}\n{"prompt": "count"}\n')
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    cfg = dict(prompts=str(source), num=2, max_new_tokens=4, max_prompt_tokens=64)
    with pytest.raises(HeadstartError, match="not empty and is not a distill output"):
        run_distill(DistillConfig(out=str(junk), **cfg), target=target, quiet=True)
    assert _tree(junk) == {"notes.txt": b"mine"}
    out = tmp_path / "out"
    run_distill(DistillConfig(out=str(out), **cfg), target=target, quiet=True)
    written = _tree(out)
    run_distill(DistillConfig(out=str(out), **cfg), target=target, quiet=True)  # resumed: nothing to add
    assert {k: v for k, v in _tree(out).items() if k != "summary.json"} == {
        k: v for k, v in written.items() if k != "summary.json"
    }
    assert not any(Path(name).name.startswith(".tmp") for name in _tree(out))


def test_train_refuses_a_directory_of_other_files_and_a_finished_run(tiny_llama, tmp_path):
    from headstart.config import load_config
    from headstart.train.config import TrainConfig
    from headstart.train.loop import check_run_dir

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "final").mkdir()  # a name a run writes, but no run: still refused
    (junk / "final" / "weights.bin").write_text("mine")
    (junk / "data.csv").write_text("mine")
    check_run_dir(tmp_path / "new", resume=False)  # new: fine
    (tmp_path / "logs-only" / "logs").mkdir(parents=True)
    check_run_dir(tmp_path / "logs-only", resume=False)  # a run that failed before its first step
    cfg = load_config(TrainConfig, None, [f"target={tiny_llama}", f"output_dir={junk}", "trackers=[none]"])
    from headstart.train.loop import train

    with pytest.raises(HeadstartError, match="already holds a finished training run"):
        train(cfg)
    (junk / "final" / "weights.bin").unlink()
    (junk / "final").rmdir()
    with pytest.raises(HeadstartError, match="holds no headstart training run"):
        train(cfg)
    assert _tree(junk) == {"data.csv": b"mine"}


def test_bench_writes_only_its_own_files(heads, tiny_llama, tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "bench"
    args = ["bench", "--target", str(tiny_llama), "--heads", str(heads), "--questions", str(questions),
            "--baselines", "vanilla", "--max-new-tokens", "4", "-q", "--output", str(out)]  # fmt: skip
    assert main(args) == 0
    assert {p.name for p in out.iterdir()} <= {"report.json", "report.md", "outputs.jsonl", "speedup_by_category.png", "accept_by_position.png",
                                               "accept_lengths.png", ".headstart-bench"}  # fmt: skip
    finished = _tree(out)
    assert main(args) == 2 and _tree(out) == finished  # a finished run is never measured over
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["provenance"]["headstart"] and "commit" in report["config"]["provenance"]
    assert str(tmp_path) not in (out / "report.json").read_text() + (out / "report.md").read_text()
    assert "Measured by headstart" in (out / "report.md").read_text()


def test_bench_takes_no_folder_for_its_own_by_a_file_name(heads, tiny_llama, tmp_path, capsys):
    """A folder holding the user's outputs.jsonl (or report.json) is not a bench run: refused
    untouched; only a run's mark (or its distinctive partial files) makes a folder bench's."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"prompt": "hello"}\n')
    for name in ("outputs.jsonl", "report.json"):
        mine = tmp_path / f"mine-{name}"
        mine.mkdir()
        (mine / name).write_text("my own lines\n")
        (mine / "notes.txt").write_text("mine")
        before = _tree(mine)
        args = ["bench", "--target", str(tiny_llama), "--heads", str(heads), "--questions", str(questions),
                "--baselines", "vanilla", "--max-new-tokens", "4", "-q", "--output", str(mine)]  # fmt: skip
        for extra in ([], ["--resume"]):
            assert main([*args, *extra]) == 2, (name, extra)
            assert "holds no bench run" in capsys.readouterr().err
            assert _tree(mine) == before


def test_bench_merge_follows_the_output_rule(heads, tiny_llama, tmp_path, capsys, monkeypatch):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"prompt": "hello"}\n{"prompt": "bye"}\n')
    base = ["bench", "--target", str(tiny_llama), "--heads", str(heads), "--questions", str(questions),
            "--baselines", "vanilla", "--max-new-tokens", "4", "-q"]  # fmt: skip
    shards = [tmp_path / "s1", tmp_path / "s2"]
    for k, shard in enumerate(shards, 1):
        assert main([*base, "--shard", f"{k}/2", "--output", str(shard)]) == 0
    merge = ["bench", "--merge", *map(str, shards), "-q", "--output"]
    checkout = tmp_path / "repo"
    (checkout / ".git").mkdir(parents=True)
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    foreign = tmp_path / "foreign"
    for folder in (checkout, home, foreign):
        folder.mkdir(exist_ok=True)
        (folder / "report.json").write_text('{"mine": true}')
        (folder / "report.md").write_text("my notes")
        before = _tree(folder)
        assert main([*merge, str(folder)]) == 2, folder
        assert _tree(folder) == before
    err = capsys.readouterr().err
    assert "holds a git repository" in err and "is the home directory" in err and "is not empty" in err
    assert main([*merge, str(checkout / ".git")]) == 2 and not (checkout / ".git" / "report.json").exists()
    merged = tmp_path / "merged"
    assert main([*merge, str(merged)]) == 0
    (merged / "notes.txt").write_text("mine")
    assert main([*merge, str(merged)]) == 0  # an earlier merge's folder: its files replaced, nothing else
    assert (merged / "notes.txt").read_text() == "mine" and (merged / "report.json").is_file()
    assert main([*merge, str(shards[0])]) == 2  # an input, and a measured run


def test_tune_writes_its_file_and_nothing_else(heads, tiny_llama, tmp_path, slow_plain):
    import shutil

    from headstart.heads.files import TUNED_FILE

    mine = tmp_path / "heads"
    shutil.copytree(heads, mine)
    (mine / "notes.txt").write_text("mine")
    before = _tree(mine)
    args = ["tune", "--target", str(tiny_llama), "--heads", str(mine), "--limit", "1", "--max-new-tokens", "4",
            "--candidates", "chain:1;chain:2"]  # fmt: skip
    assert main([*args, "--dry-run"]) == 0 and _tree(mine) == before
    assert main(args) == 0
    after = _tree(mine)
    assert set(after) - set(before) == {TUNED_FILE} and {k: after[k] for k in before} == before
    assert json.loads(after[TUNED_FILE])["tree"] in ("chain:1", "chain:2")

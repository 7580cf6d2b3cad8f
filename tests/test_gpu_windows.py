"""scripts/gpu/windows.py, the accumulating run's ledger: the next window's number, the verdict's
bookkeeping, and the card of the shipped head saying how many windows, steps and tokens made it."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu" / "windows.py"


@pytest.fixture
def windows(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_windows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "LEDGER", tmp_path / "ledger.json")
    shipped = tmp_path / "shipped"
    shutil.copytree(ROOT / "headstart" / "default_heads" / "smollm2-eagle3", shipped,
                    ignore=shutil.ignore_patterns("*.safetensors"))  # fmt: skip
    monkeypatch.setattr(module, "SHIPPED", shipped)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module


def window(number: int, adopted: bool, start: float, end: float) -> dict:
    return {"window": number, "date": "2026-11-28", "card": "NVIDIA H200", "steps": 100 * number,
            "train_tokens": 1_000_000 * number, "adopted": adopted, "reference_tree": f"tau {number}",
            "cpu_eval": {"window_head": {"eval/accept_len_est": end}, "start_head": {"eval/accept_len_est": start}}}  # fmt: skip


def test_the_next_window_counts_the_ledger(windows, capsys):
    windows.cmd_next(None)
    assert capsys.readouterr().out.strip() == "1"
    windows.LEDGER.write_text(
        json.dumps({"windows": [window(1, True, 2.0, 2.1), window(2, False, 2.1, 2.1)]})
    )
    windows.cmd_next(None)
    assert capsys.readouterr().out.strip() == "3"  # a window that lost still counts: its seed is spent


def test_the_card_says_what_made_the_head(windows):
    book = {
        "windows": [window(1, True, 2.05, 2.22), window(2, False, 2.22, 2.21), window(3, True, 2.22, 2.32)]
    }
    windows.LEDGER.write_text(json.dumps(book))
    windows.describe_lineage(book)
    config = json.loads((windows.SHIPPED / "config.json").read_text())["training"]["lineage"]
    assert (
        config["summary"].startswith("2 GPU windows") and "400 steps, 4.0M train tokens" in config["summary"]
    )
    assert len(config["windows"]) == 3  # the origin and the two adopted windows
    card = (windows.SHIPPED / "README.md").read_text()
    assert card.count("## How it was made") == 1 and "window 3" in card and "window 2" not in card
    windows.describe_lineage(book)  # again: the section is replaced, not repeated
    assert (windows.SHIPPED / "README.md").read_text().count("## How it was made") == 1


def test_next_runs_with_the_standard_library_alone(tmp_path):
    """`next` runs on the bare GPU machine before anything is installed."""
    out = subprocess.run(
        [sys.executable, "-S", str(SCRIPT), "next"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.strip().isdigit(), out.stderr


@pytest.mark.parametrize(
    ("gain", "long_gain", "adopted"),
    [
        (0.05, 0.0, True),  # better on short prompts, the same on long ones
        (0.0, 0.05, True),  # better on long prompts, the same on short ones
        (0.05, -0.05, False),  # helps short prompts and hurts long ones: not shipped
        (-0.05, 0.08, False),  # the reverse
        (0.01, 0.01, False),  # within the noise on both
        (0.05, None, True),  # a ledger entry from before the long set: the short set alone
        (0.01, None, False),
    ],
)
def test_the_verdict_asks_both_held_out_sets(windows, gain, long_gain, adopted):
    assert windows.verdict(gain, long_gain) is adopted


def test_the_long_evaluation_overrides_the_held_out_set(windows, monkeypatch, tmp_path):
    """`evaluate` with the long set passes its folder and a length that holds its rows."""
    seen = []

    def run(command, cwd, check):
        seen.append(command)
        out = Path(next(c for c in command if c.startswith("output_dir=")).split("=", 1)[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"final_eval": {"eval/accept_len_est": 2.3}}))

    monkeypatch.setattr(windows.subprocess, "run", run)
    assert (
        windows.evaluate(tmp_path / "head", tmp_path / "eval", windows.LONG_EVAL)["eval/accept_len_est"]
        == 2.3
    )
    assert "data.eval_path=[data/smollm2-kept/sglong-eval]" in seen[0] and "data.max_length=2048" in seen[0]
    assert seen[0][-1] == "-q"


def test_a_continuation_off_the_windows_is_shipped_and_kept_in_the_lineage(windows, tmp_path):
    head = tmp_path / "export"
    head.mkdir()
    for name, text in (("model.safetensors", "weights"), ("config.json", json.dumps({"training": {}})),
                       ("README.md", "# card\n\ntext\n")):  # fmt: skip
        (head / name).write_text(text)
    (tmp_path / "results.json").write_text(json.dumps({"steps": 166, "tokens": 325_724}))
    windows.LEDGER.write_text(json.dumps({"windows": [window(1, True, 2.05, 2.22)]}))
    args = argparse.Namespace(head=str(head), results=str(tmp_path / "results.json"), recipe="long-cpu",
                              evidence="held-out +0.36", card="CPU", date="2026-12-03")  # fmt: skip
    windows.cmd_continue(args)
    assert (windows.SHIPPED / "model.safetensors").read_text() == "weights"
    book = json.loads(windows.LEDGER.read_text())
    assert len(book["windows"]) == 1 and book["continuations"][0]["steps"] == 166
    windows.cmd_next(None)  # a continuation spends no window number (no seed)
    book["windows"].append(window(2, True, 2.22, 2.30) | {"date": "2026-12-05"})
    windows.describe_lineage(book)  # a later window's promote rewrites the lineage: it is kept, in order
    lines = json.loads((windows.SHIPPED / "config.json").read_text())["training"]["lineage"]["windows"]
    assert [line.split(" ")[1] for line in lines] == ["before", "window", "continued", "window"]
    card = (windows.SHIPPED / "README.md").read_text()
    assert (
        card.count("## How it was made") == 1 and "continued (2026-12-03, CPU, long-cpu): 166 steps" in card
    )

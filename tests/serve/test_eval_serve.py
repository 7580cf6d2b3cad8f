"""scripts/eval_serve.py end to end: lm-evaluation-harness (0.4.13, in its own virtualenv, made
from PyPI on first use) with `local-completions` and its default request settings against
`headstart serve --target smollm2`, with the shipped heads and without, on the repository's two
tasks: the same scores and the same per-sample responses (logprobs to the last digit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_lm_eval_gives_the_same_scores_and_logprobs_with_heads_and_without(tmp_path):
    run = subprocess.run([sys.executable, "scripts/eval_serve.py", "--limit", "4", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "identical: every metric and all 8 samples' responses" in run.stdout
    assert len(list(tmp_path.rglob("samples_*.jsonl"))) == 4  # two tasks, two modes

"""An outside reader: vLLM's `speculators` package loads a `headstart export --format speculators`
directory and drafts exactly what headstart drafts. speculators pins another transformers, so it
lives in its own virtualenv, named by HEADSTART_SPECULATORS_PYTHON (skipped without it):

    python3 -m venv /tmp/spec && /tmp/spec/bin/pip install torch==2.13.0 speculators sentencepiece
    /tmp/spec/bin/pip uninstall -y torchvision torchaudio   # pulled at versions that do not match torch
    HEADSTART_SPECULATORS_PYTHON=/tmp/spec/bin/python .venv/bin/python -m pytest -m slow tests/heads/test_heads_speculators.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import make_target_dir

from headstart.heads import HeadSpec, build_head
from headstart.heads.formats import export_heads
from headstart.targets import load_target

SPECULATORS = os.environ.get("HEADSTART_SPECULATORS_PYTHON")
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_speculators.py"


@pytest.mark.slow
@pytest.mark.skipif(not SPECULATORS, reason="set HEADSTART_SPECULATORS_PYTHON to a speculators venv's python")
def test_speculators_loads_the_export_and_drafts_like_headstart(tiny_root, tmp_path):
    # 6 layers and explicit taps: the engines want three distinct aux layers (the default taps
    # of a 6-layer target collide: 1, 2, 2)
    directory = make_target_dir(tiny_root, "llama", seed=6, num_hidden_layers=6)
    target = load_target(str(directory))
    head = build_head(
        HeadSpec(kind="eagle3", draft_vocab_size=60, feature_layers=[1, 2, 3]),
        target,
        token_counts=torch.arange(target.vocab_size) * 1.0,
    )
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = export_heads(head, "speculators", tmp_path / "speculators", dtype="float32")
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("hello there", "count to ten")))
    cmd = [sys.executable, str(SCRIPT), "--export", str(out), "--prompts", str(prompts), "--target", str(directory),
           "--max-new-tokens", "24", "--python", SPECULATORS]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["loading_problems"] == {} and report["agreement_with_headstart"] == 1.0

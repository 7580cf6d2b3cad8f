"""scripts/profile_train.py on a tiny target: every figure it promises is there and sane (the
phases sum to the step, FLOPs per token counted, utilisation against the measured peak, no host
sync in an EAGLE-3 step with its collated plan), variants interleaved, the JSON without paths."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from test_train_distilled import distilled  # noqa: F401  (the fixture)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_train.py"


def _script():
    spec = importlib.util.spec_from_file_location("profile_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dynamo resolves a traced function's globals by module name
    spec.loader.exec_module(module)
    return module


def test_the_profile_reports_every_figure(distilled, tiny_llama, tmp_path):  # noqa: F811
    out = tmp_path / "profile.json"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({"head": {"kind": "eagle3", "draft_vocab_size": 64}, "loss": {"ttt_steps": 3},
                                  "data": {"path": str(distilled), "holdout": 0}, "batch_size": 2}))  # fmt: skip
    result = _script().main([
        "--recipe", str(recipe), f"target={tiny_llama}", "--device", "cpu", "--batches", "2", "--warmup", "1",
        "--steps", "2", "--rounds", "2", "--profile-steps", "1", "--peak-size", "64",
        "--variant", "fp32:", "--variant", "bf16:mixed_precision=bf16", "--output", str(out),
    ])  # fmt: skip
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert saved["tokens_per_s"] == saved["variants"][0]["tokens_per_s"] > 0
    assert set(saved["peak_tflops"]) == {"float32", "bfloat16"} and all(
        v > 0 for v in saved["peak_tflops"].values()
    )
    assert {"device", "date", "commit", "command", "flops_counted_by"} <= saved.keys()
    for row, dtype in zip(saved["variants"], ("float32", "bfloat16"), strict=True):
        assert row["matmul_dtype"] == dtype and len(row["tokens_per_s_rounds"]) == 2
        phases = row["seconds_per_step"]
        assert {
            "target",
            "unroll",
            "masks",
            "labels",
            "loss",
            "backward",
            "optimizer",
            "collate",
        } <= phases.keys()
        assert all(s >= 0 for s in phases.values())
        # headstart's step makes none (the plan comes with the batch); transformers' eager mask
        # creation makes one (its packed-sequence check, skipped when traced: compile=true)
        assert row["host_syncs_per_step"] <= 1
        assert row["flops_per_token"] > 0 and row["flops_per_token_by_phase"]["target"] > 0
        assert row["utilisation"] > 0

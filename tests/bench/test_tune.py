"""headstart tune: measures candidate trees, stores the fastest with the heads; bench uses it."""

from __future__ import annotations

import json

from headstart.bench.tune import TUNED_FILE, candidate_trees, tuned_tree
from headstart.cli import main


def test_candidates_fit_the_heads():
    assert candidate_trees("medusa", 3) == ["chain:1", "chain:2", "chain:3", "static"]
    eagle = candidate_trees("eagle3", None)
    assert eagle[:6] == [f"chain:{d}" for d in range(1, 7)]
    assert "chain:1" in eagle and any(c.startswith("dynamic:") for c in eagle)


def test_tune_stores_the_fastest_tree(tiny_llama, tmp_path, capsys):
    from headstart.heads import HeadSpec, build_head
    from headstart.target import load_target

    target = load_target(str(tiny_llama))
    heads = tmp_path / "heads"
    build_head(HeadSpec(kind="eagle"), target).save_pretrained(heads)
    assert tuned_tree(heads) is None
    args = [
        "tune",
        "--target",
        str(tiny_llama),
        "--heads",
        str(heads),
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
    ]
    assert main(args + ["--candidates", "chain:1;dynamic:depth=2,top_k=2,total_tokens=3"]) == 0
    report = json.loads((heads / TUNED_FILE).read_text())
    rates = {row["tree"]: row["tokens_per_s"] for row in report["candidates"]}
    assert set(rates) == {"chain:1", "dynamic:depth=2,top_k=2,total_tokens=3"}
    assert report["tree"] == max(rates, key=rates.get) == tuned_tree(heads)
    assert set(report["verify_cost_ms"]) >= {"1", "8"}
    assert "best:" in capsys.readouterr().out


def test_tune_needs_heads(tiny_llama, tmp_path):
    assert main(["tune", "--target", str(tiny_llama), "--heads", str(tmp_path / "none")]) == 2

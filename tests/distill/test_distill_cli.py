"""`headstart distill` on the command line: flags and recipes map onto DistillConfig; a real SIGKILL resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headstart.cli import build_parser, main
from headstart.commands.distill import config_from_args
from headstart.distill import load_distilled

REPO = Path(__file__).resolve().parents[2]


def _cfg(argv):
    return config_from_args(build_parser().parse_args(["distill", *argv]))


def test_flags_recipe_and_overrides_build_one_config(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("out: from-recipe\nnum: 5\nbatch_size: 4\ndatafree:\n  temperature: 0.7\n")
    cfg = _cfg(
        [
            "--recipe",
            str(recipe),
            "--num",
            "9",
            "--cache-features",
            "--feature-layers",
            "1,2",
            "datafree.top_p=0.5",
            "--system",
            'say "hi"\nnow',
        ]
    )
    assert (cfg.out, cfg.num, cfg.batch_size, cfg.cache_features, cfg.feature_layers) == (
        "from-recipe",
        9,
        4,
        True,
        "1,2",
    )
    assert (cfg.datafree.temperature, cfg.datafree.top_p, cfg.system) == (0.7, 0.5, 'say "hi"\nnow')
    assert _cfg(["--out", "o"]).prompts is None  # data-free by default


def test_every_shipped_recipe_parses():
    found = [*(REPO / "recipes").glob("*.yaml"), *(REPO / "experiments").rglob("*.yaml")]
    recipes = sorted(p for p in found if " headstart distill " in p.read_text().splitlines()[0])
    assert len(recipes) >= 2 and (REPO / "recipes" / "smollm2-distill-cpu.yaml") in recipes
    for recipe in recipes:
        assert recipe.read_text().startswith(
            "# headstart distill --recipe " + recipe.relative_to(REPO).as_posix()
        )
        _cfg(["--recipe", str(recipe)])


def test_bad_config_exits_2_with_one_line(capsys):
    assert main(["distill", "--out", "o", "nmu=3"]) == 2
    assert "did you mean 'num'" in capsys.readouterr().err
    assert main(["distill", "--out", "o", "--batch-size", "0"]) == 2
    assert main(["distill"]) == 2
    assert "--out" in capsys.readouterr().err


def test_cli_runs_and_prints_a_summary(tiny_llama, tmp_path, capsys):
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(3)))
    argv = [
        "distill",
        "--target",
        str(tiny_llama),
        "--prompts",
        str(source),
        "--out",
        str(tmp_path / "out"),
        "--num",
        "3",
        "--max-new-tokens",
        "4",
        "--max-prompt-tokens",
        "64",
        "--quiet",
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records_total"] == 3 and summary["replies"] == 3
    assert len(load_distilled(tmp_path / "out")) == 3


@pytest.mark.slow  # two fresh interpreters importing torch: ~15 s idle, a minute on a busy CPU
def test_sigkill_mid_run_then_rerun_loses_and_duplicates_nothing(tiny_llama, tmp_path):
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"prompt": f"question number {i}"}) + "\n" for i in range(40)))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "headstart",
        "distill",
        "--target",
        str(tiny_llama),
        "--prompts",
        str(source),
        "--out",
        str(out),
    ]
    cmd += [
        "--num",
        "40",
        "--max-new-tokens",
        "24",
        "--max-prompt-tokens",
        "64",
        "--batch-size",
        "2",
        "--shard-size",
        "2",
        "--quiet",
    ]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while (
        time.time() < deadline and len(list((out / "data").glob("shard-*.jsonl"))) < 2 and proc.poll() is None
    ):
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # still running: the kill lands mid-run
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(load_distilled(out))
    assert 0 < killed_at < 40
    rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert sorted(load_distilled(out)["index"]) == list(range(40))
    assert not [p for p in (out / "data").iterdir() if p.name.startswith(".")]  # no temp file left visible

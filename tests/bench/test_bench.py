"""headstart bench on a tiny target: question formats, report shape, interleaving, plots."""

from __future__ import annotations

import gzip
import json

import pytest

from headstart.bench.questions import load_questions
from headstart.cli import main
from headstart.errors import HeadstartError


def _write_jsonl(path, rows, compress=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if compress:
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


def test_question_shapes(tmp_path):
    mt = _write_jsonl(tmp_path / "mt.jsonl", [{"question_id": 1, "category": "math", "turns": ["a", "b"]}])
    assert load_questions(str(mt))[0].turns == ("a",)
    assert load_questions(str(mt), all_turns=True)[0].turns == ("a", "b")
    he = _write_jsonl(
        tmp_path / "he.jsonl.gz", [{"task_id": "HumanEval/0", "prompt": "def f():"}], compress=True
    )
    q = load_questions(str(he))[0]
    assert (q.question_id, q.category, q.turns) == ("HumanEval/0", "humaneval", ("def f():",))
    plain = _write_jsonl(tmp_path / "p.jsonl", [{"text": "hi"}, {"nothing": 1}, {"prompt": "yo"}])
    assert [q.turns[0] for q in load_questions(str(plain))] == ["hi", "yo"]
    assert len(load_questions(str(plain), limit=1)) == 1


def test_bad_questions(tmp_path):
    with pytest.raises(HeadstartError, match="questions not found"):
        load_questions(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["x"]}\n{oops\n')
    with pytest.raises(HeadstartError, match="bad.jsonl:2 is not valid JSON"):
        load_questions(str(bad))
    empty = _write_jsonl(tmp_path / "empty.jsonl", [{"foo": 1}])
    with pytest.raises(HeadstartError, match="no usable question"):
        load_questions(str(empty))


def test_bench_vanilla_and_pld_report(tiny_llama, tmp_path, capsys):
    rows = [
        {"question_id": i, "category": c, "turns": [f"say {c} {i}"]} for i, c in enumerate(["a", "b", "a"])
    ]
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "bench"
    code = main(
        ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--max-new-tokens", "8"]
        + ["--output", str(out), "--baselines", "vanilla,pld"]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["config"]) >= {
        "target",
        "questions",
        "num_prompts",
        "max_new_tokens",
        "temperature",
        "device",
        "dtype",
        "threads",
    }
    assert set(report["methods"]) == {"vanilla", "pld"} and set(report["by_category"]) == {"a", "b"}
    for figures in report["methods"].values():
        assert set(figures) >= {
            "tokens_per_s",
            "speedup",
            "tau",
            "identical_fraction",
            "new_tokens",
            "wall_s",
        }
        assert figures["tau"] is None  # no heads: tau is reserved for head-based speculation
        assert figures["identical_fraction"] == 1.0  # greedy PLD is exact
    assert report["methods"]["vanilla"]["speedup"] == 1.0
    lines = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert [r["method"] for r in lines] == ["vanilla", "pld"] * 3  # interleaved prompt by prompt
    assert set(lines[0]) >= {
        "question_id",
        "category",
        "method",
        "token_ids",
        "new_tokens",
        "target_forwards",
        "wall_s",
    }
    vanilla = [r for r in lines if r["method"] == "vanilla"]
    assert all(r["target_forwards"] == r["new_tokens"] for r in vanilla)  # one forward per token
    assert (out / "report.md").read_text().startswith("# headstart bench")
    assert (out / "speedup_by_category.png").stat().st_size > 1000
    assert not list(out.glob("*.partial")) and not list(out.glob(".tmp-*"))


def test_unknown_baseline(tiny_llama, tmp_path):
    questions = _write_jsonl(tmp_path / "q.jsonl", [{"turns": ["x"]}])
    assert (
        main(
            [
                "bench",
                "--target",
                str(tiny_llama),
                "--questions",
                str(questions),
                "--baselines",
                "medusa-ish",
                "--output",
                str(tmp_path),
            ]
        )
        == 2
    )


def test_verify_cost_curve_keeps_context_fixed(tiny_llama):
    from headstart.bench.cost import verify_cost_ms
    from headstart.target import load_target

    target = load_target(str(tiny_llama))
    costs = verify_cost_ms(target, node_counts=(1, 4, 16), context=32, repeats=2)
    assert list(costs) == [1, 4, 16] and all(ms > 0 for ms in costs.values())


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_bench_with_heads_is_identical_and_reports_tau(tiny_llama, tmp_path, kind):
    from headstart.heads import HeadSpec, build_head
    from headstart.target import load_target

    target = load_target(str(tiny_llama))
    heads_dir = tmp_path / f"{kind}-heads"
    build_head(HeadSpec(kind=kind), target).save_pretrained(heads_dir)
    rows = [{"question_id": i, "category": "c", "turns": [f"tell me {i}"]} for i in range(2)]
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "bench"
    args = ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--max-new-tokens", "12"]
    assert main(args + ["--baselines", "vanilla", "--heads", f"rnd={heads_dir}", "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    figures = report["methods"]["headstart:rnd"]
    assert figures["identical_fraction"] == 1.0  # exact whatever the (random) draft
    assert figures["tau"] is not None and figures["tau"] >= 1.0
    assert report["accept_length_histogram"]["headstart:rnd"]
    assert (out / "accept_lengths.png").is_file()

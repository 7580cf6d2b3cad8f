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
    plain = _write_jsonl(tmp_path / "p.jsonl", [{"text": "hi"}, {"prompt": "yo"}])
    assert [q.turns[0] for q in load_questions(str(plain))] == ["hi", "yo"]
    skipped = _write_jsonl(tmp_path / "s.jsonl", [{"text": "hi"}, {"nothing": 1}])
    with pytest.raises(HeadstartError, match="s.jsonl:2: no 'turns'"):  # never skipped silently
        load_questions(str(skipped))
    assert len(load_questions(str(plain), limit=1)) == 1
    bom = tmp_path / "bom.jsonl"  # what Windows editors save as "UTF-8"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"text": "hi"}\n{"text": "\xef\xbb\xbfkept"}\n')
    assert [q.turns[0] for q in load_questions(str(bom))] == [
        "hi",
        "\ufeffkept",
    ]  # only the file's own mark goes


def test_bad_questions(tmp_path):
    with pytest.raises(HeadstartError, match="questions not found"):
        load_questions(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["x"]}\n{oops\n')
    with pytest.raises(HeadstartError, match="bad.jsonl:2 is not valid JSON"):
        load_questions(str(bad))
    empty = _write_jsonl(tmp_path / "empty.jsonl", [{"foo": 1}])
    with pytest.raises(HeadstartError, match="empty.jsonl:1: no 'turns'"):
        load_questions(str(empty))
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(HeadstartError, match="no question in"):
        load_questions(str(tmp_path / "blank.jsonl"))
    lone = tmp_path / "lone.jsonl"
    lone.write_text('{"turns": ["fine"]}\n{"turns": ["hello \\ud800 friend"]}\n')  # valid JSON, not text
    with pytest.raises(HeadstartError, match="lone.jsonl:2 holds a lone surrogate"):
        load_questions(str(lone))


def test_bench_vanilla_and_pld_report(tiny_llama, tmp_path, capsys):
    rows = [  # two turns each: the default --turns first measures the first only
        {"question_id": i, "category": c, "turns": [f"say {c} {i}", "again"]}
        for i, c in enumerate(["a", "b", "a"])
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
    assert report["config"]["turns"] == "first" and report["config"]["num_prompts"] == 3
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
    assert all(r["turn"] == 1 for r in lines)
    assert set(lines[0]) >= {
        "question_id",
        "turn",
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


def _bench_all_turns(tiny_llama, tmp_path, rows, *extra):
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "bench"
    args = ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--turns", "all"]
    return main(args + ["--max-new-tokens", "8", "--output", str(out), *extra]), out


def test_bench_all_turns_one_record_per_question_turn_method(tiny_llama, tmp_path):
    rows = [
        {"question_id": f"q{i}", "category": c, "turns": [f"say {i}", "more"]} for i, c in enumerate("ab")
    ]
    code, out = _bench_all_turns(tiny_llama, tmp_path, rows, "--baselines", "vanilla,pld")
    assert code == 0
    lines = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert [(r["question_id"], r["turn"], r["method"]) for r in lines] == [
        (q, turn, method) for q in ("q0", "q1") for turn in (1, 2) for method in ("vanilla", "pld")
    ]  # turn by turn across methods, every turn of a question before the next question
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["turns"] == "all" and report["config"]["num_prompts"] == 4
    assert report["methods"]["pld"]["identical_fraction"] == 1.0
    assert report["methods"]["vanilla"]["prompts"] == 4
    assert report["by_category"]["a"]["vanilla"]["new_tokens"] == sum(
        r["new_tokens"] for r in lines if r["method"] == "vanilla" and r["question_id"] == "q0"
    )  # per-category figures sum over both turns
    assert "every turn of each question" in (out / "report.md").read_text()


def test_turn_two_prompt_holds_the_method_s_own_answer(tiny_llama, tmp_path):
    from headstart.bench.methods import Run
    from headstart.bench.questions import Question
    from headstart.bench.runner import run_bench
    from headstart.bench.session import turn_prompt
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    eos = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    seen: dict[str, list[list[int]]] = {"a": [], "b": []}

    def answering(name, text):
        def method(prompt_ids):
            seen[name].append(prompt_ids)
            ids = target.tokenizer(f" {text} ", add_special_tokens=False)["input_ids"] + [eos]
            return Run(token_ids=ids, target_forwards=len(ids), wall_s=0.01)

        return method

    question = Question("7", "c", ("first question", "second question"))
    methods = {"a": answering("a", "forty-two"), "b": answering("b", "seven")}
    records = run_bench(methods, [question], turn_prompt(target, 8), tmp_path / "o.jsonl", warmup=0)
    assert [(r.turn, r.method) for r in records] == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    first = target.chat.user_prompt_ids("first question")
    for name, reply in (("a", "forty-two"), ("b", "seven")):
        assert seen[name][0] == first
        expected = target.chat.render(
            [
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": reply},  # its own answer, EOS and spaces dropped
                {"role": "user", "content": "second question"},
            ]
        )
        assert target.tokenizer.decode(seen[name][1]) == expected
    assert "forty-two" in target.tokenizer.decode(seen["a"][1])
    assert "seven" not in target.tokenizer.decode(seen["a"][1])


def test_later_turn_past_the_context_is_a_clear_error(tiny_llama, tmp_path, capsys):
    rows = [{"question_id": "long", "turns": ["x" * 300, "y" * 300]}]  # 1 token per byte, context 512
    code, out = _bench_all_turns(tiny_llama, tmp_path, rows, "--baselines", "vanilla")
    assert code == 2
    assert "question long turn 2: prompt of" in capsys.readouterr().err
    assert not (out / "report.json").exists()


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
    from headstart.inference.verify_cost import verify_cost_ms
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    costs = verify_cost_ms(target, node_counts=(1, 4, 16), context=32, repeats=2)
    assert list(costs) == [1, 4, 16] and all(ms > 0 for ms in costs.values())


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_bench_with_heads_is_identical_and_reports_tau(tiny_llama, tmp_path, kind):
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    heads_dir = tmp_path / f"{kind}-heads"
    build_head(HeadSpec(kind=kind), target).save_pretrained(heads_dir)
    rows = [{"question_id": i, "category": "c", "turns": [f"tell me {i}", "and then?"]} for i in range(2)]
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "bench"
    args = ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--max-new-tokens", "12"]
    args += ["--turns", "all", "--baselines", "vanilla,plain", "--heads", f"rnd={heads_dir}"]
    assert main(args + ["--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    figures = report["methods"]["headstart:rnd"]
    assert figures["prompts"] == 4  # 2 questions x 2 turns
    assert figures["identical_fraction"] == 1.0  # exact whatever the (random) draft, on both turns
    assert figures["tau"] is not None and figures["tau"] >= 1.0
    rounds = figures["round"]  # one extra prompt's steady-state rounds, counted (inference/rounds.py)
    assert rounds["max"]["host_reads"] == 1 and rounds["compiled_calls"] == 0 and rounds["eager_ops"] > 0
    assert rounds["ms"] > 0 and report["config"]["compile"] == "auto"
    plain = report["methods"]["plain"]
    assert "round" not in plain  # plain decoding runs no rounds of the engine
    positions = report["by_position"]["headstart:rnd"]  # every round of both turns, by context bucket
    assert list(positions) == ["0-256"] and positions["0-256"]["rounds"] == sum(
        len(json.loads(line)["accept_lengths"]) for line in (out / "outputs.jsonl").read_text().splitlines()
        if json.loads(line)["method"] == "headstart:rnd"
    )  # fmt: skip
    assert positions["0-256"]["tau"] == pytest.approx(figures["tau"], abs=0.01)
    assert "Acceptance by the round's context position" in (out / "report.md").read_text()
    assert "plain" not in report["by_position"]
    assert plain["identical_fraction"] == 1.0 and plain["tau"] is None and plain["over_plain"] is None
    assert plain["target_forwards"] == plain["new_tokens"]  # one forward per token, prefill included
    over = figures["tokens_per_s"] / plain["tokens_per_s"]
    assert figures["over_plain"] == pytest.approx(over)
    assert "over plain" in (out / "report.md").read_text()
    assert report["accept_length_histogram"]["headstart:rnd"]
    assert (out / "accept_lengths.png").is_file()


def test_bench_lookahead_baseline_and_draft_beside_plain(tiny_llama, tmp_path, capsys, monkeypatch):
    """The lookahead and early_exit baselines (untuned here: lookahead's default sizes, an exit at
    half the target's depth) and a sized lookahead through --draft-model: exact, tau and
    over_plain reported like the heads'."""
    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))  # no tune from another test
    rows = [{"question_id": i, "category": "c", "turns": [f"count {i} {i} {i} {i}"]} for i in range(2)]
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "bench"
    args = ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--max-new-tokens", "12",
            "--baselines", "plain,lookahead,early_exit", "--draft-model", "small=lookahead:window=2,ngram=3,guesses=2",
            "--output", str(out)]  # fmt: skip
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    for name in ("lookahead", "early_exit", "draft:small"):
        figures = report["methods"][name]
        assert figures["identical_fraction"] == 1.0 and figures["tau"] >= 1.0
        assert figures["over_plain"] is not None
    trees = report["config"]["trees"]
    assert trees["draft:small"] == "lookahead:window=2,ngram=3,guesses=2"
    assert trees["early_exit"] == "early exit after layer 1 of the target, chain:4"
    assert trees["lookahead"] == "lookahead decoding, lookahead:window=5,ngram=4,guesses=4"
    assert main([*args[:-2], "--output", str(tmp_path / "b2"), "--tree", "chain:2"]) != 0
    assert "--tree does not apply" in capsys.readouterr().err


def test_shards_merge_into_the_whole_run(tiny_llama, tmp_path, capsys):
    rows = [{"question_id": i, "category": c, "turns": [f"say {c} {i}"]} for i, c in enumerate("abcab")]
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    base = ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--max-new-tokens", "6"]
    for k in (1, 2):
        assert main([*base, "--shard", f"{k}/2", "--output", str(tmp_path / f"s{k}")]) == 0
    firsts = [
        json.loads(line)["question_id"]
        for line in (tmp_path / "s1" / "outputs.jsonl").read_text().splitlines()
    ]
    assert sorted(set(firsts)) == ["0", "2", "4"]  # every 2nd question from the 1st
    merged = tmp_path / "merged"
    assert (
        main(["bench", "--merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--output", str(merged)]) == 0
    )
    report = json.loads((merged / "report.json").read_text())
    assert report["config"]["num_prompts"] == 5 and report["config"]["shards"] == 2
    assert set(report["by_category"]) == {"a", "b", "c"}
    whole = tmp_path / "whole"
    assert main([*base, "--output", str(whole)]) == 0
    full = json.loads((whole / "report.json").read_text())
    for name in ("vanilla", "pld"):
        assert report["methods"][name]["new_tokens"] == full["methods"][name]["new_tokens"]
        assert report["methods"][name]["identical_fraction"] == 1.0
    # an incomplete split, or shards of different commands, are refused
    assert main(["bench", "--merge", str(tmp_path / "s1"), "--output", str(tmp_path / "bad")]) == 2
    assert "not one complete split" in capsys.readouterr().err
    assert main([*base, "--shard", "2/2", "--max-new-tokens", "4", "--output", str(tmp_path / "s2b")]) == 0
    assert (
        main(
            [
                "bench",
                "--merge",
                str(tmp_path / "s1"),
                str(tmp_path / "s2b"),
                "--output",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
    assert "max_new_tokens" in capsys.readouterr().err
    # other methods or another --limit: each method would be averaged over other prompts
    for extra, key in ((["--baselines", "vanilla"], "methods"), (["--limit", "4"], "limit")):
        other = tmp_path / f"s2-{key}"
        assert main([*base, "--shard", "2/2", *extra, "--output", str(other)]) == 0
        assert (
            main(["bench", "--merge", str(tmp_path / "s1"), str(other), "--output", str(tmp_path / "bad")])
            == 2
        )
        assert key in capsys.readouterr().err
    # --resume of the finished shard with other methods is refused, not shown as this run's report
    assert (
        main(
            [*base, "--shard", "1/2", "--baselines", "vanilla", "--output", str(tmp_path / "s1"), "--resume"]
        )
        == 2
    )
    assert "other settings (methods)" in capsys.readouterr().err
    assert (
        main(
            [
                "bench",
                "--target",
                str(tiny_llama),
                "--shard",
                "3/2",
                "--questions",
                str(questions),
                "--output",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )


def test_resume_keeps_finished_questions_and_measures_the_rest(tiny_llama, tmp_path, monkeypatch, capsys):
    from headstart.bench import runner

    rows = [{"question_id": i, "category": c, "turns": [f"say {c} {i}"]} for i, c in enumerate("abcab")]
    questions = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "bench"
    base = ["bench", "--target", str(tiny_llama), "--questions", str(questions), "--max-new-tokens", "6"]
    base += ["--baselines", "vanilla,pld", "--output", str(out)]
    real_of = runner.Record.of

    def interrupted(question, turn, method, run):
        if question.question_id == "3" and method == "pld":  # question 3 cut off halfway
            raise KeyboardInterrupt
        return real_of(question, turn, method, run)

    monkeypatch.setattr(runner.Record, "of", interrupted)
    assert main(base) == 130  # interrupted (Ctrl-C)
    assert not (out / "outputs.jsonl").exists() and (out / "config.partial.json").is_file()
    partial = [json.loads(line) for line in (out / "outputs.jsonl.partial").read_text().splitlines()]
    assert {r["question_id"] for r in partial} == {"0", "1", "2", "3"}
    with (out / "outputs.jsonl.partial").open("a") as handle:
        handle.write('{"question_id": "4", "tu')  # a line torn by the interruption
    monkeypatch.setattr(runner.Record, "of", real_of)

    # another command's settings are refused, and nothing is lost
    assert main([*base, "--max-new-tokens", "5", "--resume"]) == 2  # the last --max-new-tokens wins
    assert "max_new_tokens" in capsys.readouterr().err
    assert main([*base, "--resume"]) == 0
    assert "resuming: 3 of 5 questions already measured" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    keys = [(r["question_id"], r["method"]) for r in records]
    assert sorted(keys) == sorted((str(i), m) for i in range(5) for m in ("vanilla", "pld"))
    kept = {(r["question_id"], r["method"]): r["wall_s"] for r in partial if r["question_id"] != "3"}
    assert all(r["wall_s"] == kept[k] for r, k in zip(records, keys, strict=True) if k in kept)  # not re-run
    assert not (out / "config.partial.json").exists() and not (out / "outputs.jsonl.partial").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["methods"]["pld"]["identical_fraction"] == 1.0 and report["config"]["num_prompts"] == 5


def test_a_finished_report_is_not_overwritten(tmp_path, capsys):
    from headstart.cli import main

    (tmp_path / "report.json").write_text("{}")
    (tmp_path / ".headstart-bench").write_text('{"kind": "run", "files": []}')  # a bench run's mark
    assert main(["bench", "--questions", "mt_bench", "--output", str(tmp_path)]) == 2
    assert "already holds a finished bench report" in capsys.readouterr().err
    assert (tmp_path / "report.json").read_text() == "{}"
    (tmp_path / ".headstart-bench").unlink()  # without it, a report.json is the user's own
    assert main(["bench", "--questions", "mt_bench", "--output", str(tmp_path)]) == 2
    assert "holds no bench run" in capsys.readouterr().err


def test_a_draft_spec_holding_equals_signs_is_no_label():
    from headstart.bench.session import _label

    spec = "lookahead:window=5,ngram=4,guesses=4"
    assert _label(spec) == (spec, spec)
    assert _label(f"small={spec}") == ("small", spec)
    assert _label("runs/x/final") == ("final", "runs/x/final")

"""headstart tune: measures candidate trees, stores the fastest with the heads; bench uses it."""

from __future__ import annotations

import json
import math

import pytest

from headstart.bench.tune import _survivors, candidate_trees, forked, paired_gap
from headstart.cli import main
from headstart.heads.files import TUNED_FILE
from headstart.inference.trees.lookup import split_lookup
from headstart.inference.trees.spec import parse_tree
from headstart.tuned import tree_for_run, tuned_elsewhere, tuned_tree


def test_candidates_fit_the_heads():
    medusa = candidate_trees("medusa", 3)
    assert medusa[:3] == ["chain:1", "chain:2", "chain:3"] and medusa[-1] == "static"
    eagle = candidate_trees("eagle3", None)
    assert eagle[:6] == [f"chain:{d}" for d in range(1, 7)]
    assert any(c.startswith("dynamic:") for c in eagle)
    assert "chain:1+lookup:4" in medusa and "chain:1+lookup:4" in eagle
    assert "dynamic:depth=3,top_k=2,total_tokens=4+lookup:4" in eagle
    for spec in medusa + eagle:  # every candidate parses, and none is deeper than Medusa's heads
        base, _ = split_lookup(spec)
        tree = parse_tree(base, 3 if spec in medusa else None)
        assert not hasattr(tree, "max_depth") or spec not in medusa or tree.max_depth <= 3


def test_forked_tree_is_a_chain_plus_runner_ups():
    assert json.loads(forked(3, 2)) == [[0], [0, 0], [0, 0, 0], [1], [0, 1]]
    assert parse_tree(forked(3, 2)).size == 6  # root + 5 drafted nodes


def test_pruning_keeps_the_fast_and_at_least_three():
    def row(rate):
        return {"new_tokens": rate, "wall_s": 1.0}

    totals = {"a": row(10), "b": row(9), "c": row(3), "d": row(2), "e": row(7.5)}
    assert _survivors(list(totals), totals, 0.7) == ["a", "b", "e"]
    assert _survivors(list(totals), totals, 0.95) == ["a", "b", "e"]  # 3 always stay
    assert _survivors(list(totals), totals, 0.2) == ["a", "b", "e", "c", "d"]


def test_paired_gap_separates_a_real_gap_from_noise():
    # a steady 20% gap over 4 prompts whose speeds swing 2x with the host: far beyond the noise
    best, slower = [10.0, 5.0, 8.0, 6.0], [8.0, 4.0, 6.4, 4.8]
    gap, se = paired_gap(best, slower)
    assert abs(gap - math.log(1.25)) < 1e-9 and se < 1e-9
    # ahead on two prompts, behind on two: the mean gap is inside 2 standard errors
    gap, se = paired_gap([10.0, 10.0, 10.0, 10.0], [9.0, 11.0, 9.5, 10.4])
    assert gap <= 2 * se
    # pruned after its first prompts: paired over those only; one prompt gives no error estimate
    assert paired_gap([10.0, 10.0, 10.0], [5.0, 5.0])[0] == math.log(2.0)
    assert paired_gap([10.0], [5.0])[1] == math.inf


@pytest.mark.parametrize("kind", ["eagle", "draft_model"])  # a trained draft model is tuned as heads are
def test_tune_stores_the_fastest_tree(tiny_llama, tmp_path, capsys, slow_plain, kind):
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    heads = tmp_path / "heads"
    build_head(HeadSpec(kind=kind), target).save_pretrained(heads)
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
    assert (
        main(args + ["--candidates", "chain:1;dynamic:depth=2,top_k=2,total_tokens=3;chain:1+lookup:3"]) == 0
    )
    report = json.loads((heads / TUNED_FILE).read_text())
    rates = {row["tree"]: row["tokens_per_s"] for row in report["candidates"]}
    assert set(rates) == {"chain:1", "dynamic:depth=2,top_k=2,total_tokens=3", "chain:1+lookup:3"}
    assert report["tree"] == max(rates, key=rates.get) == tuned_tree(heads)
    assert set(report["verify_cost_ms"]) >= {"1", "8"}
    runners_up = [row for row in report["candidates"] if row["tree"] != report["tree"]]
    assert all(math.isfinite(row["behind"]) and row["behind_se"] >= 0 for row in runners_up)
    assert set(report["within_noise"]) <= {row["tree"] for row in runners_up}
    plain = report["over_plain"]  # plain decoding ran every prompt beside the trees
    assert plain["plain_tokens_per_s"] > 0 and plain["gap_se"] >= 0
    assert plain["speedup"] == pytest.approx(rates[report["tree"]] / plain["plain_tokens_per_s"])
    out = capsys.readouterr().out
    assert "best:" in out and "behind the best" in out and "plain decoding (no drafts" in out


def test_tune_needs_heads(tiny_llama, tmp_path):
    assert main(["tune", "--target", str(tiny_llama), "--heads", str(tmp_path / "none")]) == 2


def test_a_tree_tuned_elsewhere_is_named(tmp_path, capsys):
    assert tuned_elsewhere(tmp_path, "cpu", 2) is None  # nothing tuned: nothing to say
    (tmp_path / TUNED_FILE).write_text(json.dumps({"tree": "chain:2", "device": "cpu", "threads": 1}))
    assert tuned_elsewhere(tmp_path, "cpu", 1) is None
    warning = tuned_elsewhere(tmp_path, "cpu", 2)
    assert "1 thread" in warning and "--threads 2" in warning
    assert "cuda:0" in tuned_elsewhere(tmp_path, "cuda:0", 1)
    # a run takes --tree as given, silently; else the stored tree, with the note on stderr
    assert tree_for_run("chain:1", tmp_path, "cpu", 2).text == "chain:1" and not capsys.readouterr().err
    assert (
        tree_for_run(None, tmp_path, "cpu", 2).text == "chain:2" and "--threads 2" in capsys.readouterr().err
    )
    assert tree_for_run(None, tmp_path, "cpu", 1).text == "chain:2" and not capsys.readouterr().err
    assert tree_for_run(None, None, "cpu", 1) is None


def test_sampling_drops_a_tuned_lookup_branch(tmp_path):
    """A tuned tree with a lookup branch (the shipped heads' until 2026-11-26), which exact sampling
    cannot use with a static tree: sampling runs the tuned tree without it; greedy and an explicit
    --tree keep theirs."""
    from headstart.tuned import tree_for_run

    heads = tmp_path / "heads"
    heads.mkdir()
    report = {"tree": "[[0],[0,0],[1]]+lookup:4", "device": "cpu", "threads": 2}
    (heads / TUNED_FILE).write_text(json.dumps(report))
    tuned = tree_for_run(None, heads, "cpu", 2)
    assert tuned.text == "[[0],[0,0],[1]]+lookup:4" and tuned.lookup is not None
    untuned = tree_for_run(None, heads, "cpu", 2, greedy=False)
    assert (
        untuned.text == "[[0],[0,0],[1]]"
        and untuned.lookup is None
        and untuned.tree.paths == tuned.tree.paths
    )
    assert tree_for_run("chain:1+lookup:4", heads, "cpu", 2, greedy=False).text == "chain:1+lookup:4"


def test_tuning_shipped_or_read_only_heads_writes_to_the_user_cache(tmp_path, monkeypatch):
    import os

    from headstart.heads.defaults import shipped_heads
    from headstart.tuned import save_tuned, tuned_tree

    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    heads = shipped_heads("smollm2")["smollm2-eagle3"]
    before = (heads / TUNED_FILE).read_text()
    stored = save_tuned({"tree": "chain:2", "device": "cpu", "threads": 2}, heads)
    assert stored.is_relative_to(tmp_path / "cache") and (heads / TUNED_FILE).read_text() == before
    assert tuned_tree(heads) == "chain:2"  # the user's tune wins over the shipped one
    mine = tmp_path / "mine"
    mine.mkdir()
    assert save_tuned({"tree": "chain:3"}, mine) == mine / TUNED_FILE
    # tuned once while read-only (the cache), then again once writable (next to the heads): the
    # later tune is the one decoding uses
    from headstart.tuned import user_tuned_file

    cached = user_tuned_file(mine)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"tree": "chain:1"}))
    os.utime(cached, (1, 1))  # older than mine/tuned_tree.json
    assert tuned_tree(mine) == "chain:3"
    if os.geteuid() != 0:  # root writes anywhere
        mine.chmod(0o500)
        assert save_tuned({"tree": "chain:4"}, mine).is_relative_to(tmp_path / "cache")


def test_tune_never_stores_a_tree_slower_than_plain_decoding(tiny_llama, tmp_path, capsys):
    """Random heads on a tiny target cannot pay for their verify (their tau ~1.0 is counted, not
    timed: the cost bound, whatever the clock says on a loaded machine): the best tree is reported,
    not stored, and a tree stored before is kept as it was."""
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    heads = tmp_path / "heads"
    build_head(HeadSpec(kind="eagle"), load_target(str(tiny_llama))).save_pretrained(heads)
    earlier = json.dumps({"tree": "chain:2", "device": "cpu", "threads": 1})
    (heads / TUNED_FILE).write_text(earlier)
    args = ["tune", "--target", str(tiny_llama), "--heads", str(heads), "--limit", "2", "--max-new-tokens", "8",
            "--candidates", "chain:1;chain:3"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "plain steps: not stored" in out and "is kept as it was" in out, out  # the bound: no clock decides
    assert (heads / TUNED_FILE).read_text() == earlier


def test_tune_a_draft_model_picks_the_exit_layer_and_tree(tiny_llama, tmp_path, monkeypatch, capsys):
    """`tune --draft-model early-exit`: the exit layers and trees measured against plain decoding,
    the best stored in the user's cache (even when slower than plain: the user asked for that
    draft); `--draft-model early-exit` then decodes with them, exactly; without a tune it is
    refused in one line, and an explicit --tree is never overridden."""
    from headstart.speculator import load_speculator
    from headstart.targets import load_target
    from headstart.tuned import draft_tune_file

    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    target = load_target(str(tiny_llama))
    from headstart.errors import HeadstartError

    with pytest.raises(HeadstartError, match="names no exit layer"):
        load_speculator(target, draft_model="early-exit")
    args = ["tune", "--target", str(tiny_llama), "--draft-model", "early-exit", "--limit", "2",
            "--max-new-tokens", "8", "--candidates", "chain:1;chain:2"]  # fmt: skip
    assert main(args) == 0
    report = json.loads(draft_tune_file(target, "early-exit").read_text())
    assert {row["tree"] for row in report["candidates"]} == {"early-exit:1 chain:1", "early-exit:1 chain:2"}
    assert report["tree"] == f"{report['draft']} {report['draft_tree']}" and report["asked"] == "early-exit"
    assert "stored in" in capsys.readouterr().out
    speculator = load_speculator(target, draft_model="early-exit")
    assert speculator.tree.text == report["draft_tree"] and "early exit after layer 1" in speculator.mode
    assert load_speculator(target, tree="chain:3", draft_model="early-exit:1").tree.text == "chain:3"
    prompts = [target.chat.user_prompt_ids("hello there")]
    plain = load_speculator(target, plain=True).decoder.generate(
        prompts, max_new_tokens=12, eos_token_id=None
    )
    out = speculator.decoder.generate(prompts, max_new_tokens=12, eos_token_id=None)
    assert out.token_ids == plain.token_ids


def test_tune_lookahead_picks_its_sizes(tiny_llama, tmp_path, monkeypatch):
    """`tune --draft-model lookahead`: its window sizes are the candidates (its tree is its own);
    bare `--draft-model lookahead` then decodes at the stored sizes."""
    from headstart.inference.drafters.lookahead import TUNE_SIZES as LOOKAHEAD_SIZES
    from headstart.speculator import load_speculator
    from headstart.targets import load_target
    from headstart.tuned import draft_tune_file

    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    target = load_target(str(tiny_llama))
    assert load_speculator(target, draft_model="lookahead").tree.text.endswith("window=5,ngram=4,guesses=4")
    args = [
        "tune",
        "--target",
        str(tiny_llama),
        "--draft-model",
        "lookahead",
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
    ]
    assert main(args) == 0
    report = json.loads(draft_tune_file(target, "lookahead").read_text())
    assert {row["tree"] for row in report["candidates"]} <= {f"lookahead:{s}" for s in LOOKAHEAD_SIZES}
    assert report["draft"] == report["tree"] and report["draft_tree"] == ""
    assert load_speculator(target, draft_model="lookahead").tree.text == report["draft"]


def test_a_damaged_draft_tune_is_said_and_ignored(tiny_llama, tmp_path, monkeypatch, caplog):
    from headstart.speculator import load_speculator
    from headstart.targets import load_target
    from headstart.tuned import draft_tune_file

    monkeypatch.setenv("HEADSTART_CACHE", str(tmp_path / "cache"))
    target = load_target(str(tiny_llama))
    path = draft_tune_file(target, "early-exit:1")
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"draft": "early-exit:1", "draft_tree": "chain:x", "machine": "m", "threads": 1})
    )
    assert load_speculator(target, draft_model="early-exit:1").tree.text == "chain:4"  # the default
    assert "is damaged" in caplog.text

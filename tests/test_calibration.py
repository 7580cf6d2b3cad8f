"""Speculation only where it pays (headstart/calibration): on a machine the drafts were not
tuned on, the first decode measures plain decoding against a few trees, decodes plainly when no
tree wins (saying so once), keeps the verdict for the next run, and stays out of the way when a
tree is given, speculation is forced, or the stored tune was measured on this machine. The
decision is tested with injected timings (both outcomes); the real measurement only where its
outcome cannot depend on the clock (random heads fail the cost bound: their tau is counted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from headstart.calibration import VERSION
from headstart.calibration.judge import Measurement, Run, judge
from headstart.cli import main


@pytest.fixture(scope="module")
def heads_dir(tiny_llama, tmp_path_factory):
    from headstart.heads import HeadSpec, build_head
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    path = tmp_path_factory.mktemp("calibration-heads") / "eagle"
    build_head(HeadSpec(kind="eagle"), target).save_pretrained(path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADSTART_CALIBRATION_CACHE", str(tmp_path / "calibration"))
    return tmp_path / "calibration"


def generate(tiny_llama, heads_dir, *extra):
    return ["generate", "--target", str(tiny_llama), "--heads", str(heads_dir), "--prompt", "hello",
            "--max-new-tokens", "12", "--json", *extra]  # fmt: skip


def measured(rates: list[tuple[float, float]], tau: float = 2.0, verify_ms: float = 10.0) -> Measurement:
    """A measurement of one tree `chain:1` (2 nodes): per pair (its tokens/s, plain's tokens/s)."""
    steps = 10
    return Measurement(
        plain=[Run(tokens=48, wall_s=48 / p) for _, p in rates],
        trees={"chain:1": [Run(tokens=48, wall_s=48 / t, committed=round(tau * steps), steps=steps) for t, _ in rates]},
        nodes={"chain:1": 2},
        verify_ms={1: 10.0, 2: verify_ms},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rates", "tau", "verify_ms", "reason"),
    [
        ([(130, 100), (128, 100), (131, 100)], 2.0, 10.0, "pays"),  # +30%, tight pairs
        ([(80, 100), (78, 100), (82, 100)], 2.0, 10.0, "slower"),
        ([(104, 100), (97, 100), (108, 100)], 2.0, 10.0, "borderline"),  # within the noise of the margin
        ([(130, 100), (128, 100)], 2.0, 10.0, "borderline"),  # too few pairs yet
        # the clock says +50% (a slow spell during the plain runs), the bound says it cannot pay:
        ([(150, 100), (151, 100), (149, 100)], 1.0, 10.0, "bound"),  # random heads: tau 1.0
        ([(150, 100), (151, 100), (149, 100)], 1.3, 13.0, "bound"),  # a verify of 2 costs 1.3 steps
    ],
)
def test_the_decision_from_injected_timings(rates, tau, verify_ms, reason):
    verdict = judge(measured(rates, tau, verify_ms))
    assert verdict.reason == reason
    assert (verdict.tree == "chain:1") == (reason == "pays")
    assert verdict.best == "chain:1"


def test_the_measurement_stops_at_its_budget_and_when_decided(tiny_llama):
    """Fake decoders and a fake clock: a clear win stops after MIN_PAIRS prompts; a tie runs to
    MAX_PAIRS; a slow clock stops before the budget would be overrun, saying it was cut short."""
    from types import SimpleNamespace

    from headstart.calibration import measure as clocked
    from headstart.calibration.judge import MIN_PAIRS
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    now = [0.0]

    class Fake:
        def __init__(self, rate, tau, verify_nodes=2, seconds=1.0):
            self.rate, self.tau, self.verify_nodes, self.seconds, self.calls = (
                rate,
                tau,
                verify_nodes,
                seconds,
                0,
            )

        def generate(self, prompts, sampling=None):
            self.calls += 1
            now[0] += self.seconds
            tokens = sampling.max_new_tokens
            steps = max(1, round(tokens / self.tau))
            return SimpleNamespace(stats=SimpleNamespace(new_tokens=tokens, wall_s=tokens / self.rate,
                                                         committed=tokens, row_steps=steps))  # fmt: skip

    prompts = [[1, 2, 3]] * 6
    win = {"chain:1": Fake(130.0, 2.0)}
    m, verdict, finished = clocked.measure(target, win, Fake(100.0, 1.0, 1), prompts, clock=lambda: now[0])
    assert (verdict.reason, finished, len(m.plain)) == ("pays", True, MIN_PAIRS)
    tie = {"chain:1": Fake(100.0, 2.0)}
    noisy = Fake(100.0, 1.0, 1)
    rates = iter([100.0, 100.0, 108.0, 93.0, 106.0, 95.0, 104.0, 97.0, 102.0, 99.0])  # the first: warm-up

    def wobbly(prompts, sampling=None, _real=noisy.generate):
        noisy.rate = next(rates)
        return _real(prompts, sampling)

    noisy.generate = wobbly
    m, verdict, finished = clocked.measure(target, tie, noisy, prompts, budget_s=1e9, clock=lambda: now[0])
    assert verdict.reason == "borderline" and finished and len(m.plain) == clocked.MAX_PAIRS
    slow = {"chain:1": Fake(100.0, 2.0, seconds=20.0)}
    m, verdict, finished = clocked.measure(target, slow, Fake(100.0, 1.0, 1, seconds=20.0), prompts,
                                           clock=lambda: now[0])  # fmt: skip
    assert verdict.reason == "borderline" and not finished and len(m.plain) < MIN_PAIRS


def test_heads_that_do_not_pay_here_are_set_aside_once_and_said(tiny_llama, heads_dir, cache, capsys):
    """Random heads on a tiny target cannot pay (their tau ~1.0 fails the cost bound, whatever the
    clock says): the first run measures (and keeps the verdict), decodes plainly with headstart's
    own engine (the same tokens), and says so; the second run measures nothing."""
    assert main(generate(tiny_llama, heads_dir)) == 0
    first = capsys.readouterr()
    assert (
        "calibrating once for this machine" in first.err
        and "the heads do not pay on this machine" in first.err
    )
    kept = list(cache.glob("*.json"))
    assert len(kept) == 1
    verdict = json.loads(kept[0].read_text())
    assert verdict["tree"] is None and verdict["reason"] == "bound" and verdict["version"] == VERSION
    assert {"margin", "spread", "pairs", "calibrations"} <= set(verdict)
    assert main(generate(tiny_llama, heads_dir)) == 0
    second = capsys.readouterr()
    assert "calibrating" not in second.err and "do not pay" in second.err
    assert main(["generate", "--target", str(tiny_llama), "--no-heads", "--prompt", "hello", "--max-new-tokens",
                 "12", "--json"]) == 0  # fmt: skip
    plain = json.loads(capsys.readouterr().out)
    assert json.loads(first.out)["token_ids"] == json.loads(second.out)["token_ids"] == plain["token_ids"]
    assert json.loads(first.out)["stats"]["tau"] == 1.0  # no drafts


def test_a_busy_machine_does_not_make_random_heads_pay(tiny_llama, heads_dir, cache, capsys):
    """The real measurement with another process spinning on a core: the verdict is the same."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for _ in range(2):  # twice, each from scratch
            for kept in cache.glob("*.json"):
                kept.unlink()
            assert main(generate(tiny_llama, heads_dir)) == 0
            assert "the heads do not pay on this machine" in capsys.readouterr().err
            assert json.loads(next(cache.glob("*.json")).read_text())["tree"] is None
    finally:
        busy.kill()
        busy.wait()


@pytest.fixture
def paying(monkeypatch):
    """The clock's figures injected: `chain:1` beats plain decoding by 30% in tight pairs, with a
    tau that pays for its verify (the heads themselves are random: what the test checks is that a
    tree the judgement keeps is what the run decodes with, and what the cache keeps)."""
    from headstart.calibration import measure as clocked

    calls = []

    def fake(target, decoders, plain, prompts, **_):
        calls.append(sorted(decoders))
        m = measured([(130, 100), (128, 100), (131, 100)])
        m.trees = {name: m.trees["chain:1"] for name in decoders}
        m.nodes = {name: 2 for name in decoders}
        for name in decoders:
            if name != "chain:1":
                m.trees[name] = [Run(tokens=48, wall_s=48 / 90) for _ in range(3)]
        return m, judge(m), True

    monkeypatch.setattr(clocked, "measure", fake)
    return calls


def test_a_tree_is_kept_where_it_beats_plain_decoding(tiny_llama, heads_dir, cache, capsys, paying):
    assert main(generate(tiny_llama, heads_dir)) == 0
    captured = capsys.readouterr()
    verdict = json.loads(next(cache.glob("*.json")).read_text())
    assert verdict["tree"] == "chain:1" and verdict["reason"] == "pays" and verdict["speedup"] > 1.03
    assert "do not pay" not in captured.err
    out = json.loads(captured.out)
    assert out["stats"]["target_forwards"] >= 1 and len(paying) == 1
    assert main(generate(tiny_llama, heads_dir)) == 0  # kept: measured once
    assert len(paying) == 1 and "calibrating" not in capsys.readouterr().err


DAMAGED = [
    '{"tree": null}',  # no reason, no version
    '{"version": 2, "tree": null, "reason": "bound", "best_tree": null, "speedup": "fast", "seconds": 1}',
    '{"version": 2, "tree": "[[0],[7,7,7]", "reason": "pays", "best_tree": null, "speedup": 1.2, "seconds": 1}',
    '{"version": 2, "tree": "[[9],[9,9]]", "reason": "pays", "best_tree": null, "speedup": 1.2, "seconds": 1}',
    '{"version": 2, "tree": "chain:1", "reason": "bound", "best_tree": null, "speedup": 1.2, "seconds": 1}',
    '{"tree": "chain:1", "speedup": 1.5, "best_tree": "chain:1", "seconds": 1}',  # version 1's: measured again
    "[1, 2]",
    "not json",
    "\xff\xfe",
]


@pytest.mark.parametrize("text", DAMAGED)
def test_a_damaged_verdict_is_measured_again(tiny_llama, heads_dir, cache, capsys, text):
    assert main(generate(tiny_llama, heads_dir)) == 0
    (kept,) = cache.glob("*.json")
    capsys.readouterr()
    kept.write_bytes(text.encode("latin-1"))
    assert main(generate(tiny_llama, heads_dir)) == 0
    err = capsys.readouterr().err
    assert "measuring again" in err and "calibrating once" in err and "Traceback" not in err
    assert json.loads(kept.read_text())["version"] == VERSION  # replaced by a whole verdict


def test_a_borderline_verdict_is_measured_again_a_few_times(
    tiny_llama, heads_dir, cache, capsys, monkeypatch
):
    from headstart.calibration import MAX_CALIBRATIONS
    from headstart.calibration import measure as clocked

    runs = []

    def undecided(target, decoders, plain, prompts, **_):
        runs.append(1)
        m = measured([(104, 100), (97, 100), (108, 100)])
        m.trees = {name: m.trees["chain:1"] for name in decoders}
        m.nodes = {name: 2 for name in decoders}
        return m, judge(m), True

    monkeypatch.setattr(clocked, "measure", undecided)
    for _ in range(MAX_CALIBRATIONS + 2):
        assert main(generate(tiny_llama, heads_dir)) == 0
    err = capsys.readouterr().err
    assert len(runs) == MAX_CALIBRATIONS and "may not pay on this machine" in err
    assert json.loads(next(cache.glob("*.json")).read_text())["calibrations"] == MAX_CALIBRATIONS


def test_a_draft_model_goes_through_the_same_rule(tiny_llama, cache, capsys):
    """--draft-model with --speculate auto is calibrated as heads are: the target's own first
    layer drafting for a 2-layer random target does not pay (and says so)."""
    args = ["generate", "--target", str(tiny_llama), "--draft-model", "early-exit:1", "--prompt", "hello",
            "--max-new-tokens", "8", "--json"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "calibrating once" in captured.err and "do not pay on this machine" in captured.err
    assert json.loads(captured.out)["stats"]["tau"] == 1.0
    assert main([*args, "--speculate", "always"]) == 0
    assert "calibrating" not in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--tree", "chain:2"], ["--speculate", "always"]])
def test_an_explicit_tree_or_always_skips_it(tiny_llama, heads_dir, cache, capsys, extra):
    assert main(generate(tiny_llama, heads_dir, *extra)) == 0
    captured = capsys.readouterr()
    assert "calibrating" not in captured.err and not cache.exists()
    assert "eagle heads" in captured.err or json.loads(captured.out)["stats"]["tau"] >= 1.0


def test_a_tune_stored_on_this_machine_is_trusted(tiny_llama, heads_dir, cache, tmp_path, capsys):
    import shutil

    from headstart.hardware import machine

    mine = tmp_path / "heads"
    shutil.copytree(heads_dir, mine)
    report = {"tree": "chain:1", "over_plain": {"speedup": 1.3, "plain_tokens_per_s": 1.0}, "device": "cpu",
              "threads": torch.get_num_threads(), "machine": machine("cpu")}  # fmt: skip
    (mine / "tuned_tree.json").write_text(json.dumps(report))
    assert main(generate(tiny_llama, mine)) == 0
    assert "calibrating" not in capsys.readouterr().err and not cache.exists()
    report["over_plain"]["speedup"] = 0.8  # tuned here, and no tree paid: plain decoding, nothing measured
    (mine / "tuned_tree.json").write_text(json.dumps(report))
    assert main(generate(tiny_llama, mine)) == 0
    err = capsys.readouterr().err
    assert "calibrating" not in err and "says no tree beats plain decoding here" in err
    report["machine"] = "cpu:another machine"  # tuned elsewhere: measured here
    (mine / "tuned_tree.json").write_text(json.dumps(report))
    assert main(generate(tiny_llama, mine)) == 0
    assert "calibrating once" in capsys.readouterr().err

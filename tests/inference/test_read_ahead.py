"""Reading ahead in plain decoding (inference/engine.py, `read_ahead`): each step's tokens are read
after the next step is queued, and stops act one step late with what lies past them dropped. The
outputs are exactly what reading at once gives (and the target's `generate`) on every family of
the suite, with end-of-sequence, stop strings, rows joining, leaving and cancelled; seeded
per-row sampling is unchanged and keeps the target's distribution; the order of queue and read is
checked, so the test fails if the engine falls back to reading at once."""

from __future__ import annotations

import pytest
from test_greedy_exactness import PROMPTS, reference
from test_sampling_exactness import ALPHA, CONFIGS, PROMPT, joint_pvalue, small_vocab_target
from tiny import FAMILIES, make_target_dir

from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.engine import Engine, Job
from headstart.inference.plain import SamplingConfig
from headstart.inference.stops import StopRule
from headstart.targets import load_target


@pytest.fixture(scope="module")
def target(tiny_llama):
    return load_target(str(tiny_llama))


def plain(target, read_ahead: bool) -> SpeculativeDecoder:
    decoder = SpeculativeDecoder(target, None)
    decoder.read_ahead = read_ahead
    return decoder


def order_of(decoder: SpeculativeDecoder) -> list[str]:
    """Record each queued step ("q": its verify) and each read ("r") on `decoder`."""
    events: list[str] = []
    verify, read = decoder.verify, decoder._read_step

    def verify_logged(*args, **kwargs):
        events.append("q")
        return verify(*args, **kwargs)

    def read_logged(values):
        events.append("r")
        return read(values)

    decoder.verify, decoder._read_step = verify_logged, read_logged
    return events


def test_the_next_step_is_queued_before_a_step_is_read(target):
    """Step k + 1 is queued before step k's tokens are read, every step; without reading ahead
    the engine alternates (so the check cannot pass by accident)."""
    ids = target.chat.user_prompt_ids(PROMPTS[0])
    ahead, at_once = plain(target, True), plain(target, False)
    events, plain_events = order_of(ahead), order_of(at_once)
    first = ahead.generate([ids], max_new_tokens=12, eos_token_id=None).token_ids
    second = at_once.generate([ids], max_new_tokens=12, eos_token_id=None).token_ids
    assert first == second == [reference(target, ids, 12, eos=False)]
    assert plain_events == ["q", "r"] * 11  # the prefill gave the first token: 11 steps
    # ahead: q q r q r ... r r: every read but the last has one more step queued before it
    assert events == ["q"] + ["q", "r"] * 10 + ["r"], events
    assert all(events[: i + 1].count("q") > events[: i + 1].count("r") for i in range(len(events) - 1))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_output_is_the_targets_on_every_family(tiny_root, family):
    """A batch whose rows stop at different steps (end of sequence where the target ends), read
    ahead: each row's output is the target's `generate`."""
    target = load_target(str(make_target_dir(tiny_root, family, seed=11, **FAMILIES[family])))
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:3]]
    decoder = plain(target, True)
    events = order_of(decoder)
    out = decoder.generate(prompts, max_new_tokens=20)
    for ids, got in zip(prompts, out.token_ids, strict=True):
        assert got == reference(target, ids, 20, eos=True), family
    assert events[:3] == ["q", "q", "r"]


def test_a_stop_acts_one_step_late_and_drops_what_follows(target):
    """Rows that stop by end of sequence or a stop string at different steps: the same tokens,
    finish reasons and stats as reading at once; the step queued past a stop costs one forward."""
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS[:4]]
    base = plain(target, False).generate(prompts, max_new_tokens=24, eos_token_id=None)
    # the stop ids: each row's own token at a different step, so rows stop one after another
    stops = sorted({row[3 + i] for i, row in enumerate(base.token_ids)})
    outs = [
        plain(target, flag).generate(prompts, max_new_tokens=24, eos_token_id=stops) for flag in (False, True)
    ]
    assert outs[0].token_ids == outs[1].token_ids
    assert outs[0].stats.per_row_tokens == outs[1].stats.per_row_tokens
    assert outs[0].stats.committed == outs[1].stats.committed
    assert outs[1].stats.target_forwards == outs[0].stats.target_forwards + 1
    text = target.tokenizer.decode(base.token_ids[1][4:8])
    word = text.strip().split()[0] if text.strip() else text
    strung = [plain(target, flag).generate(prompts, max_new_tokens=24, eos_token_id=None, stop_strings=[word])
              for flag in (False, True)]  # fmt: skip
    assert strung[0].token_ids == strung[1].token_ids


def test_rows_joining_leaving_and_cancelled_get_their_output(target):
    """The serve pattern: requests join between steps (the unread step is taken first), one is
    cancelled mid-way, the others stop at their lengths; each output is what it gets alone."""
    engine = Engine(plain(target, True), SamplingConfig(max_new_tokens=64), read_ahead=True)
    prompts = [target.chat.user_prompt_ids(p) for p in [*PROMPTS, "count from one to twenty, slowly please"]]
    lengths = [30, 12, 41, 7, 25]
    jobs = [
        Job(key=i, prompt=p, rule=StopRule(n)) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    engine.add(jobs[:2])
    for _ in range(3):
        engine.step()
    assert engine.unread is not None  # a step is on its way when the next requests join
    engine.add(jobs[2:4])
    assert engine.unread is None
    for step in range(5):
        engine.step()
        if step == 2:
            jobs[2].cancelled = True
    engine.add(jobs[4:])
    while engine.live:
        engine.step()
    for i, job in enumerate(jobs):
        if i == 2:
            assert (
                job.finish == "cancelled"
                and job.emitted == reference(target, prompts[2], 64, False)[: len(job.emitted)]
            )
            continue
        assert job.finish == "length" and job.emitted == reference(target, prompts[i], lengths[i], False), i


def test_seeded_rows_sample_as_when_read_at_once(target):
    """Per-row generators (a server's seeded requests): the same samples read ahead or not, rows
    stopping at different lengths (the draw a stopped row makes past its stop is its own)."""
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    outputs = []
    for flag in (False, True):
        engine = Engine(plain(target, flag), SamplingConfig(max_new_tokens=32, temperature=0.9, top_k=20),
                        row_seeds=True, read_ahead=flag)  # fmt: skip
        jobs = [Job(key=i, prompt=p, rule=StopRule(8 + 5 * i), seed=100 + i) for i, p in enumerate(prompts)]
        engine.add(jobs)
        while engine.live:
            engine.step()
        outputs.append([job.emitted for job in jobs])
    assert outputs[0] == outputs[1]
    assert [len(row) for row in outputs[1]] == [8 + 5 * i for i in range(len(prompts))]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_sampling_read_ahead_keeps_the_targets_distribution(config):
    """12,000 seeded rows of 3 tokens, read ahead: the joint of the three tokens against the
    warped target's, by enumeration (the chi-square test of test_sampling_exactness)."""
    target = small_vocab_target()
    sampling = SamplingConfig(max_new_tokens=3, seed=7, **CONFIGS[config])
    engine = Engine(plain(target, True), sampling, row_seeds=True, read_ahead=True)
    jobs = [Job(key=i, prompt=list(PROMPT), rule=StopRule(3), seed=i) for i in range(12_000)]
    engine.add(jobs)
    while engine.live:
        engine.step()
    assert joint_pvalue(target, [job.emitted for job in jobs], sampling) > ALPHA

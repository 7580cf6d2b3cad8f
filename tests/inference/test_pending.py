"""Plain steps defer the drafter's observations (inference/pending.py): the engine keeps what
they commit and feeds it to the drafter in one `observe` when speculation resumes. The drafter
must end where observing every step at once leaves it (its next drafts equal), through rows
leaving and joining during the plain steps, and every reply still equals `generate` alone."""

from __future__ import annotations

import pytest
import torch

from headstart.heads import HeadSpec, build_head
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.engine import Engine, Job
from headstart.inference.pending import PendingObservations
from headstart.inference.plain import SamplingConfig
from headstart.inference.stops import StopRule
from headstart.targets import load_target
from tests.tiny import FAMILIES, make_target_dir

LENGTHS = (30, 5, 24)  # the second row leaves during the plain steps


def _heads(kind: str, target):
    from random_heads import RandomEagle, RandomMedusa

    if kind == "medusa":
        return RandomMedusa(target.hidden_size, target.vocab_size, num_heads=3)
    if kind == "dflash":
        counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
        return build_head(
            HeadSpec(kind="dflash", block_size=4, draft_vocab_size=100), target, token_counts=counts
        )
    return RandomEagle(target.model, draft_vocab=100 if kind == "eagle3" else None,
                       layers=(0, 1) if kind == "eagle3" else ())  # fmt: skip


def _run(target, heads, prompts, defer: bool, limit: int = 512):
    """Two rows step plainly three times, a third joins, four more plain steps (one row leaves),
    then the engine speculates to the end. Returns the first drafts after the plain steps, the
    waiting row groups (rows, observations) just before them, and the replies."""
    engine = Engine(SpeculativeDecoder(target, heads, tree="chain:3"), SamplingConfig(max_new_tokens=40),
                    speculate_up_to=0)  # fmt: skip
    engine._defers, engine.pending_limit = defer, limit
    jobs = [
        Job(key=i, prompt=p, rule=StopRule(n)) for i, (p, n) in enumerate(zip(prompts, LENGTHS, strict=True))
    ]
    engine.add(jobs[:2])
    for _ in range(3):
        engine.step()
    engine.add(jobs[2:])  # joins a batch stepping plainly: its prompt waits too (a group of its own)
    for _ in range(4):
        engine.step()
        assert all(g.waiting < limit for g in engine.pending.groups)  # a full group is fed at once
    assert engine.live == 2 and engine.plain_steps == 7
    waiting = [(g.rows, len(g.items), g.fresh) for g in engine.pending.groups]
    drafter = engine.pending.flush()
    assert [g.rows for g in engine.pending.groups] == [2] and not engine.pending.cold
    drafts = drafter.root_logits().clone()
    engine.speculate_up_to = None
    while engine.live:
        engine.step()
    return drafts, waiting, {job.key: job.emitted for job in jobs}


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "dflash", "medusa"])
def test_plain_steps_are_observed_at_the_next_draft_as_if_at_once(tmp_path, kind):
    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    heads = _heads(kind, target)
    prompts = [target.chat.user_prompt_ids(q) for q in ("why?", "what is the sea made of", "say hi")]
    deferred, waiting, replies = _run(target, heads, prompts, defer=True)
    at_once, none_waiting, replies_at_once = _run(target, heads, prompts, defer=False)
    # the path under test ran: the first rows' group waits with its prompt and 7 plain steps (one
    # of its rows left), the newcomer's with its prompt and 4; nothing waits without deferral
    assert waiting == [(1, 8, True), (1, 5, True)]
    assert none_waiting == [(2, 0, False)]
    torch.testing.assert_close(deferred, at_once, rtol=1e-4, atol=1e-4)
    assert replies == replies_at_once
    capped, waiting, replies_capped = _run(target, heads, prompts, defer=True, limit=3)
    # each group fed its prompt and 3 positions when 3 waited past its prompt, then 3 more: 1 waits
    assert waiting == [(1, 1, False), (1, 1, False)]
    torch.testing.assert_close(capped, at_once, rtol=1e-4, atol=1e-4)
    assert replies_capped == replies_at_once
    for i, (p, n) in enumerate(zip(prompts, LENGTHS, strict=True)):
        out = target.model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)
        assert replies[i] == out[0, len(p) :].tolist()[: len(replies[i])], i


def test_requests_that_end_while_the_batch_steps_plainly_never_run_the_head(tmp_path, monkeypatch):
    """Under load (every step plain) a server's heads cost nothing: no prompt and no committed
    position reaches the head for requests that finish before speculation resumes (each
    newcomer's prompt ran through the head at its prefill, and again at every join: 0.96x
    `--no-heads` at 8 clients); without deferral every one does. Replies equal `generate`."""
    from headstart.inference.drafters.eagle import EagleDrafter

    path = make_target_dir(tmp_path, "llama", seed=11, **FAMILIES["llama"])
    target = load_target(str(path), device="cpu", dtype="float32")
    heads = _heads("eagle3", target)
    prompts = [target.chat.user_prompt_ids(q) for q in ("why?", "what is the sea made of", "say hi")]
    observed = []
    real = EagleDrafter.observe
    monkeypatch.setattr(
        EagleDrafter, "observe", lambda self, *a: observed.append(a[2].numel()) or real(self, *a)
    )
    for defer in (True, False):
        observed.clear()
        engine = Engine(SpeculativeDecoder(target, heads, tree="chain:3"), SamplingConfig(max_new_tokens=40),
                        speculate_up_to=0)  # fmt: skip
        engine._defers = defer
        jobs = [
            Job(key=i, prompt=p, rule=StopRule(n))
            for i, (p, n) in enumerate(zip(prompts, LENGTHS, strict=True))
        ]
        engine.add(jobs[:2])
        engine.step()
        engine.add(jobs[2:])
        while engine.live:
            engine.step()
        assert (observed == []) == defer, observed
        for job, p, n in zip(jobs, prompts, LENGTHS, strict=True):
            out = target.model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)
            assert job.emitted == out[0, len(p) :].tolist(), job.key


def test_flush_joins_the_waiting_positions_in_order():
    """Observations of different widths and valid masks become one, `last` shifted to the newest."""
    seen = []

    class Recorder:
        def observe(self, *args):
            seen.append(args)

        def select_rows(self, rows):
            seen.append(("select", rows.tolist()))

    pending = PendingObservations()
    pending.start(Recorder(), rows=2)
    for width, value in ((1, 1.0), (2, 2.0), (1, 3.0)):
        hidden = torch.full((2, width, 4), value)
        pending.observe(hidden, {3: hidden + 10}, torch.full((2, width), int(value)),
                        torch.arange(width).expand(2, -1), torch.ones(2, width, dtype=torch.bool),
                        torch.tensor([width - 1, 0]))  # fmt: skip
    pending.select_rows([1], torch.device("cpu"))  # row 0 left
    pending.flush()
    assert seen[0] == ("select", [1])
    hidden, layers, tokens, positions, valid, last = seen[1]
    assert hidden[0, :, 0].tolist() == [1.0, 2.0, 2.0, 3.0]
    assert layers[3][0, :, 0].tolist() == [11.0, 12.0, 12.0, 13.0]
    assert tokens.tolist() == [[1, 2, 2, 3]] and valid.shape == (1, 4)
    assert last.tolist() == [3]  # the newest observation's own last (0), after 3 earlier positions
    assert [len(g.items) for g in pending.groups] == [0]
    pending.flush()  # nothing waiting: no call
    assert len(seen) == 2


def test_groups_split_each_step_by_rows_and_merge_in_row_order():
    """A deferred prefill's group holds its rows of every later step; a group whose rows all
    leave goes with its drafter (never fed); `flush` feeds each group (`start` first where the
    drafter reads tokens) and merges them in row order into the first."""
    from headstart.inference.pending import Deferred

    calls = []

    class Recorder:
        def __init__(self, name, start=False):
            self.name = name
            if start:
                self.start = lambda first: calls.append((name, "start", first.tolist()))

        def observe(self, *args):
            calls.append((self.name, "observe", args[2].tolist(), args[5].tolist()))

        def select_rows(self, rows):
            calls.append((self.name, "select", rows.tolist()))

        def merge(self, other):
            calls.append((self.name, "merge", other.name))

    def item(rows, width, value):
        h = torch.full((rows, width, 2), float(value))
        return (h, {}, torch.full((rows, width), value), torch.zeros(rows, width, dtype=torch.long),
                torch.ones(rows, width, dtype=torch.bool), torch.full((rows,), width - 1))  # fmt: skip

    pending = PendingObservations()
    pending.start(Recorder("a"), rows=1)
    for name, rows, start in (("b", 2, True), ("c", 1, False)):
        deferred = Deferred(Recorder(name, start=start))
        deferred.start(torch.tensor([7] * rows))
        deferred.observe(*item(rows, 3, 5))  # the prompt, 3 columns
        pending.join(deferred.group)
    assert pending.cold and [g.rows for g in pending.groups] == [1, 2, 1]
    step = item(4, 1, 9)
    step[2][:] = torch.tensor([[1], [2], [3], [4]])
    pending.observe(*step)
    pending.select_rows([0, 2], torch.device("cpu"))  # b's first row and all of c left
    assert [g.rows for g in pending.groups] == [1, 1] and calls == []  # b never fed: nothing to select
    assert pending.flush().name == "a"
    assert calls == [("a", "observe", [[1]], [0]), ("b", "start", [7]),
                     ("b", "observe", [[5, 5, 5, 3]], [3]), ("a", "merge", "b")]  # fmt: skip
    assert not pending.cold and [g.rows for g in pending.groups] == [2]

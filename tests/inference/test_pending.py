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


def _run(target, heads, prompts, defer: bool, limit: int = 64):
    """Two rows step plainly three times, a third joins, four more plain steps (one row leaves),
    then the engine speculates to the end. Returns the first drafts after the plain steps, how
    many observations were waiting for them, and the replies."""
    engine = Engine(SpeculativeDecoder(target, heads, tree="chain:3"), SamplingConfig(max_new_tokens=40),
                    speculate_up_to=0)  # fmt: skip
    engine._defers, engine.pending_limit = defer, limit
    jobs = [
        Job(key=i, prompt=p, rule=StopRule(n)) for i, (p, n) in enumerate(zip(prompts, LENGTHS, strict=True))
    ]
    engine.add(jobs[:2])
    for _ in range(3):
        engine.step()
    engine.add(jobs[2:])  # the live rows' waiting observations go in before the newcomer stacks
    for _ in range(4):
        engine.step()
        assert len(engine.pending) < limit  # a full queue is fed at once
    assert engine.live == 2 and engine.plain_steps == 7
    waiting = len(engine.pending)
    engine.pending.flush(engine.drafter)
    drafts = engine.drafter.root_logits().clone()
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
    assert waiting == 4 and none_waiting == 0  # the path under test ran (the merge flushed the first 3)
    torch.testing.assert_close(deferred, at_once, rtol=1e-4, atol=1e-4)
    assert replies == replies_at_once
    capped, waiting, replies_capped = _run(target, heads, prompts, defer=True, limit=3)
    assert waiting == 1  # 4 plain steps since the merge: 3 fed at the limit, 1 waits
    torch.testing.assert_close(capped, at_once, rtol=1e-4, atol=1e-4)
    assert replies_capped == replies_at_once
    for i, (p, n) in enumerate(zip(prompts, LENGTHS, strict=True)):
        out = target.model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)
        assert replies[i] == out[0, len(p) :].tolist()[: len(replies[i])], i


def test_flush_joins_the_waiting_positions_in_order():
    """Observations of different widths and valid masks become one, `last` shifted to the newest."""
    seen = []

    class Recorder:
        def observe(self, *args):
            seen.append(args)

    pending = PendingObservations()
    for width, value in ((1, 1.0), (2, 2.0), (1, 3.0)):
        hidden = torch.full((2, width, 4), value)
        pending.observe(hidden, {3: hidden + 10}, torch.full((2, width), int(value)),
                        torch.arange(width).expand(2, -1), torch.ones(2, width, dtype=torch.bool),
                        torch.tensor([width - 1, 0]))  # fmt: skip
    pending.select_rows(torch.tensor([1]))  # row 0 left
    pending.flush(Recorder())
    hidden, layers, tokens, positions, valid, last = seen[0]
    assert hidden[0, :, 0].tolist() == [1.0, 2.0, 2.0, 3.0]
    assert layers[3][0, :, 0].tolist() == [11.0, 12.0, 12.0, 13.0]
    assert tokens.tolist() == [[1, 2, 2, 3]] and valid.shape == (1, 4)
    assert last.tolist() == [3]  # the newest observation's own last (0), after 3 earlier positions
    assert len(pending) == 0
    pending.flush(Recorder())  # nothing waiting: no call
    assert len(seen) == 1

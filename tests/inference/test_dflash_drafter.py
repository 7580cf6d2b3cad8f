"""The DFlash drafter keeps its context incrementally (committed positions' keys and values, the
block's own dropped after each draft, rows leaving the batch): at every step its block logits
equal a block drafted from scratch over the target's features of the whole committed text."""

from __future__ import annotations

import torch

from headstart.heads import HeadSpec, build_head
from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.drafters.dflash import DFlashDrafter
from headstart.targets import capture, load_target

PROMPTS = ["hello there", "What is the capital of France? Answer briefly.", "a"]


class Checked(DFlashDrafter):
    """Records each step's block logits, then drafts the true continuation instead, so the tree
    accepts long paths of different lengths per row (what the cache bookkeeping must survive)."""

    def __init__(self, heads, vocab_size, truth):
        super().__init__(heads, vocab_size)
        self.truth, self.rows, self.records = truth, list(range(len(truth))), []
        self.kind = "checked"

    def bind(self, target_model):
        self.heads.bind(target_model)

    def observe(self, last_hidden, layers, next_tokens, positions, valid, last):
        super().observe(last_hidden, layers, next_tokens, positions, valid, last)
        rows = torch.arange(next_tokens.shape[0])
        root_pos = (positions[rows, last] + 1).tolist()
        self.records += [(self.rows[i], p, self._logits[i].clone()) for i, p in enumerate(root_pos)]
        forced = torch.full_like(self._logits, -30.0)
        for i, p in enumerate(root_pos):
            truth = self.truth[self.rows[i]]
            for depth in range(forced.shape[1]):
                if p + 1 + depth < len(truth) and depth % 5 != 4:  # every 5th depth wrong: paths end early
                    forced[i, depth, truth[p + 1 + depth]] = 30.0
        self._logits = forced

    def select_rows(self, rows):
        super().select_rows(rows)
        self.rows = [self.rows[i] for i in rows.tolist()]


def test_incremental_context_equals_a_fresh_block(tiny_llama):
    target = load_target(str(tiny_llama))
    head = build_head(HeadSpec(kind="dflash", block_size=6, num_layers=2), target)
    prompts = [target.chat.user_prompt_ids(p) for p in PROMPTS]
    refs = []
    for ids, length in zip(prompts, (40, 25, 33), strict=True):  # rows finish at different steps
        x = torch.tensor([ids])
        out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=length,
                                    do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
        refs.append(out[0].tolist())
    drafter = Checked(head, target.vocab_size, refs)
    decoder = SpeculativeDecoder(target, drafter, tree="chain:5")
    lengths = [len(r) - len(p) for r, p in zip(refs, prompts, strict=True)]
    out = decoder.generate(prompts, max_new_tokens=max(lengths), eos_token_id=None)
    for ids, ref, got, length in zip(prompts, refs, out.token_ids, lengths, strict=True):
        assert got[:length] == ref[len(ids) :]
    assert out.stats.tau > 2.5  # long accepted paths
    checked = 0
    for row, root_pos, logits in drafter.records:
        text = refs[row]
        if root_pos >= len(text):
            continue  # past the reference's end (the row ran on to the batch's longest)
        with torch.no_grad():
            feats = capture(target.model, torch.tensor([text[:root_pos]]), layers=head.feature_layers)
            cache = head.new_cache()
            head.add_context(head.fuse(feats.last_hidden, feats.layers), torch.arange(root_pos)[None], cache)
            states = head.draft_block(torch.tensor([text[root_pos]]), torch.tensor([root_pos]),
                                      torch.ones(1, root_pos, dtype=torch.bool), cache)  # fmt: skip
            fresh = head.logits(states[0, 1:])
        torch.testing.assert_close(logits, fresh, rtol=1e-3, atol=1e-3)
        checked += 1
    assert checked >= 15 and {row for row, _, _ in drafter.records} == {0, 1, 2}

"""A head's draft vocabulary: the Vd target tokens it may propose, stored as vLLM's EAGLE-3 maps
d2t (int64, Vd: target_id = i + d2t[i]) and t2d (bool, V). Drafting over Vd << V tokens is what
makes a draft step cheap on a CPU: SmolLM2's full lm_head is 113 MB to read per step, its 8192
most frequent tokens 19 MB."""

from __future__ import annotations

import torch
from torch import nn

from headstart.errors import HeadstartError


class DraftVocab:
    """Mixin for nn.Module heads: `d2t`/`t2d` buffers (saved with the weights), identity until
    `set_draft_vocab`."""

    draft_vocab_size: int

    def init_draft_vocab(self, draft: int, vocab: int, always: bool = True) -> None:
        """Register the maps; with `always=False` only for a reduced vocabulary (so checkpoints
        of full-vocabulary heads saved before draft vocabularies existed still load)."""
        assert isinstance(self, nn.Module)
        self.draft_vocab_size = draft
        if always or draft < vocab:
            self.register_buffer("d2t", torch.zeros(draft, dtype=torch.long))
            self.register_buffer("t2d", torch.arange(vocab) < draft)

    def _maps(self) -> bool:
        return "d2t" in getattr(self, "_buffers", {})

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """target_ids (Vd,): the draft vocabulary as target ids (sorted here)."""
        if not self._maps():
            raise HeadstartError(
                "this head drafts over the full vocabulary", "build it with head.draft_vocab_size set"
            )
        ids = target_ids.to(torch.long).sort().values.to(self.d2t.device)
        if ids.numel() != self.draft_vocab_size:
            raise HeadstartError(
                f"draft vocabulary has {ids.numel()} ids, head expects {self.draft_vocab_size}",
                "rebuild the head",
            )
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_ids(self) -> torch.Tensor:
        """The target id of every draft id, (Vd,)."""
        if not self._maps():
            return torch.arange(self.draft_vocab_size)
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def draft_ids_key(self) -> tuple:
        """Changes whenever `draft_ids()` may: the maps' storage, device and in-place version
        (set_draft_vocab, load_state_dict). Read on the host: caches keyed on it cost no device sync,
        where comparing the ids themselves would."""
        if not self._maps():
            return (self.draft_vocab_size,)
        d2t = self.d2t
        return (self.draft_vocab_size, d2t.device, d2t.data_ptr(), d2t._version)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if self._maps() else draft_ids

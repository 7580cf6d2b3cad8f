"""Drafters: the decoder's view of a head, one module per head kind (with its compiled steps),
found through the kind registry (headstart.kinds).

A drafter sees the target's features of every newly committed position (`observe`), gives the
draft logits of the root's children (`root_logits`), and expands frontier nodes of the tree
being drafted (`expand`), all batched over rows and frontier nodes. Logits are always over the
TARGET vocabulary: an EAGLE-3 draft vocabulary is mapped back through `draft_to_target` (d2t),
non-draft tokens get -inf. A drafter that reads committed tokens rather than the target's features
(a draft model) also has `start(first_tokens)`: the prefill hands it each row's first token, the
one that never comes as a next token. One that learns from the verify's own logits (Lookahead:
the Jacobi window's next level) has `verified(tree, logits)`, called after each verify.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from headstart.inference.drafters.common import in_target_vocab
from headstart.inference.drafters.plain import PlainDrafter


@runtime_checkable
class Drafter(Protocol):
    """The contract every drafter keeps (the engine and the decoder call nothing else)."""

    feature_layers: tuple[int, ...]
    """Target layers it reads (headstart.targets.features ids); () for the last hidden state only."""
    max_depth: int | None
    """How deep it can draft (Medusa: its number of heads); None: any depth."""

    def observe(self, last_hidden: torch.Tensor, layers: dict[int, torch.Tensor], next_tokens: torch.Tensor,
                positions: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> None:  # fmt: skip
        """Committed positions: target features (B, T, H) with the NEXT tokens (B, T), their
        positions, which are real (`valid`), and each row's last committed index (`last`, (B,))."""

    def root_logits(self) -> torch.Tensor:
        """(B, V) draft logits of the root's children."""

    def expand(self, nodes: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor, depth: int,
               visible: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """(B, k, V) logits of the children of frontier `nodes` (B, k) holding `tokens` at `depth`."""

    def end_step(self) -> None:
        """Forget what the step drafted (only committed positions stay)."""

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep these rows (requests that left the batch are dropped)."""

    def merge(self, other: Any) -> None:
        """Append `other`'s rows (requests joining the running batch)."""


@runtime_checkable
class CompiledDrafter(Drafter, Protocol):
    """A drafter whose steps can also run as compiled graphs (`--compile`): `compiled_steps` builds
    them once per decoder (None: eager), `capture` hands them to each generation's drafter."""

    @staticmethod
    def compiled_steps(heads: Any, backend: str) -> Any: ...

    def capture(self, captured: Any, reserve: int) -> None:
        """Run the steps through `captured`, the drafter's cache in a kept buffer of `reserve` entries."""


def make_drafter(heads: Any, vocab_size: int, depth: int | None = None) -> Drafter:
    """The drafter for `heads`: its kind's (headstart.kinds), plain decoding for None; an
    object that already is a Drafter (a scripted test drafter) is used as is. `depth`: how deep the
    tree drafts (None: as deep as the heads can)."""
    from headstart import kinds

    if heads is None:
        return PlainDrafter()
    if isinstance(heads, Drafter):
        return heads
    if hasattr(heads, "new_drafter"):  # a drafter of no head kind (Lookahead: nothing to train)
        return heads.new_drafter(vocab_size, depth)
    drafter = kinds.load(kinds.get(getattr(heads, "kind", "?")).drafter)
    return drafter(heads, vocab_size=vocab_size, depth=depth)


def compiled_steps(drafter: Any, heads: Any, backend: str) -> Any:
    """The drafter's steps as compiled graphs (`--compile`), or None where they stay eager (plain
    decoding, scripted drafters, heads not built by headstart)."""
    return drafter.compiled_steps(heads, backend) if isinstance(drafter, CompiledDrafter) else None


__all__ = ["CompiledDrafter", "Drafter", "PlainDrafter", "compiled_steps", "in_target_vocab", "make_drafter"]

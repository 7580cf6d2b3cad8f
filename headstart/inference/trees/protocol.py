"""The one contract every token tree keeps (static, dynamic, Lookahead's): what the decoder, the
engine and the tuner ask of a tree, so that none of them asks which kind it holds
(tests/test_import_graph.py fails on an isinstance on a tree class outside inference/trees/)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from headstart.inference.plain import SamplingConfig
    from headstart.inference.trees.draft import DraftTree


@runtime_checkable
class Tree(Protocol):
    samples_with_lookup: bool
    """Whether a prompt-lookup branch stays exact beside it under sampling (its drafts are
    one-point proposals); the one rule, applied by TreeChoice.for_sampling and
    lookup.WithLookup.check_sampling."""
    reads_context: bool
    """Its draft reads each row's committed tokens (a lookup branch): the engine passes them."""

    def check_sampling(self) -> None:
        """Raise HeadstartError (one line) when its drafts cannot be accepted exactly under sampling."""
        ...

    def levels(self, max_depth: int | None) -> int:
        """Draft steps one decode step takes (a dynamic tree's depth cut to the heads')."""
        ...

    def verify_nodes(self, max_depth: int | None) -> int:
        """Nodes one row's verify holds, the root and any lookup branch included."""
        ...

    def verify_bound(self) -> int:
        """The most nodes a verify of it can hold (the KV cache's margin)."""
        ...

    def draft_nodes(self, max_depth: int | None, lookup: int) -> int:
        """The most nodes one step drafts into a head's own cache, with a lookup branch of `lookup`."""
        ...

    def prepare(self, device: torch.device) -> None:
        """Anything built once per device (a static tree's index buffers)."""
        ...

    def round_plan(self, device: torch.device, max_depth: int | None) -> Any:
        """Its draft as a round program traces it (trees.draft.RoundPlan, greedy or sampled:
        the same draft its steps make), when its
        shapes are fixed and it reads nothing but the drafter (inference/captured_round.py);
        None for a tree that reads the rows' context or comes from its own drafter."""
        ...

    def draft(self, drafter: Any, root: torch.Tensor, sampling: SamplingConfig, generator: Any,
              max_depth: int | None, contexts: Any = None) -> DraftTree:  # fmt: skip
        """One step's drafted tree under each row's root, batched (`contexts`: each row's
        committed tokens, root last, for a tree that reads them; else None)."""
        ...

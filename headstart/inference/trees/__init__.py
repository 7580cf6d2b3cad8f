"""Token trees, one protocol: what the decoder, the engine and the tuner ask of a tree, so that
none of them asks which kind of tree it holds.

- `static.TreeBuffers`: fixed index paths (Medusa-style; `chain:N`, JSON paths, the default tree),
  drafted level by level, children drawn from q under sampling.
- `dynamic.DynamicTree`: EAGLE-2's tree, expanded by cumulative draft log-probability each step.
- `lookahead.LookaheadTree`: Lookahead decoding's Jacobi window and n-gram pool as one trie (its
  drafter, inference/drafters/lookahead.py, proposes it whole).
- `lookup.WithLookup`: any of these with a prompt-lookup branch under its root (`+lookup:K`);
  `draft.DraftTree`: one step's drafted tree, batched; `spec`: a `--tree` value parsed once into
  a `TreeChoice`, whose `resolve` gives the Tree the decoder drafts.

The protocol (`protocol.Tree`, which every tree class keeps):
    samples_with_lookup          whether a lookup branch stays exact beside it under sampling (the
                                 one rule: `TreeChoice.for_sampling` and `WithLookup.check_sampling`)
    reads_context                its draft reads the rows' committed tokens (a lookup branch)
    check_sampling()             refuses, in one line, a tree that cannot sample exactly
    levels(max_depth)            draft steps taken (a dynamic tree's depth cut to the heads')
    verify_nodes(max_depth)      nodes one row's verify holds, root and lookup branch included
    verify_bound()               the most nodes a verify can hold (the cache's margin)
    draft_nodes(max_depth, L)    the most nodes a step drafts into a head's cache
    prepare(device)              anything built once per device (a static tree's buffers)
    draft(drafter, root, sampling, generator, max_depth, contexts) -> DraftTree
"""

from headstart.inference.trees.draft import DraftTree
from headstart.inference.trees.dynamic import DynamicTree, draft_dynamic
from headstart.inference.trees.lookup import Lookup, WithLookup, extend_with_lookup, split_lookup
from headstart.inference.trees.protocol import Tree
from headstart.inference.trees.spec import TreeChoice, TreeSpec, choose_tree, parse_tree
from headstart.inference.trees.static import TreeBuffers, build_tree, default_tree, draft_static, static_plan

__all__ = ["DraftTree", "DynamicTree", "Lookup", "Tree", "TreeBuffers", "TreeChoice", "TreeSpec", "WithLookup",
           "build_tree", "choose_tree", "default_tree", "draft_dynamic", "draft_static", "extend_with_lookup",
           "parse_tree", "split_lookup", "static_plan"]  # fmt: skip

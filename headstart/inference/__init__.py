"""Decoding: plain generation and the tree-attention self-speculative decoder.

    from headstart.inference import SpeculativeDecoder
    decoder = SpeculativeDecoder(target, heads, tree="static")   # or "dynamic:depth=4,top_k=4,total_tokens=12"
    out = decoder.generate(input_ids, max_new_tokens=128, do_sample=True, temperature=0.7, streamer=streamer)
    out.token_ids, out.sequences, out.stats.tau, out.stats.tokens_per_s

Greedy and sampled outputs are exactly the target's (sampling: in distribution); `typical=True`
is Medusa's typical acceptance and is LOSSY. Modules: tree (static tree buffers), draft_tree (the
per-step batched tree), drafting (static / EAGLE-2 dynamic drafting), drafters (heads -> drafts),
verify (acceptance rules), cache (KV compaction), stops, prompts, decoder (the loop).
"""

from headstart.inference.decoder import SpeculativeDecoder
from headstart.inference.plain import SamplingConfig, plain_generate
from headstart.inference.results import DecodeStats, GenerateOutput
from headstart.inference.trees import DynamicTree
from headstart.inference.trees.static import TreeBuffers, build_tree, default_tree

__all__ = [
    "DecodeStats",
    "DynamicTree",
    "GenerateOutput",
    "SamplingConfig",
    "SpeculativeDecoder",
    "TreeBuffers",
    "build_tree",
    "default_tree",
    "plain_generate",
]

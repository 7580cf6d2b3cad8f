"""Decoding: plain generation today; the tree-attention speculative decoder lands here."""

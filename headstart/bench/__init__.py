"""Speed and acceptance benchmarks against plain decoding and baselines."""

"""The embedded SmolLM2 target (slow: loads 135M parameters)."""

from __future__ import annotations

import pytest
import torch

from headstart.targets import capture, eagle3_layer_ids, forward, load_target, new_cache, tree_attention_mask

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    """The embedded target, loaded with its GGUF blocks kept whatever this machine's timed
    calibration of reading them said (kernel.block_rows; 0 on an AVX2 host under load)."""
    from headstart.targets.smallmm import small_matmul

    kernel = small_matmul()
    saved = kernel.block_rows if kernel is not None else None
    if kernel is not None:
        kernel.block_rows = kernel.max_rows
    try:
        yield load_target("smollm2")
    finally:
        if kernel is not None:
            kernel.block_rows = saved


def test_embedded_loads_with_chat_template(smollm2):
    fp = smollm2.fingerprint
    assert (fp["num_layers"], fp["hidden_size"], fp["vocab_size"]) == (30, 576, 49152)
    assert fp["kind"] == "embedded" and len(fp["sha256"]) == 64
    assert smollm2.chat.has_template
    text = smollm2.tokenizer.decode(smollm2.chat.user_prompt_ids("Hi"))
    assert text.endswith("<|im_start|>assistant\n")
    assert eagle3_layer_ids(30) == (1, 14, 26)


def test_tree_forward_matches_sequential_on_smollm2(smollm2):
    model = smollm2.model
    prefix = torch.tensor([smollm2.chat.user_prompt_ids("Name three colours.")])
    p = prefix.shape[1]
    greedy = model.generate(prefix, max_new_tokens=4, do_sample=False)[0, p:]
    # tree: the greedy chain (0-1-2-3) plus two distractor siblings (4 under 0, 5 under 1)
    tokens = torch.tensor([[greedy[0], greedy[1], greedy[2], greedy[3], 1000, 2000]])
    parents = [-1, 0, 1, 2, 0, 1]
    anc = torch.zeros(6, 6, dtype=torch.bool)
    for i in range(6):
        j = i
        while j != -1:
            anc[i, j] = True
            j = parents[j]
    cache = new_cache(model)
    forward(model, prefix, past_key_values=cache)
    mask = tree_attention_mask(torch.ones(1, p, dtype=torch.bool), anc, smollm2.dtype)
    depth = anc.sum(-1) - 1
    tree = capture(
        model,
        tokens,
        attention_mask=mask,
        position_ids=(p + depth)[None],
        past_key_values=cache,
        layers=[1, 14],
    )
    for node in range(6):
        path = [j for j in range(6) if anc[node, j]]
        ref = model(torch.cat([prefix, tokens[:, path]], dim=1), output_hidden_states=True)
        torch.testing.assert_close(tree.logits[0, node], ref.logits[0, -1], rtol=0, atol=1e-4)
        assert tree.logits[0, node].argmax() == ref.logits[0, -1].argmax()
        torch.testing.assert_close(tree.layers[14][0, node], ref.hidden_states[15][0, -1], rtol=0, atol=1e-4)


def test_every_linear_reads_the_gguf_blocks_with_the_same_bits(smollm2, monkeypatch):
    """The embedded Q4_1 GGUF: all 210 layer weights (Q4_1, q/k rows matched back from GGUF's
    rope order) and the tied lm_head (Q8_0 embeddings) keep their blocks, and decode forwards that
    read them equal ones that read the fp32 weights bit for bit (targets/gguf_blocks.py)."""
    from torch import nn

    from headstart.targets.gguf_blocks import blocks_for
    from headstart.targets.packing import PackedLinears
    from headstart.targets.smallmm import small_matmul

    kernel = small_matmul()
    if kernel is None:
        pytest.skip("no C compiler: the kernel did not build")
    linears = [m for m in smollm2.model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 211 and all(blocks_for(m) is not None for m in linears)
    packer = PackedLinears.for_model(smollm2.model)
    ids = torch.tensor([smollm2.chat.user_prompt_ids("Name three colours.")[-8:]])
    logits = {}
    for block_rows in (0, kernel.max_rows):
        monkeypatch.setattr(kernel, "block_rows", block_rows)
        with torch.no_grad(), packer.rows(8):
            logits[block_rows] = smollm2.model(ids).logits
    assert torch.equal(logits[0], logits[kernel.max_rows])

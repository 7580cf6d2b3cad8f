"""Tiny random targets for tests: real transformers models (hidden 64, 2 layers) saved as local
HF directories with a real byte-level tokenizer and a ChatML chat template, so every loading path
is exercised exactly as for a Hub checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 288  # 256 bytes + specials, padded


# One tiny config per decoder family (tests/inference/test_families.py, tests/train/...): built
# from the family's own config class by `make_target_dir(root, family, seed=11, **FAMILIES[family])`.
WINDOW = 8  # every window: far below prompt + output
W = WINDOW
MIXED_4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
MOE = dict(num_local_experts=4, num_experts_per_tok=2)
FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=W),
    "qwen2": dict(use_sliding_window=True, sliding_window=W, max_window_layers=1),
    "qwen3": dict(use_sliding_window=True, sliding_window=W, max_window_layers=1, head_dim=16),
    "qwen3_moe": dict(
        use_sliding_window=True,
        sliding_window=W,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        head_dim=16,
    ),  # fmt: skip
    "mixtral": dict(sliding_window=W, **MOE),
    "gemma2": dict(sliding_window=W, head_dim=16, num_hidden_layers=4, query_pre_attn_scalar=16),
    "gemma3_text": dict(sliding_window=W, head_dim=16, num_hidden_layers=4, layer_types=MIXED_4),
    "cohere2": dict(sliding_window=W, num_hidden_layers=4, layer_types=MIXED_4),
    "phi3": dict(sliding_window=W),
    "gpt_oss": dict(sliding_window=W, head_dim=16, num_hidden_layers=4, layer_types=MIXED_4, **MOE),
    "olmo2": {},
    "olmo3": dict(sliding_window=W, num_hidden_layers=4, layer_types=MIXED_4),
    "smollm3": dict(no_rope_layers=[1, 0], use_sliding_window=False),
    "ministral": dict(sliding_window=W, num_hidden_layers=4, layer_types=MIXED_4, head_dim=16),
}
SLIDING_FAMILIES = {"mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3_text", "cohere2",
                    "phi3", "gpt_oss", "olmo3", "ministral"}  # fmt: skip
# layers that are not Llama-style pre-norm (Cohere's parallel block, OLMo's post-norms, Phi-3's
# fused qkv) cannot take the reference EAGLE-3 layer: their EAGLE-3 head takes the fc layout
# (fc(2H->H) + the target's own layer), as the error says
FC_LAYOUT = {"cohere2", "olmo2", "olmo3", "phi3"}


def make_tokenizer():  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
        additional_special_tokens=SPECIALS,
    )
    tok.chat_template = CHATML
    return tok


def make_config(family: str = "llama", **overrides):
    from transformers import AutoConfig

    tok_ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **tok_ids,
    )
    if family == "gemma":
        common.update(head_dim=16)
    common.update(overrides)
    return AutoConfig.for_model(family, **common)


def make_target_dir(root: Path, family: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a random tiny causal LM + tokenizer under `root/family` and return the directory."""
    from transformers import AutoModelForCausalLM

    path = Path(root) / f"tiny-{family}-{seed}"
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(family, **overrides))
    # Random init gives near-uniform logits; scale the output layer so greedy/sampled text has
    # structure (peaked distributions) like a trained model's.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    make_tokenizer().save_pretrained(path)
    return path

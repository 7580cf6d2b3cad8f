"""The target layer: loading, feature capture convention, tree-ready forward."""

from __future__ import annotations

import pytest
import torch
from tiny import make_target_dir

from headstart.errors import HeadstartError
from headstart.targets import capture, forward, load_target, new_cache, resolve_spec, tree_attention_mask

FAMILIES = ["llama", "qwen2", "mistral", "gemma"]


@pytest.fixture(scope="module", params=FAMILIES)
def target(request, tiny_root):
    return load_target(str(make_target_dir(tiny_root, request.param)))


def test_load_local_dir_is_frozen_and_fingerprinted(target):
    model = target.model
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    fp = target.fingerprint
    assert fp["kind"] == "local" and fp["hidden_size"] == 64 and fp["vocab_size"] == 288
    assert target.eos_token_ids == (2,)
    assert target.chat.has_template
    ids = target.chat.user_prompt_ids("hi")
    assert target.tokenizer.decode(ids).startswith("<|im_start|>user\nhi<|im_end|>")


def test_capture_matches_output_hidden_states(target):
    torch.manual_seed(0)
    ids = torch.randint(3, 280, (2, 9))
    ref = target.model(ids, output_hidden_states=True)
    feats = capture(target.model, ids, layers=[0, 1])
    torch.testing.assert_close(feats.logits, ref.logits)
    # id i == hidden_states[i + 1] for all but the last layer (HF applies the final norm there)
    torch.testing.assert_close(feats.layers[0], ref.hidden_states[1])
    torch.testing.assert_close(feats.last_hidden, ref.hidden_states[-1])
    head = target.model.get_output_embeddings()
    torch.testing.assert_close(head(feats.last_hidden), ref.logits, rtol=1e-5, atol=1e-4)
    assert set(feats.layers) == {0, 1}


def test_logits_to_keep_keeps_every_state(target):
    """A prefill asks for the last position's logits only; the states still cover every position."""
    torch.manual_seed(1)
    ids = torch.randint(3, 280, (2, 7))
    full = capture(target.model, ids, layers=[1])
    last = forward(target.model, ids, layers=[1], logits_to_keep=1)
    assert last.logits.shape[1] == 1
    torch.testing.assert_close(last.logits, full.logits[:, -1:])
    torch.testing.assert_close(last.last_hidden, full.last_hidden)
    torch.testing.assert_close(last.layers[1], full.layers[1])


def _ancestors(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            anc[i, j] = True
            j = parents[j]
    return anc


def test_tree_forward_matches_sequential(target):
    """Nodes of a token tree verified in one forward give the logits of decoding each path."""
    torch.manual_seed(1)
    prefix = torch.randint(3, 280, (1, 11))
    # tree: 0 -> {1, 2}; 1 -> {3}; 2 -> {4}
    parents = [-1, 0, 0, 1, 2]
    tokens = torch.randint(3, 280, (1, 5))
    anc = _ancestors(parents)
    depth = anc.sum(-1) - 1
    cache = new_cache(target.model)
    forward(target.model, prefix, past_key_values=cache)
    mask = tree_attention_mask(torch.ones(1, 11, dtype=torch.bool), anc, target.dtype)
    tree = forward(
        target.model, tokens, attention_mask=mask, position_ids=(11 + depth)[None], past_key_values=cache
    )
    for node in range(5):
        path = [j for j in range(5) if anc[node, j]]
        seq = torch.cat([prefix, tokens[:, path]], dim=1)
        ref = target.model(seq).logits[0, -1]
        torch.testing.assert_close(tree.logits[0, node], ref, rtol=0, atol=1e-4)
        assert tree.logits[0, node].argmax() == ref.argmax()


def test_padded_rows_do_not_produce_nan(target):
    ids = torch.randint(3, 280, (2, 4))
    cache = new_cache(target.model)
    mask = tree_attention_mask(
        torch.zeros(2, 0, dtype=torch.bool), torch.ones(4, 4).tril().bool(), target.dtype
    )
    mask[0, :, :, :2] = torch.finfo(target.dtype).min  # left padding of row 0
    mask[0, :, :2, :] = torch.finfo(target.dtype).min  # padded queries see nothing at all
    out = forward(
        target.model,
        ids,
        attention_mask=mask,
        position_ids=torch.tensor([[0, 0, 0, 1], [0, 1, 2, 3]]),
        past_key_values=cache,
    )
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-thing", "unknown target"),
        ("/nonexistent/model.gguf", "GGUF file not found"),
    ],
)
def test_bad_specs_fail_clearly(spec, message):
    with pytest.raises(HeadstartError, match=message):
        resolve_spec(spec)


def test_dir_without_config_and_non_causal_model(tmp_path):
    with pytest.raises(HeadstartError, match="without config.json"):
        load_target(str(tmp_path))
    from transformers import BertConfig, BertModel

    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(tmp_path / "bert")
    with pytest.raises(HeadstartError, match="not a causal language model"):
        load_target(str(tmp_path / "bert"))


def test_layer_ids_are_validated(target):
    with pytest.raises(HeadstartError, match="out of range"):
        capture(target.model, torch.tensor([[3, 4]]), layers=[5])


def test_fingerprint_follows_the_weights_not_the_path(tiny_llama, tmp_path):
    """The same weights in another directory match (heads move between machines); changed
    weights do not, whatever the directory is called."""
    import shutil

    from safetensors.torch import load_file, save_file

    from headstart.targets.load import fingerprint_mismatch

    original = load_target(str(tiny_llama)).fingerprint
    copy = shutil.copytree(tiny_llama, tmp_path / "elsewhere")
    moved = load_target(str(copy)).fingerprint
    assert moved["name"] != original["name"] and len(moved["sha256"]) == 64
    assert fingerprint_mismatch(original, moved) == []
    weights = load_file(str(copy / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    assert fingerprint_mismatch(original, load_target(str(copy)).fingerprint) == ["sha256"]
    # heads and data recorded before weights were hashed still match by path (and only by path)
    old = dict(original, sha256=None)
    assert fingerprint_mismatch(old, original) == []
    assert fingerprint_mismatch(old, moved) == ["name"]


def test_a_model_directory_without_weights_is_one_line(tiny_llama, tmp_path):
    import shutil

    shutil.copy(tiny_llama / "config.json", tmp_path / "config.json")
    with pytest.raises(HeadstartError, match="no weights"):
        resolve_spec(str(tmp_path))


def test_a_chat_template_can_be_given_for_a_target_without_one(tiny_llama, tmp_path):
    """Base models and many GGUF files carry no chat template: --chat-template / chat_template
    takes the Jinja text or a file; anything else is one line before the model loads."""
    text = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    inline = load_target(str(tiny_llama), chat_template=text)
    assert inline.chat.render([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant] "
    path = tmp_path / "chat_template.jinja"
    path.write_text(text)
    assert load_target(str(tiny_llama), chat_template=str(path)).chat.render(
        [{"role": "user", "content": "x"}]
    ) == ("[user] x\n[assistant] ")
    for bad, message in ((str(tmp_path / "nope.jinja"), "neither a Jinja template nor a file"),
                         (str(tmp_path), "neither a Jinja template nor a file")):  # fmt: skip
        with pytest.raises(HeadstartError, match=message):
            load_target(str(tiny_llama), chat_template=bad)
    plain = tmp_path / "plain.txt"
    plain.write_text("no template here")
    with pytest.raises(HeadstartError, match="holds no Jinja template"):
        load_target(str(tiny_llama), chat_template=str(plain))


@pytest.mark.parametrize("shared_kwargs", [False, True], ids=["per-layer", "one-dict"])
def test_layer_kinds_read_both_transformers_shapes(monkeypatch, shared_kwargs):
    """transformers <= 5.17 (the GPU image's, 2026-11) returns one kwargs dict for every layer,
    later versions one per layer: both give the same kinds and sliding window."""
    import transformers.cache_utils as cache_utils
    from transformers import Gemma3TextConfig

    from headstart.targets.layer_kinds import SLIDING, read_layer_kinds

    kinds = ["sliding_attention", "full_attention", "sliding_attention"]
    window = {"sliding_window": 64}
    kwargs = window if shared_kwargs else [window if k == SLIDING else {} for k in kinds]
    monkeypatch.setattr(cache_utils, "get_layer_types_and_kwargs", lambda config: (kinds, kwargs))
    read = read_layer_kinds(Gemma3TextConfig(num_hidden_layers=3))
    assert read.kinds == tuple(kinds) and read.window == 64 and read.sliding

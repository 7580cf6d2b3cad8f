"""What of a target's own generate a verify must also reproduce (headstart/targets/exactness.py):
generation_config processors, longrope's switch, a learned position table's end; and stop strings
that begin in the prompt (as transformers' StopStringCriteria matches them)."""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

import pytest
import torch
from tiny import make_target_dir

sys.path.insert(0, str(Path(__file__).parents[1] / "inference"))
from random_heads import RandomMedusa  # noqa: E402
from scripted import ScriptedDrafter  # noqa: E402

from headstart.errors import HeadstartError  # noqa: E402
from headstart.inference.decoder import SpeculativeDecoder  # noqa: E402
from headstart.targets import load_target  # noqa: E402


def reference(target, ids, new, **kwargs):
    x = torch.tensor([ids])
    out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                                eos_token_id=None, pad_token_id=0, **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_a_generation_config_processor_is_refused_for_heads(tmp_path):
    """generate(do_sample=False) applies repetition_penalty (Qwen2.5-Instruct ships 1.05); the
    decoder does not, so heads would change the text: refused in one line."""
    folder = make_target_dir(tmp_path, "llama")
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 1.5}))
    target = load_target(str(folder))
    with pytest.raises(HeadstartError, match="repetition_penalty=1.5.*differ from generate") as err:
        SpeculativeDecoder(target, RandomMedusa(target.hidden_size, target.vocab_size))
    assert "--no-heads" in err.value.fix


def test_longrope_decodes_exactly_below_its_switch_and_refuses_past_it(tmp_path):
    """Phi-3's generate recomputes its cache once a sequence passes original_max_position_embeddings
    (and longrope switches a whole forward's factors there): exact below it, refused past it."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
            "original_max_position_embeddings": 40}  # fmt: skip
    folder = make_target_dir(tmp_path, "phi3", seed=3, max_position_embeddings=256,
                             original_max_position_embeddings=40, rope_parameters=rope)  # fmt: skip
    target = load_target(str(folder))
    for length in (8, 20):
        ids = [(7 * i + 11) % 250 + 3 for i in range(length)]
        expected = reference(target, ids, 38 - length)
        drafter = ScriptedDrafter([ids + expected + [3] * 10], target.vocab_size, wrong_every=3)
        got = SpeculativeDecoder(target, drafter, tree="chain:4").generate([ids], max_new_tokens=38 - length)
        assert got.token_ids[0] == expected, length  # the last steps, whose chain would pass 40, are plain
    with pytest.raises(
        HeadstartError, match="exceeds the target's context of 40: this target's RoPE changes"
    ):
        SpeculativeDecoder(target, drafter, tree="chain:4").generate([ids], max_new_tokens=30)


def test_a_learned_position_table_is_never_indexed_past_its_end(tmp_path):
    """OPT's positions are a table of max_position_embeddings rows: a chain drafted in the last
    tokens of the context indexed past it (IndexError); those steps are plain now."""
    target = load_target(str(make_target_dir(tmp_path, "opt", seed=1, max_position_embeddings=64)))
    ids = [(7 * i + 11) % 250 + 3 for i in range(40)]
    expected = reference(target, ids, 24)
    drafter = ScriptedDrafter([ids + expected], target.vocab_size, wrong_every=1000)
    assert (
        SpeculativeDecoder(target, drafter, tree="chain:4").generate([ids], max_new_tokens=24).token_ids[0]
        == expected
    )


def test_a_stop_string_that_begins_in_the_prompt_stops_as_in_generate(tiny_llama):
    """ "is Paris" after a prompt ending in "is": transformers' StopStringCriteria (and so
    `--no-heads`) stops at " Paris"; the decoder matched only the reply's text and went on."""
    target = load_target(str(tiny_llama))
    tok = target.tokenizer
    words = "says hello abc The x ok zz cat dog sun A B C D E".split()
    for word in words:
        ids = target.chat.encode_raw("The quick brown fox " + word)
        free = reference(target, ids, 20)
        if len(first := tok.decode(free[:1])) == 1 and first in string.ascii_letters + string.digits:
            break  # a plain character: the tiny byte-level vocabulary spells it as itself
    else:
        pytest.fail("no prompt whose reply starts with a letter or digit")
    stop = tok.decode(ids[-2:]) + tok.decode(free[:1])  # two prompt characters and the reply's first
    expected = reference(target, ids, 20, stop_strings=[stop], tokenizer=tok)
    assert len(expected) < 20  # generate stopped
    decoder = SpeculativeDecoder(target, RandomMedusa(target.hidden_size, target.vocab_size), tree="chain:2")
    assert (
        decoder.generate([ids], max_new_tokens=20, stop_strings=[stop], eos_token_id=None).token_ids[0]
        == expected
    )
    # wholly inside the prompt, it stops nothing (it does not overlap a new token)
    inside = tok.decode(ids[-3:])
    assert (
        len(decoder.generate([ids], max_new_tokens=8, stop_strings=[inside], eos_token_id=None).token_ids[0])
        == 8
    )


def test_a_server_job_matches_stop_strings_in_the_reply_only(tiny_llama):
    """OpenAI and vLLM match stop strings in the generated text only: a job without stop_context
    (what `serve` submits) goes on where generate's prompt-straddling match stops."""
    from headstart.inference.engine import Engine, Job
    from headstart.inference.plain import SamplingConfig
    from headstart.inference.stops import StopRule

    target = load_target(str(tiny_llama))
    tok = target.tokenizer
    ids = target.chat.encode_raw("The capital of France is")
    stop = tok.decode(ids[-2:]) + tok.decode(reference(target, ids, 1))  # prompt's end + reply's first token
    decoder = SpeculativeDecoder(target, RandomMedusa(target.hidden_size, target.vocab_size), tree="chain:2")
    assert (
        len(decoder.generate([ids], max_new_tokens=20, stop_strings=[stop], eos_token_id=None).token_ids[0])
        == 1
    )
    engine = Engine(decoder, SamplingConfig(max_new_tokens=1))
    job = Job(key=0, prompt=ids, rule=StopRule(20, frozenset(), (stop,), tok))
    engine.add([job])
    while engine.live:
        engine.step()
    assert len(job.emitted) > 1


def test_only_processors_generate_would_build_are_refused():
    """transformers builds a processor for a count above 0 or a non-empty collection only."""
    from types import SimpleNamespace

    from headstart.targets.exactness import unapplied_processors

    def found(**config):
        return unapplied_processors(SimpleNamespace(generation_config=SimpleNamespace(**config)))

    assert found(min_new_tokens=0, min_length=0, sequence_bias={}, suppress_tokens=(), repetition_penalty=1.0,
                 no_repeat_ngram_size=0, guidance_scale=1.0, bad_words_ids=None) == []  # fmt: skip
    assert found(guidance_scale=1.5, min_new_tokens=3) == ["guidance_scale=1.5", "min_new_tokens=3"]

"""The OpenAI API as clients use it, against a real `headstart serve` on loopback driven by the
official `openai` client: OpenAI's README streaming loop, stream chunks shaped as OpenAI's,
logprobs (identical with heads and without), echo, token-id and batched prompts, n > 1, and the
requests lm-evaluation-harness's `local-completions` sends with its defaults."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from serving import Server, http  # noqa: E402

CHAT = [{"role": "user", "content": "count to ten"}]


@pytest.fixture(scope="module")
def plain_server(tiny_llama, tmp_path_factory):
    srv = Server(tiny_llama, None, tmp_path_factory.mktemp("serve-plain"))
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def target(tiny_llama):
    from headstart.targets import load_target

    return load_target(str(tiny_llama))


def events(server: Server, path: str, body: dict) -> list[dict]:
    """The data of every server-sent event of a streamed request, [DONE] excluded (raw HTTP)."""
    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as reply:
        lines = [line.decode().strip() for line in reply]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_openai_readme_streaming_loop_prints_the_reply(server, capsys):
    """OpenAI's README loop read `choices[0]` of every chunk: a usage chunk with no choices (sent
    whether asked or not) crashed it with IndexError."""
    client = server.client()
    whole = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0,
                                            stream=True)  # fmt: skip
    for chunk in stream:
        print(chunk.choices[0].delta.content or "", end="")
    assert capsys.readouterr().out == whole.choices[0].message.content
    stream = client.completions.create(model=server.model, prompt="Once upon", max_tokens=12, temperature=0,
                                       stream=True)  # fmt: skip
    for chunk in stream:
        print(chunk.choices[0].text, end="")
    text = client.completions.create(model=server.model, prompt="Once upon", max_tokens=12, temperature=0)
    assert capsys.readouterr().out == text.choices[0].text


def test_stream_chunks_are_shaped_as_openai_sends_them(server):
    body = {"model": server.model, "messages": CHAT, "max_tokens": 16, "temperature": 0, "stream": True}
    chunks = events(server, "/v1/chat/completions", body)
    assert len({c["created"] for c in chunks}) == 1 and len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c and len(c["choices"]) == 1 for c in chunks)
    first, *middle, last = [c["choices"][0] for c in chunks]
    assert first["delta"] == {"role": "assistant", "content": ""} and first["finish_reason"] is None
    assert middle and all(set(m["delta"]) == {"content"} and m["finish_reason"] is None for m in middle)
    assert last["delta"] == {} and last["finish_reason"] == "length"
    # asked for: "usage": null on every chunk, then one chunk with the usage and no choices
    asked = events(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in asked[:-1])
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 16


def tokenize(server: Server, text: str) -> list[int]:
    status, body = http("POST", f"{server.url}/tokenize", json.dumps({"prompt": text}).encode())
    assert status == 200, body
    return json.loads(body)["tokens"]


def without_ids(reply) -> dict:
    body = reply.model_dump()
    for key in ("id", "created", "model"):
        body.pop(key)
    return body


def test_logprobs_with_heads_equal_logprobs_without(server, plain_server, target):
    """Greedy logprobs are identical to the last digit with heads and without (one scoring
    forward over the same tokens, not the logits of tree verifies or plain steps), and they are
    the target's own log-softmax."""
    replies = []
    for srv in (server, plain_server):
        client = srv.client()
        chat = client.chat.completions.create(model=srv.model, messages=CHAT, max_tokens=20, temperature=0,
                                              logprobs=True, top_logprobs=3)  # fmt: skip
        text = client.completions.create(model=srv.model, prompt=[5, 70, 80, 90, 100], max_tokens=20,
                                         temperature=0, logprobs=2, echo=True)  # fmt: skip
        replies.append((without_ids(chat), without_ids(text)))
    assert replies[0] == replies[1]
    chat, text = replies[0]
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 20 and all(len(e["top_logprobs"]) == 3 for e in content)
    logprobs = text["choices"][0]["logprobs"]
    prompt = torch.tensor([[5, 70, 80, 90, 100]])
    generated = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                                      do_sample=False, eos_token_id=list(target.eos_token_ids))  # fmt: skip
    ids = generated[0].tolist()
    assert len(ids) == 25 and text["usage"]["completion_tokens"] == 20
    from headstart.serve.logprobs import Pieces

    pieces = Pieces(target.tokenizer)  # a token's text; `bytes:\xNN` for part of a character
    with torch.no_grad():
        expected = target.model(torch.tensor([ids[:25]])).logits[0].log_softmax(-1)
    for at in range(1, 25):
        assert logprobs["token_logprobs"][at] == pytest.approx(expected[at - 1, ids[at]].item(), abs=1e-5)
        best = expected[at - 1].argmax().item()
        top = logprobs["top_logprobs"][at]
        assert top[pieces(best)] == pytest.approx(expected[at - 1, best].item(), abs=1e-5)
        if at >= 5:  # a greedy token is the argmax
            assert logprobs["token_logprobs"][at] == max(top.values())


def test_token_ids_batched_prompts_and_echo(server):
    client = server.client()
    kwargs = dict(model=server.model, max_tokens=8, temperature=0)
    alone = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in ("hello", "the sea")]
    batched = client.completions.create(prompt=["hello", "the sea"], **kwargs)
    assert [c.index for c in batched.choices] == [0, 1] and [c.text for c in batched.choices] == alone
    ids = [tokenize(server, p) for p in ("hello", "the sea")]
    assert [c.text for c in client.completions.create(prompt=ids, **kwargs).choices] == alone
    assert client.completions.create(prompt=ids[1], **kwargs).choices[0].text == alone[1]
    assert batched.usage.prompt_tokens == len(ids[0]) + len(ids[1]) and batched.usage.completion_tokens == 16
    echoed = client.completions.create(prompt="hello", echo=True, **kwargs)
    assert echoed.choices[0].text == "hello" + alone[0]
    # pure scoring: max_tokens 0 with echo gives the prompt's logprobs and nothing more
    scored = client.completions.create(
        model=server.model, prompt="hello there", max_tokens=0, echo=True, logprobs=1
    )
    assert scored.choices[0].text == "hello there" and scored.usage.completion_tokens == 0
    assert scored.choices[0].logprobs.tokens == ["h", "e", "l", "l", "o", " ", "t", "h", "e", "r", "e"]
    assert scored.choices[0].logprobs.token_logprobs[0] is None
    assert all(x < 0 for x in scored.choices[0].logprobs.token_logprobs[1:])


def test_n_choices_are_rows_seeded_seed_plus_index(server):
    client = server.client()
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "tell me a story"}], max_tokens=12,
                  temperature=0.9)  # fmt: skip
    many = client.chat.completions.create(n=3, seed=7, **kwargs)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):
        alone = client.chat.completions.create(seed=7 + i, **kwargs).choices[0].message.content
        assert choice.message.content == alone, i
    assert len({c.message.content for c in many.choices}) > 1
    # streamed: each choice's chunks carry its index and end with its own finish chunk
    chunks = list(client.chat.completions.create(n=3, seed=7, stream=True, **kwargs))
    for i, choice in enumerate(many.choices):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "length"


def test_lm_eval_local_completions_requests(server):
    """The bodies lm-evaluation-harness's `local-completions` sends with its defaults (token-id
    prompts in a list, batch size 1): a loglikelihood request (echo, logprobs 1, max_tokens 1) read
    as it reads it, and a generation request with its stop list (`until` plus the EOS string)."""
    client = server.client()
    context, continuation = tokenize(server, "Question: what is 2+2?\nAnswer:"), tokenize(server, " 4")
    body = {"model": server.model, "prompt": [context + continuation], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True}  # fmt: skip
    status, text = http("POST", f"{server.url}/v1/completions", json.dumps(body).encode())
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    token_logprobs = choice["logprobs"]["token_logprobs"][len(context) : -1]  # lm-eval's parse_logprobs
    top = choice["logprobs"]["top_logprobs"][len(context) : -1]
    assert len(token_logprobs) == len(continuation) and sum(token_logprobs) < 0
    assert all(len(t) in (1, 2) for t in top)  # the best token, and the chosen one when another
    info = json.loads(http("GET", f"{server.url}/tokenizer_info")[1])
    stop = ["\n\n", "Question:", "</s>", "<|im_start|>", info["eos_token"]]  # five: OpenAI's limit is 4
    body = {"prompt": [context], "model": server.model, "max_tokens": 24, "temperature": 0, "stop": stop,
            "seed": 1234}  # fmt: skip
    status, text = http("POST", f"{server.url}/v1/completions", json.dumps(body).encode())
    assert status == 200, text
    reply = json.loads(text)["choices"][0]["text"]
    same = client.completions.create(
        model=server.model, prompt=context, max_tokens=24, temperature=0, stop=stop
    )
    assert reply == same.choices[0].text and not any(s in reply for s in stop)


def test_tokenizer_endpoints_round_trip(server):
    """vLLM's endpoints, where lm-evaluation-harness (tokenizer_backend=auto) finds the tokenizer."""
    ids = tokenize(server, "hello there")
    assert len(ids) == 11
    status, body = http("POST", f"{server.url}/detokenize", json.dumps({"tokens": ids}).encode())
    assert status == 200 and json.loads(body)["prompt"] == "hello there"
    info = json.loads(http("GET", f"{server.url}/tokenizer_info")[1])
    assert info["eos_token"] == "<|im_end|>" and info["model_max_length"] == 512


def test_tokenize_takes_a_chats_messages_and_token_ids_must_be_integers(server, target):
    """/tokenize with `messages` (vLLM's chat shape) renders them as the chat endpoint does; JSON
    booleans are not token ids (they were taken as [1, 0])."""
    status, body = http("POST", f"{server.url}/tokenize", json.dumps({"messages": CHAT}).encode())
    assert status == 200
    assert json.loads(body)["tokens"] == target.chat.encode_rendered(target.chat.render(CHAT, tools=None))
    both = {"messages": CHAT, "prompt": "x"}
    assert http("POST", f"{server.url}/tokenize", json.dumps(both).encode())[0] == 400
    for prompt in ([True, False], [[1, 2], [True]], [1.0, 2.0]):
        body = {"model": server.model, "prompt": prompt, "max_tokens": 2}
        assert http("POST", f"{server.url}/v1/completions", json.dumps(body).encode())[0] == 400, prompt
    assert http("POST", f"{server.url}/detokenize", json.dumps({"tokens": [True]}).encode())[0] == 400


def test_usage_and_logprobs_end_where_a_stop_string_cuts_the_text(server):
    """The stop string's own tokens are in neither the text, the usage nor the logprobs: the
    logprobs' bytes join to the text (up to the token the stop string starts in) and usage counts
    them."""
    client = server.client()
    whole = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0)
    text = whole.choices[0].message.content
    # a printable character first seen a few characters in: the reply is cut there
    stop = next(
        c for i, c in enumerate(text) if i >= 3 and c.isascii() and c.isprintable() and c not in text[:i]
    )
    cut = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=24, temperature=0,
                                         stop=[stop], logprobs=True)  # fmt: skip
    kept = cut.choices[0].message.content
    assert kept == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    content = cut.choices[0].logprobs.content
    assert cut.usage.completion_tokens == len(content) < whole.usage.completion_tokens
    joined = bytes(b for entry in content for b in entry.bytes).decode("utf-8", errors="replace")
    assert joined.startswith(kept) and stop not in joined[len(kept) + 1 :]


def test_logprobs_are_refused_with_stream_and_top_logprobs_needs_logprobs(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=server.model, messages=CHAT, logprobs=True, stream=True)
    assert err.value.body["param"] == "logprobs" and "stream: false" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=server.model, messages=CHAT, top_logprobs=2)

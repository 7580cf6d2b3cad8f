"""`headstart serve` as a real process on a loopback port, driven by the official `openai`
client (no mock of the HTTP layer): chat and text completions, streaming, concurrency, bad
requests, a client leaving mid-stream, keys, a full queue and shutdown while busy. Greedy replies
equal `headstart generate`'s."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serving import Server, generate_text, http  # noqa: E402

PROMPTS = ["hello there", "count to ten", "a", "Write a poem about the sea", "what is two plus two?", "bye"]


def test_chat_and_completions_equal_generate(server, tiny_llama, heads):
    client = server.client()
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hello there"}],
                                           max_tokens=20, temperature=0)  # fmt: skip
    assert reply.choices[0].message.content == generate_text(tiny_llama, heads, "hello there", 20)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 20
    text = client.completions.create(
        model=server.model, prompt="Once upon a time", max_tokens=12, temperature=0
    )
    assert text.choices[0].text == generate_text(tiny_llama, heads, "Once upon a time", 12, raw=True)
    assert [m.id for m in client.models.list().data] == [server.model]


def test_streaming_sends_the_same_text_and_usage_last(server):
    client = server.client()
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "count to ten"}], max_tokens=24,
                  temperature=0)  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(
        client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices


def test_concurrent_requests_each_get_their_own_reply(server, tiny_llama, heads):
    client = server.client()
    got: dict[str, str] = {}

    def ask(prompt: str) -> None:
        reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=16, temperature=0)  # fmt: skip
        got[prompt] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(got) == set(PROMPTS)
    for prompt in PROMPTS:
        assert got[prompt] == generate_text(tiny_llama, heads, prompt, 16), prompt


def test_seeded_sampling_is_reproducible(server):
    client = server.client()
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "tell me a story"}], max_tokens=16,
                  temperature=0.8, top_p=0.9, seed=7)  # fmt: skip
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"model": "M", "messages": []}), 400, "messages"),
        (json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}), 400, "temperature"),
        (json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi"}], "n": 0}), 400, "n"),
        (json.dumps({"model": "other", "messages": [{"role": "user", "content": "hi"}]}), 404, "is not served here"),
        (json.dumps({"model": "M", "messages": [{"role": "user", "content": "word " * 600}]}), 400, "context of 512"),
        (json.dumps({"model": "M", "messages": [{"role": "user", "content": "word " * 90}], "max_tokens": 100}), 400, "exceeds the context"),
        (json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}), 400, "max_tokens"),
        (json.dumps({"model": "M", "messages": [{"role": "user", "content": "hi \ud800 there"}]}), 400, "not valid Unicode"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(server, body, status, words):
    data = body if isinstance(body, bytes) else body.replace('"M"', json.dumps(server.model)).encode()
    code, text = http("POST", f"{server.url}/v1/chat/completions", data)
    assert code == status, text
    error = json.loads(text)["error"]
    assert words in error["message"] and error["type"]
    assert http("GET", f"{server.url}/health")[0] == 200  # still serving


def test_seeded_sampling_is_the_same_beside_a_neighbour(server):
    """A seeded request gives the same text alone and while another request of its sampling
    settings runs beside it (on a CPU a greedy lane turns to plain steps past one row; a sampled
    lane must not: plain and speculative steps draw their random numbers differently)."""
    client = server.client()
    warp = dict(model=server.model, max_tokens=60, temperature=0.8, top_p=0.9)
    kwargs = dict(warp, messages=[{"role": "user", "content": "tell me a story"}], seed=7)
    alone = client.chat.completions.create(**kwargs).choices[0].message.content
    for _ in range(3):
        neighbour = threading.Thread(
            target=lambda: client.chat.completions.create(
                **{**warp, "max_tokens": 400}, messages=[{"role": "user", "content": "hi"}]
            )
        )
        neighbour.start()
        time.sleep(0.15)  # it runs when the seeded one joins
        beside = client.chat.completions.create(**kwargs).choices[0].message.content
        neighbour.join(120)
        assert beside == alone


def test_a_temperature_too_small_to_sample_decodes_greedily(server, tiny_llama, heads):
    """1e-300 overflowed the logits to nan and failed every request of the server's running
    batch; below 1e-5 the server decodes greedily (as vLLM does)."""
    client = server.client()
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hello there"}],
                                           max_tokens=12, temperature=1e-300)  # fmt: skip
    assert reply.choices[0].message.content == generate_text(tiny_llama, heads, "hello there", 12)


def metric(server: Server, name: str) -> float:
    text = http("GET", f"{server.url}/metrics")[1]
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_a_client_leaving_before_a_plain_reply_frees_its_row(server):
    """Starlette cancels a streamed reply whose client leaves, not a plain one: its row decoded
    on to max_tokens for nobody."""
    with pytest.raises(openai.APITimeoutError):
        server.client(timeout=0.3).chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "go on"}], max_tokens=480, temperature=0
        )
    deadline = time.time() + 30
    while metric(server, "headstart_running_requests") and time.time() < deadline:
        time.sleep(0.1)
    assert metric(server, "headstart_running_requests") == 0
    # answered as nginx's 499 (client closed request) when it left, not 200 after 480 tokens
    assert metric(server, 'headstart_requests_total{endpoint="/v1/chat/completions",status="499"}') == 1
    assert "the client went away; its row is freed" in server.output()


def test_a_client_leaving_mid_stream_frees_its_row(server):
    client = server.client()
    stream = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "go on"}],
                                            max_tokens=400, temperature=0, stream=True)  # fmt: skip
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        text = http("GET", f"{server.url}/metrics")[1]
        if "headstart_running_requests 0" in text:
            break
        time.sleep(0.2)
    assert "headstart_running_requests 0" in text
    assert (
        "headstart_tau" in text
        and 'headstart_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    )
    reply = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)  # fmt: skip
    assert reply.usage.completion_tokens == 4


def test_api_key_and_a_full_queue(tiny_llama, tmp_path):
    srv = Server(tiny_llama, None, tmp_path, "--api-key", "sesame", "--max-batch", "1", "--max-queue", "1",
                 "--max-tokens", "450")  # fmt: skip
    try:
        with pytest.raises(openai.AuthenticationError):
            srv.client("wrong").models.list()
        # the key comes first: a body without it is not even validated
        assert http("POST", f"{srv.url}/v1/chat/completions", b"{not json")[0] == 401
        client = srv.client("sesame")
        assert client.models.list().data[0].id == srv.model
        import urllib.request

        for header, status in (("bearer sesame", 200), ("BEARER  sesame ", 200), ("Basic sesame", 401),
                               ("bearer sesam", 401), ("sesame", 401)):  # fmt: skip
            request = urllib.request.Request(f"{srv.url}/v1/models", headers={"Authorization": header})
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    got = answer.status
            except urllib.error.HTTPError as err:
                got = err.code
            assert got == status, header  # the scheme is case-insensitive (RFC 9110)
        # no max_tokens: the default (512), within this server's --max-tokens (it was refused)
        reply = client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": "hi"}])
        assert 0 < reply.usage.completion_tokens <= 450
        outcomes: list[str] = []
        together = threading.Barrier(5)  # all five ask while the first still runs (slow CI machines)

        def ask() -> None:
            together.wait(60)
            try:
                client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": "go on"}],
                                               max_tokens=400, temperature=0)  # fmt: skip
                outcomes.append("ok")
            except openai.RateLimitError:
                outcomes.append("429")

        threads = [threading.Thread(target=ask) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert "429" in outcomes and "ok" in outcomes, outcomes  # one runs, one waits, the rest are refused
    finally:
        assert srv.stop() == 0, srv.output()


def test_sigterm_while_busy_finishes_accepted_requests_and_exits_0(tiny_llama, tmp_path):
    """Requests accepted before SIGTERM, the running one and one still queued behind it (one row
    a lane), are finished, not cut; the server then exits 0."""
    srv = Server(tiny_llama, None, tmp_path, "--grace", "60", "--max-batch", "1")
    client = srv.client()
    streams = [client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": f"go on {i}"}],
                                              max_tokens=120, temperature=0, stream=True, stream_options={"include_usage": True})
               for i in range(2)]  # fmt: skip
    firsts = [next(iter(stream)) for stream in streams]  # the role chunk: the second is still queued
    srv.proc.send_signal(signal.SIGTERM)
    for first, stream in zip(firsts, streams, strict=True):
        rest = list(stream)
        assert first.choices[0].delta.role == "assistant" and rest[-1].usage.completion_tokens == 120
    assert srv.proc.wait(timeout=60) == 0, srv.output()
    srv.log.close()


def test_sigterm_past_the_grace_answers_503_and_exits_0(tiny_llama, tmp_path):
    """What still runs or waits when --grace runs out is answered 503 (an error event when
    streamed) by the server itself, which then exits 0; uvicorn cut them with a bare 500 and the
    decode loop died on its closed event loop (exit 1)."""
    srv = Server(tiny_llama, None, tmp_path, "--grace", "0.5", "--max-batch", "1")
    client = srv.client(timeout=60)
    outcomes: list[int] = []

    def ask(i: int) -> None:
        try:
            client.completions.create(model=srv.model, prompt=f"go on {i}", max_tokens=480, temperature=0)
            outcomes.append(200)
        except openai.APIStatusError as err:
            outcomes.append(err.status_code)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while metric(srv, "headstart_running_requests") < 1 and time.time() < deadline:
        time.sleep(0.05)
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert outcomes == [503, 503, 503], (outcomes, srv.output())
    assert srv.proc.wait(timeout=30) == 0, srv.output()
    srv.log.close()


def test_distill_through_headstart_serve_writes_the_in_process_records(server, tiny_llama, tmp_path):
    """`distill --engine openai` against `headstart serve` (greedy) and headstart's own engine
    give the same conversations, token for token."""
    from headstart.cli import main
    from headstart.distill import load_distilled

    source = tmp_path / "p.jsonl"
    source.write_text(
        "".join(json.dumps({"prompt": f"question number {i}, please"}) + "\n" for i in range(8))
    )
    base = ["-q", "distill", "--target", str(tiny_llama), "--prompts", str(source), "--num", "8",
            "--max-new-tokens", "16", "--max-prompt-tokens", "64"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "local")]) == 0
    assert main([*base, "--out", str(tmp_path / "served"), "--engine", "openai", "--base-url", f"{server.url}/v1",
                 "--model", server.model, "--concurrency", "3"]) == 0  # fmt: skip
    local = {r["index"]: r for r in load_distilled(tmp_path / "local")}
    served = {r["index"]: r for r in load_distilled(tmp_path / "served")}
    assert set(local) == set(served) == set(range(8))
    for index in local:
        assert served[index]["input_ids"] == local[index]["input_ids"], index
        assert served[index]["messages"] == local[index]["messages"]


def test_a_plain_server_prefills_a_shared_opening_once_and_replies_as_generate(tiny_llama, tmp_path):
    """Without heads, requests that open alike (a chat template's system turn, here a long common
    instruction) reuse one prefill of the opening, also one request at a time, and each greedy
    reply is still transformers' `generate`'s (`generate --no-heads`)."""
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    srv = Server(tiny_llama, None, tmp_path, "--max-batch", "4")
    try:
        client = srv.client()
        opening = "Please answer the following question carefully and briefly, in one sentence: "
        for i, question in enumerate(["what is the sea?", "why is the sky blue?", "count to three"]):
            messages = [{"role": "user", "content": opening + question}]
            reply = client.chat.completions.create(
                model=srv.model, messages=messages, max_tokens=12, temperature=0
            )
            ids = torch.tensor([target.chat.prompt_ids(messages)])
            out = target.model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
            assert reply.choices[0].message.content == target.tokenizer.decode(
                out[0, ids.shape[1] :], skip_special_tokens=True
            ), i
        cached = [line for line in http("GET", f"{srv.url}/metrics")[1].splitlines()
                  if line.startswith("headstart_prefix_cached_tokens_total ")]  # fmt: skip
        assert cached and int(cached[0].split()[1]) >= 2 * 8, cached  # the 2nd and 3rd took the opening
    finally:
        assert srv.stop() == 0, srv.output()


def test_a_client_s_paths_never_become_metric_labels(server):
    """A 404, 405 or 401 is counted under the route or a bounded stand-in: paths a client makes
    up would otherwise add a /metrics series each, without end."""
    for i in range(3):
        assert http("POST", f"{server.url}/v1/models/made-up-{i}", b"{}")[0] == 405
        assert http("GET", f"{server.url}/v1/made-up-{i}")[0] == 404
    text = http("GET", f"{server.url}/metrics")[1]
    assert "made-up" not in text and "/v1/models/{id}" in text


def test_metrics_count_speculative_and_plain_steps(server, tiny_llama, heads, tmp_path):
    """/metrics says how many decode steps verified a tree and how many went plain (past
    --speculate-up-to, or with the heads set aside)."""

    def steps(srv: Server) -> dict[str, float]:
        text = http("GET", f"{srv.url}/metrics")[1]
        return {kind: float(next(line.split()[-1] for line in text.splitlines()
                                 if line.startswith(f'headstart_decode_steps_total{{kind="{kind}"}}')))
                for kind in ("plain", "speculative")}  # fmt: skip

    before = steps(server)
    server.client().completions.create(model=server.model, prompt="once", max_tokens=8, temperature=0)
    after = steps(server)
    assert after["speculative"] > before["speculative"] and after["plain"] == before["plain"]
    plain = Server(tiny_llama, heads, tmp_path, "--speculate-up-to", "0")
    try:
        plain.client().completions.create(model=plain.model, prompt="once", max_tokens=8, temperature=0)
        counted = steps(plain)
        assert counted["plain"] > 0 and counted["speculative"] == 0
    finally:
        assert plain.stop() == 0, plain.output()


@pytest.mark.parametrize(("spec", "mode"), [("early-exit:1", "early exit after layer 1"),
                                            ("lookahead:window=3,ngram=3,guesses=2", "lookahead decoding")])  # fmt: skip
def test_a_server_drafting_with_a_draft_model_answers_as_the_target(tiny_llama, tmp_path, spec, mode):
    """`serve --draft-model early-exit:1` (the target's first layer drafts for every lane) and
    `--draft-model lookahead:...` (each row's own window and pool): greedy replies, alone and
    concurrent (rows joining and leaving the batch), are transformers' `generate`'s."""
    from headstart.targets import load_target

    target = load_target(str(tiny_llama))
    srv = Server(
        tiny_llama,
        None,
        tmp_path,
        "--draft-model",
        spec,
        "--max-batch",
        "4",
        "--speculate-up-to",
        "1000",
        "--speculate",
        "always",
    )
    try:
        client = srv.client()
        assert mode in srv.wait_for(mode)  # the mode line at start-up
        replies: dict[str, str] = {}

        def ask(prompt: str) -> None:
            replies[prompt] = client.completions.create(model=srv.model, prompt=prompt, max_tokens=16,
                                                        temperature=0).choices[0].text  # fmt: skip

        threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS[:4]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for prompt in PROMPTS[:4]:
            ids = target.chat.encode_raw(prompt)
            x = torch.tensor([ids])
            out = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                                        eos_token_id=list(target.eos_token_ids), pad_token_id=0)  # fmt: skip
            assert replies[prompt] == target.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True), (
                prompt
            )
    finally:
        assert srv.stop() == 0, srv.output()

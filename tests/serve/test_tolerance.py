"""What other servers accept, against a real `headstart serve` on loopback: unknown fields ignored
(a log line, a /metrics count), sampling fields headstart cannot honour refused by name, tools and
tool messages rendered through the target's chat template (or refused when it ignores them),
`models.retrieve`, OpenAI error bodies for every refusal (404 and 405 included), a body not sent
as JSON, and CORS."""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from serving import Server, http  # noqa: E402

HI = [{"role": "user", "content": "hi"}]
# a template that renders tools, tool calls and tool results (as Qwen's and Llama 3's do, in small)
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for tool in tools %} {{ tool.function.name }}: "
    "{{ tool.function.description }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}<call>{{ call.function.name }} "
    "{{ call.function.arguments.city }}</call>{% endfor %}{% else %}{{ message['content'] }}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
CALL = [{"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]  # fmt: skip


@pytest.fixture(scope="module")
def tools_target(tiny_llama, tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tools-target") / "tiny-llama-tools"
    shutil.copytree(tiny_llama, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tools_server(tools_target, tmp_path_factory):
    srv = Server(tools_target, None, tmp_path_factory.mktemp("serve-tools"), "--allowed-origins",
                 "http://ui.example")  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.output()


def metric_lines(server: Server, prefix: str) -> list[str]:
    return [line for line in http("GET", f"{server.url}/metrics")[1].splitlines() if line.startswith(prefix)]


def test_unknown_fields_are_ignored_with_a_log_line_and_a_count(server):
    client = server.client()
    kwargs = dict(model=server.model, max_tokens=8, temperature=0)
    plain = client.chat.completions.create(messages=HI, **kwargs).choices[0].message.content
    extra = {"chat_template_kwargs": {"enable_thinking": False}, "min_tokens": 2, "best_of_tries": 1}
    messages = [{"role": "user", "content": "hi", "weight": 1}]
    reply = client.chat.completions.create(messages=messages, extra_body=extra, reasoning_effort="low",
                                           service_tier="auto", **kwargs)  # fmt: skip
    assert reply.choices[0].message.content == plain
    greedy = dict(model=server.model, prompt="hi", max_tokens=4, temperature=0)
    text = client.completions.create(**greedy, extra_body={"max_token": 9})  # misspelt: ignored, as in vLLM
    assert text.choices[0].text == client.completions.create(**greedy).choices[0].text
    lines = [line for line in server.output().splitlines() if "ignored fields" in line]
    assert any("chat_template_kwargs" in line and "messages.0.weight" in line and "reasoning_effort" in line
               for line in lines), lines  # fmt: skip
    assert 'headstart_ignored_fields_total{field="service_tier"} 1' in metric_lines(
        server, "headstart_ignored"
    )
    assert 'headstart_ignored_fields_total{field="max_token"} 1' in metric_lines(server, "headstart_ignored")


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 0.5), ("frequency_penalty", -0.2), ("repetition_penalty", 1.1), ("min_p", 0.05),
     ("response_format", {"type": "json_object"}),
     ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
     ("tool_choice", "required"), ("logit_bias", {"5": 10})],
)  # fmt: skip
def test_fields_that_cannot_be_honoured_are_refused_by_name(server, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        server.client().chat.completions.create(model=server.model, messages=HI, extra_body={field: value})
    body = err.value.body
    assert body["param"] == field and field in body["message"], body
    assert "send" in body["message"] or "leave it out" in body["message"], body  # and what to do instead


def test_neutral_values_of_those_fields_are_accepted(server):
    client = server.client()
    kwargs = dict(model=server.model, messages=HI, max_tokens=6, temperature=0)
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    neutral = client.chat.completions.create(presence_penalty=0, frequency_penalty=0.0, response_format={"type": "text"},
                                             extra_body={"repetition_penalty": 1.0, "min_p": 0, "top_k": -1},
                                             tool_choice="none", stop=["a1", "b2", "c3", "d4", "e5", "f6"], **kwargs)  # fmt: skip
    assert neutral.choices[0].message.content == plain


def test_null_means_the_default(server):
    """OpenAI's spec marks these nullable and vLLM takes null as the default; wrappers send it."""
    nulls = {"stream": None, "n": None, "top_p": None, "stop": None, "seed": None, "logprobs": None,
             "presence_penalty": None, "stream_options": None}  # fmt: skip
    for path, body in (("chat/completions", {"messages": HI}), ("completions", {"prompt": "hi"})):
        base = {"model": server.model, "max_tokens": 6, "temperature": 0, **body}
        status, text = http("POST", f"{server.url}/v1/{path}", json.dumps({**base, **nulls}).encode())
        assert status == 200, text
        plain = json.loads(http("POST", f"{server.url}/v1/{path}", json.dumps(base).encode())[1])
        assert len(json.loads(text)["choices"]) == 1 and json.loads(text)["choices"] == plain["choices"]
    status, text = http(
        "POST", f"{server.url}/v1/completions", json.dumps({"model": server.model, "prompt": None}).encode()
    )
    assert status == 400 and "prompt" in text  # a required field stays required


def test_models_retrieve_and_errors_in_openai_shape(server):
    client = server.client()
    assert client.models.retrieve(server.model).id == server.model
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError) as err:
        client.post("/embeddings", body={"model": server.model, "input": "hi"}, cast_to=object)
    assert "no endpoint '/v1/embeddings'" in err.value.body["message"]
    for method, path, status, words in [("GET", "/v1/chat/completions", 405, "use POST"),
                                        ("POST", "/v1/models", 405, "use GET"), ("GET", "/nothing", 404, "no endpoint")]:  # fmt: skip
        code, text = http(method, f"{server.url}{path}", b"{}" if method == "POST" else None)
        body = json.loads(text)
        assert code == status and set(body) == {"error"}, text
        assert (
            set(body["error"]) == {"message", "type", "param", "code"} and words in body["error"]["message"]
        )


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_one_clear_line(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    body = json.dumps({"model": server.model, "messages": HI}).encode()
    request = urllib.request.Request(f"{server.url}/v1/chat/completions", data=body, headers=headers)
    if content_type is None:
        request.remove_header("Content-type")  # urllib adds a form type of its own
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as err:
        error = json.loads(err.read())["error"]
        assert err.code == 415 and "Content-Type: application/json" in error["message"]
        assert "\n" not in error["message"]


def test_tools_tool_calls_and_tool_results_render_through_the_template(tools_server, tools_target):
    from headstart.targets import load_target

    target = load_target(str(tools_target))
    reply = tools_server.client().chat.completions.create(model=tools_server.model, messages=CALL, tools=TOOLS,
                                                          max_tokens=10, temperature=0)  # fmt: skip
    rendered = [dict(CALL[0]), {**CALL[1], "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]}, dict(CALL[2])]  # fmt: skip
    text = target.tokenizer.apply_chat_template(
        rendered, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert (
        "weather: the weather in a city" in text and "<call>weather Paris</call>" in text and "sunny" in text
    )
    ids = torch.tensor([target.tokenizer(text, add_special_tokens=False)["input_ids"]])
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, min_new_tokens=10,
                                do_sample=False)  # fmt: skip
    assert reply.usage.prompt_tokens == ids.shape[1]
    assert reply.choices[0].message.content == target.tokenizer.decode(
        out[0, ids.shape[1] :], skip_special_tokens=True
    )


def test_a_template_that_ignores_tools_refuses_them(server):
    """The tiny target's ChatML template renders neither tools nor tool calls: a 400 saying so,
    not a prompt that silently lost them."""
    client = server.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=server.model, messages=HI, tools=TOOLS)
    assert err.value.body["param"] == "tools" and "ignores `tools`" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="ignores an assistant message's tool_calls"):
        client.chat.completions.create(model=server.model, messages=CALL)


def test_cors_for_the_allowed_origins_only(tools_server, server):
    def ask(srv: Server, method: str, origin: str) -> dict[str, str]:
        headers = {"Origin": origin, "Access-Control-Request-Method": "POST",
                   "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip
        request = urllib.request.Request(f"{srv.url}/v1/chat/completions" if method == "OPTIONS" else f"{srv.url}/v1/models",
                                         method=method, headers=headers)  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return {k.lower(): v for k, v in reply.headers.items()}
        except urllib.error.HTTPError as err:
            return {k.lower(): v for k, v in err.headers.items()}

    preflight = ask(tools_server, "OPTIONS", "http://ui.example")
    assert preflight["access-control-allow-origin"] == "http://ui.example"
    assert "POST" in preflight["access-control-allow-methods"]
    assert ask(tools_server, "GET", "http://ui.example")["access-control-allow-origin"] == "http://ui.example"
    assert "access-control-allow-origin" not in ask(tools_server, "GET", "http://evil.example")
    assert "access-control-allow-origin" not in ask(server, "GET", "http://ui.example")  # none allowed

"""The OpenAI API's requests as `headstart serve` reads them (pydantic, as FastAPI validates them):
a wrong type is a 400 that names the field; a field headstart does not know is ignored, as vLLM
ignores it (`ignored_fields` names them for the log and /metrics); a known field whose value
headstart cannot honour exactly (a penalty, constrained decoding) is a 400 that names it and says
what to send instead. Response bodies are in bodies.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

UNSUPPORTED = "headstart serve does not support it"
MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_STOPS = 64  # OpenAI allows 4; vLLM and llama-server any number (each costs a decode per token)


class Lenient(BaseModel):
    """Unknown fields are kept aside (`model_extra`), not refused; `null` for a field that has a
    default means that default (OpenAI's spec marks `stream`, `temperature`, `n`, ... nullable,
    vLLM accepts it, and client wrappers send explicit nulls)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items()
                if value is not None or key not in cls.model_fields or cls.model_fields[key].is_required()}  # fmt: skip


def ignored_fields(value: Any, where: str = "") -> list[str]:
    """The dotted names of every unknown field in a validated request, nested ones included."""
    if isinstance(value, list):
        return [name for i, item in enumerate(value) for name in ignored_fields(item, f"{where}{i}.")]
    if not isinstance(value, BaseModel):
        return []
    names = [f"{where}{key}" for key in (value.model_extra or {})]
    for key in type(value).model_fields:
        names += ignored_fields(getattr(value, key), f"{where}{key}.")
    return names


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class Function(Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: Function


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ToolSpec(Lenient):
    type: Literal["function"]
    function: dict[str, Any]


class StreamOptions(Lenient):
    include_usage: bool = False  # OpenAI's default: no usage chunk unless asked


def _refuse_unless(value: Any, neutral: Any, field: str, why: str) -> Any:
    if value is not None and value != neutral:
        raise ValueError(
            f"{field} {value!r} is not applied by headstart serve ({why}); send {neutral!r} or leave it out"
        )
    return value


PENALTY_WHY = (
    "its verifier accepts draft tokens against the target's own logits, and no penalty is applied there"
)


class Sampling(Lenient):
    """What both endpoints share."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)  # an extension (vLLM, SGLang, llama.cpp); -1 is vLLM's "off"
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=128)
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0  # vLLM's and transformers' extension
    min_p: float | None = 0.0  # an extension (vLLM, llama.cpp)
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise ValueError(f"at most {MAX_STOPS} stop strings, none empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty", "repetition_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None, info: Any) -> float | None:
        return _refuse_unless(value, 1.0 if info.field_name == "repetition_penalty" else 0.0, info.field_name,
                              PENALTY_WHY)  # fmt: skip

    @field_validator("min_p")
    @classmethod
    def _no_min_p(cls, value: float | None) -> float | None:
        return _refuse_unless(value, 0.0, "min_p", "it warps with temperature, top_p and top_k only")

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError(f"logit_bias: {UNSUPPORTED}; leave it out")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def warp(self) -> tuple[float, float, int]:
        from headstart.inference.plain import MIN_TEMPERATURE

        # below MIN_TEMPERATURE the logits would overflow: greedy, as vLLM does
        if self.temperature < MIN_TEMPERATURE:
            return (0.0, 1.0, 0)
        return (self.temperature, self.top_p, max(self.top_k, 0))


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError(
                f"type {value.get('type')!r}: headstart serve has no constrained decoding, so it cannot promise "
                "JSON; send {'type': 'text'} (and ask for JSON in the prompt), or leave it out"
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value not in (None, "none", "auto"):
            raise ValueError(
                f"{value!r} would force a tool call, which needs constrained decoding (headstart serve has "
                "none); send 'auto' or 'none': tools are rendered into the prompt and the reply is the model's text"
            )
        return value

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top(self) -> int | None:
        """How many alternatives per token when logprobs are asked for, else None."""
        return (self.top_logprobs or 0) if self.logprobs else None


TokenIds = list[StrictInt]  # JSON true/false or 1.0 are not token ids (lax ints would take them)


class CompletionRequest(Sampling):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = Field(16, ge=0)  # OpenAI's default for completions; 0 with echo: scoring
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> Any:
        if isinstance(value, list) and (not value or any(isinstance(p, list | str) and not p for p in value)):
            raise ValueError("an empty list or an empty prompt in it")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError(f"suffix (fill-in-the-middle): {UNSUPPORTED}; leave it out")
        return value

    @model_validator(mode="after")
    def _combinations(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(
                f"best_of {self.best_of} != n {self.n}: ranking choices is not served; leave best_of out"
            )
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens 0 returns nothing without echo: ask for tokens, or set echo to score the prompt"
            )
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt: a string or token ids."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]

    def limit(self) -> int | None:
        return self.max_tokens

    def top(self) -> int | None:
        return self.logprobs

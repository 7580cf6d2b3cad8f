"""vLLM's tokenizer endpoints, the ones lm-evaluation-harness looks for (`/tokenizer_info` and
`/tokenize`; its `local-completions` model then tokenizes with the server's own tokenizer,
`tokenizer_backend=auto`, and needs no tokenizer files of its own): POST /tokenize, POST
/detokenize, GET /tokenizer_info. Token ids sent by a client are checked here too."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import Field, StrictInt, model_validator

from headstart.serve.bodies import Refused
from headstart.serve.chat import chat_prompt, utf8
from headstart.serve.protocol import Lenient, Message, ToolSpec
from headstart.serve.served import Served

TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")


class TokenizeRequest(Lenient):
    """vLLM's two shapes: a completion's `prompt`, or a chat's `messages` (rendered with the chat
    template, the generation prompt added, as /v1/chat/completions renders them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    tools: list[ToolSpec] | None = None
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _one_of(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(
                "send either prompt (a completion's text) or messages (a chat), not both or neither"
            )
        return self


class DetokenizeRequest(Lenient):
    model: str | None = None
    tokens: list[StrictInt] = Field(min_length=0)


def check_ids(target: Any, ids: list[int], where: str) -> list[int]:
    """Token ids a client sent, each within the target's vocabulary (an id past it is a 400, not
    an index error in the embedding)."""
    size = int(target.vocab_size)
    bad = next((i for i in ids if not 0 <= i < size), None)
    if bad is not None:
        raise Refused(400, f"{where}: token id {bad} is outside the vocabulary (0..{size - 1})", where)
    return ids


def add_tokenizer_routes(app: FastAPI, served: Served, refuse: Any, check_model: Any) -> None:
    tokenizer = served.target.tokenizer

    @app.post("/tokenize", response_model=None)
    async def tokenize(body: TokenizeRequest) -> Any:
        try:
            if body.model is not None:
                check_model(body.model)
            if body.messages is not None:
                ids = chat_prompt(served.target.chat, body)
            else:
                ids = tokenizer(utf8(body.prompt, "prompt"), add_special_tokens=body.add_special_tokens)[
                    "input_ids"
                ]
        except Refused as err:
            return refuse("/tokenize", err)
        return JSONResponse(
            {"count": len(ids), "max_model_len": served.context, "tokens": ids, "token_strs": None}
        )

    @app.post("/detokenize", response_model=None)
    async def detokenize(body: DetokenizeRequest) -> Any:
        try:
            if body.model is not None:
                check_model(body.model)
            ids = check_ids(served.target, body.tokens, "tokens")
        except Refused as err:
            return refuse("/detokenize", err)
        return JSONResponse({"prompt": tokenizer.decode(ids)})

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> JSONResponse:
        info = {
            name: getattr(tokenizer, name, None)
            for name in ("eos_token", "bos_token", "pad_token", "unk_token")
        }
        return JSONResponse({"tokenizer_class": type(tokenizer).__name__, **info,
                             "chat_template": getattr(tokenizer, "chat_template", None),
                             "model_max_length": served.context})  # fmt: skip

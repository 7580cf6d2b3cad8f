"""The chat-template helper: one place that turns messages into the target's prompt token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headstart.errors import HeadstartError


@dataclass(frozen=True)
class Chat:
    """Wraps the tokenizer's chat template (if any).

    `prompt_ids(messages)` renders a conversation up to the start of the assistant's reply;
    `encode_raw(text)` tokenises plain text the way `--raw` prompts are fed to the target.
    """

    tokenizer: Any

    @property
    def has_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        where: str = "the chat template",
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The template's text for `messages` (a list of {role, content}, plus tool_calls or
        tool_call_id where a conversation has them) and `tools` (JSON schemas, transformers'
        `apply_chat_template(tools=...)`); a template that does not compile or raises while
        rendering (raise_exception, an undefined name, ...) is one line."""
        if not self.has_template:
            raise HeadstartError(
                "this target's tokenizer has no chat template",
                "pass --raw to feed the prompt as plain text, or use a tokenizer with a chat_template",
            )
        try:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except (
            Exception
        ) as err:  # jinja2 raises many types (TemplateError, UndefinedError, ZeroDivisionError...)
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise HeadstartError(
                f"{where} failed on a {len(messages)}-message conversation ({type(err).__name__}: {reason})",
                "fix the template (a Jinja file rendering `messages`; a template without a system role "
                "takes no --system), or use `headstart generate --raw` for plain text",
            ) from None

    def prompt_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                   tools: list[dict[str, Any]] | None = None) -> list[int]:  # fmt: skip
        """Token ids of the rendered conversation (the template supplies any BOS itself)."""
        return self.encode_rendered(
            self.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        )

    def encode_rendered(self, text: str) -> list[int]:
        """Token ids of a template's text (its special tokens are in it already)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def user_prompt_ids(self, prompt: str) -> list[int]:
        return self.prompt_ids([{"role": "user", "content": prompt}])

    def conversation_ids(self, user_turns: Sequence[str], replies: Sequence[str]) -> list[int]:
        """Prompt ids for the next reply: user_turns[i] answered by replies[i], one user turn more."""
        messages = [{"role": "user", "content": user_turns[0]}]
        for reply, turn in zip(replies, user_turns[1:], strict=True):
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": turn}]
        return self.prompt_ids(messages)

    def encode_raw(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

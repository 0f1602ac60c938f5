"""The agent's conversation: OpenAI-shaped messages, rendered to ids by a wire format.

The same format renders the server's requests (:mod:`mlx_agent.formats`), so a conversation
the agent holds and the same conversation sent to the server become the same ids. Replies
are kept with the ids the model sampled for them (the format's memo), so a re-rendered
conversation equals the KV cache token for token: the engine never re-prefills a reply.
"""

from __future__ import annotations

from typing import Sequence

import msgspec

from ..formats import DEFAULT_HERMES_SYSTEM, Format, Reply, ReplyMemo, choose, make_format
from ..tools import Tool


def agent_format(protocol: str, lm, system: str | None = None) -> Format:
    """The format for an agent over ``lm``: ``system`` replaces the json persona line, or is
    the hermes system message (a default one when None)."""
    name = choose(protocol, lm.chat)
    persona = system or (DEFAULT_HERMES_SYSTEM if name == "hermes" else None)
    return make_format(name, lm, ReplyMemo(size=None), persona)


class _State(msgspec.Struct, frozen=True):
    """A saved conversation: the system prompt's ids, the messages, the sampled replies."""

    system: list[int]
    messages: list[dict]
    replies: list[tuple[str, list[int]]]


class Conversation:
    def __init__(self, fmt: Format, tools: Sequence[Tool]):
        self.fmt, self.tools = fmt, list(tools)
        self.messages: list[dict] = []
        self.system_ids = fmt.system_prefix(self.tools)  # what every turn starts with
        self.system_text = fmt.system_text(self.tools)

    def prompt_ids(self) -> list[int]:
        return self.fmt.prompt_ids(self.messages, self.tools)

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def drop_last(self) -> None:
        """Forget the last message (a user message the context could not take)."""
        self.messages.pop()

    def add_reply(self, reply: Reply, text: str, ids: list[int]) -> None:
        """Keep a reply: its message, and the ids it was sampled as (no stop token)."""
        self.messages.append(self.fmt.reply_message(reply, text, ids))

    def add_results(self, results: Sequence[tuple[str, str]]) -> None:
        for name, content in results:
            self.messages.append({"role": "tool", "name": name, "content": content})

    def state(self) -> dict:
        return msgspec.to_builtins(_State(self.system_ids, self.messages, self.fmt.memo.items()))

    def load_state(self, state: object) -> None:
        """Continue a saved conversation; ValueError (nothing changed) when it does not fit."""
        try:
            saved = msgspec.convert(state, _State)
        except msgspec.ValidationError as e:
            raise ValueError(f"its conversation is unreadable ({e})") from None
        if saved.system != self.system_ids:
            raise ValueError("its system prompt differs from this one (other tools or --system)")
        if any(not isinstance(m.get("role"), str) for m in saved.messages):
            raise ValueError("its conversation is unreadable (a message without a role)")
        self.messages = list(saved.messages)
        for text, ids in saved.replies:
            self.fmt.memo.put(text, ids)

"""The wire formats: how a conversation becomes prompt ids and a reply becomes calls or an answer.

One layer, used by the agent loop (its own conversation) and by the server (each request's
messages), so both render the same conversation to the same ids and read the same reply
the same way:

- ``json`` (:mod:`.json_format`): the original ``posttrainllm`` protocol over ChatML.
- ``hermes`` (:mod:`.template`): the model's chat template with ``tools=``; calls are
  ``<tool_call>`` blocks.
- ``plain`` (:mod:`.template`): no tools, the chat template as the model ships it.

A format is stateless apart from its :class:`ReplyMemo` of sampled ids. It renders
(:meth:`Format.prompt_ids`), parses (:meth:`Format.parse`), says when a turn is over
(:meth:`Format.scanner`) and what a stream shows (:meth:`Format.stream_filter`); the grammar
for a reply comes from :func:`mlx_agent.grammar.tool_constraint` with the format's name.
It runs no model and no tool. The names are imported on first use (:mod:`mlx_agent._lazy`),
so reading :data:`NAMES` loads no model code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

from .._lazy import exports
from ..errors import UserFacingError

if TYPE_CHECKING:
    from ..chat import ChatFormat
    from ..tools import Tool
    from .deferred import GET_TOOL_INFO, get_tool_info_tool, tool_index, tool_info
    from .json_format import DEFAULT_PERSONA, JsonFormat, system_prompt
    from .messages import (Call, MessageError, Reply, ReplyMemo, Scanner, StreamFilter,
                           arguments_of, compact, text_of, unspaced)
    from .template import DEFAULT_HERMES_SYSTEM, HermesFormat, TemplateFormat

NAMES = ("auto", "json", "hermes")


class Format(Protocol):
    name: str
    markers: tuple[str, ...]  # strings a tool result may not contain (they forge turns)
    memo: ReplyMemo

    def system_prefix(self, tools: Sequence[Tool] = (), deferred: bool = False) -> list[int]: ...

    def system_text(self, tools: Sequence[Tool] = (), deferred: bool = False) -> str: ...

    def prompt_ids(self, messages: Sequence[dict], tools: Sequence[Tool] = (),
                   deferred: bool = False) -> list[int]: ...

    def reply_text(self, message: dict) -> str: ...

    def reply_message(self, reply: Reply, text: str, ids: list[int]) -> dict: ...

    def parse(self, text: str) -> Reply: ...

    def scanner(self, parallel: bool = ...) -> Scanner: ...

    def stream_filter(self) -> StreamFilter: ...


class ProtocolError(UserFacingError, ValueError):
    """A protocol this model cannot use."""


def choose(name: str, chat: ChatFormat) -> str:
    """Resolve ``auto``: hermes when the chat template renders tools, json otherwise. Asked
    for by name, hermes needs such a template: with any other, the tools and the calls
    made would be left out of the prompt, and the model would call tools it never saw."""
    if name == "auto":
        return "hermes" if chat.renders_tools else "json"
    if name not in ("json", "hermes", "plain"):
        raise ProtocolError(f"unknown protocol {name!r}; choose json, hermes or auto")
    if name == "hermes" and not chat.renders_tools:
        raise ProtocolError("protocol hermes needs a chat template that renders tools, and "
                            "this model's does not (the model would never see them); use "
                            "--protocol json, or auto")
    return name


def make_format(name: str, lm, memo: ReplyMemo | None = None,
                persona: str | None = None) -> Format:
    """The format ``name`` (``auto`` resolved for ``lm``); ``persona`` is the agent's
    identity line (json) or its system message when a conversation has none (hermes)."""
    from .json_format import JsonFormat
    from .template import HermesFormat, TemplateFormat

    cls = {"json": JsonFormat, "hermes": HermesFormat, "plain": TemplateFormat}[choose(name, lm.chat)]
    return cls(lm, memo, persona)


__all__ = ["Call", "DEFAULT_HERMES_SYSTEM", "DEFAULT_PERSONA", "Format", "GET_TOOL_INFO",
           "MessageError", "NAMES", "Reply", "ReplyMemo", "Scanner", "StreamFilter",
           "arguments_of", "choose", "compact", "get_tool_info_tool", "make_format",
           "system_prompt", "text_of", "tool_index", "tool_info", "unspaced"]
__getattr__, __dir__ = exports(__name__, {
    **dict.fromkeys(["GET_TOOL_INFO", "get_tool_info_tool", "tool_index", "tool_info"], ".deferred"),
    **dict.fromkeys(["DEFAULT_PERSONA", "JsonFormat", "system_prompt"], ".json_format"),
    **dict.fromkeys(["Call", "MessageError", "Reply", "ReplyMemo", "Scanner", "StreamFilter",
                     "arguments_of", "compact", "text_of", "unspaced"],
                    ".messages"),
    **dict.fromkeys(["DEFAULT_HERMES_SYSTEM", "HermesFormat", "TemplateFormat"], ".template")})

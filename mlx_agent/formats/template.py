"""Formats rendered by the model's own chat template: ``plain`` (no tools) and ``hermes``.

The template renders text; :func:`TemplateFormat.splice` turns it into ids so that message
content is always text (special tokens written in it stay text, never control tokens) and
assistant replies the model wrote are the exact ids it sampled (from the memo). The spans the
template wrote around the content are encoded with special tokens matched.
"""

from __future__ import annotations

import re
from typing import Sequence

from ..grammar import written_json
from ..tokenizer import special_tokens
from ..tools import Tool
from .messages import (Call, MessageError, Reply, ReplyMemo, arguments_of, common_prefix_of,
                       text_of)
from .scanner import OPEN, NeverScanner, RunawayListScanner, ToolCallScanner
from .streams import HermesTextStream, Passthrough
from .tool_calls import tool_call_blocks
from .deferred import get_tool_info_tool, tool_index

_MARK = "\ue000{}\ue001"  # private-use characters: where a message's content goes
_MARKS = re.compile("\ue000([0-9]+)\ue001")
DEFAULT_HERMES_SYSTEM = (
    "You are a helpful agent. Use the tools when they help; when the task is done, reply"
    " with a short final answer and no tool call."
)


class TemplateFormat:
    name = "plain"
    markers: tuple[str, ...] = ()

    def __init__(self, lm, memo: ReplyMemo | None = None, persona: str | None = None):
        self.lm = lm
        self.memo = memo if memo is not None else ReplyMemo()
        self.persona = persona  # the system message when the conversation has none
        self._specials = tuple(special_tokens(lm.tokenizer))

    # -- rendering ---------------------------------------------------------------------

    def _messages(self, messages: Sequence[dict], tools: Sequence[Tool],
                  deferred: bool) -> tuple[list[dict], list[dict]]:
        """The messages and tools the template sees."""
        out = []
        for m in messages:
            m = {**m, "content": text_of(m.get("content"))}
            if m.get("tool_calls"):  # templates want arguments as objects
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": arguments_of(c)}}
                                   for c in m["tool_calls"]]
            out.append(m)
        if self.persona and not any(m["role"] == "system" for m in out):
            out.insert(0, {"role": "system", "content": self.persona})
        return out, [t.openai() for t in tools]

    def prompt_ids(self, messages: Sequence[dict], tools: Sequence[Tool] = (),
                   deferred: bool = False) -> list[int]:
        msgs, shown = self._messages(messages, tools, deferred)
        return self.splice(msgs, shown)

    def _render(self, messages: list[dict], tools: list[dict]) -> str:
        return self.lm.chat.render(messages, tools=tools or None, add_generation_prompt=True)

    def splice(self, messages: list[dict], tools: list[dict]) -> list[int]:
        """Ids of the rendered conversation: each message's content as text (or as the ids
        sampled for it), the template's own spans with special tokens matched.

        The template renders twice, once with a marker in place of each content; where the
        two agree, the markers say exactly where each content sits. A template that rewrites
        content gets its text tokenized whole, unless a content holds control-token text.
        The tools are in the template's spans, so one whose text holds a control token's is
        refused (an MCP server's description forged a turn)."""
        self._check_tools(tools)
        text = self._render(messages, tools)
        marked = [{**m, "content": _MARK.format(i)} if m["content"] else m
                  for i, m in enumerate(messages)]
        parts = _MARKS.split(self._render(marked, tools))
        contents = [messages[int(i)]["content"] for i in parts[1::2]]
        if "".join(p if k % 2 == 0 else contents[k // 2] for k, p in enumerate(parts)) != text:
            if any(s in m["content"] for m in messages for s in self._specials):
                raise MessageError("the chat template rewrote a message that contains "
                                   "control-token text; remove it from the message")
            return self.lm.prompt_ids(text)
        ids: list[int] = []
        for k, part in enumerate(parts):
            if k % 2 == 0:
                ids += self.lm.encode(part) if part else []
                continue
            m = messages[int(part)]
            sampled = self.memo.get(m["content"]) if m["role"] == "assistant" else None
            ids += sampled if sampled is not None else self.lm.encode_text(m["content"])
        if self.lm.bos_id is not None and ids[:1] != [self.lm.bos_id]:
            ids.insert(0, self.lm.bos_id)
        return ids

    def _check_tools(self, tools: list[dict]) -> None:
        for tool in tools:
            texts, todo = [], [tool]
            while todo:  # every string, keys too: a property's name is written as well
                node = todo.pop()
                if isinstance(node, dict):
                    todo += [*node, *node.values()]
                elif isinstance(node, list):
                    todo += node
                elif isinstance(node, str):
                    texts.append(node)
            joined = "\0".join(texts)  # one search per special token, not one per string
            special = next((s for s in self._specials if s in joined), None)
            if special:
                name = (tool.get("function") or {}).get("name")
                raise MessageError(f"tool {name!r} holds the control token {special!r} in its "
                                   "description or schema, which the chat template would "
                                   "write as that token (a turn of its own); remove it")

    def system_prefix(self, tools: Sequence[Tool] = (), deferred: bool = False) -> list[int]:
        """The ids every conversation over ``tools`` starts with (what a prompt cache keeps):
        the common prefix of two that differ only in their first user message."""
        a, b = (self.prompt_ids([{"role": "user", "content": c}], tools, deferred)
                for c in ("a", "b"))
        return common_prefix_of(a, b)

    def system_text(self, tools: Sequence[Tool] = (), deferred: bool = False) -> str:
        msgs, _ = self._messages([], tools, deferred)
        return msgs[0]["content"] if msgs else ""

    # -- replies -----------------------------------------------------------------------

    @staticmethod
    def reply_text(message: dict) -> str:
        """What an assistant message renders to (the memo's key): its content."""
        content = message.get("content")
        return content if isinstance(content, str) else ""

    def reply_message(self, reply: Reply, text: str, ids: list[int]) -> dict:
        """The assistant message that keeps a reply in a conversation: the text as the
        model wrote it (calls included: templates need not render ``tool_calls``). The ids
        it was sampled as are remembered when they decode to exactly that text."""
        if text and self.lm.decode(ids) == text:
            self.memo.put(text, ids)
        return {"role": "assistant", "content": text}

    def parse(self, text: str) -> Reply:
        return Reply(content=text)

    def scanner(self, parallel: bool = True):
        return NeverScanner()

    def stream_filter(self):
        return Passthrough()


class HermesFormat(TemplateFormat):
    """Tools through the template's ``tools=``; calls are ``<tool_call>{"name",
    "arguments"}</tool_call>`` blocks, several a turn, run in order."""

    name = "hermes"
    markers = ("<tool_call>", "</tool_call>")

    def _messages(self, messages, tools, deferred):
        out, shown = super()._messages(messages, tools, deferred)
        if deferred:
            index = ("Tools (call get_tool_info with a tool's name to learn its arguments "
                     f"before calling it):\n{tool_index(tools)}")
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{index}"}
            else:
                out.insert(0, {"role": "system", "content": f"{DEFAULT_HERMES_SYSTEM}\n\n{index}"})
            shown = [get_tool_info_tool(tools).openai()]
        return out, shown

    @staticmethod
    def reply_text(message: dict) -> str:
        """An assistant message as the model writes it: its content, or its calls as
        ``<tool_call>`` blocks (compact JSON, as the grammar writes it: :func:`written_json`)."""
        content = message.get("content")
        if isinstance(content, str) and content or not message.get("tool_calls"):
            return content if isinstance(content, str) else ""
        return "\n".join("<tool_call>\n" + written_json({"name": c["function"]["name"],
                                                          "arguments": arguments_of(c)},
                                                         "hermes")
                         + "\n</tool_call>" for c in message["tool_calls"])

    def parse(self, text: str) -> Reply:
        """Calls when the text holds ``<tool_call>`` blocks (a block that cannot be read is
        a Call with ``error`` set, and the reply is not complete); otherwise the answer."""
        calls: list[Call] = tool_call_blocks(text)
        if calls:
            return Reply(calls=calls, complete=all(c.error is None for c in calls))
        return Reply(content=text.strip(), complete="<tool_call>" not in text)

    def scanner(self, parallel: bool = True):
        return RunawayListScanner(ToolCallScanner(), start=OPEN)

    def stream_filter(self):
        return HermesTextStream()

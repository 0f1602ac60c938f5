"""Chat requests to prompt ids, and replies back to content and tool calls: one format per
request, stateless apart from a memo of the ids the model sampled.

- ``plain``: no tools; the model's own chat template.
- ``json``: the json protocol (see :mod:`mlx_agent.agent.protocols`). The system turn holds
  the tools block first and the client's system text after it, so every client shares the
  tools block's KV state. A reply is ``{"answer": ...}`` or one ``{"tool", "arguments"}``
  object per call, a line each. Assistant messages a client sends back are rendered the
  same way; when they are replies this server wrote, the exact sampled ids are reused (the
  :class:`ReplyMemo`), so the cached prefix runs through them.
- ``hermes``: the model's chat template with ``tools=``; calls are ``<tool_call>`` blocks.

Deferred mode (``deferred=True``) shows a one-line index of the tools and a
``get_tool_info(name)`` tool instead of the tools' schemas; the grammar still knows every
schema. Nothing here runs a model or answers ``get_tool_info`` (see :mod:`.service`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..agent.protocols import Call, DEFAULT_HERMES_SYSTEM, json_system_prompt, tool_call_blocks
from ..tools import Tool

GET_TOOL_INFO = "get_tool_info"


class RequestError(ValueError):
    """A request this server cannot render (the message says what to change)."""


@dataclass
class Reply:
    content: str | None = None
    calls: list[Call] = field(default_factory=list)
    complete: bool = True  # False: not the protocol's shape (cut off, or no grammar)


def compact(obj: Any) -> str:
    """JSON the way the grammar writes it: no spaces, non-ASCII kept."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"content part of type {part.get('type')!r} is not supported; "
                               "send text parts ({\"type\": \"text\", \"text\": \"...\"})")
        parts.append(part["text"])
    return "".join(parts)


def arguments_of(call: dict) -> dict:
    """A tool call's arguments as a dict (OpenAI sends them as a JSON string)."""
    args = call["function"].get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise RequestError(f"tool call {call['function'].get('name')!r} has arguments "
                               "that are not valid JSON") from None
    if not isinstance(args, dict):
        raise RequestError("tool call arguments must be a JSON object")
    return args


def get_tool_info_tool(tools: Sequence[Tool]) -> Tool:
    return Tool(name=GET_TOOL_INFO,
                description="Get the full description and argument schema of one tool. "
                            "Call it before calling a tool whose arguments you do not know.",
                parameters={"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "enum": [t.name for t in tools]}}})


def tool_index(tools: Sequence[Tool]) -> str:
    """One line per tool: its name and the first line of its description."""
    lines = []
    for t in tools:
        first = (t.description.strip().splitlines() or [""])[0]
        lines.append(f"- {t.name}: {first}".rstrip(": "))
    return "\n".join(lines)


def tool_info(tools: Sequence[Tool], name: Any) -> str:
    """``get_tool_info``'s answer: the tool's schema, or an error the model can act on."""
    for t in tools:
        if t.name == name:
            return compact({"name": t.name, "description": t.description,
                            "parameters": t.parameters})
    known = ", ".join(t.name for t in tools)
    return compact({"error": f"unknown tool {name!r}; tools: {known}"})


class ReplyMemo:
    """The ids sampled for recent replies, keyed by their canonical text (bounded LRU)."""

    def __init__(self, size: int = 256):
        self.size = size
        self._ids: OrderedDict[str, list[int]] = OrderedDict()

    def put(self, text: str, ids: list[int]) -> None:
        self._ids[text] = list(ids)
        self._ids.move_to_end(text)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def get(self, text: str) -> list[int] | None:
        ids = self._ids.get(text)
        if ids is not None:
            self._ids.move_to_end(text)
        return ids


def splice_ids(lm, text: str, messages: list[dict], memo: "ReplyMemo") -> list[int]:
    """``lm.prompt_ids(text)``, except that the assistant replies this server wrote are the
    ids it sampled for them (found in the rendered text in order; a template that changes
    a reply's text just gets it tokenized)."""
    ids: list[int] = []
    pos = 0
    for m in messages:
        content = m.get("content")
        if m["role"] != "assistant" or not isinstance(content, str) or not content:
            continue
        sampled = memo.get(content)
        at = text.find(content, pos) if sampled is not None else -1
        if at < 0:
            continue
        ids += lm.encode(text[pos:at]) + sampled
        pos = at + len(content)
    ids += lm.encode(text[pos:])
    if lm.bos_id is not None and ids[:1] != [lm.bos_id]:
        ids.insert(0, lm.bos_id)
    return ids


class PlainFormat:
    """No tools: the chat template as the model ships it."""

    name = "plain"

    def __init__(self, lm, memo: "ReplyMemo | None" = None):
        self.lm = lm
        self.memo = memo or ReplyMemo()

    def prompt_ids(self, messages: list[dict], tools: Sequence[Tool], deferred: bool) -> list[int]:
        msgs = [{**m, "content": text_of(m.get("content"))} for m in messages]
        return splice_ids(self.lm, self.lm.chat.render(msgs, add_generation_prompt=True),
                          msgs, self.memo)

    def parse(self, text: str) -> Reply:
        return Reply(content=text)

    @staticmethod
    def repeats(text: str) -> bool:
        return False

    def stream_filter(self) -> "Passthrough":
        return Passthrough()


class JsonFormat:
    name = "json"

    def __init__(self, lm, memo: ReplyMemo | None = None):
        self.lm = lm
        self.memo = memo or ReplyMemo()

    def tools_block(self, tools: Sequence[Tool], deferred: bool) -> str:
        if not deferred:
            return json_system_prompt(list(tools))
        header = ("You have access to these tools; call get_tool_info with a tool's name to "
                  f"learn its arguments before calling it:\n{tool_index(tools)}")
        return json_system_prompt([get_tool_info_tool(tools)], header=header)

    def system_prefix(self, tools: Sequence[Tool], deferred: bool) -> list[int]:
        """The ids every request over ``tools`` starts with (what a prompt cache keeps)."""
        return self.lm.prompt_ids(f"<|im_start|>system\n{self.tools_block(tools, deferred)}")

    @staticmethod
    def reply_text(message: dict) -> str:
        """An assistant message as the model would have written it."""
        calls = message.get("tool_calls") or []
        if calls:
            return "\n".join(compact({"tool": c["function"]["name"], "arguments": arguments_of(c)})
                             for c in calls)
        return compact({"answer": text_of(message.get("content"))})

    def prompt_ids(self, messages: list[dict], tools: Sequence[Tool], deferred: bool) -> list[int]:
        enc = self.lm.encode
        system = [text_of(m.get("content")) for m in messages if m["role"] in ("system", "developer")]
        ids = self.system_prefix(tools, deferred)
        tail = "".join("\n\n" + s for s in system if s)
        ids += enc(f"{tail}<|im_end|>\n")
        for m in messages:
            role = m["role"]
            if role == "user":
                ids += enc(f"<|im_start|>user\n{text_of(m.get('content'))}<|im_end|>\n")
            elif role == "tool":
                ids += enc(f"<|im_start|>tool\n{text_of(m.get('content'))}<|im_end|>\n")
            elif role == "assistant":
                body = self.reply_text(m)
                sampled = self.memo.get(body)
                ids += enc("<|im_start|>assistant\n")
                ids += sampled if sampled is not None else enc(body)
                ids += enc("<|im_end|>\n")
        return ids + enc("<|im_start|>assistant\n")

    @staticmethod
    def repeats(text: str) -> bool:
        """The last finished line repeats an earlier one (a small model looping on a call)."""
        lines = text.split("\n")
        return len(lines) > 2 and lines[-2] in lines[:-2]

    def parse(self, text: str) -> Reply:
        objs, pos, decoder = [], 0, json.JSONDecoder()
        text = text.strip()
        while pos < len(text):
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                if not objs:
                    return Reply(content=text, complete=False)  # cut off, or no grammar
                break  # calls, then one cut off by the token limit: keep the whole ones
            objs.append(obj)
            pos = end
            while pos < len(text) and text[pos].isspace():
                pos += 1
        calls, seen = [], set()
        for o in objs:
            if isinstance(o, dict) and isinstance(o.get("tool"), str):
                key = compact(o)
                if key not in seen:  # a call repeated in one reply is one call
                    seen.add(key)
                    calls.append(Call(o["tool"], o.get("arguments") or {}))
        if calls:
            return Reply(calls=calls)
        if len(objs) == 1 and isinstance(objs[0], dict) and "answer" in objs[0]:
            answer = objs[0]["answer"]
            return Reply(content=answer if isinstance(answer, str) else compact(answer))
        return Reply(content=text, complete=False)

    def stream_filter(self) -> "JsonAnswerStream":
        return JsonAnswerStream()


class HermesFormat:
    name = "hermes"

    def __init__(self, lm, memo: "ReplyMemo | None" = None):
        self.lm = lm
        self.memo = memo or ReplyMemo()

    def _messages(self, messages: list[dict], tools: Sequence[Tool], deferred: bool):
        out = []
        for m in messages:
            m = {**m, "content": text_of(m.get("content"))}
            if m.get("tool_calls"):  # templates want arguments as objects
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": arguments_of(c)}}
                                   for c in m["tool_calls"]]
            out.append(m)
        if deferred:
            index = ("Tools (call get_tool_info with a tool's name to learn its arguments "
                     f"before calling it):\n{tool_index(tools)}")
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{index}"}
            else:
                out.insert(0, {"role": "system", "content": f"{DEFAULT_HERMES_SYSTEM}\n\n{index}"})
            shown = [get_tool_info_tool(tools)]
        else:
            shown = list(tools)
        return out, [t.openai() for t in shown]

    def prompt_ids(self, messages: list[dict], tools: Sequence[Tool], deferred: bool) -> list[int]:
        msgs, shown = self._messages(messages, tools, deferred)
        text = self.lm.chat.render(msgs, tools=shown or None, add_generation_prompt=True)
        return splice_ids(self.lm, text, msgs, self.memo)

    def system_prefix(self, tools: Sequence[Tool], deferred: bool) -> list[int]:
        a, b = (self.prompt_ids([{"role": "user", "content": c}], tools, deferred)
                for c in ("a", "b"))
        return a[: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))]

    @staticmethod
    def repeats(text: str) -> bool:
        return False

    def parse(self, text: str) -> Reply:
        calls = [c for c in tool_call_blocks(text)
                 if c.error is None and isinstance(c.arguments, dict)]
        if calls:
            return Reply(calls=calls)
        return Reply(content=text.strip(), complete="<tool_call>" not in text)

    def stream_filter(self) -> "HermesTextStream":
        return HermesTextStream()


def make_format(name: str, lm, memo: ReplyMemo | None = None):
    return {"json": JsonFormat, "hermes": HermesFormat, "plain": PlainFormat}[name](lm, memo)


# -- what a stream shows as content while a reply is being generated ------------------------


class Passthrough:
    def feed(self, delta: str) -> str:
        return delta


class HermesTextStream:
    """Free text streams as it comes; a reply that opens with ``<`` is calls (the grammar
    allows no ``<`` in text) and shows nothing."""

    def __init__(self):
        self.calls: bool | None = None

    def feed(self, delta: str) -> str:
        if self.calls is None:
            stripped = delta.lstrip()
            if not stripped:
                return ""
            self.calls = stripped.startswith("<")
            delta = stripped
        return "" if self.calls else delta


class JsonAnswerStream:
    """The decoded text of ``{"answer":"..."}`` as it is generated, escapes included;
    nothing for a call."""

    PREFIX = '{"answer":"'

    def __init__(self):
        self.buf = ""
        self.pos: int | None = None  # where undecoded string text starts; -1: not an answer
        self.closed = False

    def feed(self, delta: str) -> str:
        self.buf += delta
        if self.pos is None:
            head = self.buf.lstrip()
            if len(head) < len(self.PREFIX):
                if not self.PREFIX.startswith(head):
                    self.pos = -1
                return ""
            self.pos = len(self.buf) - len(head) + len(self.PREFIX) \
                if head.startswith(self.PREFIX) else -1
        if self.pos < 0 or self.closed:
            return ""
        out, i, buf = [], self.pos, self.buf
        while i < len(buf):
            c = buf[i]
            if c == '"':
                self.closed = True
                break
            if c != "\\":
                out.append(c)
                i += 1
                continue
            if i + 1 >= len(buf):
                break
            width = 2
            if buf[i + 1] == "u":
                if i + 6 > len(buf):
                    break
                width = 6
                if 0xD800 <= int(buf[i + 2:i + 6], 16) <= 0xDBFF:  # may start a pair
                    if i + 8 > len(buf):
                        break
                    width = 12 if buf[i + 6:i + 8] == "\\u" else 6
            if i + width > len(buf):
                break
            char = json.loads(f'"{buf[i:i + width]}"')
            out.append(char.encode("utf-8", "replace").decode("utf-8"))  # no lone surrogates
            i += width
        self.pos = i
        return "".join(out)

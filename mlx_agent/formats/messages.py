"""What every wire format shares: parsed replies, OpenAI-shaped messages, the sampled-id memo.

A conversation is a list of OpenAI-shaped message dicts (``role``, ``content``, and for
assistant turns optionally ``tool_calls``); the agent keeps its own conversation this way and
the server gets one per request. A parsed reply is a :class:`Reply`: calls, or an answer;
a call's string values lose the one leading space a model copies from the prompt's tokens
(:func:`unspaced`; :func:`mlx_agent.loop_guard.refused_texts` refuses a repeated call in
both forms).

:class:`ReplyMemo` keeps the ids the model sampled for a reply, keyed by the text that reply
renders to, so a conversation rendered again puts back exactly the ids in the KV cache
instead of a re-tokenization (which may split text differently).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import UserFacingError


class MessageError(UserFacingError):
    """A message that cannot be rendered (the text says what to change)."""


def unspaced(value: Any) -> Any:
    """``value`` (a call's arguments) with one leading space taken off each string that
    starts with a space and then a character that is not one.

    A prompt holds " Perth" as one token, space included; a value in a call starts right
    after its quote, where "Perth" is another token, and a small model copying the prompt
    writes the token it saw. On the held-out synthetic tasks, taking that space off turned
    2 of 100 runs from a wrong call into a right one and none the other way (README). A
    string that starts with two spaces, or is one space, is left as written."""
    if isinstance(value, str):
        return value[1:] if value[:1] == " " and value[1:2].strip() else value
    if isinstance(value, dict):
        return {k: unspaced(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unspaced(v) for v in value]
    return value


@dataclass
class Call:
    name: str
    arguments: Any
    error: str | None = None  # set when the call could not be read at all


@dataclass
class Reply:
    """A parsed assistant reply: ``calls``, or ``content`` (the answer).

    ``complete`` is False when the text is not the format's shape (cut off, written without
    the grammar, or holding a call that cannot be read): ``content`` is then the raw text.
    """

    calls: list[Call] = field(default_factory=list)
    content: str | None = None
    complete: bool = True

    def message(self) -> dict:
        """The assistant message a client (or the agent's conversation) keeps for it: an
        incomplete reply keeps its text, not calls that could not be read (or rendered)."""
        calls = self.calls if self.complete else []
        return {"role": "assistant", "content": self.content, "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls] or None}


class Scanner(Protocol):
    """Watches a reply's text as it is generated and says when the turn is over."""

    text: str
    looped: bool  # it ended the turn on a loop (a list that repeats itself): a cut, not an end

    def feed(self, segment: str) -> bool:
        """Add decoded text; True once the turn should end here."""

    @property
    def turn_text(self) -> str:
        """The text the turn keeps (it may end before the last segment)."""

    @property
    def finished(self) -> bool:
        """The reply reached the format's end by itself (not the token limit)."""


class StreamFilter(Protocol):
    """What a stream shows of a reply while it is generated (answers, not protocol)."""

    def feed(self, delta: str) -> str: ...


def compact(obj: Any) -> str:
    """Compact JSON, non-ASCII kept (hermes calls as its grammar writes them; keys)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts (an
    earlier reply's ``refusal`` parts, which OpenAI's clients send back, read as text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type")
        if kind not in ("text", "refusal"):
            raise MessageError(f"content part of type {kind!r} is not supported; "
                               "send text parts ({\"type\": \"text\", \"text\": \"...\"})")
        if not isinstance(part.get(kind), str):
            raise MessageError(f"a {kind} content part's \"{kind}\" must be a string")
        parts.append(part[kind])
    return "".join(parts)


def arguments_of(call: dict) -> dict:
    """A tool call's arguments as a dict (OpenAI sends them as a JSON string)."""
    args = call["function"].get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):  # ValueError: also a number past 4,300 digits
            raise MessageError(f"tool call {call['function'].get('name')!r} has arguments "
                               "that are not valid JSON") from None
    if not isinstance(args, dict):
        raise MessageError("tool call arguments must be a JSON object")
    try:  # a \ud800 escape parses to a lone surrogate, which no tokenizer takes
        json.dumps(args, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise MessageError(f"tool call {call['function'].get('name')!r} has arguments that "
                           "hold a lone surrogate (an unpaired \\ud800-\\udfff escape), "
                           "which is not text") from None
    return args


def valid_json_text(obj: Any) -> Any:
    """``obj`` (parsed JSON) with every lone surrogate (a ``\\ud800`` escape the model wrote
    without the grammar) replaced by U+FFFD, so it can be encoded, shown and run."""
    if isinstance(obj, str):
        return obj.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(obj, list):
        return [valid_json_text(v) for v in obj]
    if isinstance(obj, dict):
        return {valid_json_text(k): valid_json_text(v) for k, v in obj.items()}
    return obj


def common_prefix_of(a: list[int], b: list[int]) -> list[int]:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:n]


class ReplyMemo:
    """The ids sampled for recent replies, keyed by the text they render to (bounded LRU;
    ``size=None``: unbounded, for one agent conversation). Safe to share between the thread
    that renders requests and the one that generates."""

    def __init__(self, size: int | None = 256):
        self.size = size
        self._ids: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, text: str, ids: list[int]) -> None:
        if not text:
            return
        with self._lock:
            self._ids[text] = list(ids)
            self._ids.move_to_end(text)
            while self.size is not None and len(self._ids) > self.size:
                self._ids.popitem(last=False)

    def get(self, text: str) -> list[int] | None:
        with self._lock:
            ids = self._ids.get(text)
            if ids is not None:
                self._ids.move_to_end(text)
            return ids

    def items(self) -> list[tuple[str, list[int]]]:
        with self._lock:
            return [(k, list(v)) for k, v in self._ids.items()]

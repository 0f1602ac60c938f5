"""Agent events: one msgspec definition for ``--json-out`` lines and ``--transcript`` files.

Every event is a JSON object with a ``type`` tag. ``--json-out`` prints all of them but
``tool_result``; the transcript also records ``tool_result``, the exact text the model read.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class Event(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    pass


class User(Event, tag="user"):
    text: str


class Assistant(Event, tag="assistant"):
    step: int
    raw: str


class ToolCall(Event, tag="tool_call"):
    tool: str
    arguments: Any
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_sec: float


class ToolResult(Event, tag="tool_result"):
    tool: str
    content: str


class Answer(Event, tag="answer"):
    text: str
    fallback: bool = False


class Cache(Event, tag="cache", omit_defaults=True):
    """The system prompt's KV state: loaded from disk (hit) or prefilled and saved (miss)."""

    hit: bool
    tokens: int
    bytes: int
    key: str
    load_ms: float | None = None
    prefill_ms: float | None = None


class Counts(msgspec.Struct):
    """What a user turn cost, counted; mutable, so the agent loop adds to it as it runs."""

    turns: int = 0
    calls: int = 0
    valid_calls: int = 0
    tool_errors: int = 0
    generated_tokens: int = 0
    rendered_tokens: int = 0
    prefilled_tokens: int = 0
    reused_tokens: int = 0
    guarded_steps: int = 0  # steps in which the loop guard masked a repeat's tokens
    retried_steps: int = 0  # steps made to call again after a call failed (retry_after_error)
    named_steps: int = 0  # first steps made to call the tool the request named (named_tool)
    mentioned_steps: int = 0  # first steps made a call: the request wrote a tool's name
    # and the model would have answered
    stated_calls: int = 0  # calls the request's stated and copied values changed
    unfounded_calls: int = 0  # calls on a value no one gave, made questions
    stated_answers: int = 0  # answers that stated nothing of a short result, made to state it


class Stats(Counts, Event, tag="stats", frozen=True, kw_only=True):
    seconds: float = 0.0
    stop: str = "answer"  # answer | steps | context | interrupted | grammar


AnyEvent = Union[User, Assistant, ToolCall, ToolResult, Answer, Cache, Stats]
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(line: bytes | str) -> Event:
    return _decoder.decode(line)

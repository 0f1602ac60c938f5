"""The chat service behind the server: one model, one engine, requests one at a time.

:meth:`ChatService.prepare` checks a :class:`ChatCall` and renders it with the request's wire
format (:mod:`mlx_agent.formats`, the same code the agent loop renders with);
:meth:`ChatService.chat` generates through the one text layer (:mod:`mlx_agent.text`),
constrained by the tools' grammar when there are tools (``tool_choice`` and
``parallel_tool_calls`` included), and parses the reply into content or tool calls. In
deferred mode it answers the model's ``get_tool_info`` calls itself and generates again, at
most :data:`MAX_HOPS` times; after the last hop the grammar no longer offers
``get_tool_info``, so the client only ever sees real calls. A reply holding a tool call that
cannot be read is not returned as calls: the client gets what the stream showed.

The loop guard (:mod:`mlx_agent.loop_guard`) applies to the calls already in the request's
current turn (after its last user message) that have results: the grammar no longer offers
them, unless the server runs with ``allow_repeat_calls``.

Prompt reuse: the engine keeps the last conversation and :class:`KVSlots` earlier ones; each
request continues from whichever shares the longest token prefix with its prompt.
``usage.cached_tokens`` counts the prompt tokens that were not prefilled.

Concurrency: the service decodes on its lanes (:mod:`.slots`): one engine, so requests are
served one at a time, or the batched engines of one :class:`~mlx_agent.batch_runner.BatchRunner`
(``serve --max-batch N``), so up to N requests decode together, each joining the running
batch after its own prefill, with its own prefix reuse, grammar, stop strings, streaming and
cancellation. Methods here block (MLX work); the HTTP layer calls them from as many worker
threads as there are lanes. Not promised: fairness between a long prefill and the requests
decoding while it runs (the batch waits for it).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..engine import Constraint, Engine, PrefillStopped, SamplingParams
from ..formats import (GET_TOOL_INFO, Call, Format, MessageError, Reply, ReplyMemo,
                       StreamFilter, arguments_of, choose, compact, get_tool_info_tool,
                       make_format, text_of, tool_info)
from ..formats.scanner import NeverScanner
from ..formats.streams import Passthrough
from ..grammar import GrammarError, ll_tokenizer, schema_constraint, tool_constraint
from ..loop_guard import LoopGuard, call_bytes, refused_texts, token_bytes
from ..probe import would_call
from ..stated_arguments import complete_reply, pressed_tools
from ..text import TextStream
from ..tools import Tool
from .slots import Lanes
from .stops import StopStrings

MAX_HOPS = 3
OnText = Callable[[str], None]
Cancelled = Callable[[], bool]


class RequestError(MessageError):
    """A request this server cannot serve (the message says what to change)."""


@dataclass
class ChatCall:
    """One chat request, API-neutral: OpenAI-shaped message dicts and parsed tools."""

    messages: list[dict]
    tools: list[Tool] | None = None  # None: the server's catalogue
    tool_choice: str = "auto"  # auto, none, required or a tool's name
    parallel: bool = True
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    json_schema: dict | None = None  # response_format: the reply is JSON of this schema
    schema_field: str = "response_format"  # the request field it came from, for errors


@dataclass
class PreparedChat:
    """A chat request checked and rendered: its tools, format, first prompt and grammar.
    One request's state (the grammar's matcher advances as it decodes): answer it once."""

    call: ChatCall
    tools: list[Tool]
    fmt: Format
    deferred: bool
    prompt: list[int]
    constraint: Constraint | None
    max_tokens: int
    # tool choice auto, and the request writes a tool's name: the tools a call may be pressed
    pressed: list[Tool] = field(default_factory=list)  # to (ChatService._chat)


@dataclass
class PreparedCompletion:
    """A text completion checked and tokenized."""

    prompt: list[int]
    constraint: Constraint | None
    continuation: bool  # raw text continued (its first space kept), not a chat reply


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class ToolCallOut:
    id: str
    name: str
    arguments: dict


@dataclass
class ChatResult:
    content: str | None
    tool_calls: list[ToolCallOut]
    finish_reason: str  # stop, length, tool_calls, cancelled
    usage: Usage
    hops: int = 0
    seconds: float = 0.0
    guarded_steps: int = 0  # generations in which the loop guard masked a repeat's tokens


@dataclass
class Generated:
    """One generation: all text decoded, what the client was shown, the ids sampled."""

    text: str
    shown: StopStrings
    ids: list[int]  # the stop id included
    finish: str  # stop, length, cancelled
    cached: int  # prompt tokens reused from the cache
    guarded_steps: bool = False
    pressed: bool = False  # made a call: the request wrote a tool's name (ChatService._chat)


class ChatService:
    def __init__(self, lm, *, tools: Sequence[Tool] = (), tool_mode: str = "full",
                 protocol: str = "auto", kv_slots: int = 4, default_max_tokens: int = 512,
                 metrics_out: str | Path | None = None, model_name: str | None = None,
                 sampler_for: Callable[[SamplingParams], Callable] | None = None,
                 context_length: int | None = None, allow_repeat_calls: bool = False,
                 stated_arguments: bool = True,
                 engines: Sequence[Engine] = ()):
        if tool_mode not in ("full", "deferred"):
            raise ValueError(f"unknown tool mode {tool_mode!r}; use full or deferred")
        self.lm = lm
        self.tools = list(tools)
        self.tool_mode = tool_mode
        self.allow_repeat_calls = allow_repeat_calls
        self.stated_arguments = stated_arguments
        self.protocol = choose(protocol, lm.chat)
        self.lanes = Lanes(list(engines) or [lm.engine(context_length=context_length)
                                             if context_length else lm.engine()], kv_slots)
        memo = ReplyMemo()  # one memo: a reply sent back in any format renders as sampled
        self.formats = {name: make_format(name, lm, memo) for name in (self.protocol, "plain")}
        self.default_max_tokens = default_max_tokens
        self.metrics_out = Path(metrics_out) if metrics_out else None
        self._metrics_failed = False  # said once on stderr, then quiet
        self.model_name = model_name or lm.identity.name
        self.sampler_for = sampler_for or (lambda s: s.sampler())
        self.created = int(time.time())
        # no token is longer than this many characters: longer text cannot fit the context
        self.max_chars = self.context_length * max(map(len, lm.tokenizer.get_vocab()), default=1)
        self.cancelled = 0  # generations stopped because their client left
        self.last_cancelled_tokens = 0
        self._count = threading.Lock()

    @property
    def context_length(self) -> int:
        return self.lanes.engines[0].context_length

    def prime(self, prompt_cache):
        """Load the catalogue's tools block from ``prompt_cache`` (or prefill and save it)
        into every lane's engine; returns the first lane's outcome."""
        ids = self.formats[self.protocol].system_prefix(self.tools, self.tool_mode == "deferred")
        hits = [e.call(lambda e=e: prompt_cache.prime(e, self.lm.identity, ids))
                for e in self.lanes.engines]  # on the thread of each engine's MLX work
        return hits[0]

    # -- chat ------------------------------------------------------------------------------

    def prepare(self, call: ChatCall) -> PreparedChat:
        """Check ``call`` and build its first prompt and constraint; raises a
        UserFacingError for what the client must change. Uses no model state, so the HTTP
        layer can answer 400 before a stream starts."""
        # the server's --tools catalogue serves requests that bring no tools of their own,
        # except one asking for JSON of a schema: that is what it wants instead
        default = self.tools if call.json_schema is None else []
        tools = default if call.tools is None else call.tools
        deferred = bool(tools) and self.tool_mode == "deferred"
        self._check_size(_rendered_chars(call.messages, tools, deferred), "messages")
        if call.tool_choice not in ("auto", "none") and not tools:
            raise RequestError(f"tool_choice {call.tool_choice!r} needs tools",
                               param="tool_choice")
        if call.json_schema is not None and tools:
            raise RequestError(f"{call.schema_field} with tools is not supported; send one "
                               "or the other", param=call.schema_field)
        if deferred and any(t.name == GET_TOOL_INFO for t in tools):
            raise RequestError(f"a tool named {GET_TOOL_INFO!r} clashes with the server's "
                               "deferred-mode tool; rename it", param="tools")
        fmt = self.formats[self.protocol if tools else "plain"]
        prep = PreparedChat(call, list(tools), fmt, deferred, [], None,
                            call.max_tokens or self.default_max_tokens)
        prep.prompt = self._prompt(prep, call.messages)
        if self.stated_arguments and call.tool_choice == "auto" and not deferred:
            prep.pressed = pressed_tools(prep.tools, call.messages)  # a call where it would
            # answer
        try:
            prep.constraint = self._constraint(prep, 0, call.messages)
        except GrammarError as e:  # the tools' grammar, unless it was the schema's
            e.param = e.param or (call.schema_field if call.json_schema is not None else "tools")
            raise
        return prep

    def chat(self, prep: PreparedChat, on_text: OnText | None = None,
             cancelled: Cancelled = lambda: False, streaming: bool = False) -> ChatResult:
        """Answer one prepared request; ``on_text`` receives the content as it is generated.

        In deferred mode each ``get_tool_info`` reply is answered here and generated again
        (a hop); usage reports the last hop's prompt and all hops' completion tokens."""
        with self.lanes.lease(prep.prompt) as lane:
            return self._chat(lane, prep, on_text, cancelled, streaming)

    def _chat(self, lane, prep: PreparedChat, on_text: OnText | None, cancelled: Cancelled,
              streaming: bool) -> ChatResult:
        start = time.perf_counter()
        messages, prompt, constraint = list(prep.call.messages), prep.prompt, prep.constraint
        usage, hops, blocked = Usage(), 0, 0
        while True:
            press = self._constraint(prep, hops, messages, pressed=prep.pressed) \
                if prep.pressed and hops == 0 else None
            gen = self._generate(lane, prep.call, prompt, prep.max_tokens, constraint, on_text,
                                 cancelled, prep.fmt, press=press)
            usage.prompt_tokens, usage.cached_tokens = len(prompt), gen.cached
            usage.completion_tokens += len(gen.ids)
            blocked += gen.guarded_steps
            if gen.finish == "cancelled":
                return self._cancelled(ChatResult(gen.shown.text, [], "cancelled", usage, hops))
            reply = prep.fmt.parse(gen.text)
            text, ids = gen.text, _without_stop(gen.ids, self.lm.end_ids)
            if self.stated_arguments and prep.tools \
                    and (len(reply.calls) == 1 or not reply.complete):  # cut off: a loop?
                reply, text, ids = complete_reply(
                    lane[0], self.lm, prep.fmt.name, prompt, reply, text, ids,
                    gen.ids[len(ids):], prep.tools, messages,
                    made=[written for t, args in _made(messages, prep.tools)
                          for written in refused_texts(prep.fmt.name, t, args)],
                    stop=cancelled, choices=prep.tools if not prep.deferred
                    and prep.call.tool_choice in ("auto", "required") else (),
                    max_tokens=prep.max_tokens, may_answer=prep.call.tool_choice == "auto",
                    pressed=gen.pressed)
                if not reply.calls:  # the call became a question to the user: shown as an
                    shown = gen.shown.feed(reply.content or "") + gen.shown.flush()  # answer is
                    if shown and on_text:
                        on_text(shown)
            prep.fmt.reply_message(reply, text, ids)
            info = [c for c in reply.calls if c.name == GET_TOOL_INFO and c.error is None]
            if len(info) < len(reply.calls) or not info:
                break
            hops += 1
            messages += _info_turns(info, prep.tools)
            prompt = self._prompt(prep, messages)
            constraint = self._constraint(prep, hops, messages)
        result = self._result(reply, gen, usage, hops)
        result.guarded_steps = blocked
        result.seconds = time.perf_counter() - start
        self._metrics(result, streaming)
        return result

    def _result(self, reply: Reply, gen: Generated, usage: Usage, hops: int) -> ChatResult:
        """Real calls, or the answer: clean as parsed; a reply cut short (or cut at a stop
        string, or holding a call that cannot be read) as the stream showed it, never raw
        protocol text."""
        real = [c for c in reply.calls if c.name != GET_TOOL_INFO]
        if real and reply.complete:
            return ChatResult(None, [ToolCallOut(_call_id(), c.name, c.arguments) for c in real],
                              "tool_calls", usage, hops)
        clean = reply.complete and not gen.shown.hit
        content = reply.content if clean else gen.shown.text
        return ChatResult(content, [], "stop" if gen.shown.hit else gen.finish, usage, hops)

    def _check_size(self, chars: int, param: str) -> None:
        """Refuse text that cannot fit the context before tokenizing any of it (a 7.5 MB
        tool description took 12 s to tokenize before its 400, other requests waiting)."""
        if chars > self.max_chars:
            raise RequestError(f"the prompt is {chars} characters, more than the "
                               f"{self.context_length}-token context can hold; send less",
                               param=param)

    def _prompt(self, prep: PreparedChat, messages: list[dict]) -> list[int]:
        prompt = prep.fmt.prompt_ids(messages, prep.tools, prep.deferred)
        if len(prompt) >= self.context_length:
            raise RequestError(f"the prompt is {len(prompt)} tokens; the context holds "
                               f"{self.context_length}", param="messages")
        return prompt

    def _constraint(self, prep: PreparedChat, hops: int, messages: list[dict],
                    pressed: Sequence[Tool] = ()) -> Constraint | None:
        """The reply's grammar: the tools (plus get_tool_info while hops remain) less the
        calls this turn already made, a response_format schema, or none; ``pressed``, one
        call of those tools, whatever the request's tool choice."""
        call = prep.call
        if prep.tools:
            offer_info = prep.deferred and hops < MAX_HOPS and \
                call.tool_choice in ("auto", "required")
            shown = list(pressed) or \
                prep.tools + ([get_tool_info_tool(prep.tools)] if offer_info else [])
            constraint = tool_constraint(self.lm, prep.fmt.name, shown, prep.max_tokens,
                                         "required" if pressed else call.tool_choice,
                                         call.parallel and not pressed, bound_answer=False)
            made = [] if self.allow_repeat_calls else _made(messages, prep.tools)
            if not made:
                return constraint
            ll = ll_tokenizer(self.lm)
            return LoopGuard(constraint, token_bytes(ll, self.lm.vocab_size),
                             [call_bytes(self.lm, ll, text) for t, args in made
                              for text in refused_texts(prep.fmt.name, t, args)], ll)
        if call.json_schema is not None:
            return schema_constraint(self.lm, call.json_schema, call.schema_field)
        return None

    # -- raw completion --------------------------------------------------------------------

    def prepare_completion(self, prompt: str | list[int], *, raw: bool = True,
                           system: str | None = None, json_schema: dict | None = None,
                           schema_field: str = "response_format") -> PreparedCompletion:
        """The prompt ids (``raw`` text or ids, or a one-message chat) and the constraint
        (``json_schema`` from the request's ``schema_field``)."""
        self._check_size(len(prompt) + len(system or ""), "prompt")
        if isinstance(prompt, list):
            ids = list(prompt)
        elif raw:
            ids = self.lm.prompt_ids(prompt)
        else:
            msgs = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": prompt}]
            ids = self.formats["plain"].prompt_ids(msgs)
        if not ids:
            raise RequestError("the prompt is empty; send some text to continue",
                               param="prompt")
        if len(ids) >= self.context_length:
            raise RequestError(f"the prompt is {len(ids)} tokens; the context holds "
                               f"{self.context_length}", param="prompt")
        return PreparedCompletion(ids, schema_constraint(self.lm, json_schema, schema_field)
                                  if json_schema else None, continuation=raw)

    def complete(self, prep: PreparedCompletion, *, max_tokens: int,
                 sampling: SamplingParams, stop: Sequence[str] = (),
                 on_text: OnText | None = None,
                 cancelled: Cancelled = lambda: False) -> ChatResult:
        """Continue prepared prompt ids as text (``/v1/completions``, ``/api/generate``)."""
        start = time.perf_counter()
        call = ChatCall(messages=[], sampling=sampling, stop=list(stop))
        with self.lanes.lease(prep.prompt) as lane:
            gen = self._generate(lane, call, prep.prompt, max_tokens, prep.constraint, on_text,
                                 cancelled, continuation=prep.continuation)
        result = ChatResult(gen.shown.text, [], "stop" if gen.shown.hit else gen.finish,
                            Usage(len(prep.prompt), gen.cached, len(gen.ids)))
        if gen.finish == "cancelled":
            self._cancelled(result)
        result.seconds = time.perf_counter() - start
        return result

    # -- the one generation loop -----------------------------------------------------------

    def _generate(self, lane, call: ChatCall, prompt: list[int], max_tokens: int,
                  constraint: Constraint | None, on_text: OnText | None, cancelled: Cancelled,
                  fmt: Format | None = None, continuation: bool = False,
                  press: Constraint | None = None) -> Generated:
        """On ``lane`` (an engine and its KV slots): sync to ``prompt`` and sample until the
        stop token, the format's scanner, a stop string, the client leaving or the token
        limit; under ``press`` instead of ``constraint`` (one call) where the model would
        answer (:func:`mlx_agent.probe.would_call`)."""
        engine, slots = lane
        shown = StopStrings(call.stop)
        if cancelled():  # the client left while this request waited its turn
            return Generated("", shown, [], "cancelled", 0)
        scanner = fmt.scanner(call.parallel) if fmt else NeverScanner()
        content: StreamFilter = fmt.stream_filter() if fmt else Passthrough()
        if constraint is not None:
            constraint.reset()
        slots.select(prompt)
        try:  # a long prompt's prefill stops between chunks when the client leaves
            cached = engine.sync(prompt, stop=cancelled).reused
        except PrefillStopped:
            return Generated("", shown, [], "cancelled", 0)
        pressed = press is not None and fmt is not None \
            and not would_call(engine, self.lm, fmt.name, prompt, constraint)
        if pressed:
            constraint, scanner = press, fmt.scanner(False)
            constraint.reset()
        stream = TextStream(engine, self.lm.tokenizer, self.sampler_for(call.sampling),
                            max_tokens=max_tokens, stop_ids=self.lm.end_ids,
                            constraint=constraint, continuation=continuation)

        def show(segment: str) -> None:
            visible = shown.feed(content.feed(segment))
            if visible and on_text:
                on_text(visible)

        finish = None
        for _, segment in stream:
            ended = bool(segment) and scanner.feed(segment)
            show(segment)
            if cancelled():
                finish = "cancelled"
                break
            if ended or shown.hit:  # a list's loop ends the reply as its budget would
                finish = "length" if scanner.looped else "stop"
                break
        show(stream.flush())
        tail = shown.flush()
        if tail and on_text:
            on_text(tail)
        blocked = isinstance(constraint, LoopGuard) and constraint.interventions > 0
        return Generated(stream.text, shown, stream.ids, finish or stream.finish_reason, cached,
                         blocked, pressed)

    def _cancelled(self, result: ChatResult) -> ChatResult:
        with self._count:
            self.cancelled += 1
            self.last_cancelled_tokens = result.usage.completion_tokens
        return result

    def _metrics(self, result: ChatResult, streaming: bool) -> None:
        if self.metrics_out is None:
            return
        row = {"tool_mode": self.tool_mode, "get_tool_info_hops": result.hops,
               "guarded_steps": result.guarded_steps,
               "prompt_tokens": result.usage.prompt_tokens,
               "cached_tokens": result.usage.cached_tokens,
               "completion_tokens": result.usage.completion_tokens, "streaming": streaming}
        with self._count:
            try:
                with open(self.metrics_out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            except OSError as e:  # metrics never fail the request they describe
                if not self._metrics_failed:
                    print(f"mlx_agent: warning: cannot append to {self.metrics_out}: "
                          f"{e.strerror}; tool metrics are not written", file=sys.stderr)
                self._metrics_failed = True


def _rendered_chars(messages: list[dict], tools: Sequence[Tool], deferred: bool) -> int:
    """Characters of what the prompt renders: messages' content and names, their tool calls'
    names and arguments, and the tools: names, descriptions and parameter schemas as JSON
    (in deferred mode the index's names and first lines, and the largest tool's schema, which
    a ``get_tool_info`` hop shows)."""
    chars = 0
    for m in messages:
        chars += len(text_of(m.get("content"))) + len(m.get("name") or "")
        for c in m.get("tool_calls") or ():
            args = c["function"].get("arguments") or ""
            chars += len(c["function"].get("name") or "") + \
                len(args if isinstance(args, str) else compact(args))
    full = [len(t.name) + len(t.description) + len(compact(t.parameters)) for t in tools]
    if not deferred:
        return chars + sum(full)
    index = sum(len(t.name) + len((t.description.strip().splitlines() or [""])[0])
                for t in tools)
    return chars + index + max(full, default=0)


def _info_turns(calls: list[Call], tools: list[Tool]) -> list[dict]:
    """The assistant turn that asked for tool info, and the server's answers to it."""
    asked = [{"id": _call_id(), "type": "function",
              "function": {"name": GET_TOOL_INFO, "arguments": json.dumps(c.arguments)}}
             for c in calls]
    return [{"role": "assistant", "content": None, "tool_calls": asked}] + [
        {"role": "tool", "tool_call_id": tc["id"], "name": GET_TOOL_INFO,
         "content": tool_info(tools, c.arguments.get("name"))}
        for c, tc in zip(calls, asked)]


def _made(messages: list[dict], tools: list[Tool]) -> list[tuple[Tool, dict]]:
    """The calls of the current turn (after the last user message) that a tool result
    follows."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    by_name = {t.name: t for t in [*tools, get_tool_info_tool(tools)]}
    made, pending = [], []
    for m in messages[last_user + 1:]:
        if m["role"] == "tool":
            made, pending = made + pending, []
        for c in (m.get("tool_calls") or ()) if m["role"] == "assistant" else ():
            tool = by_name.get(c["function"].get("name"))
            if tool is not None:
                pending.append((tool, arguments_of(c)))
    return made


def _without_stop(ids: list[int], stop_ids) -> list[int]:
    return ids[:-1] if ids and ids[-1] in stop_ids else ids


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]

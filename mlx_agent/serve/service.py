"""The chat service behind the server: one model, one engine, requests one at a time.

:meth:`ChatService.chat` takes a request already checked by :mod:`.schema`, renders it
(:mod:`.render`), constrains the reply with the tools' grammar when there are tools
(``tool_choice`` and ``parallel_tool_calls`` included), generates, and parses the reply into
content or tool calls. In deferred mode it answers the model's ``get_tool_info`` calls
itself and generates again, at most :data:`MAX_HOPS` times; after the last hop the grammar
no longer offers ``get_tool_info``, so the client only ever sees real calls.

Prompt reuse: the engine keeps the last conversation, and up to ``kv_slots`` earlier ones
are kept as snapshots; each request continues from whichever shares the longest token prefix
with its prompt. ``usage.cached_tokens`` counts the prompt tokens that were not prefilled.

Methods here block (MLX work); the HTTP layer calls them from one worker thread. Not
promised: more than one request at a time, or batching.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import mlx.core as mx

from ..agent.protocols import choose
from ..engine import SamplingParams, common_prefix
from ..tools import Tool
from .render import GET_TOOL_INFO, Call, ReplyMemo, RequestError, get_tool_info_tool, make_format, tool_info

MAX_HOPS = 3
OnText = Callable[[str], None]


@dataclass
class ChatCall:
    """One request, protocol-neutral: OpenAI-shaped message dicts and parsed tools."""

    messages: list[dict]
    tools: list[Tool] | None = None  # None: the server's catalogue
    tool_choice: str = "auto"  # auto, none, required or a tool's name
    parallel: bool = True
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    json_schema: dict | None = None  # response_format: the reply is JSON of this schema


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt: int, cached: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.completion_tokens += completion


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


class StopStrings:
    """Cuts text at the first stop string, holding back a tail that may start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.text = ""
        self.sent = 0
        self.hit = False

    def _held(self) -> int:
        """The longest tail of the text that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:k]):
                    best = k
                    break
        return best

    def feed(self, delta: str) -> str:
        if self.hit:  # nothing after a stop string, even what the detokenizer held back
            return ""
        self.text += delta
        if not self.stops:
            return self.flush()
        start = max(self.sent - max(len(s) for s in self.stops), 0)
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if found:
            self.text, self.hit = self.text[: min(found)], True
            return self.flush()
        ready = len(self.text) - self._held()
        out = self.text[self.sent:max(ready, self.sent)]
        self.sent += len(out)
        return out

    def flush(self) -> str:
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out


class KVSlots:
    """Snapshots of earlier conversations' KV state, so interleaved clients keep their
    prefixes. The engine's live state is the most recent conversation."""

    def __init__(self, engine, size: int, min_gain: int = 16):
        self.engine, self.size, self.min_gain = engine, size, min_gain
        self.slots: list[tuple[list[int], list]] = []

    def select(self, prompt: Sequence[int]) -> None:
        """Before the engine syncs to ``prompt``: keep the live state as a snapshot when
        ``prompt`` would overwrite ``min_gain`` or more of its tokens, and restore the
        snapshot that shares the most with ``prompt`` when it beats the live state."""
        if not self.size:
            return
        live = common_prefix(self.engine.tokens, prompt)
        best, gain = None, self.min_gain
        for i, (tokens, _) in enumerate(self.slots):
            n = common_prefix(tokens, prompt)
            if n - live >= gain:
                best, gain = i, n - live
        if len(self.engine.tokens) - live >= self.min_gain:
            self._stash()
        if best is not None:
            tokens, kvs = self.slots.pop(best)
            self.engine.restore(tokens, kvs)

    def _stash(self) -> None:
        try:
            tokens, kvs = self.engine.snapshot()
        except ValueError:  # empty, or a rotated window
            return
        # copies, so a snapshot does not keep the engine's whole preallocated buffer alive
        kvs = [(mx.contiguous(k), mx.contiguous(v)) for k, v in kvs]
        mx.eval(kvs)
        # a snapshot that is a prefix of this one is redundant
        self.slots = [s for s in self.slots if s[0] != tokens[: len(s[0])]]
        self.slots.append((tokens, kvs))
        del self.slots[: max(0, len(self.slots) - self.size)]


@dataclass
class _Prepared:
    """A request checked and ready: its tools, format, first prompt and constraint."""

    call: ChatCall
    tools: list[Tool]
    fmt: object
    deferred: bool
    prompt: list[int]
    constraint: object


class ChatService:
    def __init__(self, lm, *, tools: Sequence[Tool] = (), tool_mode: str = "full",
                 protocol: str = "auto", kv_slots: int = 4, default_max_tokens: int = 512,
                 metrics_out: str | Path | None = None, model_name: str | None = None,
                 sampler_for: Callable[[SamplingParams], Callable] | None = None,
                 context_length: int | None = None):
        if tool_mode not in ("full", "deferred"):
            raise ValueError(f"unknown tool mode {tool_mode!r}; use full or deferred")
        self.lm = lm
        self.tools = list(tools)
        self.tool_mode = tool_mode
        self.protocol = choose(protocol, lm.chat)
        self.engine = lm.engine(context_length=context_length) if context_length else lm.engine()
        self.slots = KVSlots(self.engine, kv_slots)
        self.memo = ReplyMemo()
        self.default_max_tokens = default_max_tokens
        self.metrics_out = Path(metrics_out) if metrics_out else None
        self.model_name = model_name or lm.identity.name
        self.sampler_for = sampler_for or (lambda s: s.sampler())
        self.created = int(time.time())
        self.cancelled = 0  # generations stopped because their client left
        self.last_cancelled_tokens = 0

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    def prime(self, prompt_cache) -> object:
        """Load the catalogue's tools block from ``prompt_cache`` (or prefill and save it)."""
        fmt = make_format(self.protocol, self.lm, self.memo)
        ids = fmt.system_prefix(self.tools, self.tool_mode == "deferred")
        return prompt_cache.prime(self.engine, self.lm.identity, ids)

    # -- chat ------------------------------------------------------------------------------

    def prepare(self, call: ChatCall) -> _Prepared:
        """Check ``call`` and build its first prompt and constraint; raises RequestError
        (or a GrammarError, TemplateError...) for what the client must change. Uses no
        model state, so the HTTP layer can answer 400 before a stream starts."""
        tools = self.tools if call.tools is None else call.tools
        if call.tool_choice not in ("auto", "none") and not tools:
            raise RequestError(f"tool_choice {call.tool_choice!r} needs tools")
        if call.json_schema is not None and tools:
            raise RequestError("response_format with tools is not supported; send one or "
                               "the other")
        deferred = bool(tools) and self.tool_mode == "deferred"
        if deferred and any(t.name == GET_TOOL_INFO for t in tools):
            raise RequestError(f"a tool named {GET_TOOL_INFO!r} clashes with the server's "
                               "deferred-mode tool; rename it")
        fmt = make_format(self.protocol if tools else "plain", self.lm, self.memo)
        prep = _Prepared(call, list(tools), fmt, deferred, [], None)
        prep.prompt = self._prompt(prep, call.messages)
        prep.constraint = self._constraint(prep, hops=0)
        return prep

    def chat(self, call: ChatCall | _Prepared, on_text: OnText | None = None,
             cancelled: Callable[[], bool] = lambda: False, streaming: bool = False) -> ChatResult:
        """Answer one request; ``on_text`` receives the content as it is generated.

        In deferred mode each ``get_tool_info`` reply is answered here and generated again
        (a hop); usage reports the last hop's prompt and all hops' completion tokens."""
        start = time.perf_counter()
        prep = call if isinstance(call, _Prepared) else self.prepare(call)
        call, messages = prep.call, list(prep.call.messages)
        prompt, constraint = prep.prompt, prep.constraint
        usage, hops = Usage(), 0
        while True:
            text, shown, ids, finish, cached = self._hop(prep, prompt, constraint, on_text,
                                                          cancelled)
            usage.prompt_tokens, usage.cached_tokens = len(prompt), cached
            usage.completion_tokens += len(ids)
            if finish == "cancelled":
                self.cancelled += 1
                self.last_cancelled_tokens = len(ids)
                return ChatResult(shown.text, [], finish, usage, hops)
            reply = prep.fmt.parse(text)
            self._remember(prep.fmt, reply, text, ids)
            real = [c for c in reply.calls if c.name != GET_TOOL_INFO]
            info = [c for c in reply.calls if c.name == GET_TOOL_INFO]
            if real or not info:
                break
            hops += 1
            messages += self._info_turns(info, prep.tools)
            prompt = self._prompt(prep, messages)
            constraint = self._constraint(prep, hops)
        if real:
            result = ChatResult(None, [ToolCallOut(_call_id(), c.name, c.arguments)
                                       for c in real], "tool_calls", usage, hops)
        else:
            # a clean answer as parsed; a reply cut short (or cut at a stop string) as the
            # stream showed it, never raw protocol text
            clean = reply.complete and not shown.hit
            result = ChatResult(reply.content if clean else shown.text, [],
                                "stop" if shown.hit else finish, usage, hops)
        result.seconds = time.perf_counter() - start
        self._metrics(result, streaming)
        return result

    def _remember(self, fmt, reply, text: str, ids: list[int]) -> None:
        """Keep the ids sampled for a reply, to render it with when the client sends it
        back; only when that rendering is exactly the text they decode to."""
        if fmt.name == "json":
            key = fmt.reply_text(_as_message(reply))
            same = key == text.strip()
        else:
            key = reply.content
            same = not reply.calls and reply.complete and key == text
        if same and key:
            self.memo.put(key, ids[:-1] if ids and ids[-1] in self.lm.stop_ids else ids)

    def _prompt(self, prep: _Prepared, messages: list[dict]) -> list[int]:
        prompt = prep.fmt.prompt_ids(messages, prep.tools, prep.deferred)
        if len(prompt) >= self.context_length:
            raise RequestError(f"the prompt is {len(prompt)} tokens; the context holds "
                               f"{self.context_length}")
        return prompt

    def _constraint(self, prep: _Prepared, hops: int):
        """The reply's grammar: the tools (plus get_tool_info while hops remain), a
        response_format schema, or none."""
        from ..grammar import tool_constraint

        call = prep.call
        if prep.tools:
            offer_info = prep.deferred and hops < MAX_HOPS and \
                call.tool_choice in ("auto", "required")
            shown = prep.tools + ([get_tool_info_tool(prep.tools)] if offer_info else [])
            return tool_constraint(self.lm, prep.fmt.name, shown,
                                   call.max_tokens or self.default_max_tokens,
                                   call.tool_choice, call.parallel, bound_answer=False)
        if call.json_schema is not None:
            return schema_constraint(self.lm, call.json_schema)
        return None

    def _hop(self, prep: _Prepared, prompt: list[int], constraint, on_text, cancelled):
        """One generation: returns (raw text, what was shown, ids, finish, cached)."""
        content, shown = prep.fmt.stream_filter(), StopStrings(prep.call.stop)
        raw: list[str] = []

        def emit(delta: str) -> None:  # the reply's content, cut at a stop string
            raw.append(delta)
            visible = shown.feed(content.feed(delta))
            if visible and on_text:
                on_text(visible)

        def halt() -> bool:  # a stop string, or a small model repeating a call
            if shown.hit:
                return True
            return bool(raw) and "\n" in raw[-1] and prep.fmt.repeats("".join(raw))

        max_tokens = prep.call.max_tokens or self.default_max_tokens
        text, ids, finish, cached = self._generate(prompt, prep.call.sampling, max_tokens,
                                                   constraint, emit, cancelled, halt)
        tail = shown.flush()
        if tail and on_text:
            on_text(tail)
        return text, shown, ids, finish, cached

    def _info_turns(self, calls: list[Call], tools) -> list[dict]:
        """The assistant turn that asked for tool info, and the server's answers to it."""
        asked = [{"id": _call_id(), "type": "function",
                  "function": {"name": GET_TOOL_INFO, "arguments": json.dumps(c.arguments)}}
                 for c in calls]
        return [{"role": "assistant", "content": None, "tool_calls": asked}] + [
            {"role": "tool", "tool_call_id": tc["id"], "name": GET_TOOL_INFO,
             "content": tool_info(tools, c.arguments.get("name"))}
            for c, tc in zip(calls, asked)]

    # -- raw completion --------------------------------------------------------------------

    def prepare_completion(self, prompt: str, *, raw: bool = True, system: str | None = None,
                           json_schema: dict | None = None) -> tuple[list[int], object]:
        """The prompt ids (``raw`` text, or a one-message chat) and the constraint."""
        if raw:
            ids = self.lm.prompt_ids(prompt)
        else:
            msgs = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": prompt}]
            ids = make_format("plain", self.lm).prompt_ids(msgs, [], False)
        if not ids:
            raise RequestError("the prompt is empty")
        if len(ids) >= self.context_length:
            raise RequestError(f"the prompt is {len(ids)} tokens; the context holds "
                               f"{self.context_length}")
        return ids, (schema_constraint(self.lm, json_schema) if json_schema else None)

    def complete(self, prepared: tuple[list[int], object], *, max_tokens: int,
                 sampling: SamplingParams, stop: Sequence[str] = (),
                 on_text: OnText | None = None,
                 cancelled: Callable[[], bool] = lambda: False) -> ChatResult:
        """Continue prepared prompt ids as text (``/v1/completions``, ``/api/generate``)."""
        start = time.perf_counter()
        ids, constraint = prepared
        shown = StopStrings(stop)

        def emit(delta: str) -> None:
            visible = shown.feed(delta)
            if visible and on_text:
                on_text(visible)

        _, out, finish, cached = self._generate(ids, sampling, max_tokens, constraint, emit,
                                                cancelled, lambda: shown.hit)
        tail = shown.flush()
        if tail and on_text:
            on_text(tail)
        if finish == "cancelled":
            self.cancelled += 1
            self.last_cancelled_tokens = len(out)
        result = ChatResult(shown.text, [], "stop" if shown.hit else finish,
                            Usage(len(ids), cached, len(out)))
        result.seconds = time.perf_counter() - start
        return result

    # -- the one generation loop -----------------------------------------------------------

    def _generate(self, prompt: list[int], sampling: SamplingParams, max_tokens: int,
                  constraint, emit: OnText, cancelled, halt: Callable[[], bool]):
        """Sync to ``prompt`` and sample; returns (text, ids, finish reason, cached)."""
        if cancelled():  # the client left while this request waited its turn
            return "", [], "cancelled", 0
        if constraint is not None:
            constraint.reset()
        self.slots.select(prompt)
        sync = self.engine.sync(prompt)
        detok = self.lm.tokenizer.detokenizer
        detok.reset()
        ids: list[int] = []
        finish = "length"
        room = self.engine.room
        budget = max_tokens if room is None else min(max_tokens, room)
        for token in self.engine.generate(self.sampler_for(sampling), max_tokens=budget,
                                          stop_ids=self.lm.stop_ids, constraint=constraint):
            ids.append(token)
            if token in self.lm.stop_ids:
                finish = "stop"
                break
            detok.add_token(token)
            segment = detok.last_segment  # reading it consumes it
            if segment:
                emit(segment)
            if cancelled():
                finish = "cancelled"
                break
            if halt():
                finish = "stop"
                break
        detok.finalize()
        segment = detok.last_segment
        if segment:
            emit(segment)
        if finish == "length" and constraint is not None and constraint.done:
            finish = "stop"
        return detok.text, ids, finish, sync.reused

    def _metrics(self, result: ChatResult, streaming: bool) -> None:
        if self.metrics_out is None:
            return
        row = {"tool_mode": self.tool_mode, "get_tool_info_hops": result.hops,
               "prompt_tokens": result.usage.prompt_tokens,
               "cached_tokens": result.usage.cached_tokens,
               "completion_tokens": result.usage.completion_tokens, "streaming": streaming}
        with open(self.metrics_out, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


@functools.lru_cache(maxsize=16)
def _schema_grammar(schema_json: str, tokenizer) -> str:
    from llguidance import LLMatcher

    from ..grammar import GrammarError, check_compiles

    try:
        grammar = LLMatcher.grammar_from_json_schema(
            schema_json, defaults={"whitespace_flexible": False})
    except ValueError as e:
        raise GrammarError(f"the response_format schema is not usable: {e}") from None
    check_compiles(grammar, tokenizer, "the response_format schema")
    return grammar


def schema_constraint(lm, schema: dict):
    """A constraint that allows JSON of ``schema`` only (``response_format``)."""
    from ..grammar import Constraint, ll_tokenizer

    tokenizer = ll_tokenizer(lm)
    return Constraint(tokenizer, _schema_grammar(json.dumps(schema, sort_keys=True), tokenizer),
                      lm.vocab_size)


def _as_message(reply) -> dict:
    """A parsed reply as the assistant message a client would send back."""
    return {"role": "assistant", "content": reply.content, "tool_calls": [
        {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.calls] or None}


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]

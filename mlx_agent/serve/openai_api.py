"""The OpenAI API as pure adapters: request bodies to a :class:`ChatCall`, results to
response bodies and server-sent-event chunks. Nothing here runs a model."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from ..formats import compact
from ..tools import ToolSchemaError, declared_tools
from . import schema
from .common import BadRequest, Limits
from .service import ChatCall, ChatResult


def error_body(e: BadRequest) -> dict:
    kind = "server_error" if e.status >= 500 else "invalid_request_error"
    return {"error": {"message": str(e), "type": kind, "param": e.param, "code": e.code}}


def chat_call(req: schema.ChatRequest, limits: Limits) -> ChatCall:
    if req.n != 1:
        raise BadRequest("n must be 1", param="n")
    if req.logprobs:  # accepted, then answered with logprobs null: refused instead
        raise BadRequest("logprobs are not supported; send logprobs false or leave it out",
                         param="logprobs")
    if req.top_logprobs:
        raise BadRequest("top_logprobs is not supported (no logprobs are computed); send 0 "
                         "or leave it out", param="top_logprobs")
    # once ignored: a forced function_call came back as prose
    if req.functions or isinstance(req.function_call, dict):
        raise BadRequest("functions and function_call are not supported; send tools and "
                         "tool_choice (OpenAI's current names) instead",
                         param="functions" if req.functions else "function_call")
    if not req.messages:
        raise BadRequest("messages must not be empty", param="messages")
    # max_completion_tokens is OpenAI's newer name: it wins, a 0 included (0 is refused)
    newer = req.max_completion_tokens is not None
    max_tokens, sampling = limits(req.max_completion_tokens if newer else req.max_tokens,
                                  req.temperature, req.top_p, req.seed, req.top_k, req.min_p,
                                  max_tokens_name="max_completion_tokens" if newer
                                  else "max_tokens", **penalties(req))
    tools = None
    if req.tools is not None:
        try:
            tools = declared_tools(req.tools)
        except ToolSchemaError as e:
            raise BadRequest(str(e), param="tools") from None
        except RecursionError:
            raise BadRequest("a tool schema is nested too deeply", param="tools") from None
    choice = req.tool_choice or "auto"
    if isinstance(choice, schema.NamedToolChoice):
        choice = choice.function.name
    return ChatCall(messages=[_message(m) for m in _tool_results(req.messages)], tools=tools,
                    tool_choice=choice, parallel=req.parallel_tool_calls,
                    max_tokens=max_tokens, sampling=sampling, stop=req.stops(),
                    json_schema=response_schema(req.response_format))


def penalties(req) -> dict:
    """A chat or text completion request's penalties and logit bias, as :class:`Limits`
    takes them."""
    return {"presence_penalty": req.presence_penalty,
            "frequency_penalty": req.frequency_penalty, "logit_bias": req.logit_bias}


def _tool_results(messages: list[schema.Message]) -> list[schema.Message]:
    """``messages`` with each assistant message's results in the order of its calls: the
    prompt carries no ids, so the order is how the model pairs a result with its call.

    A tool message answers a call: it must follow an assistant message with tool_calls
    (after that message's other results), and its tool_call_id must be one of those calls'
    ids (unless they have none to match by: empty or repeated), as OpenAI requires."""
    out: list[schema.Message] = []
    run: list[schema.Message] = []  # the results answering the last assistant's calls
    ids: dict[str, int] | None = None  # those calls' ids, by position; None: no calls
    asker = -1  # the index of that assistant message

    def in_call_order() -> list[schema.Message]:  # a dict, not list.index: 40,000 calls
        return sorted(run, key=lambda r: ids[r.tool_call_id]) if ids else run  # took 24 s

    for i, m in enumerate(messages):
        if m.role != "tool":
            out += in_call_order()
            run, asker = [], i
            calls = [c.id for c in m.tool_calls] if m.role == "assistant" and m.tool_calls \
                else None
            ids = None if calls is None else {} if "" in calls or len(set(calls)) < len(calls) \
                else {c: k for k, c in enumerate(calls)}
            out.append(m)
            continue
        if ids is None:
            raise BadRequest(f"messages[{i}] has role tool but follows no assistant message "
                             "with tool_calls; send a tool result right after the assistant "
                             "message (and its other results) whose call it answers",
                             param=f"messages[{i}]")
        if ids and m.tool_call_id not in ids:
            got = "missing" if m.tool_call_id is None else repr(m.tool_call_id)
            named = ", ".join(list(ids)[:10]) + (", ..." if len(ids) > 10 else "")
            raise BadRequest(f"messages[{i}].tool_call_id is {got}, not the id of one of the "
                             f"calls of messages[{asker}] ({named}); send the id of "
                             "the call it answers", param=f"messages[{i}].tool_call_id")
        run.append(m)
    return out + in_call_order()


def _message(m: schema.Message) -> dict:
    """"developer" is OpenAI's newer name for "system"."""
    d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                         "content": m.content}
    if m.name:
        d["name"] = m.name
    if m.tool_calls:
        d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": c.function.arguments}} for c in m.tool_calls]
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    return d


def response_schema(fmt: schema.ResponseFormat | None) -> dict | None:
    """``response_format`` as a JSON schema for the grammar (None: free text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None or not fmt.json_schema.schema:
        raise BadRequest("response_format json_schema needs json_schema.schema",
                         param="response_format")
    return fmt.json_schema.schema


def usage(result: ChatResult) -> dict:
    u = result.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def tool_calls(result: ChatResult, streaming: bool = False) -> list[dict]:
    return [{**({"index": i} if streaming else {}), "id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": compact(c.arguments)}}
            for i, c in enumerate(result.tool_calls)]


def chat_head(model: str, chunk: bool = False) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk" if chunk else "chat.completion",
            "created": int(time.time()), "model": model}


def chat_response(result: ChatResult, model: str) -> dict:
    message = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = tool_calls(result)
    return {**chat_head(model), "choices": [{"index": 0, "message": message, "logprobs": None,
                                             "finish_reason": result.finish_reason}],
            "usage": usage(result)}


def _data(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def chat_chunks(events: AsyncIterator[tuple[str, Any]], model: str,
                      include_usage: bool) -> AsyncIterator[str]:
    head = chat_head(model, chunk=True)

    def chunk(delta: dict, finish: str | None = None) -> str:
        return _data({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish}]})

    # null until text comes, as OpenAI streams a reply that turns out to be tool calls
    yield chunk({"role": "assistant", "content": None})
    async for kind, value in events:
        if kind == "text":
            yield chunk({"content": value})
        elif kind == "error":
            yield _data(error_body(value))
        elif kind == "result":
            if value.tool_calls:
                yield chunk({"tool_calls": tool_calls(value, streaming=True)})
            yield chunk({}, value.finish_reason)
            if include_usage:
                yield _data({**head, "choices": [], "usage": usage(value)})
    yield "data: [DONE]\n\n"


def completion_head(model: str) -> dict:
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
            "created": int(time.time()), "model": model}


def completion_prompt(req: schema.CompletionRequest, vocab_size: int) -> str | list[int]:
    if req.n != 1:
        raise BadRequest("n must be 1", param="n")
    if req.best_of not in (None, 1):
        raise BadRequest("best_of must be 1", param="best_of")
    if req.logprobs is not None:  # even 0 asks for the sampled tokens' logprobs
        raise BadRequest("logprobs are not supported; leave logprobs out (or null)",
                         param="logprobs")
    if req.suffix:
        raise BadRequest("suffix is not supported (text is only continued, never filled "
                         "in); leave it out", param="suffix")
    return _one_prompt(req.prompt, vocab_size)


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value)


def _one_prompt(prompt, vocab_size: int) -> str | list[int]:
    """OpenAI's four shapes of ``prompt``: text, token ids, or a batch of either, here
    of one."""
    if isinstance(prompt, str):
        return prompt
    if _is_ids(prompt):
        bad = next((i for i in prompt if not 0 <= i < vocab_size), None)
        if bad is not None:
            raise BadRequest(f"the prompt holds token {bad}, but the model's ids run from 0 to "
                             f"{vocab_size - 1}", param="prompt")
        return prompt
    if len(prompt) == 1 and (isinstance(prompt[0], str) or _is_ids(prompt[0])):
        return _one_prompt(prompt[0], vocab_size)
    if prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        raise BadRequest("send one prompt per request", param="prompt")
    raise BadRequest("the prompt must be a string, a list of token ids, or a list holding "
                     "one of those", param="prompt")


def completion_response(result: ChatResult, head: dict, prompt: str, echo: bool) -> dict:
    text = (prompt if echo else "") + (result.content or "")
    return {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": result.finish_reason}],
            "usage": usage(result)}


async def completion_chunks(events: AsyncIterator[tuple[str, Any]], head: dict, prompt: str,
                            echo: bool, include_usage: bool) -> AsyncIterator[str]:
    def chunk(text: str, finish: str | None = None) -> str:
        return _data({**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                           "finish_reason": finish}]})

    if echo:
        yield chunk(prompt)
    async for kind, value in events:
        if kind == "text":
            yield chunk(value)
        elif kind == "error":
            yield _data(error_body(value))  # as chat's streams send it: type, param, code
        elif kind == "result":
            yield chunk("", value.finish_reason)
            if include_usage:
                yield _data({**head, "choices": [], "usage": usage(value)})
    yield "data: [DONE]\n\n"

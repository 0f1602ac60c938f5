"""The Ollama API as pure adapters: request bodies to a :class:`ChatCall`, results to
response bodies and NDJSON lines. Nothing here runs a model."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from ..tools import ToolSchemaError, declared_tools
from . import schema
from .common import BadRequest, Limits
from .service import ChatCall, ChatResult


NO_IMAGES = ("images are not supported: this model reads text only; send the request "
             "without images")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def sampling(options: schema.OllamaOptions | None, limits: Limits):
    o = options or schema.OllamaOptions()
    max_tokens = o.num_predict if o.num_predict and o.num_predict > 0 else None
    seed = None if o.seed == -1 else o.seed  # Ollama's default, "random": the server's here
    return limits(max_tokens, o.temperature, o.top_p, seed, o.top_k, o.min_p,
                  max_tokens_name="options.num_predict", presence_penalty=o.presence_penalty,
                  frequency_penalty=o.frequency_penalty)


def check_generate(req: schema.OllamaGenerateRequest) -> None:
    """Refuses what ``/api/generate`` takes and this server cannot do, where it was ignored
    (a fill-in-the-middle request came back as a plain continuation)."""
    if req.suffix:
        raise BadRequest("suffix is not supported (text is only continued, never filled in); "
                         "leave it out")
    if req.template:
        raise BadRequest("template is not supported: the model's own chat template is used "
                         "(send raw: true with a prompt you have formatted yourself)")
    if req.context:
        raise BadRequest("context is not supported (it is deprecated in Ollama too); send the "
                         "conversation as messages to /api/chat")


def stops(options: schema.OllamaOptions | None) -> list[str]:
    return list(options.stop or []) if options else []


def chat_call(req: schema.OllamaChatRequest, limits: Limits) -> ChatCall:
    max_tokens, params = sampling(req.options, limits)
    messages = [_message(m) for m in req.messages]
    if not messages:
        raise BadRequest("messages must not be empty")
    tools = None
    if req.tools is not None:
        try:
            tools = declared_tools(req.tools)
        except ToolSchemaError as e:
            raise BadRequest(str(e)) from None
        except RecursionError:
            raise BadRequest("a tool schema is nested too deeply") from None
    return ChatCall(messages=messages, tools=tools, max_tokens=max_tokens, sampling=params,
                    stop=stops(req.options), json_schema=format_schema(req.format),
                    schema_field="format")


def _message(m: schema.OllamaMessage) -> dict:
    if m.images:
        raise BadRequest(NO_IMAGES)
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
            "name": c.function.name, "arguments": c.function.arguments}}
            for i, c in enumerate(m.tool_calls)]
    if m.tool_name:
        d["name"] = m.tool_name
    return d


def format_schema(fmt: Any) -> dict | None:
    """Ollama's ``format``: "json", a JSON schema, or nothing."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "object"}
    if isinstance(fmt, dict):
        return fmt
    raise BadRequest('format must be "json" or a JSON schema')


def loaded(model: str, chat: bool) -> dict:
    """The answer to Ollama's "load the model" request: ``/api/chat`` with no messages,
    ``/api/generate`` with no prompt."""
    part = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": model, "created_at": now_iso(), **part, "done": True,
            "done_reason": "load"}


def stats(result: ChatResult) -> dict:
    ns = int(result.seconds * 1e9)
    return {"done": True, "done_reason": "stop" if result.finish_reason == "tool_calls"
            else result.finish_reason, "total_duration": ns, "load_duration": 0,
            "prompt_eval_count": result.usage.prompt_tokens - result.usage.cached_tokens,
            "prompt_eval_duration": 0, "eval_count": result.usage.completion_tokens,
            "eval_duration": ns}


def message(result: ChatResult, content: str | None = None) -> dict:
    body: dict = {"role": "assistant",
                  "content": result.content or "" if content is None else content}
    if result.tool_calls:
        body["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}}
                              for c in result.tool_calls]
    return body


def chat_response(result: ChatResult, model: str) -> dict:
    return {"model": model, "created_at": now_iso(), "message": message(result), **stats(result)}


def generate_response(result: ChatResult, model: str) -> dict:
    return {"model": model, "created_at": now_iso(), "response": result.content or "",
            **stats(result)}


async def lines(events: AsyncIterator[tuple[str, Any]], model: str,
                chat: bool) -> AsyncIterator[str]:
    """NDJSON for ``/api/chat`` (``chat``) or ``/api/generate``."""
    def line(body: dict) -> str:
        return json.dumps({"model": model, "created_at": now_iso(), **body},
                          ensure_ascii=False) + "\n"

    async for kind, value in events:
        if kind == "text":
            part = {"message": {"role": "assistant", "content": value}} if chat \
                else {"response": value}
            yield line({**part, "done": False})
        elif kind == "error":
            yield line({"error": str(value)})
        elif kind == "result":
            if chat and value.tool_calls:
                yield line({"message": message(value, ""), "done": False})
            part = {"message": {"role": "assistant", "content": ""}} if chat \
                else {"response": ""}
            yield line({**part, **stats(value)})


def tags(service) -> dict:
    ident, path = service.lm.identity, service.lm.path
    size = path.stat().st_size if path.is_file() else 0
    return {"models": [{
        "name": service.model_name, "model": service.model_name,
        "modified_at": datetime.fromtimestamp(service.created, timezone.utc).isoformat(),
        "size": size, "digest": ident.fingerprint.rsplit(":", 1)[-1],
        "details": {"format": ident.format,
                    "family": getattr(service.lm.model, "model_type", ""),
                    "parameter_size": "", "quantization_level": ident.weight_format}}]}


def show(service) -> dict:
    ident, family = service.lm.identity, getattr(service.lm.model, "model_type", "")
    return {"modelfile": "", "parameters": "", "template": service.lm.chat.template,
            "details": {"format": ident.format, "family": family,
                        "quantization_level": ident.weight_format},
            # keyed by architecture, as Ollama's are: clients look for "<arch>.context_length"
            "model_info": {"general.architecture": family,
                           f"{family or 'general'}.context_length": service.context_length},
            "capabilities": ["completion", "tools"]}

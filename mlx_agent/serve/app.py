"""The HTTP surface: OpenAI and Ollama endpoints over one :class:`ChatService` (Starlette).

Every request body is decoded with :mod:`.schema`; bad JSON, a wrong type, an unknown model,
an unknown role or a limit out of range is a 400 with an OpenAI-style error body (Ollama
endpoints: ``{"error": ...}``, and 404 for an unknown model, as Ollama answers). Model work
runs on one worker thread, so requests are served one at a time in arrival order. A client
that disconnects stops its generation at the next token; a request whose client left while
it waited does no work.

Not promised: ``n > 1``, logprobs, images, or more than one model per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine import SamplingParams
from ..tools import ToolSchemaError, declared_tools
from . import schema
from .render import RequestError, compact
from .service import ChatCall, ChatResult, ChatService

VERSION = "0.1.0"


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


def _user_errors() -> tuple[type[BaseException], ...]:
    from ..cache import ContextFull
    from ..chat import TemplateError
    from ..grammar import GrammarError

    return (RequestError, ToolSchemaError, GrammarError, ContextFull, TemplateError)


def openai_error(e: BadRequest) -> JSONResponse:
    return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error",
                                   "param": e.param, "code": e.code}}, status_code=e.status)


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class Server:
    def __init__(self, service: ChatService, default_sampling: SamplingParams = SamplingParams(),
                 pool: ThreadPoolExecutor | None = None):
        self.service = service
        self.default_sampling = default_sampling
        # the one thread that touches the model (pass the one that loaded it, on Metal)
        self.pool = pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx-agent-model")
        self.names = {service.model_name, f"{service.model_name}:latest"}
        self.live: set[threading.Event] = set()  # cancel flags of running requests

    async def shutdown(self) -> None:
        for cancel in list(self.live):  # running generations stop at their next token
            cancel.set()
        await asyncio.to_thread(self.pool.shutdown, wait=True, cancel_futures=True)

    # -- plumbing --------------------------------------------------------------------------

    async def _body(self, request: Request, kind: type) -> Any:
        try:
            return schema.decode(await request.body(), kind)
        except ValueError as e:
            raise BadRequest(str(e)) from None

    def _check_model(self, name: str | None, ollama: bool = False) -> None:
        if name is not None and name not in self.names:
            raise BadRequest(f"model {name!r} not found; this server serves "
                             f"{self.service.model_name!r}", status=404 if ollama else 400,
                             code="model_not_found", param="model")

    def _limits(self, max_tokens: int | None, temperature: float | None, top_p: float | None,
                seed: int | None, top_k: int | None = None, min_p: float | None = None
                ) -> tuple[int | None, SamplingParams]:
        ctx = self.service.context_length
        if max_tokens is not None and not 1 <= max_tokens <= ctx:
            raise BadRequest(f"max_tokens must be between 1 and the context length {ctx}, "
                             f"got {max_tokens}", param="max_tokens")
        if temperature is not None and not 0 <= temperature <= 2:
            raise BadRequest(f"temperature must be between 0 and 2, got {temperature}",
                             param="temperature")
        d = self.default_sampling
        if seed is not None:
            seed %= 2**64  # OpenAI takes any integer; MLX's generator a uint64
        try:
            sampling = SamplingParams(
                temperature=d.temperature if temperature is None else temperature,
                top_p=d.top_p if top_p is None else top_p,
                top_k=d.top_k if top_k is None else top_k,
                min_p=d.min_p if min_p is None else min_p,
                seed=d.seed if seed is None else seed)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return max_tokens, sampling

    async def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the model thread; the client's mistakes become BadRequest."""
        return await self._settle(asyncio.get_running_loop().run_in_executor(self.pool, fn))

    async def _run(self, request: Request, fn: Callable[[Callable[[], bool]], ChatResult]
                   ) -> ChatResult:
        """Run ``fn(cancelled)`` on the model thread; a client that leaves cancels it."""
        cancel = threading.Event()
        self.live.add(cancel)
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self.pool, fn, cancel.is_set)

        async def watch():
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    cancel.set()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            return await self._settle(job)
        finally:  # done, failed, or this handler was cancelled: stop the generation
            cancel.set()
            self.live.discard(cancel)
            watcher.cancel()

    @staticmethod
    async def _settle(job):
        try:
            return await job
        except _user_errors() as e:
            raise BadRequest(str(e)) from None

    def _stream(self, fn: Callable[[Callable[[str], None], Callable[[], bool]], ChatResult]
                ) -> AsyncIterator[tuple[str, Any]]:
        """Run ``fn(on_text, cancelled)`` on the model thread; yields ("text", str) as the
        model writes and then ("result", ChatResult) or ("error", BadRequest)."""
        async def events():
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            cancel = threading.Event()
            self.live.add(cancel)

            def on_text(text: str) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, ("text", text))

            job = loop.run_in_executor(self.pool, fn, on_text, cancel.is_set)
            job.add_done_callback(lambda _: queue.put_nowait(("done", None)))
            try:
                while True:
                    kind, value = await queue.get()
                    if kind == "done":
                        break
                    yield kind, value
                try:
                    yield "result", await self._settle(job)
                except BadRequest as e:
                    yield "error", e
                except Exception as e:  # a bug of ours, after the headers went out
                    yield "error", BadRequest(f"internal error: {e}", status=500,
                                              code="server_error")
            finally:  # the client left (or the stream ended): stop generating
                cancel.set()
                self.live.discard(cancel)

        return events()

    # -- OpenAI ----------------------------------------------------------------------------

    def _chat_call(self, req: schema.ChatRequest) -> ChatCall:
        if req.n != 1:
            raise BadRequest("n must be 1", param="n")
        if not req.messages:
            raise BadRequest("messages must not be empty", param="messages")
        max_tokens, sampling = self._limits(req.max_completion_tokens or req.max_tokens,
                                            req.temperature, req.top_p, req.seed)
        tools = None
        if req.tools is not None:
            try:
                tools = declared_tools(req.tools)
            except ToolSchemaError as e:
                raise BadRequest(str(e), param="tools") from None
        choice = req.tool_choice or "auto"
        if isinstance(choice, schema.NamedToolChoice):
            choice = choice.function.name
        messages = []
        for m in req.messages:  # "developer" is OpenAI's newer name for "system"
            d = {"role": "system" if m.role == "developer" else m.role, "content": m.content}
            if m.name:
                d["name"] = m.name
            if m.tool_calls:
                d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": c.function.arguments}}
                    for c in m.tool_calls]
            if m.tool_call_id:
                d["tool_call_id"] = m.tool_call_id
            messages.append(d)
        return ChatCall(messages=messages, tools=tools, tool_choice=choice,
                        parallel=req.parallel_tool_calls, max_tokens=max_tokens,
                        sampling=sampling, stop=req.stops(),
                        json_schema=_schema_of(req.response_format))

    @staticmethod
    def _usage(result: ChatResult) -> dict:
        u = result.usage
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}

    @staticmethod
    def _openai_calls(result: ChatResult, streaming: bool = False) -> list[dict]:
        return [{**({"index": i} if streaming else {}), "id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": compact(c.arguments)}}
                for i, c in enumerate(result.tool_calls)]

    async def chat_completions(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.ChatRequest)
            self._check_model(req.model)
            call = self._chat_call(req)
            if req.stream:  # a bad request is a 400, checked before the stream starts
                prep = await self._call(lambda: self.service.prepare(call))
                events = self._stream(lambda on_text, cancelled: self.service.chat(
                    prep, on_text, cancelled, streaming=True))
                return StreamingResponse(self._chat_sse(events, req.include_usage),
                                         media_type="text/event-stream")
            result = await self._run(request, lambda cancelled: self.service.chat(call, None, cancelled))
        except BadRequest as e:
            return openai_error(e)
        message = {"role": "assistant", "content": result.content}
        if result.tool_calls:
            message["tool_calls"] = self._openai_calls(result)
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
            "created": int(time.time()), "model": self.service.model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": result.finish_reason}],
            "usage": self._usage(result)})

    async def _chat_sse(self, events, include_usage: bool) -> AsyncIterator[str]:
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.service.model_name}

        def chunk(delta: dict, finish: str | None = None) -> str:
            body = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish}]}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        async for kind, value in events:
            if kind == "text":
                yield chunk({"content": value})
            elif kind == "error":
                kind_name = "server_error" if value.status >= 500 else "invalid_request_error"
                err = {"error": {"message": str(value), "type": kind_name,
                                 "param": value.param, "code": value.code}}
                yield f"data: {json.dumps(err)}\n\n"
            elif kind == "result":
                if value.tool_calls:
                    yield chunk({"tool_calls": self._openai_calls(value, streaming=True)})
                yield chunk({}, value.finish_reason)
                if include_usage:
                    yield f"data: {json.dumps({**head, 'choices': [], 'usage': self._usage(value)})}\n\n"
        yield "data: [DONE]\n\n"

    async def completions(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.CompletionRequest)
            self._check_model(req.model)
            if req.n != 1:
                raise BadRequest("n must be 1", param="n")
            prompt = req.prompt
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    raise BadRequest("send one prompt per request", param="prompt")
                prompt = prompt[0]
            max_tokens, sampling = self._limits(req.max_tokens, req.temperature, req.top_p, req.seed)
            stop = req.stops()
            prepared = await self._call(lambda: self.service.prepare_completion(prompt))

            def work(on_text, cancelled):
                return self.service.complete(prepared, max_tokens=max_tokens, sampling=sampling,
                                             stop=stop, on_text=on_text, cancelled=cancelled)

            head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
                    "created": int(time.time()), "model": self.service.model_name}
            if req.stream:
                return StreamingResponse(self._completion_sse(self._stream(work), head, req),
                                         media_type="text/event-stream")
            result = await self._run(request, lambda cancelled: work(None, cancelled))
        except BadRequest as e:
            return openai_error(e)
        text = (prompt if req.echo else "") + (result.content or "")
        return JSONResponse({**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                  "finish_reason": result.finish_reason}],
                             "usage": self._usage(result)})

    async def _completion_sse(self, events, head: dict, req) -> AsyncIterator[str]:
        def chunk(text: str, finish: str | None = None) -> str:
            body = {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                         "finish_reason": finish}]}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        if req.echo:
            yield chunk(req.prompt if isinstance(req.prompt, str) else req.prompt[0])
        async for kind, value in events:
            if kind == "text":
                yield chunk(value)
            elif kind == "error":
                yield f"data: {json.dumps({'error': {'message': str(value)}})}\n\n"
            elif kind == "result":
                yield chunk("", value.finish_reason)
                if req.include_usage:
                    yield f"data: {json.dumps({**head, 'choices': [], 'usage': self._usage(value)})}\n\n"
        yield "data: [DONE]\n\n"

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.service.model_name, "object": "model", "created": self.service.created,
            "owned_by": "mlx_agent"}]})

    # -- Ollama ----------------------------------------------------------------------------

    def _ollama_sampling(self, options: schema.OllamaOptions | None):
        o = options or schema.OllamaOptions()
        max_tokens = o.num_predict if o.num_predict and o.num_predict > 0 else None
        return self._limits(max_tokens, o.temperature, o.top_p, o.seed, o.top_k, o.min_p)

    def _ollama_call(self, req: schema.OllamaChatRequest) -> ChatCall:
        max_tokens, sampling = self._ollama_sampling(req.options)
        messages = []
        for m in req.messages:
            if m.images:
                raise BadRequest("images are not supported by this model")
            d: dict = {"role": m.role, "content": m.content}
            if m.tool_calls:
                d["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
                    "name": c.function.name, "arguments": c.function.arguments}}
                    for i, c in enumerate(m.tool_calls)]
            if m.tool_name:
                d["name"] = m.tool_name
            messages.append(d)
        if not messages:
            raise BadRequest("messages must not be empty")
        tools = None
        if req.tools is not None:
            try:
                tools = declared_tools(req.tools)
            except ToolSchemaError as e:
                raise BadRequest(str(e)) from None
        stop = list(req.options.stop or []) if req.options else []
        return ChatCall(messages=messages, tools=tools, max_tokens=max_tokens, sampling=sampling,
                        stop=stop, json_schema=_ollama_schema(req.format))

    def _ollama_stats(self, result: ChatResult) -> dict:
        ns = int(result.seconds * 1e9)
        return {"done": True, "done_reason": "stop" if result.finish_reason == "tool_calls"
                else result.finish_reason, "total_duration": ns, "load_duration": 0,
                "prompt_eval_count": result.usage.prompt_tokens - result.usage.cached_tokens,
                "prompt_eval_duration": 0, "eval_count": result.usage.completion_tokens,
                "eval_duration": ns}

    @staticmethod
    def _ollama_message(result: ChatResult, content: str | None = None) -> dict:
        message: dict = {"role": "assistant",
                         "content": result.content or "" if content is None else content}
        if result.tool_calls:
            message["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}}
                                     for c in result.tool_calls]
        return message

    async def ollama_chat(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.OllamaChatRequest)
            self._check_model(req.model, ollama=True)
            call = self._ollama_call(req)
            head = {"model": req.model}
            if req.stream:
                prep = await self._call(lambda: self.service.prepare(call))
                events = self._stream(lambda on_text, cancelled: self.service.chat(
                    prep, on_text, cancelled, streaming=True))
                return StreamingResponse(self._ollama_ndjson(events, head, chat=True),
                                         media_type="application/x-ndjson")
            result = await self._run(request, lambda cancelled: self.service.chat(call, None, cancelled))
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        return JSONResponse({**head, "created_at": _now_iso(),
                             "message": self._ollama_message(result), **self._ollama_stats(result)})

    async def _ollama_ndjson(self, events, head: dict, chat: bool) -> AsyncIterator[str]:
        def line(body: dict) -> str:
            return json.dumps({**head, "created_at": _now_iso(), **body}, ensure_ascii=False) + "\n"

        async for kind, value in events:
            if kind == "text":
                part = {"message": {"role": "assistant", "content": value}} if chat \
                    else {"response": value}
                yield line({**part, "done": False})
            elif kind == "error":
                yield line({"error": str(value)})
            elif kind == "result":
                if chat and value.tool_calls:
                    yield line({"message": self._ollama_message(value, ""), "done": False})
                part = {"message": {"role": "assistant", "content": ""}} if chat \
                    else {"response": ""}
                yield line({**part, **self._ollama_stats(value)})

    async def ollama_generate(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.OllamaGenerateRequest)
            self._check_model(req.model, ollama=True)
            max_tokens, sampling = self._ollama_sampling(req.options)
            stop = list(req.options.stop or []) if req.options else []
            head = {"model": req.model}
            if not req.prompt:  # Ollama's "load the model" request
                return JSONResponse({**head, "created_at": _now_iso(), "response": "",
                                     "done": True, "done_reason": "load"})

            prepared = await self._call(lambda: self.service.prepare_completion(
                req.prompt, raw=req.raw, system=req.system,
                json_schema=_ollama_schema(req.format)))

            def work(on_text, cancelled):
                return self.service.complete(
                    prepared, max_tokens=max_tokens or self.service.default_max_tokens,
                    sampling=sampling, stop=stop, on_text=on_text, cancelled=cancelled)

            if req.stream:
                return StreamingResponse(self._ollama_ndjson(self._stream(work), head, chat=False),
                                         media_type="application/x-ndjson")
            result = await self._run(request, lambda cancelled: work(None, cancelled))
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        return JSONResponse({**head, "created_at": _now_iso(), "response": result.content or "",
                             **self._ollama_stats(result)})

    async def ollama_tags(self, request: Request) -> Response:
        s, ident = self.service, self.service.lm.identity
        path = s.lm.path
        size = path.stat().st_size if path.is_file() else 0
        return JSONResponse({"models": [{
            "name": s.model_name, "model": s.model_name,
            "modified_at": datetime.fromtimestamp(s.created, timezone.utc).isoformat(),
            "size": size, "digest": ident.fingerprint.rsplit(":", 1)[-1],
            "details": {"format": ident.format, "family": getattr(s.lm.model, "model_type", ""),
                        "parameter_size": "", "quantization_level": ident.weight_format}}]})

    async def ollama_show(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except json.JSONDecodeError:
            return JSONResponse({"error": "the body is not valid JSON"}, status_code=400)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if name not in self.names:
            return JSONResponse({"error": f"model {name!r} not found"}, status_code=404)
        s, ident = self.service, self.service.lm.identity
        return JSONResponse({
            "modelfile": "", "parameters": "", "template": s.lm.chat.template,
            "details": {"format": ident.format,
                        "family": getattr(s.lm.model, "model_type", ""),
                        "quantization_level": ident.weight_format},
            "model_info": {"general.architecture": getattr(s.lm.model, "model_type", ""),
                           "context_length": s.context_length},
            "capabilities": ["completion", "tools"]})

    async def ollama_version(self, request: Request) -> Response:
        return JSONResponse({"version": VERSION})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.service.model_name,
                             "cancelled_generations": self.service.cancelled})


def _schema_of(fmt: schema.ResponseFormat | None) -> dict | None:
    """OpenAI's ``response_format`` as a JSON schema for the grammar (None: free text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    if fmt.json_schema is None or not fmt.json_schema.schema:
        raise BadRequest("response_format json_schema needs json_schema.schema",
                         param="response_format")
    return fmt.json_schema.schema


def _ollama_schema(fmt: Any) -> dict | None:
    """Ollama's ``format``: "json", a JSON schema, or nothing."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "object"}
    if isinstance(fmt, dict):
        return fmt
    raise BadRequest('format must be "json" or a JSON schema')


def make_app(service: ChatService, default_sampling: SamplingParams = SamplingParams(),
             pool: ThreadPoolExecutor | None = None) -> Starlette:
    server = Server(service, default_sampling, pool)
    routes = [
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/api/chat", server.ollama_chat, methods=["POST"]),
        Route("/api/generate", server.ollama_generate, methods=["POST"]),
        Route("/api/tags", server.ollama_tags, methods=["GET"]),
        Route("/api/version", server.ollama_version, methods=["GET"]),
        Route("/api/show", server.ollama_show, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await server.shutdown()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = server
    return app

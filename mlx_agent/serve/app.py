"""The HTTP surface: OpenAI and Ollama routes over one :class:`ChatService` (Starlette).

Handlers decode the body (:mod:`.schema`), turn it into a chat call with the API's adapter
(:mod:`.openai_api`, :mod:`.ollama_api`), render and check it off the model thread, run it on
the model thread, and hand the result back to the adapter. Bad JSON, a wrong type, an unknown
role, a limit out of range or JSON nested too deeply is a 400 with an OpenAI-style error body
(Ollama endpoints: ``{"error": ...}``); an unknown model is a 404 (code ``model_not_found``),
as both APIs answer; a body over ``max_body_bytes`` is a 413. Model work runs on one worker
thread per lane of the service (one, unless it batches): requests beyond that wait in
arrival order. A client that disconnects
stops its generation at the next token; a request whose client left while it waited does no
work.

Not promised: ``n > 1``, logprobs, images, or more than one model per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine import SamplingParams
from ..errors import UserFacingError
from ..thread_state import executor
from . import ollama_api, openai_api, schema
from .common import BadRequest, Limits
from .service import ChatCall, ChatResult, ChatService

VERSION = "0.1.0"
SHUTTING_DOWN = "the server is shutting down; send the request again once it is back"
DEFAULT_MAX_BODY = 8 * 1024 * 1024


class Server:
    def __init__(self, service: ChatService, default_sampling: SamplingParams = SamplingParams(),
                 pool: ThreadPoolExecutor | None = None, max_body_bytes: int = DEFAULT_MAX_BODY):
        self.service = service
        self.limits = Limits(service.context_length, default_sampling, service.lm.vocab_size)
        self.max_body_bytes = max_body_bytes
        # a thread per lane (one lane: the thread that touches the model; pass the one that
        # loaded it, on Metal)
        self.pool = pool or executor(len(service.lanes), "mlx-agent-model")
        # rendering and tokenizing requests: off the model thread, so a big one blocks no one
        self.prep_pool = executor(2, "mlx-agent-prep")
        self.names = {service.model_name, f"{service.model_name}:latest"}
        self.live: set[threading.Event] = set()  # cancel flags of running requests
        self.stopping = False  # the process is shutting down: see stop()

    def stop(self) -> None:
        """The process is shutting down (SIGTERM, Ctrl-C): running generations stop at their
        next token (or prefill chunk) and answer 503, as does any request after this one.
        Called from the signal handler, so the clients are told at once rather than after
        the server's grace period for open connections."""
        self.stopping = True
        for cancel in list(self.live):
            cancel.set()

    async def shutdown(self) -> None:
        self.stop()
        self.prep_pool.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.pool.shutdown, wait=True, cancel_futures=True)

    # -- plumbing --------------------------------------------------------------------------

    async def _read(self, request: Request) -> bytes:
        """The body, refused with a 413 past ``max_body_bytes`` without reading the rest."""
        limit = self.max_body_bytes
        too_big = BadRequest(f"the request body is over {limit} bytes; send less (or start "
                             "the server with a larger --max-body-bytes)", status=413)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_big
        except ClientDisconnect:  # gone mid-body: nobody to answer, nothing to log
            raise BadRequest("the client left before the whole body came") from None
        return bytes(body)

    async def _body(self, request: Request, kind: type) -> Any:
        raw = await self._read(request)
        try:
            return schema.decode(raw, kind)
        except schema.InvalidBody as e:
            raise BadRequest(str(e), param=e.param) from None

    def _check_model(self, name: str | None) -> None:
        """A 404, as OpenAI and Ollama answer a model they do not serve."""
        if name is not None and name not in self.names:
            raise BadRequest(f"model {name!r} not found; this server serves "
                             f"{self.service.model_name!r}", status=404,
                             code="model_not_found", param="model")

    async def _prepare(self, fn: Callable[[], Any]) -> Any:
        """Check and render a request off the model thread."""
        self._check_running()
        return await self._settle(asyncio.get_running_loop().run_in_executor(self.prep_pool, fn))

    def _check_running(self, result: ChatResult | None = None) -> None:
        """A 503 once the server is stopping: for a request not yet started, or for one
        whose generation the shutdown cut (``result``, finished "cancelled")."""
        if self.stopping and (result is None or result.finish_reason == "cancelled"):
            raise BadRequest(SHUTTING_DOWN, status=503, code="server_shutting_down")

    async def _run(self, request: Request, fn: Callable[[Callable[[], bool]], ChatResult]
                   ) -> ChatResult:
        """Run ``fn(cancelled)`` on the model thread; a client that leaves cancels it."""
        cancel = threading.Event()
        self.live.add(cancel)
        if self.stopping:  # stop() ran while this request was being prepared
            cancel.set()
        job = asyncio.get_running_loop().run_in_executor(self.pool, fn, cancel.is_set)

        async def watch():
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    cancel.set()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            result = await self._settle(job)
            self._check_running(result)
            return result
        finally:  # done, failed, or this handler was cancelled: stop the generation
            cancel.set()
            self.live.discard(cancel)
            watcher.cancel()

    @staticmethod
    async def _settle(job):
        try:
            return await job
        except UserFacingError as e:
            raise BadRequest(str(e), param=e.param) from None
        except RecursionError:
            raise BadRequest("the request is nested too deeply to use") from None

    def _stream(self, fn: Callable[[Callable[[str], None], Callable[[], bool]], ChatResult]
                ) -> AsyncIterator[tuple[str, Any]]:
        """Run ``fn(on_text, cancelled)`` on the model thread; yields ("text", str) as the
        model writes and then ("result", ChatResult) or ("error", BadRequest)."""
        async def events():
            loop = asyncio.get_running_loop()
            queue: asyncio.Queue = asyncio.Queue()
            cancel = threading.Event()
            self.live.add(cancel)
            if self.stopping:  # stop() ran while this request was being prepared
                cancel.set()

            def on_text(text: str) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, ("text", text))

            job = loop.run_in_executor(self.pool, fn, on_text, cancel.is_set)
            job.add_done_callback(lambda _: queue.put_nowait(("done", None)))
            try:
                while (item := await queue.get())[0] != "done":
                    yield item
                try:
                    result = await self._settle(job)
                    self._check_running(result)
                    yield "result", result
                except BadRequest as e:
                    yield "error", e
                except Exception as e:  # a bug of ours, after the headers went out
                    yield "error", BadRequest(f"internal error: {e}", status=500,
                                              code="server_error")
            finally:  # the client left (or the stream ended): stop generating
                cancel.set()
                self.live.discard(cancel)

        return events()

    async def _chat(self, request: Request, call: ChatCall, stream: bool):
        """A chat call: its result, or (when ``stream``) the events of its generation."""
        prep = await self._prepare(lambda: self.service.prepare(call))
        if stream:  # a bad request was a 400 above, before the stream starts
            return self._stream(lambda on_text, cancelled: self.service.chat(
                prep, on_text, cancelled, streaming=True))
        return await self._run(request, lambda cancelled: self.service.chat(prep, None, cancelled))

    # -- OpenAI ----------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.ChatRequest)
            self._check_model(req.model)
            out = await self._chat(request, openai_api.chat_call(req, self.limits), req.stream)
        except BadRequest as e:
            return JSONResponse(openai_api.error_body(e), status_code=e.status)
        if req.stream:
            return StreamingResponse(openai_api.chat_chunks(out, self.service.model_name,
                                                            req.include_usage),
                                     media_type="text/event-stream")
        return JSONResponse(openai_api.chat_response(out, self.service.model_name))

    async def completions(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.CompletionRequest)
            self._check_model(req.model)
            prompt = openai_api.completion_prompt(req, self.service.lm.vocab_size)
            max_tokens, sampling = self.limits(req.max_tokens, req.temperature, req.top_p,
                                               req.seed, req.top_k, req.min_p,
                                               **openai_api.penalties(req))
            prepared = await self._prepare(lambda: self.service.prepare_completion(prompt))

            def work(on_text, cancelled):
                return self.service.complete(prepared, max_tokens=max_tokens, sampling=sampling,
                                             stop=req.stops(), on_text=on_text,
                                             cancelled=cancelled)

            head = openai_api.completion_head(self.service.model_name)
            if not isinstance(prompt, str):  # token ids: echoed as their text
                prompt = self.service.lm.decode(prompt) if req.echo else ""
            if req.stream:
                return StreamingResponse(openai_api.completion_chunks(
                    self._stream(work), head, prompt, req.echo, req.include_usage),
                    media_type="text/event-stream")
            result = await self._run(request, lambda cancelled: work(None, cancelled))
        except BadRequest as e:
            return JSONResponse(openai_api.error_body(e), status_code=e.status)
        return JSONResponse(openai_api.completion_response(result, head, prompt, req.echo))

    def _model(self) -> dict:
        return {"id": self.service.model_name, "object": "model",
                "created": self.service.created, "owned_by": "mlx_agent"}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        try:
            self._check_model(request.path_params["model"])
        except BadRequest as e:
            return JSONResponse(openai_api.error_body(e), status_code=e.status)
        return JSONResponse(self._model())

    # -- Ollama ----------------------------------------------------------------------------

    async def ollama_chat(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.OllamaChatRequest)
            self._check_model(req.model)
            if not req.messages:  # Ollama's "load the model" request
                ollama_api.sampling(req.options, self.limits)  # its options still checked
                return JSONResponse(ollama_api.loaded(req.model, chat=True))
            out = await self._chat(request, ollama_api.chat_call(req, self.limits), req.stream)
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        if req.stream:
            return StreamingResponse(ollama_api.lines(out, req.model, chat=True),
                                     media_type="application/x-ndjson")
        return JSONResponse(ollama_api.chat_response(out, req.model))

    async def ollama_generate(self, request: Request) -> Response:
        try:
            req = await self._body(request, schema.OllamaGenerateRequest)
            self._check_model(req.model)
            max_tokens, sampling = ollama_api.sampling(req.options, self.limits)
            if req.images:
                raise BadRequest(ollama_api.NO_IMAGES)
            ollama_api.check_generate(req)
            if not req.prompt:  # Ollama's "load the model" request
                return JSONResponse(ollama_api.loaded(req.model, chat=False))
            prepared = await self._prepare(lambda: self.service.prepare_completion(
                req.prompt, raw=req.raw, system=req.system,
                json_schema=ollama_api.format_schema(req.format), schema_field="format"))

            def work(on_text, cancelled):
                return self.service.complete(
                    prepared, max_tokens=max_tokens or self.service.default_max_tokens,
                    sampling=sampling, stop=ollama_api.stops(req.options), on_text=on_text,
                    cancelled=cancelled)

            if req.stream:
                return StreamingResponse(ollama_api.lines(self._stream(work), req.model,
                                                          chat=False),
                                         media_type="application/x-ndjson")
            result = await self._run(request, lambda cancelled: work(None, cancelled))
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        return JSONResponse(ollama_api.generate_response(result, req.model))

    async def ollama_tags(self, request: Request) -> Response:
        return JSONResponse(ollama_api.tags(self.service))

    async def ollama_show(self, request: Request) -> Response:
        try:
            body = json.loads(await self._read(request) or b"{}")
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, and
            # int()'s refusal of a number of more than 4,300 digits
            return JSONResponse({"error": "the body is not valid JSON (or is nested too "
                                          "deeply)"}, status_code=400)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            return JSONResponse({"error": "the body needs \"model\": a model's name"},
                                status_code=400)
        if name not in self.names:
            return JSONResponse({"error": f"model {name!r} not found"}, status_code=404)
        return JSONResponse(ollama_api.show(self.service))

    async def ollama_version(self, request: Request) -> Response:
        return JSONResponse({"version": VERSION})

    async def root(self, request: Request) -> Response:
        """Ollama's heartbeat (its CLI sends ``HEAD /`` before anything else)."""
        return PlainTextResponse(f"mlx_agent is running ({self.service.model_name})")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.service.model_name,
                             "cancelled_generations": self.service.cancelled})


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """An unknown path or a wrong method, in the API's error shape rather than plain text."""
    path, method = request.url.path, request.method
    if exc.status_code == 404:
        served = [route.path.replace(":path}", "}") for route in request.app.routes]
        message = f"no endpoint {path}; this server has {', '.join(served)}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{path} does not take {method}; use {allowed or 'another method'}"
    else:
        message = exc.detail
    if path.startswith("/api/"):
        body: dict = {"error": message}
    else:
        body = openai_api.error_body(BadRequest(message, status=exc.status_code))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def make_app(service: ChatService, default_sampling: SamplingParams = SamplingParams(),
             pool: ThreadPoolExecutor | None = None,
             max_body_bytes: int = DEFAULT_MAX_BODY) -> Starlette:
    server = Server(service, default_sampling, pool, max_body_bytes)
    routes = [
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.model, methods=["GET"]),
        Route("/api/chat", server.ollama_chat, methods=["POST"]),
        Route("/api/generate", server.ollama_generate, methods=["POST"]),
        Route("/api/tags", server.ollama_tags, methods=["GET"]),
        Route("/api/version", server.ollama_version, methods=["GET"]),
        Route("/api/show", server.ollama_show, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/", server.root, methods=["GET"]),  # HEAD too
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        await server.shutdown()

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error})
    app.state.server = server
    return app

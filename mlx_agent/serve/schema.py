"""Request bodies of the OpenAI and Ollama APIs, as msgspec structs.

Decoding is the validation: a known field of the wrong type is a :class:`msgspec.ValidationError`
that names it (the server answers 400). Fields this server does not use are accepted and
ignored, as OpenAI's own server does with fields it does not know, so clients that send
``user`` or ``keep_alive`` work unchanged, and a null reads as the field left out
(:class:`Body`); a chat request's ``logprobs: false`` is accepted,
``logprobs: true`` or a ``top_logprobs`` above 0 refused (this server computes none), as
are the deprecated ``functions`` and a named ``function_call`` (send tools), and
so is a text completion's ``logprobs`` (any number), ``best_of`` above 1 or ``suffix``.
Responses are plain dicts built by :mod:`.openai_api` and :mod:`.ollama_api`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Struct

Role = Literal["system", "developer", "user", "assistant", "tool"]
# Stop strings are matched against the reply at every token on the model thread: a thousand
# of a thousand characters each held it for a second a token, every other request waiting
# (OpenAI takes 4)
MAX_STOPS, MAX_STOP_CHARS = 16, 256
Stop = Annotated[str, msgspec.Meta(max_length=MAX_STOP_CHARS)]
Stops = Annotated[list[Stop], msgspec.Meta(max_length=MAX_STOPS)]


class Body(Struct, kw_only=True):
    """A request body (or a part of one) whose ``X | None`` fields with a default read a null
    as the field left out, as OpenAI does and Ollama's Go decoder does (it skips nulls):
    clients that write every field, null when unset, send ``"stream": null``."""

    def __post_init__(self):
        kind = type(self)
        # looked up once a class: fields() per struct took 13 s for 200,000 messages
        if (defaults := _DEFAULTS.get(kind)) is None:
            defaults = _DEFAULTS[kind] = [
                (f.name, f.default) for f in msgspec.structs.fields(kind)
                if f.default not in (None, msgspec.NODEFAULT)]
        for name, default in defaults:
            if getattr(self, name) is None:
                setattr(self, name, default)


_DEFAULTS: dict[type, list[tuple[str, Any]]] = {}


class FunctionCall(Struct):
    name: str
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCall(Struct):
    function: FunctionCall
    id: str = ""
    type: str = "function"


class Message(Struct):
    role: Role
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class NamedFunction(Struct):
    name: str


class NamedToolChoice(Struct):
    function: NamedFunction
    type: Literal["function"] = "function"


class StreamOptions(Body):
    include_usage: bool | None = False


class JsonSchemaFormat(Struct):
    schema: dict[str, Any] = {}
    name: str = ""
    strict: bool | None = None


class ResponseFormat(Struct):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _OpenAIRequest(Body, kw_only=True):
    """The fields chat and text completions share."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not OpenAI's: the extras vLLM's and llama.cpp's servers take
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: Union[Stop, Stops, None] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_OpenAIRequest, kw_only=True):
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = True
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None  # refused when true: the server has none to give
    top_logprobs: int | None = None
    functions: list[Any] | None = None  # OpenAI's deprecated tools: refused, not ignored
    function_call: Any = None


class CompletionRequest(_OpenAIRequest, kw_only=True):
    # text, or token ids, alone or as a one-item batch (msgspec takes one array type a
    # union: the items are checked by openai_api.completion_prompt)
    prompt: Union[str, list[Any]]
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None  # refused unless null: the server has none to give
    best_of: int | None = None  # refused above 1, as n is
    suffix: str | None = None  # refused unless empty: text is only ever continued


class OllamaOptions(Struct):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_predict: int | None = None
    stop: Stops | None = None


class OllamaToolCall(Struct):
    function: FunctionCall


class OllamaMessage(Body):
    role: Role
    content: str | None = ""
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    images: list[str] | None = None


class OllamaChatRequest(Body):
    model: str
    messages: list[OllamaMessage]
    tools: list[dict[str, Any]] | None = None
    stream: bool | None = True
    options: OllamaOptions | None = None
    format: Any = None


class OllamaGenerateRequest(Body):
    model: str
    prompt: str | None = ""
    system: str | None = None
    raw: bool | None = False
    images: list[str] | None = None  # refused: this model reads text
    stream: bool | None = True
    options: OllamaOptions | None = None
    format: Any = None
    suffix: str | None = None  # refused unless empty: text is only ever continued
    template: str | None = None  # refused unless empty: the model's own chat template is used
    context: list[int] | None = None  # refused unless empty: send /api/chat messages


class InvalidBody(ValueError):
    """A body that does not decode; ``param``: the field at fault, when one is."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def decode(body: bytes, kind: type) -> Any:
    """``body`` as ``kind``; raises :class:`InvalidBody` with a message fit for the client."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        at = re.search(r" - at `\$\.(.+)`$", str(e))  # msgspec's path: `$.messages[0].role`
        raise InvalidBody(f"invalid request: {e}", at and at.group(1)) from None
    except msgspec.DecodeError as e:
        raise InvalidBody(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise InvalidBody("the body is nested too deeply; send JSON nested less than "
                          "a few hundred levels") from None

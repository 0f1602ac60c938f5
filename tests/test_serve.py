"""The server over real sockets: the official ``openai`` client, raw HTTP for Ollama, a
random tiny model (real tokenizer and grammar) or a scripted one, started on port 0."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import mlx.core as mx
import pytest

from mlx_agent.batch_runner import BatchRunner
from mlx_agent.engine import SamplingParams
from mlx_agent.serve import ChatCall, ChatService, http, make_app
from mlx_agent.formats import tool_info
from mlx_agent.formats.streams import JsonAnswerStream
from mlx_agent.serve.service import StopStrings
from mlx_agent.tools import declared_tools

openai = pytest.importorskip("openai")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.\nMore detail here.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {
        "name": "set_timer", "description": "Start a timer.",
        "parameters": {"type": "object", "required": ["minutes"], "properties": {
            "minutes": {"type": "integer"}}}}},
]


class Scripted:
    """Per generation, the next scripted reply's ids, then the end-of-turn token."""

    def __init__(self, lm, *replies: str):
        self.lm, self.replies = lm, list(replies)

    def __call__(self, sampling):
        ids = self.lm.encode(self.replies.pop(0)) if self.replies else []
        end = self.lm.encode("<|im_end|>")[0]

        def sample(logprobs):
            return mx.array([ids.pop(0) if ids else end])

        return sample


class Running:
    """A real uvicorn server on a free port, in a thread."""

    def __init__(self, service, sampling=SamplingParams(), **limits):
        import uvicorn

        self.service = service
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(http.config(make_app(service, sampling), **limits))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=f"{self.base}/v1", api_key="none", max_retries=0)

    def post(self, path: str, body) -> tuple[int, dict | list]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
                status, kind = r.status, r.headers.get("content-type", "")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        if kind.startswith("application/x-ndjson"):
            return status, [json.loads(line) for line in text.splitlines() if line.strip()]
        return status, json.loads(text)

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve(tiny_lm):
    running = []

    def start(lm=tiny_lm, **kw):
        sampling = kw.pop("sampling", SamplingParams())
        limits = {k: kw.pop(k) for k in ("request_timeout", "max_connections") if k in kw}
        r = Running(ChatService(lm, model_name="tiny", **kw), sampling, **limits)
        running.append(r)
        return r

    yield start
    for r in running:
        r.stop()


def user(text):
    return [{"role": "user", "content": text}]


def test_plain_chat_and_streaming_give_the_same_text(serve):
    s = serve()
    r = s.client.chat.completions.create(model="tiny", messages=user("Hello"), max_tokens=12)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    chunks = list(s.client.chat.completions.create(
        model="tiny", messages=user("Hello"), max_tokens=12, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert [m.id for m in s.client.models.list().data] == ["tiny"]


def test_tool_call_round_trip(serve, tiny_lm):
    call = '{"tool":"get_weather","arguments":{"city":"Paris"}}'
    s = serve(sampler_for=Scripted(tiny_lm, call, '{"answer":"Sunny in Paris."}'))
    messages = user("Weather in Paris?")
    r = s.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    (tc,) = r.choices[0].message.tool_calls
    assert tc.id.startswith("call_") and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    messages += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tc.id, "content": "18 C, sunny"}]
    r2 = s.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    assert r2.choices[0].message.content == "Sunny in Paris."
    assert r2.choices[0].finish_reason == "stop"
    # the cached prefix runs through the first reply: it is rendered with the ids sampled
    first = r.usage.prompt_tokens + r.usage.completion_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens >= first - 1


def test_streamed_tool_calls_and_answers(serve, tiny_lm):
    call = '{"tool":"set_timer","arguments":{"minutes":5}}'
    answer = '{"answer":"Café \\"ok\\" 😀\\n done"}'  # escapes as the grammar allows them
    s = serve(sampler_for=Scripted(tiny_lm, call, answer))
    chunks = list(s.client.chat.completions.create(model="tiny", messages=user("5 min timer"),
                                                   tools=TOOLS, stream=True))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [("set_timer", {"minutes": 5})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(not c.choices[0].delta.content for c in chunks)  # no raw JSON as content
    # content null, not "", as OpenAI streams a tool call: the SDK's accumulated message
    # (its stream helper's final completion) had content '' beside the calls
    assert chunks[0].choices[0].delta.content is None
    again = serve(sampler_for=Scripted(tiny_lm, call))
    with again.client.chat.completions.stream(model="tiny", messages=user("5 min timer"),
                                              tools=TOOLS) as stream:
        final = stream.get_final_completion().choices[0].message
    assert final.content is None and final.tool_calls[0].function.name == "set_timer"
    chunks = list(s.client.chat.completions.create(model="tiny", messages=user("hi"),
                                                   tools=TOOLS, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == 'Café "ok" 😀\n done'


@pytest.mark.parametrize("choice", ["required", "set_timer", "none"])
def test_tool_choice_is_enforced_by_the_grammar(serve, choice):
    """A random model sampled at temperature 1 obeys tool_choice every time."""
    s = serve(default_max_tokens=160)
    tool_choice = {"type": "function", "function": {"name": choice}} \
        if choice == "set_timer" else choice
    for seed in range(3):
        r = s.client.chat.completions.create(model="tiny", messages=user("Do something"),
                                             tools=TOOLS, tool_choice=tool_choice,
                                             temperature=1.0, seed=seed)
        m = r.choices[0].message
        if choice == "none":
            assert not m.tool_calls and isinstance(m.content, str)
            continue
        assert m.tool_calls, m.content
        names = {tc.function.name for tc in m.tool_calls}
        assert names <= ({"set_timer"} if choice == "set_timer" else {"get_weather", "set_timer"})
        for tc in m.tool_calls:  # arguments always valid against the schema
            tool = {t.name: t for t in declared_tools(TOOLS)}[tc.function.name]
            assert tool.validate(json.loads(tc.function.arguments)) == []


def test_parallel_calls_in_one_reply_and_a_repeat_is_cut(serve, tiny_lm):
    two = ('{"tool":"get_weather","arguments":{"city":"Paris"}}\n'
           '{"tool":"get_weather","arguments":{"city":"Oslo"}}\n'
           '{"tool":"get_weather","arguments":{"city":"Paris"}}\n'
           '{"tool":"get_weather","arguments":{"city":"Rome"}}')
    s = serve(sampler_for=Scripted(tiny_lm, two))
    r = s.client.chat.completions.create(model="tiny", messages=user("Paris and Oslo"),
                                         tools=TOOLS)
    cities = [json.loads(tc.function.arguments)["city"] for tc in r.choices[0].message.tool_calls]
    assert cities == ["Paris", "Oslo"]  # the model repeated Paris: generation stopped there


def test_ollama_endpoints(serve, tiny_lm):
    call = '{"tool":"get_weather","arguments":{"city":"Oslo"}}'
    s = serve(sampler_for=Scripted(tiny_lm, call, '{"answer":"Cold."}', "Hi there", call,
                                   "Once more"))
    status, r = s.post("/api/chat", {"model": "tiny", "stream": False, "tools": TOOLS,
                                     "messages": user("Oslo weather?")})
    assert status == 200 and r["done"] is True
    assert r["message"]["tool_calls"] == [{"function": {"name": "get_weather",
                                                        "arguments": {"city": "Oslo"}}}]
    msgs = user("Oslo weather?") + [r["message"], {"role": "tool", "content": "-3 C",
                                                   "tool_name": "get_weather"}]
    status, r = s.post("/api/chat", {"model": "tiny", "stream": False, "tools": TOOLS,
                                     "messages": msgs})
    assert r["message"]["content"] == "Cold." and r["eval_count"] > 0
    status, lines = s.post("/api/chat", {"model": "tiny:latest", "messages": user("hi"),
                                         "options": {"num_predict": 5}})
    assert status == 200 and lines[-1]["done"] is True and not any(x["done"] for x in lines[:-1])
    assert "".join(x["message"]["content"] for x in lines) == "Hi there" and len(lines) > 2
    status, lines = s.post("/api/chat", {"model": "tiny", "tools": TOOLS,
                                         "messages": user("Oslo?")})
    assert lines[-2]["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Once", "stream": False,
                                         "options": {"num_predict": 2}})
    assert status == 200 and r["response"] == "Once more" and r["eval_count"] == 2
    assert r["done_reason"] == "length"
    status, r = s.post("/api/show", {"model": "tiny"})
    assert status == 200 and "tools" in r["capabilities"]
    for name in ([1], {"a": 1}, None):  # a list was a 500 (unhashable)
        status, r = s.post("/api/show", {"model": name})
        assert status == 400 and "model" in r["error"]
    status, r = s.post("/api/show", b'{"model": ' + b"1" * 4301 + b"}")  # was a 500
    assert status == 400 and "not valid JSON" in r["error"]
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Once", "stream": False,
                                         "options": {"num_predict": 10**9}})
    assert status == 400 and r["error"].startswith("options.num_predict must be"), r
    assert s.get("/api/tags")["models"][0]["name"] == "tiny"
    assert "version" in s.get("/api/version") and s.get("/health")["status"] == "ok"
    status, r = s.post("/api/chat", {"model": "llama3", "messages": user("hi")})
    assert status == 404 and "not found" in r["error"]
    for path, body in (("/api/generate", {"prompt": "Describe it.", "images": ["aGk="]}),
                       ("/api/chat", {"messages": [{"role": "user", "content": "Describe it.",
                                                    "images": ["aGk="]}]})):
        status, r = s.post(path, {"model": "tiny", "stream": False, **body})
        assert status == 400 and "images are not supported" in r["error"], r


def test_ollama_load_requests_answer_done_with_reason_load(serve):
    """No messages (or no prompt) is how Ollama's clients load a model: /api/chat was a 400."""
    s = serve()
    for path, body, part in (("/api/chat", {"messages": []},
                              {"message": {"role": "assistant", "content": ""}}),
                             ("/api/generate", {"prompt": ""}, {"response": ""})):
        status, r = s.post(path, {"model": "tiny", **body})
        assert status == 200, r
        assert {k: r[k] for k in ("model", "done", "done_reason", *part)} == \
            {"model": "tiny", "done": True, "done_reason": "load", **part}, r
        assert r["created_at"].endswith("Z")
        status, r = s.post(path, {"model": "tiny", **body, "options": {"temperature": 9}})
        assert status == 400 and "temperature" in r["error"], r


def test_deferred_mode_answers_get_tool_info_itself(serve, tiny_lm, tmp_path):
    info = '{"tool":"get_tool_info","arguments":{"name":"get_weather"}}'
    call = '{"tool":"get_weather","arguments":{"city":"Rome","unit":"c"}}'
    metrics = tmp_path / "m.jsonl"
    s = serve(sampler_for=Scripted(tiny_lm, info, call, info, call, info, info, info, call),
              tool_mode="deferred", metrics_out=metrics)
    r = s.client.chat.completions.create(model="tiny", messages=user("Rome?"), tools=TOOLS)
    (tc,) = r.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == \
        ("get_weather", {"city": "Rome", "unit": "c"})
    chunks = list(s.client.chat.completions.create(model="tiny", messages=user("Rome?"),
                                                   tools=TOOLS, stream=True))
    names = [tc.function.name for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert names == ["get_weather"]
    r = s.client.chat.completions.create(model="tiny", messages=user("Rome?"), tools=TOOLS)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(m["get_tool_info_hops"], m["streaming"], m["tool_mode"]) for m in rows] == \
        [(1, False, "deferred"), (1, True, "deferred"), (3, False, "deferred")]
    assert all(m["prompt_tokens"] > 0 and m["completion_tokens"] > 0 for m in rows)


def test_deferred_prompt_is_an_index_and_the_hop_cap_drops_get_tool_info(tiny_lm):
    from mlx_agent.formats import make_format

    tools = declared_tools(TOOLS)
    fmt = make_format("json", tiny_lm)
    text = tiny_lm.decode(fmt.prompt_ids(user("hi"), tools, deferred=True))
    assert "- get_weather: Current weather in a city." in text and "More detail" not in text
    assert "get_tool_info(name: string)" in text and "city: string" not in text
    full = tiny_lm.decode(fmt.prompt_ids(user("hi"), tools, deferred=False))
    assert "get_weather(city: string, unit?: string)" in full
    service = ChatService(tiny_lm, tool_mode="deferred")
    prep = service.prepare(ChatCall(messages=user("hi"), tools=tools))
    ask = tiny_lm.encode('{"tool":"get_tool_info","arguments":{"name":"set_timer"}}')
    for hops, ok in ((0, True), (2, True), (3, False)):  # MAX_HOPS = 3
        c = service._constraint(prep, hops, prep.call.messages)
        assert (c.matcher.validate_tokens(ask) == len(ask)) is ok
    assert json.loads(tool_info(tools, "set_timer"))["parameters"]["required"] == ["minutes"]
    assert "unknown tool 'nope'" in json.loads(tool_info(tools, "nope"))["error"]


def test_prefix_reuse_across_requests_matches_a_fresh_server(serve, tiny_lm):
    s = serve()
    kw = dict(model="tiny", max_tokens=8)
    cats = "Tell me about cats: their history, their habits, and how to care for them."
    first = s.client.chat.completions.create(messages=user(cats), **kw)
    convo = user(cats) + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And dogs?"}]
    other = s.client.chat.completions.create(messages=user("Something else entirely, " * 4), **kw)
    second = s.client.chat.completions.create(messages=convo, **kw)
    # the conversation's state came back from a KV slot after the other request, through
    # the first reply (rendered from the ids sampled)
    first_total = first.usage.prompt_tokens + first.usage.completion_tokens
    assert second.usage.prompt_tokens_details.cached_tokens >= first_total - 1
    no_slots = serve(kv_slots=0).client
    for messages in (user(cats), user("Something else entirely, " * 4), convo):
        r = no_slots.chat.completions.create(messages=messages, **kw)
    assert r.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens
    fresh = serve().client.chat.completions.create(messages=convo, **kw)
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert fresh.choices[0].message.content == second.choices[0].message.content
    assert other.choices[0].message.content is not None


@pytest.mark.parametrize("kv_slots", [1, 2])
def test_a_full_store_of_kv_slots_still_gives_back_the_conversation_asked_for(serve, kv_slots):
    # the live state was saved (dropping the oldest slot) before the chosen slot was popped
    # by its old index: once the store was full the wrong state came back (the one just
    # saved), and a conversation returned to after one other request was prefilled again
    s = serve(kv_slots=kv_slots)

    def cached(prompt: str) -> int:
        status, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert status == 200, r
        return r["usage"]["prompt_tokens_details"]["cached_tokens"]

    a, b, c = ("alpha " * 40, "beta " * 40, "gamma " * 40)
    for other in (c, b)[:kv_slots]:  # fill the store
        cached(other)
    cached(a)
    cached(b)  # a goes to the newest slot, the oldest out
    assert cached(a) >= 39


def _chain(n: int) -> dict:
    """A schema whose $defs name each other n deep: finite, and shallow as JSON."""
    defs = {f"d{i:05d}": {"type": "object", "required": ["n"],
                          "properties": {"n": {"$ref": f"#/$defs/d{i + 1:05d}"}}}
            for i in range(n)}
    defs[f"d{n:05d}"] = {"type": "string"}
    return {"type": "object", "properties": {"p": {"$ref": "#/$defs/d00000"}}, "$defs": defs}


def _tool(properties: dict, required: list | None = None) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": properties, **({"required": required} if required
                                                         else {})}}}


@pytest.mark.parametrize("body,needle", [
    (b'{"messages": [', "not valid JSON"),
    ({"messages": "hi"}, "Expected `array`"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, "max_tokens"),
    # 0 was read as "not sent" and the request served with max_tokens (or the default)
    ({"messages": user("hi"), "max_completion_tokens": 0, "max_tokens": 5},
     "max_completion_tokens must be between 1 and"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    # answered with a 200 and logprobs null: what was asked for silently missing
    ({"messages": user("hi"), "logprobs": True}, "logprobs are not supported"),
    ({"messages": user("hi"), "logprobs": False, "top_logprobs": 2},
     "top_logprobs is not supported"),
    # OpenAI's deprecated function calling, ignored: a forced call answered in prose
    ({"messages": user("hi"), "functions": [{"name": "f", "parameters": {"type": "object"}}]},
     "functions and function_call are not supported; send tools and tool_choice"),
    ({"messages": user("hi"), "function_call": {"name": "f"}}, "send tools and tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"function": {"name": "a b"}}]},
     "tool name"),
    ({"messages": [{"role": "user", "content": "hi"}],  # a 500 once
      "tools": [{"type": "function", "function": "get_weather"}]}, '"function" must be an object'),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
      "model": "tiny"}, '"text" must be a string'),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not a tool"),
    ({"messages": [{"role": "user", "content": "hi " * 3000}]}, "context holds"),
    ({"tools": TOOLS, "messages": [  # JSON's \ud800 escape, inside the arguments string
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "\\ud800"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}, "lone surrogate"),
    # a tool result that answers no call was a 200 (OpenAI answers 400)
    ({"messages": [{"role": "tool", "content": "r", "tool_call_id": "zzz"}]},
     "messages[0] has role tool but follows no assistant message with tool_calls"),
    ({"tools": TOOLS, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}, "messages[4] has role tool"),
    # a hostile tester's 500s: integers llguidance cannot take, or not exactly
    ({"messages": user("x"), "tools": [_tool({"a": {"type": "integer",
                                                     "maximum": 10**20}})]},
     "'parameters.properties.a.maximum' is 100000000000000000000, past the 64-bit range"),
    ({"messages": user("x"), "tools": [_tool({"a": {"const": 2**53 + 1}})]}, "past 2^53"),
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"enum": [2**53 + 1]}}}}, "'enum[0]' is 9007199254740993"),
    # checked against the meta-schema as tools' parameters are: this was a 200 with "-100"
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "number", "multipleOf": -1}}}},
     "the response_format schema: 'multipleOf' is not valid JSON Schema: -1 is less than"),
    # accepted, and the grammar dead-ended after "{": a 200 with an empty reply
    ({"messages": user("x"), "tool_choice": "required", "tools": [_tool(
        {"a": {"$ref": "#"}}, required=["a"])]}, "admits no value the grammar can finish"),
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#"}},
                                "required": ["a"]}}}}, "admits no value the grammar can finish"),
    # no recursion, and no value: the 400 spoke of endless values and a recursion's way out
    ({"messages": user("x"), "tool_choice": "required", "tools": [_tool(
        {"a": {"type": "array", "prefixItems": [{"type": "integer"}], "items": False,
               "minItems": 2}}, required=["a"])]}, "or bounds no value meets"),
    # a second probe's: a chain of $defs, shallow as JSON, crashed llguidance (a segfault:
    # the server died); a "²" or 5,000 digits as a $ref's index; a typeless endless schema
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _chain(1000)}}}, "nests more than 512 levels deep"),
    ({"messages": user("x"), "tools": [{"type": "function", "function": {
        "name": "f", "parameters": _chain(1000)}}]}, "nests more than 512 levels deep"),
    ({"messages": user("x"), "tools": [_tool({"a": {"$ref": "#/required/²"}})]},
     "points at nothing in the schema"),
    # a chain of $refs that loops: llguidance gave up a token in (an empty "stop" once)
    ({"messages": user("x"), "tool_choice": "required", "tools": [{"type": "function",
      "function": {"name": "x", "parameters": {"type": "object", "properties": {
          "p": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"$ref": "#/$defs/b"},
                                                 "b": {"$ref": "#/$defs/a"}}}}}]},
     "loops without a schema (#/$defs/a -> #/$defs/b -> #/$defs/a)"),
    ({"messages": user("x"), "tool_choice": "required", "tools": [{"type": "function",
      "function": {"name": "f", "parameters": {"properties": {"a": {"$ref": "#"}},
                                               "required": ["a"]}}}]},
     "admits no value the grammar can finish"),
    # a number of 4,301 digits in an arguments string: Python's int() refuses it
    ({"tools": TOOLS, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": ' + "1" * 4301 + "}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}, "not valid JSON"),
    # stop strings are matched at every token on the model thread: a thousand long ones
    # held it for seconds a token
    ({"messages": user("x"), "stop": ["z" * 10] * 17}, "Expected `array` of length <= 16"),
    ({"messages": user("x"), "stop": "z" * 257}, "Expected `str` of length <= 256"),
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"enum": list(range(20_001))}}}}, "more than 20,000 JSON values"),
    # llguidance writes a special token's text as that token: the stop token, mid-JSON (a
    # 200 whose content was one quote); a property name did the same to a forced call
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"enum": ["<|im_end|>"]}}}}, "holds the special token '<|im_end|>'"),
    ({"messages": user("x"), "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "^<\\|im_end\\|>$"}}}},
     "holds the special token '<|im_end|>'"),
    ({"messages": user("x"), "tool_choice": "required", "tools": [_tool(
        {"a <|im_start|>": {"type": "string"}}, required=["a <|im_start|>"])]},
     "holds the special token '<|im_start|>'"),
    # validating this many schema values held the preparing threads for seconds
    ({"messages": user("x"), "tools": [_tool({f"p{i}": {"type": "string"}
                                              for i in range(12_000)})]}, "20,000 JSON values"),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(serve, body, needle):
    s = serve(context_length=1024)
    status, r = s.post("/v1/chat/completions", body)
    assert status == 400 and needle in r["error"]["message"], r
    assert r["error"]["type"] == "invalid_request_error"
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2,
                                                "logprobs": False, "top_logprobs": 0})
    assert status == 200 and r["choices"][0]["message"]["role"] == "assistant"


def test_everything_the_prompt_renders_counts_toward_the_size_check(serve):
    """Only messages' content was counted before tokenizing: a 7.5 MB tool description or
    tool-call arguments took 12 s to tokenize before the 400, other requests waiting."""
    s = serve(context_length=1024)
    big = "x" * (s.service.max_chars + 1)
    call = {"id": "c1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": big})}}
    for path, body in [
        ("/v1/chat/completions", {"messages": user("hi"), "tools": [
            {"type": "function", "function": {"name": "f", "description": big}}]}),
        ("/v1/chat/completions", {"messages": user("hi"), "tools": [
            _tool({"a": {"type": "string", "description": big}})]}),
        ("/v1/chat/completions", {"tools": TOOLS, "messages": user("hi") + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi",
                                                "name": big}]}),
        ("/api/chat", {"model": "tiny", "messages": user("hi") + [  # arguments as an object
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": big}}}]}]}),
    ]:
        status, r = s.post(path, body)
        message = r["error"] if path.startswith("/api/") else r["error"]["message"]
        assert status == 400 and "characters, more than the 1024-token context" in message, r
    # deferred mode renders a one-line index, and one tool's schema in a hop
    deferred = serve(context_length=1024, tool_mode="deferred")
    status, r = deferred.post("/v1/chat/completions", {"messages": user("hi"), "tools": [
        _tool({"a": {"type": "string", "description": big}})]})
    assert status == 400 and "characters, more than" in r["error"]["message"], r
    status, r = deferred.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2,
                                                       "tools": TOOLS})
    assert status == 200, r


def stream_then_leave(s) -> None:
    """Start a long streamed chat, read a few lines, and go away mid-stream."""
    req = urllib.request.Request(s.base + "/v1/chat/completions", data=json.dumps(
        {"messages": user("Write a long story."), "stream": True}).encode(),
        headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=30)
    for _ in range(4):
        resp.readline()
    resp.close()


def test_a_client_that_disconnects_stops_its_generation(serve):
    s = serve(default_max_tokens=1500)
    stream_then_leave(s)
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 1})
    assert status == 200  # served after the abandoned one stopped (one worker, in order)
    assert s.service.cancelled == 1 and s.service.last_cancelled_tokens < 1500
    assert s.get("/health")["cancelled_generations"] == 1


def test_completions_endpoint_with_stop_strings(serve, tiny_lm):
    s = serve(sampler_for=Scripted(tiny_lm, "alpha beta gamma", "alpha beta gamma"))
    r = s.client.completions.create(model="tiny", prompt="Say:", max_tokens=10, stop=[" gam"])
    assert r.choices[0].text == "alpha beta" and r.choices[0].finish_reason == "stop"
    chunks = list(s.client.completions.create(model="tiny", prompt="Say:", max_tokens=10,
                                              stop=[" gam"], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "alpha beta"


@pytest.mark.parametrize("extra, needle", [
    # each was a 200 with logprobs null, one completion, no suffix: what was asked for missing
    ({"logprobs": 2}, "logprobs are not supported"),
    ({"logprobs": 0}, "logprobs are not supported"),
    ({"best_of": 3}, "best_of must be 1"),
    ({"suffix": " the end."}, "suffix is not supported"),
])
def test_completion_options_the_server_cannot_honour_are_400s(serve, extra, needle):
    s = serve()
    for stream in (False, True):
        status, r = s.post("/v1/completions", {"prompt": "Say:", "max_tokens": 2,
                                               "stream": stream, **extra})
        assert status == 400 and needle in r["error"]["message"], r
        assert r["error"]["param"] == next(iter(extra))
    status, r = s.post("/v1/completions", {"prompt": "Say:", "max_tokens": 2, "logprobs": None,
                                           "best_of": 1, "suffix": ""})
    assert status == 200 and r["choices"][0]["finish_reason"] == "length", r


@pytest.mark.parametrize("extra, needle", [
    # each was a 200: a fill-in-the-middle request came back as a plain continuation
    ({"suffix": " the end."}, "suffix is not supported"),
    ({"template": "{{ .Prompt }}"}, "template is not supported"),
    ({"context": [1, 2, 3]}, "context is not supported"),
])
def test_ollama_generate_options_the_server_cannot_honour_are_400s(serve, extra, needle):
    s = serve()
    for stream in (False, True):
        status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Say:", "stream": stream,
                                             "options": {"num_predict": 2}, **extra})
        assert status == 400 and needle in r["error"], r
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Say:", "stream": False,
                                         "options": {"num_predict": 2}, "suffix": "",
                                         "template": "", "context": []})
    assert status == 200 and r["done"], r

def test_a_completion_prompt_may_be_token_ids(serve, tiny_lm):
    # OpenAI's four prompt shapes; token ids were a 400 ("expected str")
    s = serve()
    ids = tiny_lm.encode("Say:")

    def complete(prompt, **extra):
        return s.post("/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                          **extra})

    status, text = complete("Say:")
    assert status == 200, text
    for prompt in (ids, [ids], ["Say:"]):
        status, r = complete(prompt)
        assert status == 200 and r["choices"][0]["text"] == text["choices"][0]["text"], r
        assert r["usage"]["prompt_tokens"] == len(ids)
    status, r = complete(ids, echo=True)
    assert r["choices"][0]["text"] == "Say:" + text["choices"][0]["text"], r
    for prompt, needle in (([-1], "token -1"), ([tiny_lm.vocab_size], f"token {tiny_lm.vocab_size}"),
                           ([1.5], "a list of token ids"), ([True], "a list of token ids"),
                           ([], "a list of token ids"), (["a", "b"], "one prompt per request"),
                           ([ids, ids], "one prompt per request"), ("", "the prompt is empty")):
        status, r = complete(prompt)
        assert status == 400 and needle in r["error"]["message"], (prompt, r)

def test_a_completion_keeps_the_space_its_first_token_starts_with(serve, tiny_lm):
    # mlx-lm's detokenizer drops it (right for a chat reply): "is" + "Paris" was "isParis"
    s = serve(sampler_for=Scripted(tiny_lm, *[" Paris, and the"] * 4))
    r = s.client.completions.create(model="tiny", prompt="The capital of France is",
                                    max_tokens=4)
    assert r.choices[0].text == " Paris, and the"
    chunks = s.client.completions.create(model="tiny", prompt="The capital of France is",
                                         max_tokens=4, stream=True)
    assert "".join(c.choices[0].text for c in chunks) == " Paris, and the"
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "The capital of France is",
                                         "raw": True, "stream": False})
    assert r["response"] == " Paris, and the"
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Capital of France?",
                                         "stream": False})  # a chat reply: no space
    assert r["response"] == "Paris, and the"


def test_json_answer_stream_decodes_escapes_split_anywhere():
    text = '{"answer":"a\\"b\\\\c\\u00e9\\ud83d\\ude00\\n end"}'
    for step in (1, 2, 3, 7):
        s = JsonAnswerStream()
        out = "".join(s.feed(text[i:i + step]) for i in range(0, len(text), step))
        assert out == json.loads(text)["answer"]
    s = JsonAnswerStream()
    assert s.feed('{"tool":"x","arguments":{}}') == ""


def test_stop_strings_hold_back_a_partial_match():
    s = StopStrings(["END"])
    assert s.feed("abc E") == "abc "  # "E" might start "END"
    assert s.feed("N") == ""
    assert s.feed("Dxyz") == "" and s.hit and s.text == "abc "
    assert s.feed("more after the stop") == "" and s.text == "abc "
    s = StopStrings(["ab", "xyz"])
    assert s.feed("q x") == "q " and s.feed("y") == "" and s.feed("w") == "xyw" and not s.hit


def test_hermes_models_get_tool_call_blocks(serve, tiny_lm):
    from dataclasses import replace

    from mlx_agent.chat import ChatFormat

    from .test_agent_loop import QWEN_LIKE

    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    block = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    s = serve(lm, sampler_for=Scripted(lm, block, "It is sunny."), protocol="hermes")
    r = s.client.chat.completions.create(model="tiny", messages=user("Paris?"), tools=TOOLS)
    (tc,) = r.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("get_weather", {"city": "Paris"})
    messages = user("Paris?") + [r.choices[0].message.model_dump(exclude_none=True),
                                 {"role": "tool", "tool_call_id": tc.id, "content": "sunny"}]
    chunks = list(s.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                   stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "It is sunny."


def test_the_tools_block_comes_from_the_prompt_cache(tiny_lm, tmp_path):
    from mlx_agent.prompt_cache import PromptCache

    tools = declared_tools(TOOLS)
    first = ChatService(tiny_lm, tools=tools).prime(PromptCache(tmp_path))
    service = ChatService(tiny_lm, tools=tools)
    hit = service.prime(PromptCache(tmp_path))
    assert not first.hit and hit.hit and hit.tokens == first.tokens > 50
    r = service.chat(service.prepare(ChatCall(messages=user("hi"), max_tokens=4)))
    assert r.usage.cached_tokens >= hit.tokens


def test_a_batched_service_primes_every_lane_from_the_prompt_cache(tiny_lm, tmp_path):
    """serve --max-batch with --prompt-cache-dir: saved, then loaded into each lane's engine
    on the batch runner's model thread (MLX arrays belong to the thread that made them)."""
    from mlx_agent.prompt_cache import PromptCache

    tools = declared_tools(TOOLS)
    hits = []
    for _ in range(2):  # the first saves, the second loads
        with BatchRunner(tiny_lm.model, max_batch=2) as runner:
            service = ChatService(tiny_lm, tools=tools,
                                  engines=[runner.engine(tiny_lm) for _ in range(2)])
            hits.append(service.prime(PromptCache(tmp_path)))
            preps = [service.prepare(ChatCall(messages=user("hi"), max_tokens=4))
                     for _ in range(2)]  # one each: a prepared chat holds its matcher
            results = together([lambda p=p: service.chat(p) for p in preps])
    assert not hits[0].hit and hits[1].hit and hits[1].tokens == hits[0].tokens > 50
    assert all(r.usage.cached_tokens >= hits[1].tokens for r in results)  # both lanes


@pytest.mark.real_model
def test_a_reply_ends_where_the_model_opens_a_turn_of_its_own(serve, real_model):
    # "Hi xxx...": the bundled model answers by opening a made-up next turn; the content was
    # "<|im_start|>user\nWhat is the probability of 10000?" with finish_reason "stop"
    assert real_model.encode("<|im_start|>")[0] in real_model.end_ids - real_model.stop_ids
    s = serve(real_model)
    messages = user("Hi " + "x" * 3000)
    first = s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=40)
    text = first.choices[0].message.content
    assert "<|im_start|>" not in text and "user" not in text
    assert first.choices[0].finish_reason == "stop"
    chunks = s.client.chat.completions.create(model="tiny", messages=messages, max_tokens=40,
                                             stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    # the conversation goes on from it: its turn is closed by <|im_end|> in the next prompt
    more = messages + [{"role": "assistant", "content": text}] + user("What is 2+2?")
    r = s.client.chat.completions.create(model="tiny", messages=more, max_tokens=8)
    assert r.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert "<|im_start|>" not in r.choices[0].message.content


@pytest.mark.real_model
def test_serve_command_on_a_free_port(tmp_path):
    import re
    import subprocess
    import sys

    # the default model (with its general adapter, which opens with a few words of filler);
    # one plain question it answers (with or without the adapter, 5 of 9 such are right: the
    # blend says "Mort d'Al-Ferrar" for France's capital, the first default "Paris")
    proc = subprocess.Popen([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port", "0",
                             "--max-tokens", "32"], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # start-up lines, until the address
            found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if found:
                break
        port = int(found.group(1))
        body = json.dumps({"messages": user("What is the capital of Japan?")}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
        assert "Tokyo" in reply["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port",
                        str(taken.getsockname()[1])], capture_output=True, text=True, timeout=120)
    taken.close()
    assert r.returncode == 2 and "cannot listen on" in r.stderr and "Traceback" not in r.stderr


def test_response_format_constrains_the_reply_to_the_schema(serve):
    import jsonschema

    schema = {"type": "object", "additionalProperties": False, "required": ["n", "c"],
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                             "c": {"enum": ["red", "blue"]}}}
    s = serve()
    for seed in range(3):
        r = s.client.chat.completions.create(
            model="tiny", messages=user("Pick"), temperature=1.0, seed=seed, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    status, r = s.post("/api/chat", {"model": "tiny", "stream": False, "format": schema,
                                     "messages": user("Pick"), "options": {"temperature": 1}})
    jsonschema.validate(json.loads(r["message"]["content"]), schema)
    status, r = s.post("/v1/chat/completions", {"messages": user("x"), "tools": TOOLS,
                                                "response_format": {"type": "json_object"}})
    assert status == 400 and "response_format with tools" in r["error"]["message"]
    # a server with a --tools catalogue: a request asking for JSON is not offered it
    with_tools = serve(tools=declared_tools(TOOLS))
    status, r = with_tools.post("/v1/chat/completions", {
        "messages": user("Pick"), "max_tokens": 64, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert status == 200, r
    jsonschema.validate(json.loads(r["choices"][0]["message"]["content"]), schema)
    nothing = {"type": "object", "properties": {"a": {"$ref": "#"}},  # was a 200, ""
               "required": ["a"]}
    status, r = s.post("/v1/chat/completions", {"messages": user("x"), "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": nothing}}})
    assert status == 400 and "admits no value the grammar can finish" in r["error"]["message"], r
    for path, extra in (("/api/chat", {"messages": user("x")}), ("/api/generate", {"prompt": "x"})):
        status, r = s.post(path, {"model": "tiny", "format": nothing, **extra})
        assert status == 400 and r["error"].startswith("the format schema admits no value"), r
    status, r = s.post("/api/chat", {"model": "tiny", "format": schema, "tools": TOOLS,
                                     "messages": user("x")})
    assert status == 400 and r["error"].startswith("format with tools"), r
    for path, extra in (("/api/chat", {"messages": user("x")}), ("/api/generate", {"prompt": "x"})):
        status, r = s.post(path, {"model": "tiny", "format": {"type": "nope"}, **extra})
        assert status == 400 and r["error"].startswith(
            "the format schema: 'type' is not valid JSON Schema"), r


def test_a_bad_streaming_request_is_a_400_before_the_stream(serve):
    s = serve()
    with pytest.raises(openai.BadRequestError, match="not a tool"):
        s.client.chat.completions.create(model="tiny", messages=user("x"), tools=TOOLS,
                                         stream=True, tool_choice={"type": "function",
                                                                   "function": {"name": "nope"}})
    status, r = s.post("/api/chat", {"model": "tiny", "messages": [
        {"role": "user", "content": "hi " * 3000}]})
    assert status == 400 and "context holds" in r["error"]


def test_an_answer_cut_by_the_token_limit_is_text_not_protocol(serve, tiny_lm):
    long = '{"answer":"The weather in Paris is sunny and warm today, with a light breeze."}'
    s = serve(sampler_for=Scripted(tiny_lm, long, long))
    r = s.client.chat.completions.create(model="tiny", messages=user("Paris?"), tools=TOOLS,
                                         max_tokens=8)
    chunks = list(s.client.chat.completions.create(model="tiny", messages=user("Paris?"),
                                                   tools=TOOLS, max_tokens=8, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == text
    assert text.startswith("The weather") and "{" not in text


def test_deferred_returns_real_calls_made_beside_get_tool_info(serve, tiny_lm):
    both = ('{"tool":"get_tool_info","arguments":{"name":"set_timer"}}\n'
            '{"tool":"get_weather","arguments":{"city":"Oslo"}}')
    s = serve(sampler_for=Scripted(tiny_lm, both), tool_mode="deferred")
    r = s.client.chat.completions.create(model="tiny", messages=user("Oslo?"), tools=TOOLS)
    assert [tc.function.name for tc in r.choices[0].message.tool_calls] == ["get_weather"]
    with pytest.raises(openai.BadRequestError, match="clashes"):
        s.client.chat.completions.create(model="tiny", messages=user("x"), tools=TOOLS + [
            {"type": "function", "function": {"name": "get_tool_info", "parameters": {}}}])


# -- serve --max-batch: concurrent requests decode in one batch and get what they would alone
# (greedy, the tiny random model: exact), with their own grammar, stop strings, streaming and
# cancellation

PROMPTS = ["Hello", "Write a poem about the sea.", "What is 2+2?", "Name three colours."]


@pytest.fixture
def batched(tiny_lm):
    """A server whose service has ``lanes`` batched engines, and the runner's counters."""
    started = []

    def start(lanes: int = 3, **kw):
        runner = BatchRunner(tiny_lm.model, max_batch=lanes)
        service = ChatService(tiny_lm, model_name="tiny", **kw,
                              engines=[runner.engine(tiny_lm) for _ in range(lanes)])
        r = Running(service)
        started.append((r, runner))
        return r, runner

    yield start
    for r, runner in started:
        r.stop()
        runner.close()


def together(fns):
    """Run the callables at once (one thread each); their results in order."""
    out = [None] * len(fns)
    errors = []

    def run(i, fn):
        try:
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return out


def chat(s, prompt, **kw):
    r = s.client.chat.completions.create(model="tiny", messages=user(prompt), max_tokens=24,
                                         **kw)
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


def test_concurrent_requests_share_steps_and_match_requests_served_alone(tiny_lm, batched):
    alone = Running(ChatService(tiny_lm, model_name="tiny"))
    try:
        want = [chat(alone, p) for p in PROMPTS]
    finally:
        alone.stop()
    s, runner = batched(lanes=3)
    got = together([lambda p=p: chat(s, p) for p in PROMPTS])  # four clients, three lanes
    assert got == want
    assert runner.rows_stepped > runner.steps  # steps decoded more than one request
    # streamed, concurrently: the same text as each request alone
    streams = together([lambda p=p: "".join(
        c.choices[0].delta.content or "" for c in s.client.chat.completions.create(
            model="tiny", messages=user(p), max_tokens=24, stream=True) if c.choices)
        for p in PROMPTS[:3]])
    assert streams == [w[0] for w in want[:3]]


def test_each_request_keeps_its_own_grammar_and_stop_strings(tiny_lm, batched):
    s, runner = batched(lanes=2)
    call, plain = together([
        lambda: s.client.chat.completions.create(
            model="tiny", messages=user("weather in Paris"), tools=TOOLS, max_tokens=48,
            tool_choice={"type": "function", "function": {"name": "set_timer"}}),
        lambda: s.client.completions.create(model="tiny", prompt="One, two, three",
                                            max_tokens=40, stop=["e"]),
    ])
    tc = call.choices[0].message.tool_calls
    assert tc and tc[0].function.name == "set_timer"
    assert isinstance(json.loads(tc[0].function.arguments)["minutes"], int)
    assert "e" not in plain.choices[0].text


def test_a_client_that_leaves_stops_only_its_own_generation(tiny_lm, batched):
    s, runner = batched(lanes=2, default_max_tokens=1500)
    alone = Running(ChatService(tiny_lm, model_name="tiny"))
    try:
        want = chat(alone, "Name three colours.")
    finally:
        alone.stop()

    # one client leaves mid-stream while the other request decodes beside it
    _, got = together([lambda: stream_then_leave(s), lambda: chat(s, "Name three colours.")])
    assert got == want
    deadline = time.time() + 30
    while s.service.cancelled < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert s.service.cancelled == 1 and s.service.last_cancelled_tokens < 1500


@pytest.mark.real_model
def test_serve_command_takes_max_batch():
    import subprocess
    import sys

    """The real command: --max-batch 2 serves two concurrent requests on the bundled model."""
    proc = subprocess.Popen([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port", "0",
                             "--max-batch", "2", "--max-tokens", "8"], stderr=subprocess.PIPE,
                            text=True)
    try:
        line = ""
        for line in proc.stderr:  # start-up lines, until the address
            if "serving" in line:
                break
        assert "batches of up to 2" in line, line
        base = line.rsplit(" on ", 1)[1].strip()

        def ask(prompt):
            req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(
                {"messages": user(prompt)}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())["choices"][0]["finish_reason"]

        assert together([lambda: ask("Tell me about the sea."),
                         lambda: ask("Tell me about the mountains.")]) == ["length"] * 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_requests_that_once_broke_the_server_for_everyone_after_them(serve):
    s = serve()
    # a top_k past the vocabulary: mlx-lm's filter raised inside a compiled function and
    # left MLX's random state broken, so every later unseeded sampled request was a 500
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "hi", "stream": False,
                                         "options": {"top_k": 10**6, "temperature": 1,
                                                     "num_predict": 2}})
    assert status == 200, r
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2,
                                                "temperature": 1.0})
    assert status == 200, r
    # a property schema of true or false (JSON Schema allows both) was an AttributeError
    tools = [{"type": "function", "function": {"name": "t", "description": "d", "parameters": {
        "type": "object", "properties": {"x": True, "y": False}}}}]
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 4,
                                                "tools": tools})
    assert status == 200, r


def test_a_temperature_or_top_p_too_small_for_float32_is_greedy(serve):
    """1e-300 (or 1e-39) scaled the logprobs past float32's range, or dropped every token:
    random tokens or an empty reply, with a 200. A top_p of 0, which OpenAI takes, was a
    400; it is greedy too."""
    s = serve()

    def replies(sampling: dict) -> list[str]:
        _, chat = s.post("/v1/chat/completions", {"messages": user("Hello"), "max_tokens": 8,
                                                  "seed": 1, **sampling})
        _, text = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 8, "seed": 1,
                                             **sampling})
        _, ollama = s.post("/api/generate", {"model": "tiny", "prompt": "Once", "stream": False,
                                             "options": {"num_predict": 8, "seed": 1,
                                                         **sampling}})
        return [chat["choices"][0]["message"]["content"], text["choices"][0]["text"],
                ollama["response"]]

    greedy = replies({"temperature": 0})
    assert all(greedy), greedy
    for sampling in ({"temperature": 1e-300}, {"temperature": 1e-39},
                     {"temperature": 1.0, "top_p": 1e-300}, {"temperature": 1.0, "top_p": 1e-39},
                     {"temperature": 1.0, "top_p": 0},
                     # vLLM's and llama.cpp's extras, which OpenAI clients send: ignored before
                     {"temperature": 1.0, "top_k": 1}, {"temperature": 1.0, "min_p": 0.9999}):
        assert replies(sampling) == greedy, sampling
    status, r = s.post("/v1/chat/completions", {"messages": user("Hello"), "top_p": 1.5})
    assert status == 400 and r["error"]["param"] == "top_p", r


def test_a_metrics_file_that_cannot_be_written_never_fails_a_request(serve, tmp_path, capfd):
    s = serve(metrics_out=tmp_path)  # a directory: every append fails
    for _ in range(2):
        status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2})
        assert status == 200, r
    err = capfd.readouterr().err
    assert err.count("cannot append to") == 1  # said once


def test_serve_refuses_a_metrics_path_it_cannot_write_before_loading(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port", "0",
                        "--tool-metrics-out", str(tmp_path / "missing" / "m.jsonl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "--tool-metrics-out" in r.stderr and "No such file" in r.stderr
    os.mkfifo(tmp_path / "fifo")  # opening it to append would wait for a reader
    r = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port", "0",
                        "--tool-metrics-out", str(tmp_path / "fifo")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr


def test_a_client_that_leaves_mid_body_is_no_traceback(serve, capfd):
    s = serve()
    with socket.create_connection(("127.0.0.1", s.port)) as c:
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\"")
    time.sleep(0.5)
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2})
    assert status == 200, r
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err


def test_bytes_that_are_not_http_get_a_json_400(serve):
    s = serve()
    for junk in (b"GARBAGE\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                 b"GET / HTTP/1.1\r\nHost: a\r\nHost\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(junk)
            reply = _read_all(c, 5)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, reply
        assert "not valid HTTP/1.1" in json.loads(body)["error"]["message"], reply
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2})
    assert status == 200, r


def test_a_long_prompt_stops_prefilling_when_its_client_leaves(tiny_lm):
    service = ChatService(tiny_lm, model_name="tiny")
    prep = service.prepare(ChatCall(messages=user("tell me more " * 500), max_tokens=4))
    asked = []

    def cancelled():  # the client is there when the request starts, gone a chunk later
        asked.append(1)
        return len(asked) > 1

    r = service.chat(prep, cancelled=cancelled)
    assert r.finish_reason == "cancelled" and service.cancelled == 1
    assert r.usage.completion_tokens == 0 and len(asked) == 2  # one chunk, not three
    r = service.chat(service.prepare(ChatCall(messages=user("hi"), max_tokens=4)))
    assert r.finish_reason in ("stop", "length")


def _read_all(sock: socket.socket, wait: float) -> bytes:
    sock.settimeout(wait)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except socket.timeout:
        return data + b"<open>"  # still open after `wait` seconds
    except ConnectionResetError:
        return data + b"<reset>"
    return data


def test_a_request_that_never_arrives_whole_gets_a_408_and_is_closed(serve, capfd):
    s = serve(request_timeout=0.5)
    post = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    body = json.dumps({"messages": user("hi"), "max_tokens": 2}).encode()
    whole = post + b"Content-Length: %d\r\n\r\n" % len(body) + body
    partial = [b"",  # connected, nothing sent
               post,  # headers unfinished
               post + b"Content-Length: 99\r\n\r\n{",  # body unfinished: a handler waits
               whole + post + b"Content-Length: 99\r\n\r\n{"]  # pipelined behind an answer
    socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in partial]
    for c, data in zip(socks, partial):
        c.sendall(data)
    trickle = socket.create_connection(("127.0.0.1", s.port))
    trickle.sendall(post)
    start, answered = time.monotonic(), None
    with contextlib.suppress(OSError):  # a header line every 0.1 s does not extend the deadline
        while answered is None and time.monotonic() - start < 3:
            trickle.sendall(b"X-Slow: 1\r\n")
            time.sleep(0.1)
            if select.select([trickle], [], [], 0)[0]:
                answered = time.monotonic() - start
    assert answered is not None and answered < 1.2, answered
    replies = [_read_all(c, 4) for c in socks + [trickle]]
    for c in socks + [trickle]:
        c.close()
    for reply in replies[:3] + replies[4:]:
        assert reply.startswith(b"HTTP/1.1 408") and b"within 0.5 s" in reply, reply
    assert replies[3].startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in replies[3], replies[3]
    assert not any(reply.endswith((b"<open>", b"<reset>")) for reply in replies), replies
    # an answer given before the body came (a 404 here) is not followed by a 408
    early = socket.create_connection(("127.0.0.1", s.port))
    early.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
    reply = _read_all(early, 2)
    early.close()
    assert reply.startswith(b"HTTP/1.1 404") and b"408" not in reply, reply
    # an Ollama client's body that never comes whole gets Ollama's error shape
    ollama = socket.create_connection(("127.0.0.1", s.port))
    ollama.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{")
    reply = _read_all(ollama, 4)
    ollama.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert json.loads(reply.partition(b"\r\n\r\n")[2]) == {
        "error": "the request did not arrive within 0.5 s; send it whole"}
    # between requests the deadline sleeps: a kept-alive connection idle for twice the
    # deadline (under uvicorn's 5 s keep-alive) serves its next request
    from http.client import HTTPConnection

    conn = HTTPConnection("127.0.0.1", s.port, timeout=30)
    for pause in (0, 1.0):
        time.sleep(pause)
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        assert reply.status == 200 and json.loads(reply.read())["choices"]
    conn.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err


def test_connections_past_the_cap_get_a_503_and_the_rest_keep_working(serve):
    s = serve(max_connections=3, request_timeout=1.0)
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(3)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", s.port))
    with contextlib.suppress(OSError):  # a request it sends is read and dropped, not reset
        extra.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 2\r\n\r\n{}")
    reply = _read_all(extra, 3)
    assert reply.startswith(b"HTTP/1.1 503") and b"too many open connections" in reply, reply
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    extra.close()
    for c in idle:  # the idle ones are dropped at their deadline, freeing the server
        assert _read_all(c, 3).startswith(b"HTTP/1.1 408")
        c.close()
    status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2})
    assert status == 200, r


def test_the_connection_cap_leaves_file_descriptors_to_spare():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:  # a low soft limit, as macOS starts with: raised for the cap wanted, spare kept
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert http.connection_cap(1000) == 1000
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1000 + 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    clamped = subprocess.run([sys.executable, "-c", "import resource; from mlx_agent.serve "
                              "import http; resource.setrlimit(resource.RLIMIT_NOFILE, "
                              "(1024, 1024)); print(http.connection_cap(2000))"],
                             capture_output=True, text=True, timeout=60)
    # cannot be raised: what fits beside the descriptors open and the spare ones
    assert 0 < int(clamped.stdout) <= 1024 - 256, clamped.stderr


def test_unknown_paths_and_wrong_methods_answer_in_json(serve):
    s = serve()
    for method in ("HEAD", "GET"):  # Ollama's heartbeat: its CLI sends HEAD / first (a 404)
        with urllib.request.urlopen(urllib.request.Request(s.base + "/", method=method),
                                    timeout=10) as r:
            assert r.status == 200 and r.read() == (b"" if method == "HEAD" else
                                                    b"mlx_agent is running (tiny)")
    for method, path, status, needle in [
            ("GET", "/v1/embeddings", 404, "no endpoint /v1/embeddings"),
            ("GET", "/v1/chat/completions", 405, "use POST"),
            ("POST", "/api/pull", 404, "/api/chat"),
            ("GET", "/api/chat", 405, "does not take GET")]:
        req = urllib.request.Request(s.base + path, method=method,
                                     data=b"{}" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=10)
        body = json.loads(caught.value.read())
        message = body["error"] if path.startswith("/api/") else body["error"]["message"]
        assert caught.value.code == status and needle in message, body


@pytest.mark.real_model
def test_sigterm_stops_running_generations_at_once_with_a_503():
    import re
    import signal

    # a reply the grammar keeps going for thousands of tokens: only the shutdown ends it
    endless = {"messages": user("Say something."), "max_tokens": 4000, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "minLength": 20000}}}}
    proc = subprocess.Popen([sys.executable, "-m", "mlx_agent.cli.main", "serve", "--port", "0",
                             "--no-adapter"], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # start-up lines, until the address
            if found := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                break
        base = f"http://127.0.0.1:{found.group(1)}"

        def post(body):
            req = urllib.request.Request(base + "/v1/chat/completions", headers={
                "Content-Type": "application/json"}, data=json.dumps(body).encode())
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        streamed: list[str] = []

        def stream():
            req = urllib.request.Request(base + "/v1/chat/completions", headers={
                "Content-Type": "application/json"}, data=json.dumps(
                    {**endless, "stream": True}).encode())
            with urllib.request.urlopen(req, timeout=60) as r:
                streamed.extend(line.decode() for line in r)

        threads = [threading.Thread(target=stream)]
        threads[0].start()
        deadline = time.time() + 120
        while len(streamed) < 4:  # the stream's generation is running
            assert time.time() < deadline
            time.sleep(0.05)
        waiting: list = []  # queued behind the stream on the one model thread (started
        # second: first, it could take the lane and the stream never begin)
        threads.append(threading.Thread(target=lambda: waiting.append(post(endless))))
        threads[1].start()
        time.sleep(0.5)  # it has arrived and waits its turn
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        rc = proc.wait(timeout=30)
        took = time.time() - start
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert rc == 0 and took < 5, (rc, took, err)  # inside uvicorn's 5 s grace period
    assert "Traceback" not in err and "CancelledError" not in err, err
    status, body = waiting[0]
    assert status == 503 and "shutting down" in json.loads(body)["error"]["message"], body
    events = [line for line in streamed if line.startswith("data: ")]
    assert "shutting down" in events[-2] and events[-1] == "data: [DONE]\n", events[-3:]


GIVES_UP = [  # compiles, then llguidance gives up a token in (a tester's; the other, a $ref
    # loop, is refused before it starts now)
    {"messages": user("Call e."), "tool_choice": "required", "max_tokens": 30, "tools": [_tool(
        {"a": {"type": "string", "minLength": 5000}}, required=["a"])]},
]


@pytest.mark.parametrize("body", GIVES_UP)
def test_a_grammar_that_gives_up_mid_reply_is_an_error_not_an_empty_stop(serve, batched, body):
    alone = serve()
    together_, runner = batched(lanes=2)
    for s in (alone, together_):
        status, r = s.post("/v1/chat/completions", body)
        assert status == 400 and "gave up mid-reply" in r["error"]["message"], r
        req = urllib.request.Request(s.base + "/v1/chat/completions", data=json.dumps(
            {**body, "stream": True}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            events = [line.decode() for line in resp if line.startswith(b"data: ")]
        assert "gave up mid-reply" in events[-2] and events[-1] == "data: [DONE]\n", events
        status, r = s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2})
        assert status == 200, r  # and the server (the batch's other rows) keeps serving


def test_a_completion_streams_error_event_has_chats_shape():
    """A streamed /v1/completions error (a shutdown's 503) carried only its message; chat's
    carry type, param and code, which clients read (code: server_shutting_down)."""
    import asyncio

    from mlx_agent.serve import openai_api
    from mlx_agent.serve.common import BadRequest

    async def events():
        yield "text", "Once"
        yield "error", BadRequest("the server is shutting down", status=503,
                                  code="server_shutting_down")

    async def collect(chunks):
        return [c async for c in chunks]

    head = openai_api.completion_head("tiny")
    sent = asyncio.run(collect(openai_api.completion_chunks(events(), head, "", False, False)))
    error = json.loads(sent[1].removeprefix("data: "))
    assert error == openai_api.error_body(BadRequest("the server is shutting down", status=503,
                                                     code="server_shutting_down"))
    assert error["error"]["code"] == "server_shutting_down" and sent[-1] == "data: [DONE]\n\n"


def test_a_body_too_large_gets_its_413_even_from_a_client_that_closes(serve):
    """urllib sends ``Connection: close`` and its whole body before it reads: the 413 went
    out after the headers, uvicorn closed with the body unread, and the client met a broken
    pipe (or a reset) instead of the answer."""
    s = serve()
    body = b'{"messages": [{"role": "user", "content": "' + b"a" * (9 << 20) + b'"}]}'
    status, r = s.post("/v1/chat/completions", body)
    assert status == 413 and "--max-body-bytes" in r["error"]["message"], r
    assert s.get("/health")["status"] == "ok"  # and it goes on serving


def test_a_null_field_reads_as_not_sent(serve):
    """OpenAI reads a null as the field left out, and Ollama's Go decoder skips nulls: a
    client that writes every field (null when unset) got 400 "Expected `bool`, got `null`"
    for stream, n, parallel_tool_calls, echo, a completion's max_tokens, ..."""
    s = serve()
    status, r = s.post("/v1/chat/completions", {
        "messages": user("hi"), "max_tokens": 2, "n": None, "stream": None,
        "parallel_tool_calls": None, "stream_options": {"include_usage": None}})
    assert status == 200 and r["object"] == "chat.completion", r
    status, r = s.post("/v1/completions", {"prompt": "Once", "max_tokens": None, "n": None,
                                           "echo": None, "stream": None})
    assert status == 200 and 0 < r["usage"]["completion_tokens"] <= 16, r  # OpenAI's 16
    for path, body in (("/api/chat", {"messages": [{"role": "user", "content": None}]}),
                       ("/api/generate", {"prompt": "Once", "raw": None})):
        status, lines = s.post(path, {"model": "tiny", "stream": None,
                                      "options": {"num_predict": 2}, **body})
        assert status == 200 and lines[-1]["done"] is True, lines  # streamed, the default


def test_an_unknown_model_is_a_404_model_not_found_as_openai_answers(serve):
    """OpenAI answers 404 (code model_not_found) for a model it does not serve, and the SDK
    raises NotFoundError; this server said 400, a BadRequestError."""
    s = serve()
    for call in (lambda: s.client.chat.completions.create(model="gpt-9", messages=user("hi")),
                 lambda: s.client.completions.create(model="gpt-9", prompt="hi")):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body["code"] == "model_not_found"
        assert "'gpt-9' not found; this server serves 'tiny'" in caught.value.body["message"]
    r = s.client.chat.completions.create(model="tiny", messages=user("hi"), max_tokens=2)
    assert r.choices[0].message.role == "assistant"


def test_a_model_is_retrieved_by_its_id(serve):
    """GET /v1/models/{id} (the SDK's models.retrieve, which clients call to check a model)
    was a 404 "no endpoint" for the model the server serves."""
    s = serve()
    listed = s.client.models.list().data[0]
    assert s.client.models.retrieve("tiny") == listed
    with pytest.raises(openai.NotFoundError) as caught:
        s.client.models.retrieve("gpt-9")
    assert caught.value.body["code"] == "model_not_found"


def test_ollama_show_names_the_context_length_by_architecture(serve):
    """Ollama's /api/show keys model_info by architecture ("llama.context_length"), and
    clients look the context length up by that key (or a key ending ".context_length");
    this server wrote a bare "context_length", which none of them found."""
    s = serve()
    status, r = s.post("/api/show", {"model": "tiny"})
    info = r["model_info"]
    assert status == 200 and info["general.architecture"] == "llama"
    assert info["llama.context_length"] == s.service.context_length


def test_ollama_seed_minus_one_means_unseeded(serve):
    """Ollama's default seed is -1, "a random seed": it was read as the fixed seed 2^64-1,
    so a client that sends Ollama's default options got the same sampled text every time."""
    s = serve()

    def generate(seed):
        status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Once", "stream": False,
                                             "options": {"seed": seed, "temperature": 1,
                                                         "num_predict": 16}})
        assert status == 200, r
        return r["response"]

    assert generate(7) == generate(7)
    assert len({generate(-1) for _ in range(3)}) > 1  # 16 draws of a nearly flat 49,152


def test_tool_results_are_matched_to_their_calls_by_id(serve, tiny_lm):
    """Results go to the model in the order of the calls they answer (the prompt names no
    ids): a client that appends them as its tools finish sent Oslo's result as Paris's.
    A tool_call_id that answers none of the calls is a 400, as OpenAI answers it."""
    from mlx_agent.serve import openai_api, schema
    from mlx_agent.serve.common import Limits

    def call(i, city):
        return {"id": f"c{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}

    def messages(*results):
        return user("Paris and Oslo?") + [
            {"role": "assistant", "content": None, "tool_calls": [call(1, "Paris"),
                                                                  call(2, "Oslo")]},
            *({"role": "tool", "tool_call_id": i, "content": text} for i, text in results)]

    def rendered(body):
        req = schema.decode(json.dumps(body).encode(), schema.ChatRequest)
        made = openai_api.chat_call(req, Limits(2048, SamplingParams()))
        return [(m.get("tool_call_id"), m["content"]) for m in made.messages[2:]]

    out_of_order = {"messages": messages(("c2", "cold"), ("c1", "sunny")), "tools": TOOLS}
    assert rendered(out_of_order) == [("c1", "sunny"), ("c2", "cold")]
    s = serve(sampler_for=Scripted(tiny_lm, '{"answer":"ok"}'))
    status, r = s.post("/v1/chat/completions", out_of_order)
    assert status == 200 and r["choices"][0]["message"]["content"] == "ok", r
    status, r = s.post("/v1/chat/completions", {
        "messages": messages(("c1", "sunny"), ("zzz", "cold")), "tools": TOOLS})
    assert status == 400 and r["error"]["param"] == "messages[3].tool_call_id", r
    assert "is 'zzz', not the id of one of the calls of messages[1] (c1, c2)" in \
        r["error"]["message"]


def test_a_field_of_the_wrong_type_is_named_in_the_error_param(serve):
    """OpenAI's error body names the field in ``param`` (the SDK's ``e.param``); a field
    that failed to decode had a null param, its path only inside the message."""
    s = serve()
    for body, param in (({"messages": user("hi"), "temperature": "hot"}, "temperature"),
                        ({"messages": [{"role": "wizard", "content": "hi"}]},
                         "messages[0].role"),
                        ({"messages": user("hi"), "stop": ["z" * 10] * 17}, "stop")):
        with pytest.raises(openai.BadRequestError) as caught:
            s.client.chat.completions.create(model="tiny", **body)
        assert caught.value.body["param"] == param, caught.value.body


def test_results_of_many_calls_are_put_in_order_without_a_quadratic_search():
    """Each result's call was found with list.index: 40,000 calls and their results, a 5 MiB
    body under the 8 MiB cap, held a request thread for 24 s."""
    import time

    import msgspec

    from mlx_agent.serve import schema
    from mlx_agent.serve.openai_api import _tool_results

    n = 40_000
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
             for i in range(n)]
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                *({"role": "tool", "tool_call_id": f"c{n - 1 - i}", "content": str(i)}
                  for i in range(n))]
    req = msgspec.json.decode(msgspec.json.encode({"messages": messages}),
                              type=schema.ChatRequest)
    start = time.monotonic()
    ordered = _tool_results(req.messages)
    assert time.monotonic() - start < 5
    assert [m.tool_call_id for m in ordered[2:]] == [f"c{i}" for i in range(n)]


def test_penalties_and_logit_bias_move_the_reply(serve, tiny_lm):
    s = serve()
    yes = tiny_lm.encode(" yes")
    assert len(yes) == 1

    def completion(**extra):
        status, r = s.post("/v1/completions", {"prompt": "Say", "max_tokens": 12,
                                                "temperature": 0, **extra})
        assert status == 200, r
        return r["choices"][0]["text"]

    greedy = completion()
    words = greedy.split()
    most = max(words, key=words.count)
    assert words.count(most) > 5  # the random model repeats itself
    # each drawn token is pushed down by 2: this model's logits are closer than that
    spread = completion(presence_penalty=2)
    assert spread.split().count(most) <= 1 and len(set(spread.split())) > 5
    assert completion(logit_bias={str(yes[0]): 100}) == " yes" * 12
    assert completion(logit_bias={str(yes[0]): 100}, temperature=1, seed=3) == " yes" * 12
    first = tiny_lm.encode(greedy)[0]
    assert tiny_lm.encode(completion(logit_bias={str(first): -100}))[0] != first
    chat = s.client.chat.completions.create(model="tiny", messages=user("Hello"), max_tokens=6,
                                            temperature=0, logit_bias={yes[0]: 100})
    assert chat.choices[0].message.content.strip() == " ".join(["yes"] * 6)
    status, r = s.post("/api/generate", {"model": "tiny", "prompt": "Say", "raw": True,
                                         "stream": False, "options": {
                                             "num_predict": 12, "temperature": 0,
                                             "presence_penalty": 2}})
    assert status == 200 and r["response"] == spread, r
    for body, param in (({"presence_penalty": 2.5}, "presence_penalty"),
                        ({"frequency_penalty": -3}, "frequency_penalty"),
                        ({"logit_bias": {"yes": 5}}, "logit_bias"),
                        ({"logit_bias": {"y" * 100_000: 5}}, "logit_bias"),
                        ({"logit_bias": {"-1": 5}}, "logit_bias"),
                        ({"logit_bias": {str(tiny_lm.vocab_size): 5}}, "logit_bias"),
                        ({"logit_bias": {"5": 101}}, "logit_bias")):
        status, r = s.post("/v1/chat/completions", {"messages": user("hi"), **body})
        assert status == 400 and r["error"]["param"] == param, (body, str(r)[:300])
        assert "Traceback" not in r["error"]["message"] and len(r["error"]["message"]) < 300
    status, r = s.post("/api/chat", {"model": "tiny", "messages": user("hi"),
                                     "options": {"frequency_penalty": 9}})
    assert status == 400 and "frequency_penalty" in r["error"], r


def test_a_logit_bias_key_of_thousands_of_digits_is_a_400_naming_the_field(serve):
    # int() refuses more than 4,300 digits: the 400 said 'Exceeds the limit (4300 digits)
    # for integer string conversion ... use sys.set_int_max_str_digits()', param null
    s = serve()

    def bias(key):
        return s.post("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 2,
                                               "logit_bias": {key: 5}})

    status, r = bias("9" * 5000)
    assert status == 400 and r["error"]["param"] == "logit_bias", r
    assert r["error"]["message"].startswith("logit_bias names token 999999999999999999..., "
                                            "but the model's ids end at"), r
    status, r = bias("0" * 5000 + "5")  # leading zeros name the same id, as in "05"
    assert status == 200, r


def test_an_earlier_replys_refusal_part_is_read_as_its_text(serve, tiny_lm):
    # OpenAI's clients send a reply back as they got it, refusal parts and all: it was a 400
    s = serve()
    refused = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
               {"role": "user", "content": "ok"}]
    said = [*refused[:1], {"role": "assistant", "content": "I can't."}, *refused[2:]]
    results = [s.post("/v1/chat/completions", {"messages": m, "max_tokens": 3, "temperature": 0})
               for m in (refused, said)]
    assert [status for status, _ in results] == [200, 200], results
    assert results[0][1]["usage"]["prompt_tokens"] == results[1][1]["usage"]["prompt_tokens"]
    status, r = s.post("/v1/chat/completions", {"messages": [
        {"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]}]})
    assert status == 400 and '"refusal" must be a string' in r["error"]["message"], r
    status, r = s.post("/v1/chat/completions", {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})
    assert status == 400 and "'image_url' is not supported" in r["error"]["message"], r


@pytest.mark.parametrize("path, body, param", [
    # each 400 had param null: a client (or OpenAI's SDK's BadRequestError.param) could not
    # tell which field to change
    ("/v1/chat/completions", {"messages": user("hi " * 3000)}, "messages"),
    ("/v1/chat/completions", {"messages": user("hi"), "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": user("hi"), "tools": TOOLS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "response_format"),
    ("/v1/completions", {"prompt": "hi " * 3000}, "prompt"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    # the grammar's refusals had param null
    ("/v1/chat/completions", {"messages": user("hi"), "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ("/v1/chat/completions", {"messages": user("hi"), "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ("/v1/chat/completions", {"messages": user("hi"), "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}}, "response_format"),
])
def test_a_400_from_the_chat_service_names_its_field(serve, path, body, param):
    s = serve(context_length=1024)
    status, r = s.post(path, body)
    assert status == 400 and r["error"]["param"] == param, r

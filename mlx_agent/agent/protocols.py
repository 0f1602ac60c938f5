"""How tools are shown to the model and how its replies become calls: ``json`` and ``hermes``.

- ``json`` (the original ``posttrainllm`` protocol): a ChatML system turn listing tools as
  ``- name(req: type, opt?: type)  description``; the model replies with one JSON object,
  ``{"tool": ..., "arguments": {...}}`` or ``{"answer": ...}``; results come back in a
  ``tool`` turn holding ``{"tool", "stdout", "stderr", "exit_code"}``. The conversation is kept
  as token ids, assistant turns as the exact ids sampled, so the cache never re-prefills a
  reply and the cached ids always equal the conversation.
- ``hermes``: the model's own chat template, rendered with ``tools=``; calls are
  ``<tool_call>{"name", "arguments"}</tool_call>`` blocks, several per turn, run in order.
  The whole conversation is re-rendered every turn (templates may render history differently
  from what was generated) and the engine reuses the longest common token prefix.

A protocol owns the conversation; it knows nothing of caches or processes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..chat import ChatFormat
from ..tools import Tool
from .scanner import JsonObjectScanner, ToolCallScanner

DEFAULT_PERSONA = "You are a specialized on-device agent."
DEFAULT_HERMES_SYSTEM = (
    "You are a helpful agent. Use the tools when they help; when the task is done, reply"
    " with a short final answer and no tool call."
)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class Call:
    name: str
    arguments: Any
    error: str | None = None  # set when the call could not be read at all


@dataclass
class Reply:
    calls: list[Call] = field(default_factory=list)
    answer: str | None = None
    fallback: bool = False


def tool_call_blocks(text: str) -> list[Call]:
    """The ``<tool_call>{"name", "arguments"}</tool_call>`` blocks in ``text``, in order; a
    block that cannot be read is a Call with ``error`` set."""
    calls = []
    for block in _TOOL_CALL.findall(text):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError as e:
            calls.append(Call("?", None, f"tool call is not valid JSON ({e.msg})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append(Call("?", None, 'tool call needs {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models send the arguments JSON-encoded
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append(Call(obj["name"], args))
    return calls


def json_system_prompt(tools: list[Tool], persona: str | None = None,
                       header: str = "You have access to these tools:") -> str:
    lines = [persona or DEFAULT_PERSONA, header]
    lines += [f"- {t.signature()}  {t.description}".rstrip() for t in tools]
    lines += [
        "When you need a tool, reply with a single JSON object and nothing else:",
        '{"tool": "<name>", "arguments": {...}}',
        "The tool's result then comes back to you in a tool message.",
        "When you have the final answer, reply with:",
        '{"answer": "<your answer>"}',
    ]
    return "\n".join(lines)


class JsonProtocol:
    name = "json"
    markers = ("<|im_start|>", "<|im_end|>")

    def __init__(self, lm, tools: list[Tool], system: str | None = None):
        self.lm = lm
        self.system_text = json_system_prompt(tools, system)
        self.system_ids = lm.prompt_ids(f"<|im_start|>system\n{self.system_text}<|im_end|>\n")
        self.ids: list[int] = list(self.system_ids)
        self._end = lm.encode("<|im_end|>")
        self._newline = lm.encode("\n")

    def add_user(self, text: str) -> None:
        self.ids += self.lm.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def prompt_ids(self) -> list[int]:
        return list(self.ids)

    def scanner(self) -> JsonObjectScanner:
        return JsonObjectScanner()

    def parse(self, scanner: JsonObjectScanner) -> Reply:
        text = scanner.object_text
        raw = scanner.text.strip()
        try:
            obj = json.loads(text) if text is not None else None
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("tool"), str):
            return Reply(calls=[Call(obj["tool"], obj.get("arguments", {}))])
        if isinstance(obj, dict) and "answer" in obj:
            answer = obj["answer"]
            return Reply(answer=answer if isinstance(answer, str) else json.dumps(answer))
        return Reply(answer=raw, fallback=True)

    def add_assistant(self, raw: str, sampled: list[int], closed: bool) -> None:
        self.ids += sampled
        if not closed:  # the scanner stopped the turn: close it as the model should have
            self.ids += self._end
        self.ids += self._newline

    def add_results(self, results: list[tuple[str, str]]) -> None:
        text = "".join(f"<|im_start|>tool\n{content}<|im_end|>\n" for _, content in results)
        self.ids += self.lm.encode(text + "<|im_start|>assistant\n")

    def state(self) -> dict:
        return {"ids": list(self.ids)}

    def load_state(self, state: dict) -> None:
        ids = state.get("ids")
        if not (isinstance(ids, list) and ids[: len(self.system_ids)] == self.system_ids):
            raise ValueError("its system prompt differs from this one (other tools or --system)")
        self.ids = ids


class HermesProtocol:
    name = "hermes"
    markers = ("<tool_call>", "</tool_call>")

    def __init__(self, lm, tools: list[Tool], system: str | None = None):
        self.lm = lm
        self.tools = [t.openai() for t in tools]
        self.messages: list[dict] = [{"role": "system", "content": system or DEFAULT_HERMES_SYSTEM}]
        # The rendered prefix before the first user message: what two conversations that
        # differ only in that message share (templates may put anything after the system turn).
        a, b = (lm.prompt_ids(self._render([*self.messages, {"role": "user", "content": c}]))
                for c in ("a", "b"))
        self.system_ids = a[: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))]

    def _render(self, messages, generation: bool = True) -> str:
        return self.lm.chat.render(messages, tools=self.tools, add_generation_prompt=generation)

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def prompt_ids(self) -> list[int]:
        return self.lm.prompt_ids(self._render(self.messages))

    def scanner(self) -> ToolCallScanner:
        return ToolCallScanner()

    def parse(self, scanner: ToolCallScanner) -> Reply:
        raw = scanner.turn_text
        calls = tool_call_blocks(raw)
        return Reply(calls=calls) if calls else Reply(answer=raw.strip())

    def add_assistant(self, raw: str, sampled: list[int], closed: bool) -> None:
        self.messages.append({"role": "assistant", "content": raw})

    def add_results(self, results: list[tuple[str, str]]) -> None:
        for name, content in results:
            self.messages.append({"role": "tool", "name": name, "content": content})

    def state(self) -> dict:
        return {"messages": self.messages}

    def load_state(self, state: dict) -> None:
        messages = state.get("messages")
        if not (isinstance(messages, list) and messages[:1] == self.messages[:1]):
            raise ValueError("its system prompt differs from this one (other tools or --system)")
        self.messages = messages


def choose(name: str, chat: ChatFormat) -> str:
    """Resolve ``auto``: hermes when the chat template renders tools, json otherwise."""
    if name == "auto":
        return "hermes" if chat.renders_tools else "json"
    if name not in ("json", "hermes"):
        raise ValueError(f"unknown protocol {name!r}; choose json, hermes or auto")
    return name


def make_protocol(name: str, lm, tools: list[Tool], system: str | None = None):
    cls = {"json": JsonProtocol, "hermes": HermesProtocol}[choose(name, lm.chat)]
    return cls(lm, tools, system)

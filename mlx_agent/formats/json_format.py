"""The ``json`` format (the original ``posttrainllm`` protocol), over ChatML.

The system turn lists the tools as ``- name(req: type, opt?: type)  description`` under a
persona line, then says how to reply; the conversation's own system messages follow that
block, so every conversation over the same tools shares its KV state. The model replies with
``{"tool": ..., "arguments": {...}}`` (with parallel calls: one object a line) or
``{"answer": ...}``; tool results come back in ``tool`` turns. An assistant turn renders as the
exact ids sampled for it when the memo has them, else as the grammar would write it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from ..grammar import written_json
from ..tools import Tool
from .deferred import INDEX_HEADER, get_tool_info_tool, tool_index
from .messages import (Call, Reply, ReplyMemo, arguments_of, compact, text_of, unspaced,
                       valid_json_text)
from .scanner import JsonObjectScanner, RepeatedLineScanner, RunawayListScanner
from .streams import JsonAnswerStream

DEFAULT_PERSONA = "You are a specialized on-device agent."
TOOLS_HEADER = "You have access to these tools:"
INSTRUCTIONS = (  # {call} and {answer}: the reply's shapes, spaced as the grammar writes them;
    # chosen by scripts/prompt_variants.py (README: "The json protocol's prompt")
    "To call a tool, reply with a single JSON object: {call}",
    "For a final answer, reply with: {answer}",
    "Reply with JSON only.",
)
_ROLES = ("user", "tool", "assistant", "system")


def as_written(obj: Any) -> str:
    """JSON as the json protocol's grammar makes the model write it (its separators and
    numbers: :func:`written_json`)."""
    return written_json(obj, "json")


def instructions() -> list[str]:
    """The lines after the tool list, their examples in the grammar's spacing."""
    call = as_written({"tool": "<name>", "arguments": "{...}"}).replace('"{...}"', "{...}")
    answer = as_written({"answer": "<your answer>"})
    return [line.format(call=call, answer=answer) for line in INSTRUCTIONS]


def system_prompt(tools: Sequence[Tool], persona: str | None = None,
                  header: str = TOOLS_HEADER) -> str:
    lines = [persona or DEFAULT_PERSONA, header]
    lines += [f"- {t.signature()}  {t.description}".rstrip() for t in tools]
    return "\n".join([*lines, *instructions()])


class JsonFormat:
    name = "json"
    markers = ("<|im_start|>", "<|im_end|>")

    def __init__(self, lm, memo: ReplyMemo | None = None, persona: str | None = None):
        self.lm = lm
        self.memo = memo if memo is not None else ReplyMemo()
        self.persona = persona
        self._open = {role: lm.encode(f"<|im_start|>{role}\n") for role in _ROLES}
        self._close = lm.encode("<|im_end|>\n")
        self._prefixes: dict[str, list[int]] = {}  # tools block -> its ids (a few entries)

    # -- rendering ---------------------------------------------------------------------

    def system_text(self, tools: Sequence[Tool] = (), deferred: bool = False) -> str:
        """The tools block: the system turn's text before any system message."""
        if not deferred:
            return system_prompt(tools, self.persona)
        return system_prompt([get_tool_info_tool(tools)], self.persona,
                             header=f"{INDEX_HEADER}\n{tool_index(tools)}")

    def system_prefix(self, tools: Sequence[Tool] = (), deferred: bool = False) -> list[int]:
        """The ids every conversation over ``tools`` starts with (what a prompt cache keeps)."""
        block = self.system_text(tools, deferred)
        ids = self._prefixes.get(block)
        if ids is None:
            if len(self._prefixes) >= 8:
                self._prefixes.clear()
            ids = self._prefixes[block] = \
                self.lm.prompt_ids("<|im_start|>system\n") + self.lm.encode_text(block)
        return list(ids)

    def prompt_ids(self, messages: Sequence[dict], tools: Sequence[Tool] = (),
                   deferred: bool = False) -> list[int]:
        text = self.lm.encode_text
        system = [text_of(m.get("content")) for m in messages if m["role"] == "system"]
        ids = self.system_prefix(tools, deferred)
        ids += text("".join("\n\n" + s for s in system if s)) + self._close
        for m in messages:
            role = m["role"]
            if role in ("user", "tool"):
                ids += self._open[role] + text(text_of(m.get("content"))) + self._close
            elif role == "assistant":
                body = self.reply_text(m)
                sampled = self.memo.get(body)
                ids += self._open[role] + (sampled if sampled is not None else text(body))
                ids += self._close
        return ids + self._open["assistant"]

    # -- replies -----------------------------------------------------------------------

    @staticmethod
    def reply_text(message: dict) -> str:
        """An assistant message as the model writes it (:func:`as_written`), a call a line."""
        calls = message.get("tool_calls") or []
        if calls:
            return "\n".join(as_written({"tool": c["function"]["name"],
                                         "arguments": arguments_of(c)}) for c in calls)
        return as_written({"answer": text_of(message.get("content"))})

    def reply_message(self, reply: Reply, text: str, ids: list[int]) -> dict:
        """The assistant message that keeps ``reply`` in a conversation. The ids it was
        sampled as (no stop token) are remembered under the text the message renders to,
        so the turn renders back as exactly what the model wrote."""
        message = reply.message()
        self.memo.put(self.reply_text(message), ids)
        return message

    def parse(self, text: str) -> Reply:
        """The JSON objects from the first ``{`` on, a line each: the calls among them
        (a call repeated in one reply is one call), or one ``{"answer"}``; anything else
        is an incomplete reply whose content is the text. Whole objects before a cut-off
        one are kept."""
        objs, decoder = [], json.JSONDecoder()
        stripped = text.strip()
        pos = stripped.find("{")
        while 0 <= pos < len(stripped):
            try:
                obj, pos = decoder.raw_decode(stripped, pos)
                objs.append(unspaced_call(valid_json_text(obj)))
            except (ValueError, RecursionError):  # cut off, nested too deeply, or a number
                break  # of more than 4,300 digits (int() refuses it): the reply ends here
            while pos < len(stripped) and stripped[pos].isspace():
                pos += 1
        calls, seen = [], set()
        for o in objs:
            if isinstance(o, dict) and isinstance(o.get("tool"), str):
                args = o.get("arguments", {})
                call = Call(o["tool"], args, None if isinstance(args, dict) else
                            "tool call arguments must be a JSON object")
                key = compact([call.name, call.arguments])
                if key not in seen:
                    seen.add(key)
                    calls.append(call)
        if calls:  # one that cannot be read: the reply keeps its text, as hermes's does
            unread = any(c.error for c in calls)
            return Reply(calls=calls, content=stripped if unread else None, complete=not unread)
        if len(objs) == 1 and isinstance(objs[0], dict) and "answer" in objs[0]:
            answer = objs[0]["answer"]
            return Reply(content=answer if isinstance(answer, str) else compact(answer))
        if not objs and (opened := _ANSWER_OPENED.match(stripped)):  # cut off mid-answer
            return Reply(content=_cut_string(stripped[opened.end():]), complete=False)
        return Reply(content=stripped, complete=False)

    def scanner(self, parallel: bool = False):
        """One object ends the turn; with parallel calls, a repeated line does; a list that
        only repeats its items does too."""
        return RunawayListScanner(RepeatedLineScanner() if parallel else JsonObjectScanner())

    def stream_filter(self):
        return JsonAnswerStream()


def unspaced_call(obj: Any) -> Any:
    """A ``{"tool", "arguments"}`` object with its arguments :func:`unspaced`; else ``obj``."""
    if isinstance(obj, dict) and isinstance(obj.get("tool"), str) and "arguments" in obj:
        return {**obj, "arguments": unspaced(obj["arguments"])}
    return obj


_ANSWER_OPENED = re.compile(r'\{\s*"answer"\s*:\s*"')


def _cut_string(rest: str) -> str:
    """The text of a JSON string cut off (``Hello, how can I``, ``caf\\u00``): what
    decodes of it, the cut escape left off; ``rest`` itself if none does."""
    for end in range(len(rest), max(-1, len(rest) - 7), -1):
        try:
            value = json.loads(f'"{rest[:end]}"', strict=False)  # raw newlines too
        except ValueError:
            continue
        return value
    return rest

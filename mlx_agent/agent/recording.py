"""The agent's trajectory log: each step's ids fed and sampled, token-exact, in ``.atraj``.

A step's prompt goes in as the ids the engine had to feed (``prompt[reused:]``) at
``prefix_len`` (where they start), so replaying the steps gives exactly the KV cache. Tool
results are fed with the next step's prompt, so they are written then, the first of them
carrying those ids; results the model never read are written at the end of the turn.
"""

from __future__ import annotations

import json
from typing import Sequence

import msgspec

from ..formats import Reply
from ..tools import ToolResult
from ..trajectory import Recorder, Step, ToolCallRecord, ToolResultRecord
from . import events as ev


class TrajectoryLog:
    def __init__(self, recorder: Recorder, system_ids: Sequence[int], system_text: str):
        self.recorder = recorder
        self.system_ids, self.system_text = list(system_ids), system_text
        self._system_done = False
        self._pending: list[Step] = []  # tool results waiting for the prompt that feeds them

    def step(self, prompt: Sequence[int], reused: int, user_text: str | None, raw: str,
             sampled: list[int], reply: Reply, results: Sequence[tuple[ToolResult, str]]) -> None:
        """Record one assistant step: what was fed before it, and what it sampled."""
        for s in self._fed(list(prompt), reused, user_text):
            self.recorder.add(s)
        call = reply.calls[0] if reply.calls else None
        # a call that could not be read (arguments not an object) is no call to learn from:
        # the reply's text and ids keep what the model wrote, the tool step its error
        record = ToolCallRecord(name=call.name, arguments_json=json.dumps(call.arguments)) \
            if call and call.error is None and isinstance(call.arguments, dict) else None
        self.recorder.add(Step(role="assistant", content=raw, output_ids=list(sampled),
                               tool_call=record))
        self._pending = [_tool_step(result, content) for result, content in results]

    def finish(self, stats: ev.Stats) -> None:
        for pending in self._pending:  # results the model never read
            self.recorder.add(pending)
        self._pending = []
        self.recorder.finish_turn(msgspec.to_builtins(stats))

    def _fed(self, prompt: list[int], reused: int, user_text: str | None) -> list[Step]:
        steps, fed, at = [], prompt[reused:], reused
        system = self.system_ids
        if not self._system_done:
            self._system_done = True
            loaded = reused >= len(system)  # from a prompt cache (or a resumed session)
            if loaded or prompt[: len(system)] == system:
                steps.append(Step(role="system", content=self.system_text, input_ids=system,
                                  prefix_len=0))
                # the whole rest of the prompt, cached or not: the engine may hold more than
                # the system prompt (the same task's previous run), the trajectory does not
                fed, at = prompt[len(system):], len(system)
        if user_text is not None:
            return [*steps, Step(role="user", content=user_text, input_ids=fed, prefix_len=at)]
        pending, self._pending = self._pending, []
        if pending:  # the tool turn(s) went in as one block
            pending[0].input_ids, pending[0].prefix_len = fed, at
        return steps + pending


def _tool_step(result: ToolResult, content: str) -> Step:
    return Step(role="tool", content=content, tool_result=ToolResultRecord(
        name=result.tool, stdout=result.stdout, stderr=result.stderr,
        exit_code=result.exit_code, duration_sec=result.duration_sec,
        timed_out=result.timed_out))

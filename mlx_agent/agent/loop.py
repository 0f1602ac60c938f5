"""The agent loop: generate, parse, run tools, feed results back, repeat, over one KV cache.

``Agent.ask(text)`` runs one user turn: up to ``max_steps`` assistant steps, each synced to the
protocol's full conversation (the engine reuses the cached prefix and prefills the rest),
generated until the protocol's scanner or the end-of-turn token ends it, then parsed into
tool calls or an answer. Calls are validated against their schema before anything runs;
unknown tools, invalid arguments, refusals and forged turn markers go back to the model as
error results. Every sampled token stays in the cache, and after each sync the cached ids
equal the rendered conversation.

Limits live in one place (:meth:`Agent.ask`): ``steps`` when the step budget runs out,
``context`` when a non-rotating cache is full (a rotating window keeps going, its system
prompt pinned), ``interrupted`` on Ctrl-C during generation (the session goes on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgspec
from typing import Callable, Sequence

from ..cache import ContextFull
from ..engine import Engine, SamplingParams
from ..tokenizer import special_tokens
from ..tools import Tool, ToolResult, error_result, run_tool
from . import events as ev
from .protocols import Call, Reply

Confirm = Callable[[str, dict], bool]


@dataclass
class AgentConfig:
    max_steps: int = 8
    max_tokens: int = 256
    tool_timeout: float = 30.0
    tool_env: Sequence[str] = ()
    tool_cwd: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    confirm: Confirm | None = None  # asked before each call; False = denied
    grammar: bool = True  # constrain replies to valid tool calls and answers
    # "auto", "required", "none", a tool's name, or {"name", "arguments"}: that exact call
    # (see mlx_agent.grammar). A sequence gives one choice per step of a turn, its last
    # repeated: ("calculate", "none") makes the first step call `calculate` and every later
    # step answer. Needs the grammar.
    tool_choice: str | dict | Sequence[str | dict] = "auto"

    def choice(self, step: int) -> str:
        tc = self.tool_choice
        if isinstance(tc, (str, dict)):
            return _choice_key(tc)
        return _choice_key(tc[min(step, len(tc) - 1)]) if tc else "auto"

    def choices(self) -> set[str]:
        tc = self.tool_choice
        if isinstance(tc, (str, dict)):
            return {_choice_key(tc)}
        return {_choice_key(c) for c in tc} or {"auto"}


def _choice_key(choice: str | dict) -> str:
    if isinstance(choice, dict):
        from ..grammar import forced_call

        return forced_call(choice["name"], choice.get("arguments", {}))
    return choice


@dataclass
class Outcome:
    answer: str | None
    fallback: bool
    stats: ev.Stats


class Agent:
    def __init__(self, lm, engine: Engine, tools: Sequence[Tool], protocol,
                 config: AgentConfig | None = None,
                 emit: Callable[[ev.Event], None] = lambda e: None, sampler=None,
                 recorder=None):
        self.lm, self.engine, self.protocol = lm, engine, protocol
        self.recorder = recorder  # a trajectory.Recorder, or None
        self._pending_tool_steps: list = []
        self._system_recorded = False
        self.tools = {t.name: t for t in tools}
        self.config = config or AgentConfig()
        self.emit = emit
        self.sampler = sampler or self.config.sampling.sampler()
        self.forbidden = sorted(set(special_tokens(lm.tokenizer)) | set(protocol.markers))
        self.turn_warning: str | None = None
        self._constraints: dict[str, object] = {}
        choices = self.config.choices()
        if self.config.grammar:  # compile now: a bad schema or choice is a start-up error
            for choice in choices:
                self._constraint(choice)
        elif choices != {"auto"}:
            raise ValueError("tool_choice needs the grammar (the grammar is what enforces it)")
        if engine.cache_mode == "rotating":
            engine.pin(len(protocol.system_ids))

    def prime(self, prompt_cache) -> ev.Cache:
        """Load the system prompt's KV state from ``prompt_cache``, or prefill and save it."""
        hit = prompt_cache.prime(self.engine, self.lm.identity, self.protocol.system_ids)
        ms = round(hit.seconds * 1000, 2)
        event = ev.Cache(hit=hit.hit, tokens=hit.tokens, bytes=hit.bytes, key=hit.key,
                         load_ms=ms if hit.hit else None, prefill_ms=None if hit.hit else ms)
        self.emit(event)
        return event

    def save_session(self, path) -> int:
        """Write the conversation and its KV state to ``path`` (atomically)."""
        from ..prompt_cache import save_session

        return save_session(path, self.lm.identity, self.engine, self.protocol.name,
                            self.protocol.state())

    def resume(self, path) -> int:
        """Continue a saved conversation; returns how many tokens came back without prefill.
        Raises ValueError (and changes nothing) when the file cannot be used."""
        from ..prompt_cache import load_session

        name, state, tokens, kvs = load_session(path, self.lm.identity)
        if name != self.protocol.name:
            raise ValueError(f"it uses the {name} protocol, this run {self.protocol.name}")
        before = self.protocol.state()
        self.protocol.load_state(state)
        try:
            if tokens:
                self.engine.restore(tokens, kvs)
        except ContextFull as e:
            self.protocol.load_state(before)
            raise ValueError(str(e)) from None
        return len(tokens)

    # -- one user turn ---------------------------------------------------------------

    def ask(self, text: str) -> Outcome:
        self.emit(ev.User(text=text))
        self.protocol.add_user(text)
        stats = dict(turns=0, calls=0, valid_calls=0, tool_errors=0, generated_tokens=0,
                     rendered_tokens=0, prefilled_tokens=0, reused_tokens=0)
        start = time.perf_counter()
        answer, fallback, stop = None, False, "steps"
        self.turn_warning = None
        for step in range(self.config.max_steps):
            prompt = self.protocol.prompt_ids()
            try:
                sync = self.engine.sync(prompt)
            except ContextFull as e:
                stop, self.turn_warning = "context", str(e)
                break
            except KeyboardInterrupt:  # Ctrl-C while the prompt is read: no reply this turn
                stop = "interrupted"
                break
            self._record_fed(prompt, sync.reused, text if step == 0 else None)
            stats["turns"] += 1
            stats["rendered_tokens"] += len(prompt)
            stats["prefilled_tokens"] += sync.prefilled
            stats["reused_tokens"] += sync.reused
            scanner, sampled = self.protocol.scanner(), []
            closed = interrupted = False
            try:
                closed = self._generate(scanner, sampled, self._constraint(self.config.choice(step)))
            except KeyboardInterrupt:  # the reply so far stands; the session goes on
                interrupted = True
            stats["generated_tokens"] += len(sampled)
            reply: Reply = self.protocol.parse(scanner)
            raw = scanner.text
            self.emit(ev.Assistant(step=step, raw=raw))
            self._record_assistant(raw, sampled, reply)
            self.protocol.add_assistant(getattr(scanner, "turn_text", raw), sampled, closed)
            if interrupted:
                stop = "interrupted"
                break
            if not reply.calls:
                answer, fallback, stop = reply.answer, reply.fallback, "answer"
                if not closed and not scanner_finished(scanner) and self.engine.room == 0:
                    stop, self.turn_warning = "context", "the context is full"
                break
            results = []
            for call in reply.calls:
                result, valid = self._run(call)
                stats["calls"] += 1
                stats["valid_calls"] += valid
                stats["tool_errors"] += result.exit_code != 0 or result.timed_out
                content = result.for_model()
                self.emit(ev.ToolResult(tool=result.tool, content=content))
                results.append((result.tool, content))
                self._record_tool(result, content)
            self.protocol.add_results(results)
        if answer is not None:
            self.emit(ev.Answer(text=answer, fallback=fallback))
        final = ev.Stats(**stats, seconds=round(time.perf_counter() - start, 3), stop=stop)
        self.emit(final)
        if self.recorder is not None:
            for pending in self._pending_tool_steps:  # results the model never read
                self.recorder.add(pending)
            self._pending_tool_steps = []
            self.recorder.finish_turn(msgspec.to_builtins(final))
        return Outcome(answer, fallback, final)

    # -- trajectory recording (token-exact: the ids fed and the ids sampled) -------------

    def _record_fed(self, prompt: list[int], reused: int, user_text: str | None) -> None:
        if self.recorder is None:
            return
        from ..trajectory import Step

        fed, at = prompt[reused:], reused
        system = list(self.protocol.system_ids)
        if not self._system_recorded:
            self._system_recorded = True
            loaded = reused >= len(system)  # from a prompt cache (or a resumed session)
            if loaded or prompt[: len(system)] == system:
                self.recorder.add(Step(role="system", content=_system_text(self.protocol),
                                       input_ids=system, prefix_len=0))
                if not loaded:
                    fed, at = prompt[len(system):], len(system)
        if user_text is not None:
            self.recorder.add(Step(role="user", content=user_text, input_ids=fed, prefix_len=at))
            return
        steps, self._pending_tool_steps = self._pending_tool_steps, []
        for i, step in enumerate(steps):
            if i == 0:  # the tool turn(s) went in as one block
                step.input_ids, step.prefix_len = fed, at
            self.recorder.add(step)

    def _record_assistant(self, raw: str, sampled: list[int], reply: Reply) -> None:
        if self.recorder is None:
            return
        import json

        from ..trajectory import Step, ToolCallRecord

        call = reply.calls[0] if reply.calls else None
        record = ToolCallRecord(name=call.name, arguments_json=json.dumps(call.arguments)) \
            if call else None
        self.recorder.add(Step(role="assistant", content=raw, output_ids=list(sampled),
                               tool_call=record))

    def _record_tool(self, result: ToolResult, content: str) -> None:
        if self.recorder is None:
            return
        from ..trajectory import Step, ToolResultRecord

        self._pending_tool_steps.append(Step(role="tool", content=content, tool_result=ToolResultRecord(
            name=result.tool, stdout=result.stdout, stderr=result.stderr,
            exit_code=result.exit_code, duration_sec=result.duration_sec,
            timed_out=result.timed_out)))

    # -- pieces ----------------------------------------------------------------------

    def _constraint(self, choice: str):
        """The grammar constraint for ``choice`` (None with the grammar off), reset."""
        if not self.config.grammar:
            return None
        if choice not in self._constraints:
            from ..grammar import tool_constraint

            self._constraints[choice] = tool_constraint(
                self.lm, self.protocol.name, list(self.tools.values()), self.config.max_tokens,
                choice, parallel=self.protocol.name == "hermes")  # json: one call a reply
        constraint = self._constraints[choice]
        constraint.reset()
        return constraint

    def _generate(self, scanner, sampled: list[int], constraint) -> bool:
        """One assistant step: sample into ``sampled`` and ``scanner`` until the scanner or
        the stop token ends it; True when the model closed the turn with its stop token."""
        detok = self.lm.tokenizer.detokenizer
        detok.reset()
        for token in self.engine.generate(self.sampler, max_tokens=self.config.max_tokens,
                                          stop_ids=self.lm.stop_ids, constraint=constraint):
            sampled.append(token)
            if token in self.lm.stop_ids:
                break
            detok.add_token(token)
            segment = detok.last_segment
            if segment and scanner.feed(segment):
                return False
        detok.finalize()
        tail = detok.last_segment
        if tail:
            scanner.feed(tail)
        return bool(sampled) and sampled[-1] in self.lm.stop_ids

    def _run(self, call: Call) -> tuple[ToolResult, bool]:
        """Run one call if it is valid; returns the result and whether the call was valid."""
        if call.error:
            result, valid = error_result(call.name, call.error), False
            self._emit_call(call, result)
            return result, valid
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            result = error_result(call.name, f"unknown tool {call.name!r}; available: {known}")
            self._emit_call(call, result)
            return result, False
        problems = tool.validate(call.arguments)
        if problems:
            result = error_result(tool.name, "invalid arguments: " + "; ".join(problems))
            self._emit_call(call, result)
            return result, False
        if self.config.confirm and not self.config.confirm(tool.name, call.arguments):
            result = error_result(tool.name, "the user denied this tool call")
        else:
            result = run_tool(tool, call.arguments, timeout=self.config.tool_timeout,
                              env_names=self.config.tool_env, cwd=self.config.tool_cwd)
            forged = next((s for s in self.forbidden if s in result.stdout or s in result.stderr), None)
            if forged:
                result = error_result(tool.name, f"the tool output contains the reserved "
                                                 f"marker {forged!r}; it was withheld")
        self._emit_call(call, result)
        return result, True

    def _emit_call(self, call: Call, r: ToolResult) -> None:
        self.emit(ev.ToolCall(tool=r.tool, arguments=call.arguments, stdout=r.stdout,
                              stderr=r.stderr, exit_code=r.exit_code, timed_out=r.timed_out,
                              duration_sec=r.duration_sec))


def _system_text(protocol) -> str:
    if hasattr(protocol, "system_text"):
        return protocol.system_text
    return protocol.messages[0]["content"]


def scanner_finished(scanner) -> bool:
    return bool(getattr(scanner, "end", None) is not None or getattr(scanner, "done", False))

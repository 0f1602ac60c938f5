"""The agent loop: generate, parse, run tools, feed results back, repeat, over one KV cache.

``Agent.ask(text)`` runs one user turn as steps (``_step``): sync the engine to the
conversation (the cached prefix is reused, the rest prefilled), query the model until the
format's scanner or the end-of-turn token ends the reply (``_query``), parse it, and run its
calls (``_execute``). Calls are validated against their schema before anything runs; unknown
tools, invalid arguments, refusals and forged turn markers go back to the model as error
results. Every sampled token stays in the cache, and after each sync the cached ids equal
the rendered conversation.

A turn ends in one place (:meth:`Agent.ask`): ``answer``; ``steps`` when the step budget runs
out; ``context`` when a non-rotating cache is full (a rotating window keeps going, its
system prompt pinned), with the reason on :attr:`Outcome.warning` (a user message that does
not fit is taken out of the conversation again: :attr:`Outcome.dropped`); ``interrupted`` on
Ctrl-C during generation (the session goes on), the interrupt kept on
:attr:`Outcome.interrupt` for a caller that stops on it (a subclass the caller raised for
SIGTERM stays that subclass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import msgspec

from ..cache import ContextFull
from ..engine import Constraint, Engine, PrefillStats, SamplingParams, greedy_sampler
from ..formats import Call, Format
from ..grammar import GrammarError, forced_call, is_forced, ll_tokenizer, tool_constraint
from ..loop_guard import LoopGuard, call_bytes, refused_texts, token_bytes
from ..prompt_cache import load_session, save_session
from ..probe import would_call
from ..stated_arguments import complete_reply, pressed_tools
from ..stated_result import stated_answer
from ..text import TextStream
from ..tokenizer import special_tokens
from ..tools import Sandbox, Tool, ToolResult, advised_tool, error_result, run_tool
from . import events as ev
from .conversation import Conversation
from .limits import MAX_STEPS, MAX_TOKENS, RETRY_AFTER_ERROR
from .named_tool import named_tool
from .recording import TrajectoryLog

INTERRUPTED = "interrupted by the user: not run, or stopped before it finished"

Confirm = Callable[[str, dict], bool]


@dataclass
class AgentConfig:
    max_steps: int = MAX_STEPS
    max_tokens: int = MAX_TOKENS
    tool_timeout: float = 30.0
    tool_env: Sequence[str] = ()
    tool_cwd: str | None = None
    sandbox: Sandbox | None = None  # confines _exec tools (see mlx_agent.tools.sandbox)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    confirm: Confirm | None = None  # asked before each call; False = denied
    grammar: bool = True  # constrain replies to valid tool calls and answers
    # "auto", "required", "none", a tool's name, or {"name", "arguments"}: that exact call
    # (see mlx_agent.grammar). A sequence gives one choice per step of a turn, its last
    # repeated: ("calculate", "none") makes the first step call `calculate` and every later
    # step answer. Needs the grammar.
    tool_choice: str | dict | Sequence[str | dict] = "auto"
    # the loop guard: within a turn, the grammar no longer offers a call that already ran
    allow_repeat_calls: bool = False
    # after a call fails (an error result, a timeout; not one the user denied), the next
    # reply must be a call, so the model tries another way (the loop guard keeps it from
    # the same call; where a built-in tool's error advises a built-in tool, "... call the
    # grep tool" or "leave the path out", a call of that one) before it answers; at most
    # this many times a turn, only where the choice is "auto", a step is left for the answer
    # and the guard leaves a call to make (not when every tool takes no arguments and has
    # run this turn). 0: the model may answer at once. Needs the grammar.
    retry_after_error: int = RETRY_AFTER_ERROR
    # a request that tells the agent to use a tool by name ("Use the echo tool to ...")
    # makes the first step call it, where the choice is "auto" (see named_tool); with
    # stated_arguments, so does one that writes a tool's name (described_tool.mentioned)
    # where the model would answer (probe.would_call), and a later step, after a result,
    # where it writes the name of a tool no call has tried this turn (a chain's second
    # step, in a clause with no negation or condition: stated_arguments.pressed_tools); the
    # call becomes a question to the user where it makes up a required value.
    # Needs the grammar.
    follow_named_tool: bool = True
    # a turn's first call of another tool than the one the request describes is written
    # again for that one (see described_tool); a call's optional arguments are made the
    # ones the request states: probed and added where it states them, dropped where nobody
    # wrote them (see stated_arguments); and the values it copies from the request copied
    # exactly (see copied_values); where the tool choice is auto, a call on a number no
    # one gave becomes an answer that asks the user for it (see unfounded). Needs the grammar.
    stated_arguments: bool = True

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
        return forced_call(choice["name"], choice.get("arguments", {}))
    return choice


class TurnStats(ev.Counts):
    """What one user turn cost, as it runs; becomes the ``stats`` event."""

    def synced(self, prompt: int, sync: PrefillStats) -> None:
        self.turns += 1
        self.rendered_tokens += prompt
        self.prefilled_tokens += sync.prefilled
        self.reused_tokens += sync.reused

    def ran(self, result: ToolResult, valid: bool) -> None:
        self.calls += 1
        self.valid_calls += valid
        self.tool_errors += result.exit_code != 0 or result.timed_out

    def event(self, seconds: float, stop: str) -> ev.Stats:
        return ev.Stats(**msgspec.structs.asdict(self), seconds=round(seconds, 3), stop=stop)


@dataclass
class Outcome:
    answer: str | None
    fallback: bool
    stats: ev.Stats
    warning: str | None = None  # why a turn stopped early (the context is full)
    interrupt: KeyboardInterrupt | None = None  # what cut the turn: re-raise it to stop
    dropped: bool = False  # the user's message did not fit: left out of the conversation
    cut: bool = False  # the answer reached max_tokens before it ended: it is partial


@dataclass
class _Query:
    """One reply as generated: its text, the ids sampled, and how it ended."""

    raw: str  # every character decoded
    turn_text: str  # what the turn keeps (the scanner may end it before the last segment)
    sampled: list[int]
    closed: bool  # the model ended the turn (its stop token, or one of lm.end_ids)
    finished: bool  # the reply reached the format's end by itself
    interrupt: KeyboardInterrupt | None = None  # Ctrl-C (or a subclass) cut the reply
    guarded_steps: bool = False  # the loop guard masked tokens that would repeat a call
    gave_up: str | None = None  # the grammar gave up mid-reply (llguidance's limits): why
    looped: bool = False  # the scanner cut a list that repeats itself (a loop, as if at the
    # token budget)


@dataclass
class _End:
    """Why a turn ends here."""

    stop: str  # answer | context | interrupted | grammar
    answer: str | None = None
    fallback: bool = False
    warning: str | None = None
    interrupt: KeyboardInterrupt | None = None
    dropped: bool = False
    cut: bool = False


class Agent:
    def __init__(self, lm, engine: Engine, tools: Sequence[Tool], fmt: Format,
                 config: AgentConfig | None = None,
                 emit: Callable[[ev.Event], None] = lambda e: None, sampler=None,
                 recorder=None, probe_sampler=None):
        """``probe_sampler`` draws the values of a call's probes
        (:mod:`mlx_agent.stated_arguments`, :mod:`mlx_agent.copied_values`,
        :mod:`mlx_agent.described_tool`): greedy by
        default, the value the model finds most likely, whatever ``sampler`` draws replies
        with."""
        self.lm, self.engine, self.fmt = lm, engine, fmt
        self.tools = {t.name: t for t in tools}
        self.config = config or AgentConfig()
        self.emit = emit
        self.sampler = sampler or self.config.sampling.sampler()
        self.probe_sampler = probe_sampler or greedy_sampler
        self.conversation = Conversation(fmt, tools)
        self.log = TrajectoryLog(recorder, self.conversation.system_ids,
                                 self.conversation.system_text) if recorder else None
        self.forbidden = sorted(set(special_tokens(lm.tokenizer)) | set(fmt.markers))
        self._constraints: dict[tuple[str, bool], Constraint] = {}
        self._made: list[str] = []  # this turn's calls that ran, as the grammar writes them
        self._called: set[str] = set()  # the tools they called
        self._tried: set[str] = set()  # the tools the turn's calls tried: ran, failed, denied
        self._failed, self._retries = False, 0  # the last step's calls failed; retries left
        self._advised: list[str] = []  # tools the last step's failed built-in calls advise
        self._ll = ll_tokenizer(lm) if self.config.grammar else None
        choices = self.config.choices()
        if self.config.grammar:  # compile now: a bad schema or choice is a start-up error
            for choice in choices:
                self._constraint(choice, self.fmt.name == "hermes")  # json: one call a reply
        elif choices != {"auto"}:
            raise ValueError("tool_choice needs the grammar (the grammar is what enforces it)")
        system = len(self.conversation.system_ids)
        if engine.cache_mode == "rotating":
            if system >= engine.kv_window:
                raise ContextFull(f"the system prompt is {system} tokens, more than the "
                                  f"{engine.kv_window}-token KV window can hold pinned; use a "
                                  "larger window or fewer tools")
            engine.pin(system)
        elif system >= engine.context_length:
            raise ContextFull(f"the system prompt is {system} tokens ({len(self.tools)} tool"
                              f"{'' if len(self.tools) == 1 else 's'}) "
                              f"and the context holds {engine.context_length}; give fewer "
                              "tools (or raise the context length)")

    def prime(self, prompt_cache) -> ev.Cache:
        """Load the system prompt's KV state from ``prompt_cache``, or prefill and save it."""
        hit = prompt_cache.prime(self.engine, self.lm.identity, self.conversation.system_ids)
        ms = round(hit.seconds * 1000, 2)
        event = ev.Cache(hit=hit.hit, tokens=hit.tokens, bytes=hit.bytes, key=hit.key,
                         load_ms=ms if hit.hit else None, prefill_ms=None if hit.hit else ms)
        self.emit(event)
        return event

    def save_session(self, path) -> int:
        """Write the conversation and its KV state to ``path`` (atomically)."""
        return save_session(path, self.lm.identity, self.engine, self.fmt.name,
                            self.conversation.state())

    def resume(self, path) -> int:
        """Continue a saved conversation; returns how many tokens came back without prefill.
        Raises ValueError (and changes nothing) when the file cannot be used."""
        # a snapshot holds at most this many tokens (a rotating window's, before it rotates)
        most = max(self.engine.context_length, self.engine.kv_window)
        name, state, tokens, kvs = load_session(path, self.lm.identity, most)
        if name != self.fmt.name:
            raise ValueError(f"it uses the {name} protocol, this run {self.fmt.name}")
        if not self.engine.computes_whole(len(tokens)):
            # this window would have computed the later tokens seeing only the window: the
            # saved KV state is not its own, so the conversation is prefilled again
            tokens, kvs = [], []
        before = self.conversation.state()
        self.conversation.load_state(state)
        whole = len(self.conversation.prompt_ids())  # a saved conversation without its KV
        if self.engine.room is not None and whole >= self.engine.context_length:
            self.conversation.load_state(before)  # no turn could follow it
            raise ValueError(f"its conversation is {whole} tokens, more than the "
                             f"{self.engine.context_length}-token context")
        try:
            if tokens:
                self.engine.restore(tokens, kvs)
        except ContextFull as e:
            self.conversation.load_state(before)
            raise ValueError(str(e)) from None
        return len(tokens)

    # -- one user turn: run -> step -> query / execute --------------------------------

    def ask(self, text: str) -> Outcome:
        self.emit(ev.User(text=text))
        self.conversation.add_user(text)
        self._made, self._called, self._tried = [], set(), set()
        self._failed, self._retries = False, self.config.retry_after_error
        self._advised = []
        stats, start = TurnStats(), time.perf_counter()
        end = _End("steps")
        for step in range(self.config.max_steps):
            if (done := self._step(step, stats, text if step == 0 else None)) is not None:
                end = done
                break
        if end.answer is not None:
            self.emit(ev.Answer(text=end.answer, fallback=end.fallback))
        final = stats.event(time.perf_counter() - start, end.stop)
        self.emit(final)
        if self.log is not None:
            self.log.finish(final)
        return Outcome(end.answer, end.fallback, final, end.warning, end.interrupt, end.dropped,
                       end.cut)

    def _step(self, step: int, stats: TurnStats, user_text: str | None) -> _End | None:
        """One assistant step; returns why the turn ends, or None to go on."""
        prompt = self.conversation.prompt_ids()
        try:
            sync = self.engine.sync(prompt)
        except ContextFull as e:
            if user_text is None:  # the fact alone: the caller gives its own advice
                return _End("context", warning=e.fact)
            # the model never read the message: kept, it would fill every later turn too
            self.conversation.drop_last()
            return _End("context", warning=e.fact, dropped=True)
        except KeyboardInterrupt as e:  # during prefill: the engine repaired its cache
            return _End("interrupted", interrupt=e)
        stats.synced(len(prompt), sync)
        choice = self.config.choice(step)
        if (step == 0 and choice == "auto" and self.config.follow_named_tool
                and self.config.grammar and user_text is not None
                and (named := named_tool(user_text, self.tools)) is not None):
            choice = named
            stats.named_steps += 1
        # the request writes a tool's name (after a result, one not called yet), and the
        # model would answer from its own knowledge: it must call (one of those tools), and
        # is asked for what it would make up
        press = pressed_tools(list(self.tools.values()), self._messages(), self._tried) \
            if choice == "auto" and self.config.grammar and self.config.stated_arguments \
            and self.config.follow_named_tool and self._call_left() \
            and getattr(self.engine, "cache_mode", None) != "rotating" else []
        pressed = bool(press) and not would_call(
            self.engine, self.lm, self.fmt.name, prompt,
            self._constraint("auto", self.fmt.name == "hermes"))
        if pressed:  # after a result, the one tool pressed; the first reply, any
            choice = press[0].name if step > 0 else "required"
            stats.mentioned_steps += 1
        if (choice == "auto" and self._failed and self._retries > 0 and self.config.grammar
                and step + 1 < self.config.max_steps and self._call_left()):
            # the built-in tool a built-in tool's error advises ("no file 'TODO'; ... call
            # the grep tool"; "leave the path out": the same tool, which the guard keeps
            # from the same call); else any
            advised = next((name for name in self._advised if self.tools.get(name) is not None
                            and self.tools[name].builtin is not None), None) \
                if self.config.follow_named_tool else None
            choice, self._retries = advised or "required", self._retries - 1
            stats.retried_steps += 1
        q = self._query(choice, parallel=False if pressed else None)
        stats.generated_tokens += len(q.sampled)
        stats.guarded_steps += q.guarded_steps
        reply = parsed = self.fmt.parse(q.turn_text)
        text, ids = q.turn_text, q.sampled[:-1] if q.closed else q.sampled
        raw, sampled = q.raw, q.sampled
        if self.config.stated_arguments and self.config.grammar and q.interrupt is None \
                and not is_forced(choice):  # an exact call (a guided rollout's) stays so
            tail = q.sampled[len(ids):]
            try:
                reply, text, ids = complete_reply(
                    self.engine, self.lm, self.fmt.name, prompt, reply, text, ids, tail,
                    list(self.tools.values()), self._messages(),
                    self.probe_sampler, self._made,
                    choices=list(self.tools.values()) if choice in ("auto", "required")
                    else (), max_tokens=self.config.max_tokens,  # a named tool stays
                    may_answer=choice == "auto" or pressed, pressed=pressed)
            except KeyboardInterrupt as e:  # during a probe: the reply stands as sampled,
                q.interrupt = e  # and the engine's cache holds what its tokens say
            if reply is not parsed:  # the call as completed is what the model reads next
                raw, sampled = text, ids + tail
                if reply.calls:
                    stats.stated_calls += 1
                else:  # a call on made-up numbers: the user is asked for them
                    stats.unfounded_calls += 1
            elif q.interrupt is None:
                try:
                    stated = stated_answer(self.engine, self.lm, self.fmt.name, prompt, reply,
                                           text, ids, tail, self._messages())
                except KeyboardInterrupt as e:  # the answer stands as sampled, as after a
                    q.interrupt, stated = e, (reply, text, ids)  # probe
                if stated[0] is not reply:  # an answer beside a short result: the result
                    reply, text, ids = stated
                    raw, sampled = text, ids + tail
                    stats.stated_answers += 1
        self.emit(ev.Assistant(step=step, raw=raw))
        self.conversation.add_reply(reply, text, ids)
        self._failed, self._advised = False, []
        stopped = q.interrupt is not None or q.gave_up
        results, cut = ([], None) if stopped or not reply.calls else \
            self._execute(reply.calls, stats)
        if reply is not parsed and text in self._made and parsed.calls \
                and reply.calls[0].name == parsed.calls[0].name:
            # the changed call ran: the guard refuses the call as sampled too, which the
            # next step would change into the same call (a call of another tool is never
            # moved after the turn's first: the model may make it next)
            call = parsed.calls[0]
            self._made += refused_texts(self.fmt.name, self.tools[call.name], call.arguments)
        if self.log is not None:
            self.log.step(prompt, sync.reused, user_text, raw, sampled, reply, results)
        if q.interrupt is not None:
            return _End("interrupted", interrupt=q.interrupt)
        if q.gave_up:
            return _End("grammar", warning=q.gave_up)
        if not reply.calls:
            if not (q.closed or q.finished) and self.engine.room == 0:
                return _End("context", reply.content, not reply.complete, "the reply reached "
                            f"the end of the {self.engine.context_length}-token context")
            if not (q.closed or q.finished) and (len(q.sampled) >= self.config.max_tokens
                                                 or q.looped):
                return _End("answer", reply.content, not reply.complete, cut=True)
            return _End("answer", reply.content, not reply.complete)
        self.conversation.add_results([(r.tool, content) for r, content in results])
        return _End("interrupted", interrupt=cut) if cut is not None else None

    def _query(self, choice: str, parallel: bool | None = None) -> _Query:
        """Sample one reply under the tool choice ``choice`` until the scanner or the stop
        token ends it (Ctrl-C: the reply so far stands); ``parallel``: whether it may hold
        several calls (by default hermes's may, json's one)."""
        parallel = self.fmt.name == "hermes" if parallel is None else parallel
        scanner = self.fmt.scanner(parallel=parallel)
        constraint = self._guarded(self._constraint(choice, parallel))
        stream = TextStream(self.engine, self.lm.tokenizer, self.sampler,
                            max_tokens=self.config.max_tokens, stop_ids=self.lm.end_ids,
                            constraint=constraint)
        interrupt, gave_up = None, None
        try:
            for _, segment in stream:
                if segment and scanner.feed(segment):
                    break
        except KeyboardInterrupt as e:
            interrupt = e
        except GrammarError as e:  # this turn's alone: the session (an eval's other runs) goes on
            gave_up = str(e)
        scanner.feed(stream.flush())
        closed = bool(stream.ids) and stream.ids[-1] in self.lm.end_ids
        looped = scanner.looped  # cut as the token budget would cut it
        return _Query(scanner.text, scanner.turn_text, stream.ids, closed,
                      scanner.finished and not looped, interrupt,
                      isinstance(constraint, LoopGuard) and constraint.interventions > 0,
                      gave_up, looped)

    def _execute(self, calls: list[Call], stats: TurnStats
                 ) -> tuple[list[tuple[ToolResult, str]], KeyboardInterrupt | None]:
        """Run the calls in order; returns each result with the text the model reads, and
        the Ctrl-C (or SIGTERM) that cut them short, if one did (the executor has killed the
        tool): that call and the ones after it get an error result, so the conversation
        stays whole and the session can go on."""
        results, cut = [], None
        for call in calls:
            self._tried.add(call.name)
            if cut is None:
                try:
                    result, valid, denied = self._run(call)
                except KeyboardInterrupt as e:
                    cut = e
            if cut is not None:
                result, valid, denied = error_result(call.name, INTERRUPTED), False, False
                self.emit(ev.ToolCall(tool=call.name, arguments=call.arguments, stdout="",
                                      stderr=result.stderr, exit_code=result.exit_code,
                                      timed_out=False, duration_sec=0.0))
            stats.ran(result, valid)
            # a failure to try another way after (a call the user denied is not one)
            failed = (result.exit_code != 0 or result.timed_out) and not denied
            self._failed |= failed
            tool = self.tools.get(call.name)
            if failed and tool is not None and (advised := advised_tool(tool, result)):
                self._advised.append(advised)
            content = result.for_model()
            self.emit(ev.ToolResult(tool=result.tool, content=content))
            results.append((result, content))
        return results, cut

    def _run(self, call: Call) -> tuple[ToolResult, bool, bool]:
        """Run one call if it is valid and not denied; returns the result, whether the call
        was valid and whether the user denied it."""
        result, valid, denied = self._check(call), False, False
        if result is None:
            valid = True
            if self.config.confirm and not self.config.confirm(call.name, call.arguments):
                result = error_result(call.name, "the user denied this tool call")
                denied = True
            else:
                tool = self.tools[call.name]
                result = self._withhold_markers(run_tool(
                    tool, call.arguments, timeout=self.config.tool_timeout,
                    env_names=self.config.tool_env, cwd=self.config.tool_cwd,
                    sandbox=self.config.sandbox))
                self._made += refused_texts(self.fmt.name, tool, call.arguments)
                self._called.add(tool.name)
        self.emit(ev.ToolCall(tool=result.tool, arguments=call.arguments, stdout=result.stdout,
                              stderr=result.stderr, exit_code=result.exit_code,
                              timed_out=result.timed_out, duration_sec=result.duration_sec))
        return result, valid, denied

    def _check(self, call: Call) -> ToolResult | None:
        """The error result for a call that must not run, or None for a valid one."""
        if call.error:
            return error_result(call.name, call.error)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return error_result(call.name, f"unknown tool {call.name!r}; available: {known}")
        problems = tool.validate(call.arguments)
        if problems:
            return error_result(tool.name, "invalid arguments: " + "; ".join(problems))
        return None

    def _withhold_markers(self, result: ToolResult) -> ToolResult:
        forged = next((s for s in self.forbidden if s in result.stdout or s in result.stderr),
                      None)
        if forged:
            return error_result(result.tool, f"the tool output contains the reserved marker "
                                             f"{forged!r}; it was withheld")
        return result

    def _messages(self) -> list[dict]:
        """The conversation as the model reads it, system prompt first."""
        return [{"role": "system", "content": self.conversation.system_text},
                *self.conversation.messages]

    def _call_left(self) -> bool:
        """Whether the loop guard leaves a call to make: a tool not called this turn, or one
        that takes arguments (other arguments are another call). A retry is forced only
        then; else the guard would have to stand aside and let a call repeat."""
        return self.config.allow_repeat_calls or any(
            t.name not in self._called or t.parameters.get("properties")
            for t in self.tools.values())

    def _guarded(self, constraint: Constraint | None) -> Constraint | None:
        """``constraint`` with this turn's calls excluded (the loop guard), when on."""
        if constraint is None or not self._made or self.config.allow_repeat_calls:
            return constraint
        ll = self._ll
        return LoopGuard(constraint, token_bytes(ll, self.lm.vocab_size),
                         [call_bytes(self.lm, ll, text) for text in self._made], ll)

    def _constraint(self, choice: str, parallel: bool) -> Constraint | None:
        """The grammar constraint for ``choice`` (None with the grammar off), reset."""
        if not self.config.grammar:
            return None
        if (choice, parallel) not in self._constraints:
            self._constraints[choice, parallel] = tool_constraint(
                self.lm, self.fmt.name, list(self.tools.values()), self.config.max_tokens,
                choice, parallel=parallel)
        constraint = self._constraints[choice, parallel]
        constraint.reset()
        return constraint

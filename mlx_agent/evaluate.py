"""``mlx_agent eval``: run the agent over a task set, check each outcome, record rewards.

A tasks file is JSONL; each task:

    {"id": "weather-1", "prompt": "...",
     "tools": "tools.json",            # optional, relative to the tasks file
     "builtin_tools": true,            # optional, over the task's working directory
     "fixture": "fixtures/repo",       # optional directory, copied fresh for every run
     "tool_choice": ["calculate", "none"],   # optional, per step (see AgentConfig): guided
                 # rollouts that make the call, then answer; {"name", "arguments"} forces a call
     "check": {"tool_calls": [{"name": "...", "arguments": {...}}]}   # in order; the
                                                # expected arguments must all match;
                                                # [] means an answer with no call at all
           | {"shell": "pytest -q"}                                   # exits 0 in the task dir
           | {"answer_pattern": "Paris"}}                             # regex on the answer

Every run gets a fresh temporary copy of its fixture (or an empty directory) as the working
directory of its tools. One engine serves all runs, so the shared system prompt is prefilled
once and reused. Each run's trajectory gets its reward (1.0 or 0.0). A ``sandbox`` in
``config_overrides`` (see ``AgentConfig``) confines the tools, ``run_tests`` and a shell check
to the run's directory. Nothing here prints.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import msgspec

from .agent import Agent, AgentConfig, agent_format
from .agent import events as ev
from .batch_runner import BatchRunner, run_pool
from .cache import ContextFull
from .engine import Engine, SamplingParams
from .errors import UserFacingError
from .fileio import check_tree, copy_tree, jsonl_lines, read_regular
from .json_errors import json_problem
from .tools import Tool, builtin_tools, load_tools
from .tools.executor import run_process, stopped_by
from .tools.sandbox import Sandbox
from .trajectory import Recorder, set_reward


class TaskError(UserFacingError, ValueError):
    """A tasks file that cannot be used; the message names the file and line."""


class Check(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    tool_calls: list[dict] | None = None
    shell: str | None = None
    answer_pattern: str | None = None


class Task(msgspec.Struct, forbid_unknown_fields=True):
    prompt: str
    check: Check
    id: str = ""
    tools: str | None = None
    builtin_tools: bool = False
    fixture: str | None = None
    tool_choice: str | dict | list[str | dict] | None = None


@dataclass
class RunResult:
    task: str
    seed: int
    reward: float
    calls: int
    valid_calls: int
    turns: int
    rendered: int
    reused: int
    seconds: float
    answer: str | None
    trajectory: str | None = None
    # why the run could not be finished (its reward is 0), or why its turn stopped early
    # (the context filled, the grammar gave up: its reward is what it did before)
    error: str | None = None
    tool_errors: int = 0  # calls whose tool failed
    guarded_steps: int = 0  # steps in which the loop guard masked a repeated call
    retried_steps: int = 0  # steps made to call again after a failed call
    named_steps: int = 0  # first steps made to call the tool the request named
    mentioned_steps: int = 0  # first steps made a call: the request wrote a tool's name
    stated_calls: int = 0  # calls the request's stated and copied values changed
    unfounded_calls: int = 0  # calls on a value no one gave, made questions
    stated_answers: int = 0  # answers that stated nothing of a short result, made to state it

    def row(self) -> dict:
        """The run's row in ``eval --out``: the same however the runs were distributed,
        apart from ``seconds``."""
        row = {"task": self.task, "seed": self.seed, "reward": self.reward,
               "calls": self.calls, "turns": self.turns, "answered": self.answer is not None,
               "tool_errors": self.tool_errors, "guarded_steps": self.guarded_steps,
               "retried_steps": self.retried_steps, "named_steps": self.named_steps,
               "mentioned_steps": self.mentioned_steps, "stated_calls": self.stated_calls,
               "unfounded_calls": self.unfounded_calls, "stated_answers": self.stated_answers,
               "seconds": round(self.seconds, 3)}
        return row | ({"error": self.error} if self.error else {})


@dataclass
class Summary:
    runs: list[RunResult] = field(default_factory=list)

    def row(self) -> dict[str, float]:
        n = max(len(self.runs), 1)
        calls = sum(r.calls for r in self.runs)
        rendered = sum(r.rendered for r in self.runs)
        return {
            "runs": len(self.runs),
            "success": sum(r.reward for r in self.runs) / n,
            "valid_calls": sum(r.valid_calls for r in self.runs) / calls if calls else 0.0,
            "answered": sum(r.answer is not None for r in self.runs) / n,
            "mean_calls": calls / n,
            "mean_turns": sum(r.turns for r in self.runs) / n,
            "cache_share": sum(r.reused for r in self.runs) / rendered if rendered else 0.0,
            "seconds": sum(r.seconds for r in self.runs),
        }


MAX_TASKS_FILE_BYTES = 256 << 20  # a million tasks of a couple hundred bytes fit
MAX_RUNS = 1_000_000  # tasks times seeds: each run is listed up front (11 days at 1 s a run)


def load_tasks(path: str | Path) -> list[Task]:
    return [task for _, task in _numbered_tasks(path)]


def _numbered_tasks(path: str | Path) -> list[tuple[int, Task]]:
    """The tasks of the file, each with its line number."""
    path = Path(path)
    tasks, fixtures, lines = [], set(), {}
    try:
        text = read_regular(path, max_bytes=MAX_TASKS_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    for i, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        try:
            task = msgspec.json.decode(line, type=Task)
        except msgspec.DecodeError as e:
            raise TaskError(f"{path}:{i}: not a task ({json_problem(e, line)})") from None
        except RecursionError:
            raise TaskError(f"{path}:{i}: not a task (JSON nested too deeply to read)") from None
        checks = [c for c in (task.check.tool_calls, task.check.shell, task.check.answer_pattern)
                  if c is not None]
        if len(checks) != 1:
            raise TaskError(f"{path}:{i}: a task needs exactly one check "
                             "(tool_calls, shell or answer_pattern)")
        if task.check.shell is not None and not task.check.shell.strip():
            raise TaskError(f"{path}:{i}: the shell check is empty (it would pass every run); "
                            "give a command that exits 0 when the task is done")
        if task.check.answer_pattern is not None:
            try:
                re.compile(task.check.answer_pattern)
            except re.error as e:
                raise TaskError(f"{path}:{i}: answer_pattern is not a regex ({e})") from None
        for want in task.check.tool_calls or ():
            if not (isinstance(want.get("name"), str)
                    and isinstance(want.get("arguments", {}), dict)):
                raise TaskError(f"{path}:{i}: each expected tool call needs "
                                 '{"name": "...", "arguments": {...}}')
        if not task.prompt.strip():
            raise TaskError(f"{path}:{i}: the prompt is empty")
        if not task.tools and not task.builtin_tools:
            raise TaskError(f"{path}:{i}: a task needs tools or builtin_tools")
        if task.fixture is not None and task.fixture not in fixtures:
            if not (path.parent / task.fixture).is_dir():
                raise TaskError(f"{path}:{i}: fixture {task.fixture!r} is not a directory "
                                 f"(it is read relative to {path.parent})")
            try:  # copied for every run: files, folders and links only, a bounded number
                check_tree(path.parent / task.fixture)
            except OSError as e:
                raise TaskError(f"{path}:{i}: fixture {task.fixture!r} cannot be copied: "
                                f"{e.filename}: {e.strerror}") from None
            fixtures.add(task.fixture)
        choices = task.tool_choice if isinstance(task.tool_choice, list) else [task.tool_choice]
        for c in choices:
            if isinstance(c, dict) and not (isinstance(c.get("name"), str)
                                            and isinstance(c.get("arguments", {}), dict)):
                raise TaskError(f"{path}:{i}: a tool_choice call needs "
                                 '{"name": "...", "arguments": {...}}')
        task = msgspec.structs.replace(task, id=task.id or f"task-{i}")
        if task.id in lines:  # ids name its rows and trajectories, and order them
            raise TaskError(f"{path}:{i}: task id {task.id!r} is the id of line "
                            f"{lines[task.id]} too; give each task its own")
        lines[task.id] = i
        tasks.append((i, task))
    if not tasks:
        raise TaskError(f"{path} has no tasks")
    return tasks


@dataclass(frozen=True)
class TaskFile:
    """A tasks file read and checked once: its tasks, and the folder their ``tools`` and
    ``fixture`` paths are relative to. The functions below take one or a path (read then)."""

    path: Path
    tasks: list[Task]
    lines: tuple[int, ...] = ()  # each task's line in the file

    @property
    def base(self) -> Path:
        return self.path.parent

    def where(self, k: int) -> str:
        """``file:line`` of the ``k``-th task, as the file's other errors begin."""
        return f"{self.path}:{self.lines[k]}" if self.lines else str(self.path)

    @classmethod
    def of(cls, tasks: str | Path | TaskFile) -> TaskFile:
        if isinstance(tasks, TaskFile):
            return tasks
        numbered = _numbered_tasks(tasks)
        return cls(Path(tasks), [t for _, t in numbered], tuple(i for i, _ in numbered))


def passed(task: Task, workdir: Path, calls: list[tuple[str, Any]], answer: str | None,
           timeout: float = 60.0, attempted: int | None = None,
           sandbox: Sandbox | None = None) -> bool:
    """``calls`` are the valid calls made; ``attempted`` counts every call, invalid ones too
    (a task that needs no tool wants an answer and fails on any attempt at a call); a
    ``shell`` check runs under ``sandbox`` (it runs the code the model wrote)."""
    check = task.check
    if check.tool_calls == []:
        return answer is not None and (len(calls) if attempted is None else attempted) == 0
    if check.tool_calls is not None:
        # the expected calls, in order, among the valid calls made; the expected arguments
        # must all be there with their values (optional extras the model adds are fine)
        it = iter(calls)
        return all(any(n == want.get("name") and isinstance(a, dict)
                       and all(a.get(k) == v for k, v in want.get("arguments", {}).items())
                       for n, a in it)
                   for want in check.tool_calls)
    if check.shell is not None:
        # the check often runs code the model wrote (pytest): it gets the tools' sandbox
        r = run_process(["/bin/bash", "-c", check.shell], tool="check", timeout=timeout,
                        cwd=workdir, sandbox=sandbox)
        return r.exit_code == 0 and not r.timed_out
    return answer is not None and _search(check.answer_pattern, answer, min(timeout, 10.0))


_SEARCH = "import json, re, sys; p, t = json.load(sys.stdin); sys.exit(0 if re.search(p, t) else 1)"


def _search(pattern: str, text: str, timeout: float) -> bool:
    """``re.search`` in a child process that the timeout can end (a tasks file's pattern
    such as ``^(.|.)*QQQ$`` backtracks for hours, and Python cannot interrupt a match):
    about 20 ms a check. A search past the timeout is no match. Run as a tool is (a Ctrl-C
    or SIGTERM mid-check kills and reaps it: :class:`~mlx_agent.tools.executor.Reaper`)."""
    r = run_process([sys.executable, "-I", "-S", "-c", _SEARCH], tool="answer_pattern",
                    timeout=timeout, stdin=json.dumps([pattern, text]).encode())
    if r.stderr.startswith("error: could not start"):  # no check made: not a miss
        raise UserFacingError(f"the answer_pattern check {r.stderr.removeprefix('error: ')}; "
                              "the machine may be out of processes or open files: run "
                              "with a smaller --batch")
    return r.exit_code == 0 and not r.timed_out


def check_expected_tools(tasks: str | Path | TaskFile, extra: Sequence[Tool] = ()) -> None:
    """Raises TaskError for a task that expects a call of a tool it does not have (its tools
    file, the built-ins when it asks for them, or ``extra``: an MCP server's), or arguments
    that tool's schema refuses: it could never pass; or whose ``tool_choice`` names a tool
    it does not have, or forces a call whose arguments do not fit the tool's schema. Checked
    before any run; each error begins with the task's ``file:line``."""
    tasks = TaskFile.of(tasks)
    builtin = {t.name: t for t in builtin_tools(tasks.base)}
    catalogues: dict[str, dict[str, Tool]] = {}
    for k, task in enumerate(tasks.tasks):
        if task.tools and task.tools not in catalogues:
            catalogues[task.tools] = {t.name: t for t in load_tools(tasks.base / task.tools,
                                                                   handlers="list")}
        have = {**catalogues.get(task.tools, {}), **{t.name: t for t in extra},
                **(builtin if task.builtin_tools else {})}
        for want in task.check.tool_calls or ():
            if want["name"] not in have:
                raise TaskError(f"{tasks.where(k)}: task {task.id!r} expects a call of "
                                f"{want['name']!r}, which is not one of its tools")
            problems = have[want["name"]].unreachable(want.get("arguments", {}))
            if problems:  # only calls that fit the schema count: it could never pass
                raise TaskError(f"{tasks.where(k)}: task {task.id!r} expects arguments no "
                                f"valid call of {want['name']!r} can have: {problems[0]}")
        choices = task.tool_choice if isinstance(task.tool_choice, list) else [task.tool_choice]
        for c in choices:
            name = c.get("name") if isinstance(c, dict) else c
            if c is None or name in ("auto", "none", "required"):
                continue
            if name not in have:
                raise TaskError(f"{tasks.where(k)}: tool_choice names {name!r}, which is not "
                                f"one of the task's tools ({', '.join(sorted(have)) or 'none'}); "
                                "use auto, required, none or a tool's name")
            problems = have[name].validate(c.get("arguments", {})) if isinstance(c, dict) else []
            if problems:
                raise TaskError(f"{tasks.where(k)}: tool_choice's forced call of {name!r} does "
                                f"not fit its schema: {problems[0]}")


def check_handlers(tasks: str | Path | TaskFile, handlers: str = "refuse") -> None:
    """Each tools file the tasks name, loaded with ``handlers`` (``"refuse"``: a Python
    ``_handler`` tool, which runs outside any sandbox, is an error naming it) before any of
    them is imported: a tasks file is data, and may come from anyone."""
    tasks = TaskFile.of(tasks)
    for name in sorted({t.tools for t in tasks.tasks if t.tools}):
        load_tools(tasks.base / name, handlers=handlers)


def tool_names(tasks: str | Path | TaskFile) -> set[str]:
    """The names of every tool the tasks' tools files define."""
    tasks = TaskFile.of(tasks)
    files = {t.tools for t in tasks.tasks if t.tools}
    return {tool.name for f in sorted(files)
            for tool in load_tools(tasks.base / f, handlers="list")}


def run(lm, tasks_file: str | Path | TaskFile, *, seeds: int = 1, protocol: str = "auto",
        config_overrides: dict | None = None, trajectory_dir: str | Path | None = None,
        sampler_for: Callable[[int], Any] | None = None,
        on_run: Callable[[RunResult], None] = lambda r: None, batch: int = 1,
        extra_tools: Sequence[Tool] = (), handlers: str = "refuse") -> Summary:
    """Run every task ``seeds`` times; ``extra_tools`` (an MCP server's) join every task's
    own; ``sampler_for(seed)`` overrides sampling (tests). A tasks file is data: a Python
    ``_handler`` tool in its tools files is an error unless ``handlers="import"`` (see
    :func:`check_handlers`).

    With ``batch`` > 1, that many runs go at a time, each in a thread with an engine of its
    own, decoding together on a :class:`~mlx_agent.batch_runner.BatchRunner` (a run's tools
    execute while the others decode); ``on_run`` gets results as runs finish, the summary
    lists them in task order."""
    tasks = TaskFile.of(tasks_file)
    check_handlers(tasks, handlers)
    runs = [(task, seed) for task in tasks.tasks for seed in range(seeds)]

    def one(engine: Engine, item: tuple[Task, int]) -> RunResult:
        task, seed = item
        return run_one(lm, engine, task, seed, tasks.base, protocol,
                       dict(config_overrides or {}), trajectory_dir,
                       sampler_for(seed) if sampler_for else None, extra_tools)

    if batch <= 1:
        engine = lm.engine()
        summary = Summary()
        for item in runs:
            summary.runs.append(one(engine, item))
            on_run(summary.runs[-1])
        return summary
    stop = threading.Event()  # set on Ctrl-C: a worker's tool call ends now, not at its timeout

    def stoppable(engine: Engine, item: tuple[Task, int]) -> RunResult:
        with stopped_by(stop):
            return one(engine, item)

    def cancel() -> None:
        stop.set()
        runner.cancel()

    with BatchRunner(lm.model, max_batch=batch) as runner:
        engines = [runner.engine(lm) for _ in range(min(batch, len(runs)))]
        return Summary(run_pool(engines, runs, stoppable, on_done=lambda i, r: on_run(r),
                                cancel=cancel))


def run_one(lm, engine: Engine, task: Task, seed: int, base: Path, protocol: str,
            overrides: dict, trajectory_dir: str | Path | None, sampler,
            extra_tools: Sequence[Tool] = ()) -> RunResult:
    """One run of one task in a fresh working directory; its trajectory gets its reward."""
    with tempfile.TemporaryDirectory(prefix="mlx-agent-eval-") as tmp:
        workdir = Path(tmp) / "work"
        if task.fixture:
            try:
                copy_tree(base / task.fixture, workdir)
            except OSError as e:
                raise TaskError(f"task {task.id!r}: cannot copy its fixture: {e.filename}: "
                                f"{e.strerror}") from None
        else:
            workdir.mkdir()
        # its handlers were checked before any run (run()'s check_handlers, or the CLI's)
        tools = load_tools(base / task.tools, handlers="import") if task.tools else []
        if task.builtin_tools:
            tools += builtin_tools(workdir, sandbox=overrides.get("sandbox"))
        tools += extra_tools
        sampling = dataclasses.replace(overrides.get("sampling", SamplingParams()), seed=seed)
        config = AgentConfig(**{**overrides, "tool_cwd": str(workdir), "sampling": sampling})
        if task.tool_choice is not None:
            tc = task.tool_choice
            config.tool_choice = tuple(tc) if isinstance(tc, list) else tc
        calls: list[tuple[str, Any]] = []

        def emit(e):
            if isinstance(e, ev.ToolCall) and e.exit_code != -1:
                calls.append((e.tool, e.arguments))

        recorder = Recorder(trajectory_dir, task=task.id,
                            model_fingerprint=lm.identity.fingerprint,
                            sampling=dataclasses.asdict(sampling)) if trajectory_dir else None
        start = time.perf_counter()
        try:
            try:
                agent = Agent(lm, engine, tools, agent_format(protocol, lm), config, emit=emit,
                              recorder=recorder, sampler=sampler)
            except ContextFull as e:  # the task's tools alone overflow the context
                raise TaskError(f"task {task.id!r}: {e}") from None
            out = agent.ask(task.prompt)
            if out.interrupt is not None:  # Ctrl-C or SIGTERM cut the reply (the agent caught it)
                raise out.interrupt
            s = out.stats
            reward = float(passed(task, workdir, calls, out.answer, attempted=s.calls,
                                  sandbox=overrides.get("sandbox")))
            if recorder:
                set_reward(recorder.path, reward)
        except KeyboardInterrupt:  # stop here: a run cut short is no result, nor training data
            if recorder:
                recorder.path.unlink(missing_ok=True)
            raise
        return RunResult(task=task.id, seed=seed, reward=reward,
                         calls=s.calls, valid_calls=s.valid_calls, turns=s.turns,
                         rendered=s.rendered_tokens, reused=s.reused_tokens,
                         seconds=time.perf_counter() - start, answer=out.answer,
                         trajectory=str(recorder.path) if recorder else None,
                         tool_errors=s.tool_errors, guarded_steps=s.guarded_steps,
                         retried_steps=s.retried_steps, named_steps=s.named_steps,
                         mentioned_steps=s.mentioned_steps, stated_calls=s.stated_calls,
                         unfounded_calls=s.unfounded_calls, stated_answers=s.stated_answers,
                         error=out.warning)  # why the turn stopped early, if it did

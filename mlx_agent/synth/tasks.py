"""Tasks built from a tool catalogue: one call, no call, two chained calls, a stated result.

Five kinds, in ``eval``'s task format (``evaluate.Task``):

- ``call``: one request, checked by the expected call (``tool_calls``);
- ``none``: chit-chat, general knowledge or a small sum to work out (only where no tool's
  words speak of arithmetic) unrelated to the catalogue, checked by ``tool_calls: []`` (no
  call may be made);
- ``outside``: a request phrased like a tool request, for a tool the catalogue lacks (see
  :func:`outside_tools`; each side asks for its own half of them), checked by
  ``tool_calls: []``: the model must say it cannot, not call the nearest tool it has;
- ``chain``: two calls where the second takes the first one's result as a parameter
  (a number into a number parameter, a short text into a free-text one), checked by both
  calls in order;
- ``answer``: one request whose answer must state the tool's result (``answer_pattern``).

The last two need the tool's real result, so :class:`Results` runs tools, as ``eval``
would, in a fresh empty directory, and keeps a result only when it is one short line, the
same on a second run, and different for other arguments (a constant "ok" says nothing).

Held-out tasks draw values and phrasings from their own side only, and one whose values,
prompt or calls appear in training is drawn again, so the overlap is zero by construction
and measured in the report. Not promised: every requested task count (a catalogue of one
argument-less tool has one possible call); chains or answers where no tool can run.
"""

from __future__ import annotations

import random
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..tools import Sandbox, Tool, run_tool
from ..tools.builtin import rebound
from .phrasing import ARITHMETIC, VERBS, WORKED, Phrase, Phraser
from .values import (Sampler, Unsatisfiable, as_schema, canonical, free_leaves, kind_of,
                     singular, words)

KINDS = ("call", "none", "outside", "chain", "answer")
CHAIN_TEXT_KINDS = frozenset({"text", "query", "title", "word"})
MAX_RESULT = 80


@dataclass(frozen=True)
class SynthTask:
    """A task as written (``task``) and what the report and the tests need to know of it."""

    task: dict
    kind: str
    tools: tuple[str, ...]  # the tools its calls use (outside: the one asked for, not had)
    templates: tuple[str, ...]
    calls: tuple[str, ...]  # canonical JSON of every call the task involves
    values: frozenset[str]  # the free values of those calls (see values.free_leaves)
    asked: dict | None = None  # outside: the call the request names ({"name", "arguments"})


class Results:
    """Runs tools to learn their results; caches by call, so each call runs at most twice."""

    def __init__(self, tools: list[Tool], run: bool = True, timeout: float = 10.0,
                 sandbox: Sandbox | None = None):
        self.enabled, self.timeout, self.sandbox = run, timeout, sandbox
        self._cache: dict[str, str | None] = {}
        self._varies: dict[str, bool] = {}
        self.tools = {t.name: t for t in tools}

    def runnable(self, tool: Tool) -> bool:
        return self.enabled and bool(tool.exec_template or tool.handler or tool.builtin)

    def _run(self, tool: Tool, arguments: dict) -> str | None:
        with tempfile.TemporaryDirectory(prefix="mlx-agent-synth-") as cwd:
            r = run_tool(rebound(tool, cwd), arguments, timeout=self.timeout, cwd=cwd,
                         sandbox=self.sandbox)
        out = r.stdout.strip()
        if r.exit_code != 0 or r.timed_out or not out or "\n" in out or len(out) > MAX_RESULT:
            return None
        return out

    def result(self, tool: Tool, arguments: dict) -> str | None:
        """The tool's one-line result for these arguments, or None when it has none to use."""
        if not self.runnable(tool):
            return None
        key = canonical([tool.name, arguments])
        if key not in self._cache:
            first = self._run(tool, arguments)
            same = first is not None and self._run(tool, arguments) == first
            self._cache[key] = first if same else None
        return self._cache[key]

    def varies(self, tool: Tool, sampler: Sampler) -> bool:
        """Whether the tool's result depends on its arguments (tried on two samples)."""
        if tool.name not in self._varies:
            seen = set()
            for _ in range(4):
                try:
                    seen.add(self.result(tool, sampler.arguments(tool)))
                except Unsatisfiable:
                    break
            self._varies[tool.name] = len(seen - {None}) >= 2
        return self._varies[tool.name]


def chain_targets(tools: list[Tool], source: Tool) -> list[tuple[Tool, str, bool]]:
    """Parameters another call could take ``source``'s result in (numbers, or free text),
    each with whether its name shares a word with the source tool's name."""
    own = {singular(w) for w in words(source.name)}
    out = []
    for tool in tools:
        context = frozenset(words(tool.name) + words(tool.description))
        for name, schema in tool.properties.items():
            kind = kind_of(name, schema, context)
            if kind.pool in ("integer", "number") or kind.pool in CHAIN_TEXT_KINDS:
                out.append((tool, name, bool(own & {singular(w) for w in words(name)})))
    return out


def _as_param(result: str, schema: dict) -> Any:
    """The result as a value of the parameter's type, or None when it is not one."""
    t = as_schema(schema).get("type")
    if t in ("integer", "number") and re.fullmatch(r"-?\d+", result):
        return int(result)
    if t == "number" and re.fullmatch(r"-?\d+\.\d+", result):
        return float(result)
    if t == "string" and not re.fullmatch(r"-?\d+(\.\d+)?", result):
        return result
    return None


def answer_pattern(result: str) -> str:
    """A regex that finds ``result`` whole in an answer (not inside a longer number/word)."""
    return rf"(?<![\w.]){re.escape(result)}(?![\w])"


def _call(name: str, arguments: dict) -> dict:
    return {"name": name, "arguments": arguments}


class Builder:
    """Builds tasks of each kind for one side."""

    def __init__(self, tools: list[Tool], side: str, rng: random.Random, results: Results,
                 optional_share: float = 0.5, files: tuple[str, ...] = ()):
        self.tools, self.side, self.rng, self.results = tools, side, rng, results
        self.sampler = Sampler(rng, side, optional_share, files)
        self.phraser = Phraser(rng, side, self.sampler)
        self.by_name = {t.name: t for t in tools}
        self.vocabulary = _vocabulary(tools)

    def arguments(self, tool: Tool, fixed: dict | None = None) -> dict:
        """Sampled arguments, with ``fixed`` ones set, in the schema's property order;
        raises :class:`Unsatisfiable` when they do not validate."""
        fixed = fixed or {}
        drawn = {**self.sampler.arguments(tool, omit=tuple(fixed)), **fixed}
        args = {k: drawn[k] for k in tool.properties if k in drawn}
        problems = tool.validate(args)
        if problems:  # a schema keyword the sampler does not know: draw again elsewhere
            raise Unsatisfiable(f"{tool.name}: {problems[0]}")
        return args

    def _task(self, kind: str, prompt: Phrase, check: dict, calls: list[tuple[Tool, dict]],
              asked: tuple[Tool, dict] | None = None):
        """A task whose expected ``calls`` are given; ``asked``: the (tool, arguments) an
        ``outside`` request names, whose values count as the task's, with no call."""
        named = calls + ([asked] if asked else [])
        values = frozenset(v for tool, args in named for v in free_leaves(tool.parameters, args))
        task = {"prompt": prompt.text, "tools": "tools.json", "check": check}
        return SynthTask(task, kind, tuple(t.name for t, _ in named), prompt.templates,
                         tuple(canonical(_call(t.name, a)) for t, a in calls), values,
                         _call(asked[0].name, asked[1]) if asked else None)

    def call(self, tool: Tool) -> SynthTask:
        args = self.arguments(tool)
        return self._task("call", self.phraser.request(tool, args),
                          {"tool_calls": [_call(tool.name, args)]}, [(tool, args)])

    def answer(self, tool: Tool) -> SynthTask | None:
        args = self.arguments(tool)
        result = self.results.result(tool, args)
        if result is None:
            return None
        return self._task("answer", self.phraser.answer(tool, args),
                          {"answer_pattern": answer_pattern(result)}, [(tool, args)])

    def chain(self, source: Tool, targets: list[tuple[Tool, str, bool]]) -> SynthTask | None:
        args = self.arguments(source)
        result = self.results.result(source, args)
        if result is None:
            return None
        usable = [(t, p, close) for t, p, close in targets
                  if _as_param(result, t.properties[p]) is not None]
        if not usable:
            return None
        target, param, _ = self.rng.choice([u for u in usable if u[2]] or usable)
        second = self.arguments(target, {param: _as_param(result, target.properties[param])})
        if target is source and second == args:
            return None
        rest = {k: v for k, v in second.items() if k != param}
        prompt = self.phraser.chain(source, args, target, rest, param)
        check = {"tool_calls": [_call(source.name, args), _call(target.name, second)]}
        return self._task("chain", prompt, check, [(source, args), (target, second)])

    def no_tool(self) -> SynthTask | None:
        prompt = self.phraser.no_tool()
        if {singular(w) for w in words(prompt.text)} & self.vocabulary:
            return None  # it might be about the catalogue after all
        if WORKED.intersection(prompt.templates) and self.vocabulary & ARITHMETIC:
            return None  # a number to work out, and the catalogue may do arithmetic
        return self._task("none", prompt, {"tool_calls": []}, [])

    def outside(self, tool: Tool) -> SynthTask | None:
        """A request for ``tool``, which the catalogue does not have."""
        if tool.name in self.by_name:
            return None
        args = self.arguments(tool)
        return self._task("outside", self.phraser.request(tool, args), {"tool_calls": []}, [],
                          asked=(tool, args))


STOP = frozenset("""a an the and or of to for in on at by with from is are be it its this that
these those as into your you my me i we our what which who how do does get set give make
use using tool tools return returns value values given""".split())


def _vocabulary(tools: list[Tool]) -> set[str]:
    """Content words of the catalogue, which a no-tool request must not use."""
    vocab = set()
    for t in tools:
        text = [t.name, t.description] + [f"{k} {as_schema(v).get('description', '')}"
                                          for k, v in t.properties.items()]
        vocab |= {singular(w) for s in text for w in words(s) if len(w) > 2}
    return vocab - STOP


def outside_tools(tools: list[Tool], pool: list[Tool]) -> list[Tool]:
    """The tools of ``pool`` a request of kind ``outside`` may ask for: none shares a
    word of its name but a leading verb with the catalogue's vocabulary, so none is
    something the catalogue can do under another name."""
    vocab, names = _vocabulary(tools), {t.name for t in tools}

    def nouns(name: str) -> set[str]:
        w = words(name)
        return {singular(x) for x in (w[1:] if w and w[0] in VERBS else w)}

    return [t for t in pool if t.name not in names and not nouns(t.name) & vocab]


@dataclass
class Plan:
    """How many tasks of each kind a side gets."""

    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, n: int, shares: dict[str, float], available: set[str],
           rng: random.Random) -> "Plan":
        """``n * share`` tasks of each available kind, the rest calls: ``n`` in all. A
        fractional count rounds up with the probability of its fraction, so a share too small
        for one catalogue (5% of 8 tasks) still has its share over many; where those round-ups
        pass ``n`` (a few tasks), the kinds last in :data:`KINDS` lose them."""
        def count(k: str) -> int:
            whole, frac = divmod(round(n * shares.get(k, 0.0), 9), 1)
            return int(whole) + (frac > 0 and rng.random() < frac)

        counts, left = {}, n
        for k in KINDS:
            if k != "call":
                counts[k] = min(count(k), left) if k in available else 0
                left -= counts[k]
        counts["call"] = left
        return cls(counts)

    def slots(self, rng: random.Random) -> list[str]:
        out = [k for k in KINDS for _ in range(self.counts.get(k, 0))]
        rng.shuffle(out)
        return out


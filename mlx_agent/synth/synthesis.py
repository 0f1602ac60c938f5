"""``mlx_agent synth``: a training and a held-out task set for a tool catalogue, and a report.

:func:`synthesize` plans each side's kinds by the configured shares (the kinds a catalogue
cannot make, chains or stated results where no tool gives a usable result, go to plain
calls), builds training first, then held-out tasks that share no free value, prompt, call or
template with it, and measures that overlap in the report. :func:`write` puts
``train.jsonl``, ``heldout.jsonl`` (``eval``'s format), ``tools.json`` (the catalogue, byte
for byte) and ``report.json`` in a directory, each file atomically, all or none.

Deterministic: the same tools and config give byte-identical files (every random choice
comes from ``random.Random`` seeded with the seed and the side). Not promised: the requested
number of tasks when the catalogue has fewer distinct ones to give.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..fileio import atomic_path
from ..signals import held_back
from ..tools import Sandbox, Tool, declared_tools
from . import pools as P
from .config import SynthConfig
from .tasks import KINDS, Builder, Plan, Results, SynthTask, chain_targets, outside_tools
from .values import Sampler, Unsatisfiable

ATTEMPTS = 40  # draws per task before its kind gives way to a plain call
MAX_MISSES = 10  # tasks in a row that could not be drawn before a side stops short
__all__ = ["SynthConfig", "Synthesis", "overlap", "report_lines", "synthesize", "write"]


@dataclass(frozen=True)
class Synthesis:
    train: list[SynthTask]
    heldout: list[SynthTask]
    report: dict


@dataclass
class _Catalogue:
    """What the sides share: the tools, their results, and which kinds each can make."""

    tools: list[Tool]
    results: Results
    usable: list[Tool]
    answerable: list[Tool]
    chains: dict[str, list]
    skipped: dict[str, str]
    outside: list[Tool]  # tools the catalogue lacks, which ``outside`` requests ask for


def _survey(tools: list[Tool], config: SynthConfig, sandbox: Sandbox | None,
            pool: list[Tool] | None) -> _Catalogue:
    results = Results(tools, config.run_tools, config.tool_timeout, sandbox)
    probe = Sampler(random.Random(f"{config.seed}:probe"), P.TRAIN, config.optional_share,
                    config.files)
    usable, skipped = [], {}
    for tool in tools:
        why = _unusable(tool, probe)
        if why is None:
            usable.append(tool)
        else:
            skipped[tool.name] = why
    answerable = [t for t in usable if results.runnable(t) and results.varies(t, probe)]
    chains = {t.name: chain_targets(usable, t) for t in answerable}
    outside = []
    if config.outside_share > 0:
        outside = outside_tools(tools, generated_tools(config.seed) if pool is None else pool)
    return _Catalogue(tools, results, usable, answerable,
                      {k: v for k, v in chains.items() if v}, skipped, outside)


def _unusable(tool: Tool, probe: Sampler) -> str | None:
    """Why ``tool`` cannot be used: a schema the tool-call grammar cannot be built from, or
    no arguments drawn that validate (drawn as often as a task draws them: one draw of "an
    id or an email" that left out both skipped the tool for every task); None when it can."""
    from ..grammar import schema_problem  # llguidance and MLX: only when synthesis runs

    refused = schema_problem(tool.parameters)
    if refused:  # its tasks would be refused by agent and eval at start-up
        return f"the tool-call grammar cannot be built from its schema ({refused})"
    why = ""
    for _ in range(ATTEMPTS):
        try:
            problems = tool.validate(probe.arguments(tool))
        except Unsatisfiable as e:
            problems = [str(e)]
        if not problems:
            return None
        why = problems[0]
    return why


def generated_tools(seed: int) -> list[Tool]:
    """Every tool :mod:`.catalogues` generates (what ``outside`` requests ask for by
    default)."""
    from .catalogues import generate_tools
    return declared_tools([tool for _, tool in generate_tools(seed)], "generated tools")


def _cycle(rng: random.Random, items: list) -> Iterator:
    """Every item once per round, in a fresh order each round (even coverage)."""
    while True:
        order = list(items)
        rng.shuffle(order)
        yield from order


def _side(side: str, n: int, cat: _Catalogue, config: SynthConfig,
          taken: list[SynthTask], done: Callable[[int], None]) -> list[SynthTask]:
    rng = random.Random(f"{config.seed}:{side}")
    b = Builder(cat.usable, side, rng, cat.results, config.optional_share, config.files)
    asked = _half(cat.outside, side)
    available = {"call", "none"} | ({"answer"} if cat.answerable else set()) | (
        {"chain"} if cat.chains else set()) | ({"outside"} if asked else set())
    if not cat.usable:
        available = {"none"}
    tools, answering, foreign = (_cycle(rng, cat.usable), _cycle(rng, cat.answerable),
                                 _cycle(rng, asked))
    sources = sorted(cat.chains)
    makers = {
        "call": lambda: b.call(next(tools)),
        "none": b.no_tool,
        "outside": lambda: b.outside(next(foreign)),
        "answer": lambda: b.answer(next(answering)),
        "chain": lambda: (lambda s: b.chain(b.by_name[s], cat.chains[s]))(rng.choice(sources)),
    }
    seen_values = frozenset().union(*(t.values for t in taken))
    seen_prompts = {t.task["prompt"] for t in taken}
    seen_calls = {c for t in taken for c in t.calls}
    out: list[SynthTask] = []
    misses = 0
    slots = Plan.of(n, config.shares(), available, rng).slots(rng)
    for i, kind in enumerate(slots):
        for k in [k for k in (kind, "call") if k in available]:  # none usable: skipped
            task = _draw(makers[k], lambda t: not (t.values & seen_values
                                                   or t.task["prompt"] in seen_prompts
                                                   or set(t.calls) & seen_calls))
            if task is not None:
                seen_prompts.add(task.task["prompt"])
                out.append(task)
                misses = 0
                break
        else:
            misses += 1
            if misses == MAX_MISSES:  # the catalogue has no more distinct tasks to give
                done(len(slots) - i)
                break
        done(1)
    return [dataclasses.replace(t, task={"id": f"{side}-{i:04d}-{t.kind}", **t.task})
            for i, t in enumerate(out)]


def _half(tools: list[Tool], side: str) -> list[Tool]:
    """``side``'s half of the tools ``outside`` requests ask for (by name, alternately), so
    held-out requests never ask for a tool training taught the model it lacks."""
    ordered = sorted(tools, key=lambda t: t.name)
    return ordered[0 if side == P.TRAIN else 1::2]


def _draw(make, ok) -> SynthTask | None:
    for _ in range(ATTEMPTS):
        try:
            task = make()
        except Unsatisfiable:
            continue
        if task is not None and ok(task):
            return task
    return None


def synthesize(tools: list[Tool], config: SynthConfig = SynthConfig(),
               sandbox: Sandbox | None = None, outside: list[Tool] | None = None,
               done: Callable[[int], None] = lambda n: None) -> Synthesis:
    """Training and held-out tasks for ``tools``, and the report of what was made; ``_exec``
    tools run under ``sandbox`` (as ``eval`` runs them) to learn their results. ``outside``
    requests ask for tools of ``outside`` (default: every generated tool) that the
    catalogue lacks. ``done(n)``: n more of the ``n_train + n_heldout`` tasks asked for are
    settled (made, or given up), for a progress display: running the tools takes time."""
    cat = _survey(tools, config, sandbox, outside)
    train = _side(P.TRAIN, config.n_train, cat, config, [], done)
    heldout = _side(P.HELDOUT, config.n_heldout, cat, config, train, done)
    return Synthesis(train, heldout, _report(train, heldout, cat, config))


def _summary(tasks: list[SynthTask], asked: int, tools: list[Tool]) -> dict:
    kinds = Counter(t.kind for t in tasks)
    used = Counter(name for t in tasks for name in set(t.tools))
    return {"tasks": len(tasks), "asked": asked,
            "kinds": {k: kinds[k] for k in KINDS},
            "tools": {t.name: used[t.name] for t in tools},
            "free_values": len(frozenset().union(*(t.values for t in tasks))),
            "templates": sorted({i for t in tasks for i in t.templates})}


def overlap(train: list[SynthTask], heldout: list[SynthTask]) -> dict[str, int]:
    """How many values, templates, prompts and calls the two sides share."""
    def each(get):
        a = {x for t in train for x in get(t)}
        return len(a & {x for t in heldout for x in get(t)})

    return {"values": each(lambda t: t.values), "templates": each(lambda t: t.templates),
            "prompts": each(lambda t: [t.task["prompt"]]), "calls": each(lambda t: t.calls),
            "outside tools": each(lambda t: t.tools if t.kind == "outside" else ())}


def _report(train, heldout, cat: _Catalogue, config: SynthConfig) -> dict:
    return {
        "seed": config.seed,
        "tools": [t.name for t in cat.tools],
        "train": _summary(train, config.n_train, cat.tools),
        "heldout": _summary(heldout, config.n_heldout, cat.tools),
        "overlap": overlap(train, heldout),
        "answerable": [t.name for t in cat.answerable],
        "chains": [f"{s} -> {t.name}.{p}" for s, targets in sorted(cat.chains.items())
                   for t, p, _ in targets],
        "skipped": cat.skipped,
        "ran_tools": config.run_tools,
    }


def report_lines(report: dict) -> list[str]:
    """The report as a few lines for a terminal."""
    lines = []
    for side in ("train", "heldout"):
        s = report[side]
        kinds = ", ".join(f"{k} {v}" for k, v in s["kinds"].items())
        short = f" (asked {s['asked']})" if s["tasks"] < s["asked"] else ""
        lines.append(f"{side}: {s['tasks']} tasks{short}: {kinds}; "
                     f"{s['free_values']} distinct values, {len(s['templates'])} templates")
    o = report["overlap"]
    lines.append("shared by train and heldout: " + ", ".join(f"{k} {v}" for k, v in o.items()))
    if not report["answerable"]:
        why = ("tools were not run" if not report["ran_tools"]
               else "no tool gave a short, repeatable result that depends on its arguments")
        lines.append(f"no answer or two-call tasks: {why}")
    else:
        lines.append(f"tools with a usable result: {', '.join(report['answerable'])}; "
                     f"two-call chains: {len(report['chains'])}")
    for name, why in report["skipped"].items():
        lines.append(f"skipped tool {name}: {why}")
    return lines


def write(synthesis: Synthesis, tools_data: bytes, out: str | Path) -> list[Path]:
    """Writes the four files into ``out`` (created if missing); all appear, or none."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "train.jsonl": _jsonl(synthesis.train), "heldout.jsonl": _jsonl(synthesis.heldout),
        "tools.json": tools_data,
        "report.json": (json.dumps(synthesis.report, indent=1, ensure_ascii=False) + "\n"
                        ).encode("utf-8"),
    }
    # the renames happen one after another as the stack closes: a Ctrl-C or SIGTERM between
    # two left some files new and others missing, so both wait until all are in place
    with held_back(), contextlib.ExitStack() as stack:
        for name, data in files.items():
            stack.enter_context(atomic_path(out / name)).write_bytes(data)
    return [out / name for name in files]


def _jsonl(tasks: list[SynthTask]) -> bytes:
    return "".join(json.dumps(t.task, ensure_ascii=False) + "\n" for t in tasks).encode("utf-8")

"""Conversations written from synthesised tasks, and their training rows: no rollout needed.

For each task of :mod:`.tasks`, :func:`write_conversation` writes the request, then each
call the task involves with its arguments, the tool's result as the agent would show it
(``ToolResult.for_model``), and a short answer that states the last result; a task that
needs no tool gets a direct answer and no call; a two-call task's second call already
carries the first result (synthesis built it from the tool's real result); a request for a
tool the catalogue lacks (kind ``outside``) gets a short "I cannot" that names the action.
:func:`rows` renders them with :func:`mlx_agent.written_rows.conversation_row`: the agent's
own wire format, token-exact, the loss only on assistant tokens; it can open a task with a
mistaken call (:func:`slip`: a value miscopied from the request, and the tool's "not found"),
which the row keeps as context and does not train.

A result (:class:`Outcomes`) is the tool's own when the tool runs and succeeds (exit 0,
some output): ``_exec`` tools in the given sandbox, in a fresh copy of the fixture or an
empty directory; ``_handler``, built-in and MCP tools as the agent runs them. Otherwise (the
tool cannot run, running is off, or it failed here) the result is synthesised from the
schema (:mod:`.results`) and counted as such. Deterministic under a seed, given tools that
are.

Not promised: that a synthesised result is what the tool would return; answers to no-tool
requests that say more than a polite, on-topic line (unless ``replies`` gives them, e.g. the
raw model's own).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..fileio import copy_tree
from ..tools import Tool, ToolResult, run_tool
from ..tools.builtin import rebound
from ..tools.sandbox import Sandbox
from ..written_rows import conversation_row
from . import pools as P
from .phrasing import action_of
from .results import synthesised_result
from .tasks import SynthTask
from .values import as_schema, canonical, followed

MAX_SAID = 80  # characters of a result an answer states
ANSWERS = ("The result is {r}.", "{tool} returned {r}.", "It returned {r}.",
           "Here is what I got: {r}.", "Done. The result: {r}.", "{r}")
COMPLIMENTS = frozenset({"brave", "generous", "gentle", "bright", "humble", "eager", "vivid",
                         "calm", "witty", "tidy", "curious", "loyal"})
SYNONYMS = {"brave": "courageous", "quiet": "silent", "ancient": "very old",
            "generous": "giving", "fragile": "delicate", "clumsy": "awkward", "gentle": "mild",
            "bright": "shining", "stubborn": "obstinate", "humble": "modest", "eager": "keen",
            "vivid": "intense", "calm": "peaceful", "witty": "clever", "fierce": "ferocious",
            "tidy": "neat", "curious": "inquisitive", "loyal": "faithful"}
# Direct answers to synthesis's no-tool requests, by template (phrasing.NO_TOOL, train side)
NO_TOOL_ANSWERS = {
    "none-a/0": "Here is one: {topic} have surprised people for a very long time, and there "
                "is always more to learn about them.",
    "none-a/1": "{Topic} here and {topic} there,\n{Topic} wonders everywhere.",
    "none-a/2": "A word that means {adjective} is \"{synonym}\".",
    "none-a/3": "People like {topic} because they are interesting, a little surprising, and "
                "fun to learn about.",
    "none-a/4": "Curious, lovely, memorable.",
    "none-a/5": "{Topic} are part of our big, wonderful world, and learning about them is "
                "like going on a small adventure.",
    "none-a/6": "{compliment}",
    "none-a/7": "Good morning! My day is going well, thank you. How can I help you?",
    "none-a/8": "You're welcome! Glad I could help.",
}
# Answers to a request for a tool the catalogue lacks (kind "outside")
OUTSIDE_ANSWERS = ("I can't {action}: none of my tools does that.",
                   "Sorry, I have no tool to {action}.",
                   "None of the tools I have can {action}, so I can't do that here.")
# what keeps a string parameter's value from being miscopied under the grammar
FIXED = frozenset({"enum", "const", "pattern", "format"})
# A tool's error for a value it does not know (a mistaken call's result)
SLIP_ERRORS = ("error: no {label} '{v}'", "not found: {v}", "{Label} '{v}' does not exist.",
               "invalid {label}: '{v}' is unknown")
NO_TOOL_FALLBACK = "Happy to help with that directly: it does not need any of my tools."
# Answers to the no-tool requests with numbers (train side), worked out from them
WORKED_ANSWERS = {
    "none-a/9": lambda a, b: f"{a} times {b} is {a * b}.",
    "none-a/10": lambda a, b: f"The area is {a} × {b} = {a * b} square metres.",
    "none-a/11": lambda a, b: f"Yes, {a} is even." if a % 2 == 0 else f"No, {a} is odd.",
    "none-a/12": lambda a, b: f"{a} plus {b} is {a + b}.",
    "none-a/13": lambda a, b: f"{a} hours is {a * 60} minutes.",
}


@dataclass(frozen=True)
class Outcome:
    content: str  # the tool message, as the agent shows a result to the model
    said: str  # what an answer states
    source: str  # "real" or "synthesised"


class Outcomes:
    """Each call's result, real where the tool runs and succeeds, else synthesised; cached
    by call, with a count of each source in :attr:`counts`."""

    def __init__(self, *, run: bool = True, sandbox: Sandbox | None = None,
                 fixture: str | Path | None = None, timeout: float = 10.0, seed: int = 0):
        self.run, self.sandbox, self.timeout, self.seed = run, sandbox, timeout, seed
        self.fixture = Path(fixture) if fixture else None
        self.counts: Counter = Counter()
        self._cache: dict[str, Outcome] = {}

    def __call__(self, tool: Tool, arguments: dict) -> Outcome:
        key = canonical([tool.name, arguments])
        if key not in self._cache:
            self._cache[key] = self._real(tool, arguments) or self._made_up(tool, arguments, key)
        outcome = self._cache[key]
        self.counts[outcome.source] += 1
        return outcome

    def _real(self, tool: Tool, arguments: dict) -> Outcome | None:
        if not (self.run and (tool.exec_template or tool.handler or tool.builtin)):
            return None
        result = run_on_copy(tool, arguments, self.fixture, sandbox=self.sandbox,
                             timeout=self.timeout)
        said = result.stdout.strip().split("\n")[0].strip()
        if result.exit_code != 0 or result.timed_out or not said:
            return None
        return Outcome(result.for_model(), _cut(said), "real")

    def _made_up(self, tool: Tool, arguments: dict, key: str) -> Outcome:
        said = synthesised_result(tool, arguments, random.Random(f"{self.seed}:{key}"))
        return Outcome(ToolResult(tool=tool.name, stdout=said + "\n").for_model(), said,
                       "synthesised")


def run_on_copy(tool: Tool, arguments: dict, fixture: str | Path | None, *,
                sandbox: Sandbox | None = None, timeout: float = 10.0) -> ToolResult:
    """``tool`` run as the agent runs it, in a fresh copy of ``fixture`` (or an empty
    directory), built-ins rebound to that copy; the copy is gone when it returns."""
    with tempfile.TemporaryDirectory(prefix="mlx-agent-written-") as tmp:
        cwd = Path(tmp) / "work"
        if fixture:
            copy_tree(fixture, cwd)
        else:
            cwd.mkdir()
        return run_tool(rebound(tool, cwd), arguments, timeout=timeout, cwd=cwd,
                        sandbox=sandbox)


def _cut(text: str) -> str:
    if len(text) <= MAX_SAID:
        return text
    return text[:MAX_SAID].rsplit(" ", 1)[0] or text[:MAX_SAID]


def _ordered(schema: dict, value, root: dict | None = None):
    """``value`` with object keys in the schema's property order (canonical JSON sorts
    them; the model writes them as the schema lists them), through local ``$ref``s into
    ``root`` (default: ``schema``, the tool's parameters)."""
    root = schema if root is None else root
    schema = as_schema(followed(schema, root))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: _ordered(props.get(k, {}), value[k], root) for k in keys}
    if isinstance(value, list):
        return [_ordered(schema.get("items", {}), v, root) for v in value]
    return value


def _as_written_number(text: str) -> int | float:
    """A number as the agent reads it back from the grammar's spelling: the grammar writes
    a whole float as an integer (see :func:`mlx_agent.grammar.written_json`), so a tool runs
    with ``1``, not ``1.0``."""
    x = float(text)
    return int(x) if x.is_integer() else x


def task_calls(task: SynthTask, tools: dict[str, Tool]) -> list[tuple[Tool, dict]]:
    """The calls a task involves, in order, with arguments in schema order and numbers as
    the agent would read them (:func:`_as_written_number`)."""
    out = []
    for text in task.calls:
        call = json.loads(text, parse_float=_as_written_number)
        tool = tools[call["name"]]
        out.append((tool, _ordered(tool.parameters, call["arguments"])))
    return out


def call_message(tool: Tool, arguments: dict, n: int | str) -> dict:
    """The assistant message that makes the ``n``-th call (its id ``call_{n}``), as a
    client writes it."""
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{n}", "type": "function",
        "function": {"name": tool.name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]}


def no_tool_answer(task: SynthTask) -> str:
    """A direct answer to a request no tool serves, on the request's own topic (or its
    numbers worked out)."""
    prompt = task.task["prompt"]
    worked = next((WORKED_ANSWERS[t] for t in task.templates if t in WORKED_ANSWERS), None)
    if worked:
        a, b = (int(n) for n in (re.findall(r"\d+", prompt) + ["0"])[:2])
        return worked(a, b)
    topic = next((t for t in P.TOPICS if re.search(rf"\b{t}\b", prompt)), "that")
    adjective = next((a for a in P.ADJECTIVES if re.search(rf"\b{a}\b", prompt)), "kind")
    compliment = (f"Yes, calling someone {adjective} is usually a compliment."
                  if adjective in COMPLIMENTS else
                  f"Not usually: \"{adjective}\" is rarely meant as praise.")
    template = next((NO_TOOL_ANSWERS[t] for t in task.templates if t in NO_TOOL_ANSWERS),
                    NO_TOOL_FALLBACK)
    return template.format(topic=topic, Topic=topic[:1].upper() + topic[1:],
                           adjective=adjective, synonym=SYNONYMS.get(adjective, "gentle"),
                           compliment=compliment)


def write_conversation(task: SynthTask, tools: dict[str, Tool], outcomes: Outcomes,
                       rng: random.Random, replies: Mapping[str, str] | None = None
                       ) -> list[dict]:
    """The task's conversation: request, calls with their results, and the answer
    (to a no-tool request: ``replies[prompt]`` where given, e.g. the raw model's own)."""
    messages = [{"role": "user", "content": task.task["prompt"]}]
    calls = task_calls(task, tools)
    if task.kind == "outside":
        answer = rng.choice(OUTSIDE_ANSWERS).format(action=action_of(task.tools[0]))
        return messages + [{"role": "assistant", "content": answer}]
    if not calls:
        reply = (replies or {}).get(task.task["prompt"]) or no_tool_answer(task)
        return messages + [{"role": "assistant", "content": reply}]
    outcome = None
    for n, (tool, arguments) in enumerate(calls):
        outcome = outcomes(tool, arguments)
        messages += [call_message(tool, arguments, n),
                     {"role": "tool", "name": tool.name, "content": outcome.content}]
    answer = rng.choice(ANSWERS).format(r=outcome.said, tool=calls[-1][0].name)
    return messages + [{"role": "assistant", "content": answer}]


def misspelt(value: str, rng: random.Random) -> str:
    """``value`` as a small model miscopies it: a letter dropped, two swapped, a vowel
    changed, or only its first word (never ``value`` itself)."""
    for _ in range(8):
        way, i = rng.randrange(4), rng.randrange(1, max(len(value) - 1, 2))
        if way == 0:
            near = value[:i] + value[i + 1:]
        elif way == 1:
            near = value[:i - 1] + value[i] + value[i - 1] + value[i + 1:]
        elif way == 2:
            vowels = [k for k, c in enumerate(value) if c in "aeiou"]
            if not vowels:
                continue
            k = rng.choice(vowels)
            near = value[:k] + rng.choice([v for v in "aeiou" if v != value[k]]) + value[k + 1:]
        else:
            near = value.split()[0]
        if near != value and near.strip():
            return near
    return value + "x"


def slip(task: SynthTask, tools: dict[str, Tool], rng: random.Random) -> list[dict] | None:
    """A mistaken call to open the task's conversation, and its result: the first call with
    a string argument the request gives miscopied (:func:`misspelt`), and an error that says
    the value was not found. None for a task with no such argument. The error is written,
    not run (a tool that runs may well accept the miscopied value): what the row teaches is
    the recovery from it."""
    calls = task_calls(task, tools)
    if not calls:
        return None
    tool, arguments = calls[0]
    props = as_schema(tool.parameters).get("properties", {})
    # strings the request gives and the grammar leaves free (it would keep an enum's,
    # a constant's or a pattern's value from being miscopied at all)
    copied = [k for k, v in arguments.items() if isinstance(v, str) and len(v) >= 4
              and v in task.task["prompt"]
              and not FIXED.intersection(as_schema(followed(props.get(k, {}),
                                                            tool.parameters)))]
    if not copied:
        return None
    key = rng.choice(copied)
    wrong = misspelt(arguments[key], rng)
    label = key.replace("_", " ")
    error = rng.choice(SLIP_ERRORS).format(label=label, Label=label.capitalize(), v=wrong)
    result = ToolResult(tool=tool.name, stdout="", stderr=error + "\n", exit_code=1)
    return [call_message(tool, {**arguments, key: wrong}, "slip"),
            {"role": "tool", "name": tool.name, "content": result.for_model()}]


def _as_written(message: dict, tools: Mapping[str, Tool], protocol: str) -> dict:
    """``message`` with each call's arguments in the order ``protocol``'s grammar writes
    them (the json protocol's: required first, as its prompt lists them)."""
    from ..grammar import written_arguments  # llguidance and MLX: only when rows are made

    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [{**c, "function": {
        **c["function"], "arguments": json.dumps(written_arguments(
            protocol, tools[c["function"]["name"]], json.loads(c["function"]["arguments"])),
            ensure_ascii=False)}} for c in calls]}


def rows(lm, fmt, tools: Sequence[Tool], tasks: Sequence[SynthTask], outcomes: Outcomes,
         seed: int = 0, replies: Mapping[str, str] | None = None, per_row: int = 1,
         slip_share: float = 0.0) -> list[dict]:
    """Training rows (``conversation_row``'s, plus ``task`` and ``kind``); ``replies`` as
    :func:`write_conversation` takes them.

    ``per_row`` tasks make one row: one conversation in which the user asks for each in
    turn, as a session in the agent's REPL does, in an order drawn from ``seed``. The
    catalogue's system prompt, most of a row's tokens, is then paid once for ``per_row``
    replies instead of once for each. Every reply is trained (but a mistaken call, below),
    the first on a fresh conversation and the rest after unrelated earlier requests.

    ``slip_share`` of the tasks whose first call copies a string from the request open with
    that call miscopied and its error (:func:`slip`); the mistake is not
    trained, the recovery is."""
    rng, slips = random.Random(f"{seed}:answers"), random.Random(f"{seed}:slips")
    by_name = {t.name: t for t in tools}
    order = list(tasks)
    if per_row > 1:
        random.Random(f"{seed}:rows").shuffle(order)
    out = []
    for start in range(0, len(order), per_row):
        group = order[start:start + per_row]
        messages, untrained = [], []
        for task in group:
            written = write_conversation(task, by_name, outcomes, rng, replies)
            mistake = (slip(task, by_name, slips)
                       if slip_share and slips.random() < slip_share else None)
            if mistake:  # after the request; context for the call that recovers
                untrained.append(len(messages) + 1)
                written = written[:1] + mistake + written[1:]
            messages += written
        messages = [_as_written(m, by_name, fmt.name) for m in messages]
        out.append({**conversation_row(lm, fmt, tools, messages, untrained),
                    "task": ",".join(t.task["id"] for t in group),
                    "kind": "+".join(t.kind for t in group)})
    return out

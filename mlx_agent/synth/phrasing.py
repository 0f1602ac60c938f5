"""Requests phrased from a tool's name, description and parameters, through template families.

A request is a template (imperative, question, indirect, with a distracting detail, naming
the tool, or quoting its purpose) filled with the tool's action (``get_weather`` -> "get
weather"), its description, and an argument list in one of several styles ("city Paris",
"city: Paris", "city=Paris", ...), a value that names itself at times without its label
("in Paris"). Every template, argument style, bare form, distractor, answer request,
two-call connector and no-tool request belongs to a family, and every family to one side:
the held-out side is phrased only in families training never saw.

Promised: a template id names exactly one template; the same random state gives the same
text. Not promised: fluent English for every tool name (the action is the name's words).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from . import pools as P
from .values import as_schema, kind_of, singular, words

# The first words of a name that read as a verb; otherwise the action is "use <name words>".
VERBS = frozenset("""add analyze append apply approve archive assign book browse build buy calculate
cancel change check clear close compare compute convert copy count create decode delete
describe detect download edit encode estimate evaluate execute explain export fetch filter
find format generate get grep list load lookup look make merge modify move open order parse pay
play post predict print project publish query read record register remove rename reply report
request reserve reset resize restart retrieve run save schedule scan search send set share
show sort start stop submit summarize sync tag test track transfer translate update upload
validate verify view withdraw work write""".split())

# family -> templates; "[...]" holds the part that mentions the arguments (dropped when none)
REQUESTS = {
    P.TRAIN: {
        "imperative-a": ("{action}[ with {args}].", "please {action}[: {args}].",
                         "{action} for me[, {args}]."),
        "question-a": ("can you {action}[ with {args}]?", "could you {action}[ for {args}]?"),
        "indirect-a": ("I need to {action}[ with {args}].",
                       "I'd like you to {action}[ using {args}]."),
        "distractor-a": ("{distractor} Anyway, {action}[ with {args}].",
                         "{distractor} Could you {action}[ for {args}]?"),
        "named-a": ("use {tool}[ with {args}].", "call {tool}[ with {args}]."),
        "purpose-a": ("I need this done: {purpose}[. Use {args}].",),
    },
    P.HELDOUT: {
        "imperative-b": ("{action} right away[ — {args}].", "go ahead and {action}[ ({args})]."),
        "question-b": ("would you {action}[ with {args}], please?",
                       "is it possible to {action}[ using {args}]?"),
        "indirect-b": ("my manager asked me to {action}[; {args}].",
                       "it would help if you could {action}[ with {args}]."),
        "distractor-b": ("{action}[ with {args}]. {distractor}",),
        "named-b": ("run the {tool} tool[ on {args}].",),
        "purpose-b": ("task: {purpose}[ ({args})].",),
    },
}
DISTRACTORS = {
    P.TRAIN: ("I'm between meetings.", "My laptop battery is almost dead.",
              "Sorry for the short notice.", "It has been a long week.",
              "By the way, {person} says hello.", "I have {number} tabs open right now."),
    P.HELDOUT: ("I'm on the bus right now.", "The office wifi is slow today.",
                "Quick one before lunch.", "{person} reminded me to ask.",
                "We are {number} minutes behind schedule."),
}
ANSWERS = {P.TRAIN: {"answer-a": (" Tell me what it returns.", " Then tell me the result.")},
           P.HELDOUT: {"answer-b": (" Report back what you get.", " Let me know the output.")}}
CHAINS = {  # a 135M model learns the connector, not the idea: many ways to say "then use it"
    P.TRAIN: {"chain-a": ("{first}, then {second} using the result as the {label}.",
                          "first {first}. After that, {second} with the {label} set to what "
                          "it returns.",
                          "{first} and then {second}, with its result as the {label}.",
                          "please {first}. Next, take what that gives back and {second}, "
                          "using it as the {label}.",
                          "two steps: {first}; then {second} where the {label} is the first "
                          "step's result.",
                          "{first}. When you have the result, {second} and use that result "
                          "for the {label}.",
                          "can you {first} and afterwards {second}? The {label} should be "
                          "whatever the first call returns.",
                          "{first}, followed by {second} (fill in the {label} with what the "
                          "first step returns).")},
    P.HELDOUT: {"chain-b": ("{first}; once that is done, {second}, passing its output as the "
                            "{label}.",
                            "begin with this: {first}. Then {second}, feeding in the answer "
                            "you got as its {label}.")},
}
NO_TOOL = {
    P.TRAIN: {"none-a": ("tell me a fun fact about {topic}.",
                         "write a two-line poem about {topic}.",
                         "what is a word that means {adjective}?", "why do people like {topic}?",
                         "describe {topic} in three words.", "explain {topic} to a child.",
                         "is calling someone {adjective} a compliment?",
                         "good morning! How is your day going?", "thanks, that is all I needed.",
                         # questions with numbers that need no tool: the answer works them out
                         "what is {a} times {b}?",
                         "what is the area of a rectangle {a} m long and {b} m wide?",
                         "is {a} an even number?", "what is {a} plus {b}?",
                         "how many minutes are there in {a} hours?")},
    P.HELDOUT: {"none-b": ("give me one interesting thing about {topic}.",
                           "compose a short rhyme about {topic}.",
                           "what is the opposite of {adjective}?", "what makes {topic} special?",
                           "sum up {topic} in one sentence.",
                           "use the word {adjective} in a sentence.",
                           "hey there, how have you been?", "cheers, we are done for today.",
                           "what do you get when you add {a} and {b}?",
                           "what is the perimeter of a square with {a} cm sides?",
                           "is {a} an odd number?", "how many seconds are in {a} minutes?",
                           "what is {a} squared?")},
}
# the no-tool templates that ask for a number worked out: not drawn for a catalogue that
# does arithmetic (its calculator would be the right answer)
WORKED = frozenset(f"{family}/{i}" for side in NO_TOOL.values()
                   for family, texts in side.items()
                   for i, text in enumerate(texts) if "{a}" in text)
ARITHMETIC = frozenset("""add addition arithmetic area calculate calculator convert conversion
divide division evaluate expression math maths minus multiply multiplication perimeter plus
subtract sum""".split())
# How an argument list reads, by side: (id, one item, separator, last separator)
ARG_STYLES = {
    P.TRAIN: (("kv", "{label} {value}", ", ", " and "), ("colon", "{label}: {value}", "; ", "; "),
              ("as", "{value} as the {label}", ", ", " and "),
              ("of", "a {label} of {value}", ", ", " and "),
              ("vl", "{value} {label}", ", ", " and ")),
    P.HELDOUT: (("eq", "{label}={value}", ", ", ", "),
                ("being", "the {label} being {value}", ", ", " and "),
                ("equal", "{label} equal to {value}", ", ", " and ")),
}
# A value that says which parameter it binds by itself, stated as people do, without its
# label ("in Denver", "on 2025-03-14", "Celsius"), where no other argument of the call is of
# its kind; by side, kind -> form ("number" is a number said with its unit: "for 3 days")
BARE = {
    P.TRAIN: {"city": "in {v}", "place_state": "in {v}", "place_country": "in {v}",
              "country": "in {v}", "date": "on {v}", "time": "at {v}", "datetime": "at {v}",
              "language": "in {v}", "currency": "in {v}", "enum": "{v}", "email": "for {v}",
              "number": "for {v}"},
    P.HELDOUT: {"city": "near {v}", "place_state": "near {v}", "place_country": "near {v}",
                "country": "within {v}", "date": "dated {v}", "time": "by {v}",
                "datetime": "as of {v}", "language": "into {v}", "currency": "as {v}",
                "enum": "the {v} option", "email": "via {v}", "number": "over {v}"},
}
BARE_SHARE = 0.4  # how often an argument that can be said bare is
# A boolean argument in words, from its name: a name that starts with one of FLAG_VERBS reads
# as a verb phrase ("avoid tolls"), any other as a switch ("away mode on"); by side,
# (verb phrase, true / false), (switch, true / false)
FLAG_VERBS = frozenset("""allow avoid enable exclude include keep notify require return send
show skip use""".split())
FLAGS = {P.TRAIN: (("{p}", "do not {p}"), ("{p} on", "{p} off")),
         P.HELDOUT: (("please {p}", "don't {p}"), ("with {p}", "without {p}"))}
QUOTED = frozenset({"text", "query", "title", "word", "product", "company", "address",
                    "command", "quantity"})
_SEGMENT = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True)
class Phrase:
    text: str
    templates: tuple[str, ...]  # ids of every template, style and distractor used


def template_ids(side: str) -> set[str]:
    """Every template id of ``side`` (for the overlap report)."""
    out = set()
    for table in (REQUESTS, ANSWERS, CHAINS, NO_TOOL):
        for family, texts in table[side].items():
            out |= {f"{family}/{i}" for i in range(len(texts))}
    out |= {f"bare-{side}/{kind}" for kind in BARE[side]}
    out |= {f"args-{s[0]}" for s in ARG_STYLES[side]}
    out |= {f"distractor-{side}/{i}" for i in range(len(DISTRACTORS[side]))}
    return out


def action(tool) -> str:
    """What calling the tool does, as a verb phrase from its name."""
    return action_of(tool.name)


def action_of(name: str) -> str:
    """What calling a tool named ``name`` does, as a verb phrase."""
    w = words(name)
    if w and w[0] in VERBS:
        return " ".join(w)
    return f"use {' '.join(w) or name}"


def purpose(tool) -> str:
    """The description's first sentence, lower-cased like the middle of a sentence."""
    text = (tool.description or "").strip().split("\n")[0]
    text = re.split(r"(?<=[.!?])\s", text)[0].rstrip(".!? ")
    if not text:
        return action(tool)
    return text if text[1:2].isupper() else text[0].lower() + text[1:]


def label(name: str, schema: dict, rng: random.Random) -> str:
    """How a request names a parameter: its name's words, or a short description."""
    schema = as_schema(schema)
    desc = schema.get("description")
    desc = desc.strip().rstrip(".") if isinstance(desc, str) else ""
    if desc and len(desc.split()) <= 4 and rng.random() < 0.5:
        desc = re.sub(r"^(the|a|an)\s+", "", desc, flags=re.I)  # templates say "the {label}"
        return desc[0].lower() + desc[1:] if not desc[1:2].isupper() else desc
    return " ".join(words(name)) or name


def say(value: Any, schema: dict, name: str, context: frozenset, rng: random.Random,
        style: tuple, used: list | None = None) -> str:
    """How a request states ``value`` of parameter ``name``."""
    schema = as_schema(schema)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "(" + args_text(value, schema, context, rng, style, used) + ")"
    if isinstance(value, list):
        item_name = " ".join(singular(w) for w in words(name))
        items = [say(v, schema.get("items", {}), item_name, context, rng, style, used)
                 for v in value]
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    kind = kind_of(name, schema, context)
    if isinstance(value, (int, float)):
        unit = kind.unit
        if not unit or unit.lower() in words(name):
            return str(value)
        return f"{value}{unit}" if unit in ("%", "°C", "°F") else f"{value} {unit}"
    if kind.pool in QUOTED and (" " in value or not value):
        return f'"{value}"'
    return value


def args_text(arguments: dict, schema: dict, context: frozenset, rng: random.Random,
              style: tuple, used: list | None = None) -> str:
    """The argument list in ``style`` (an ``ARG_STYLES`` entry), in a random order (not the
    schema's: a value binds to its label, not its position); flags in their side's words;
    a value that can go without its label (``bare_kind``) does so at ``BARE_SHARE``, its
    form's id appended to ``used``."""
    _, item, sep, last = style
    side = P.TRAIN if style in ARG_STYLES[P.TRAIN] else P.HELDOUT
    props = schema.get("properties", {})
    order = list(arguments.items())
    rng.shuffle(order)
    kinds = {k: bare_kind(k, v, props.get(k, {}), context) for k, v in order}
    shared = {kind for kind, n in Counter(kinds.values()).items() if n > 1}
    parts = []
    for k, v in order:
        if isinstance(v, bool):
            parts.append(flag(k, v, side))
            continue
        value, kind = say(v, props.get(k, {}), k, context, rng, style, used), kinds[k]
        if kind and kind not in shared and rng.random() < BARE_SHARE:
            parts.append(BARE[side][kind].format(v=value))
            if used is not None:
                used.append(f"bare-{side}/{kind}")
        else:
            parts.append(item.format(label=label(k, props.get(k, {}), rng), value=value))
    if len(parts) <= 1:
        return "".join(parts)
    return sep.join(parts[:-1]) + last + parts[-1]


def bare_kind(name: str, value: Any, schema: dict, context: frozenset) -> str | None:
    """The ``BARE`` form a value of parameter ``name`` can take without its label: a string
    of a kind that names itself (a city, a date, an enum's value), or a number said with a
    unit its name does not hold; None for any other."""
    schema = as_schema(schema)
    kind = kind_of(name, schema, context)
    if value is None or isinstance(value, (bool, dict, list)):
        return None
    if isinstance(value, (int, float)):
        unit = kind.unit
        return "number" if unit and unit.lower() not in words(name) else None
    return kind.pool if kind.pool in BARE[P.TRAIN] else None


def flag(name: str, value: bool, side: str) -> str:
    """Boolean parameter ``name`` set to ``value``, in ``side``'s words: "include photos",
    "away mode off"."""
    w = words(name)
    phrase = " ".join(w) or name
    verb, switch = FLAGS[side]
    true, false = verb if w and w[0] in FLAG_VERBS else switch
    return (true if value else false).format(p=phrase)


def fill(template: str, args: str, **slots: str) -> str:
    """A template with its argument segment kept (when there are arguments) or dropped."""
    text = _SEGMENT.sub(lambda m: m.group(1) if args else "", template)
    return text.format(args=args, **slots)


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


class Phraser:
    """Phrases requests on one side, drawing templates, styles and details from it."""

    def __init__(self, rng: random.Random, side: str, sampler):
        self.rng, self.side, self.sampler = rng, side, sampler

    def _choose(self, table: dict) -> tuple[str, str]:
        family = self.rng.choice(sorted(table[self.side]))
        i = self.rng.randrange(len(table[self.side][family]))
        return f"{family}/{i}", table[self.side][family][i]

    def _distractor(self) -> tuple[str, str]:
        i = self.rng.randrange(len(DISTRACTORS[self.side]))
        text = DISTRACTORS[self.side][i].format(person=self.sampler.pick(P.PEOPLE),
                                                number=self.sampler.on_side(2, 60))
        return f"distractor-{self.side}/{i}", text

    def clause(self, tool, arguments: dict) -> tuple[str, tuple[str, ...]]:
        """``action[ with args]`` for two-call requests; returns (text, ids of the style and
        bare forms used)."""
        style = self.rng.choice(ARG_STYLES[self.side])
        used: list[str] = []
        args = args_text(arguments, tool.parameters, _context(tool), self.rng, style, used)
        return (fill("{action}[ with {args}]", args, action=action(tool)),
                (f"args-{style[0]}", *used))

    def request(self, tool, arguments: dict) -> Phrase:
        tid, template = self._choose(REQUESTS)
        style = self.rng.choice(ARG_STYLES[self.side])
        used = [tid, f"args-{style[0]}"]
        args = args_text(arguments, tool.parameters, _context(tool), self.rng, style, used)
        distractor = ""
        if "{distractor}" in template:
            did, distractor = self._distractor()
            used.append(did)
        text = fill(template, args, action=action(tool), tool=tool.name,
                    purpose=purpose(tool), distractor=distractor)
        return Phrase(sentence(text), tuple(used))

    def answer(self, tool, arguments: dict) -> Phrase:
        base = self.request(tool, arguments)
        tid, suffix = self._choose(ANSWERS)
        return Phrase(base.text + suffix, (*base.templates, tid))

    def chain(self, first, first_args: dict, second, second_args: dict, param: str) -> Phrase:
        tid, template = self._choose(CHAINS)
        a, sa = self.clause(first, first_args)
        b, sb = self.clause(second, second_args)
        name = label(param, second.properties.get(param, {}), self.rng)
        return Phrase(sentence(template.format(first=a, second=b, label=name)),
                      (tid, *sa, *sb))

    def no_tool(self) -> Phrase:
        tid, template = self._choose(NO_TOOL)
        text = template.format(topic=self.sampler.pick(P.TOPICS),
                               adjective=self.sampler.pick(P.ADJECTIVES),
                               a=self.sampler.on_side(2, 99), b=self.sampler.on_side(2, 99))
        return Phrase(sentence(text), (tid,))


def _context(tool) -> frozenset:
    return frozenset(words(tool.name) + words(tool.description))

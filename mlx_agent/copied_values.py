"""A call's values as the request writes them: a garbled copy copied again, a place and a
list whole.

A small model copying a phrase from the request garbles some of it: "Lasagna" for "Los
Angeles", "nucleus" for "neutron", "Bron LeBron James", ``make the dish to "extra spicy"``
for "extra spicy". And copying a place it stops at the first comma: "Riga" for "Riga,
Latvia", "2020 Addison Street" for "2020 Addison Street, Berkeley, CA, USA", "Sousse" for
"Sousse, Tunisia". The qualifier the user wrote is what tells Paris, France from Paris,
Texas, and a tool that asks for "the city and state" needs it. And a list of numbers loses
or repeats an item.

:func:`recopied`: a string argument with a word of letters that neither the user's
messages, the turn's tool results nor the tool's schema write (:func:`garbled`) is probed
again (:func:`mlx_agent.probe.probe`) under a schema whose values are the request's phrases
(:func:`phrases`: up to :data:`PHRASE_WORDS` words, as written) that share at least
:data:`LIKENESS` of its letters (:class:`difflib.SequenceMatcher`'s ratio; not "Manhattan"
for "New York City", a value the model meant). The phrase the model picks replaces the
value where it is no other argument's value, the schema takes it, and the model itself,
with no grammar, finds it at most :data:`MARGIN` nats less likely than what it wrote
(:func:`mlx_agent.probe.likelihood`; not "fresh" for ``language: "english"``, which the
request does not write but the model means). Greedy decoding commits to a token at a time,
so a garble can be less likely as a whole than the phrase ("Lasagna", -7.0 nats, against
"Los Angeles", -6.1), or a little more ("nucleus", -1.3, against "neutron", -3.1).

:func:`whole_lists`: a list of numbers one item off a run of numbers the request writes
("85, 90, 88, 92, 86, 89, 91" copied with 91 twice, "[12, 15, 18, 20, 21, 26, 30]" without
18) is made that run.

:func:`whole_places`: each string argument of a place parameter (:func:`is_place`: its name
or description says location, city, address...) that the request writes is extended to
the comma-separated qualifiers the request writes right after it (up to four, of one to
three words each, capitalised or a code: "CA", "94704"), up to the end of the clause, where
the schema takes the longer value.

Not promised: only top-level strings of a parameter with no ``enum``, ``const``,
``format`` or ``pattern`` are read, and only a value of at most :data:`PHRASE_WORDS` words
is copied again (a longer one is the model's own text, not a copy). Words are ASCII
letters: a value in another script is never garbled. Phrases come from the last user
message only, its first :data:`PHRASE_CHARS` characters: a garbled id copied from a tool
result stays garbled. A qualifier is recognised by its capital letter, so one written in
lower case ("paris, france") is not taken; a clause that starts with a capitalised word
after a comma ("Riga, Latvia, Can you...") is cut before it only where that word is one of
:data:`CLAUSE_STARTS`; a list of places ending in "and" or "or" ("Boston, Chicago, and
Denver") is not a place qualified, but one with neither ("Compare Boston, Chicago,
Denver") reads as one. A place is not extended where the tool has a parameter of its own
for a place's parts (state, country, region, postal code) or another argument holds the
qualifier. Nothing is read where the caller's engine has a rotating KV cache
(:func:`mlx_agent.stated_arguments.complete_reply` leaves such calls as sampled).
"""

from __future__ import annotations

import difflib
import itertools
import re
from typing import Any, Callable, Sequence

from .engine import Sampler, greedy_sampler
from .heard import NAME_WORD, Heard, number, number_runs
from .probe import PROBE_CHARS, likelihood, probe
from .tools import Tool

LIKENESS = 0.3  # the least SequenceMatcher ratio of a garbled value and its phrase
MARGIN = 2.0  # nats: how much less likely than its own value the model may find the phrase
PHRASE_WORDS = 8  # the longest phrase of the request a copy may take, in words
PHRASE_CHARS = 2000  # phrases come from the request's first so many characters
MAX_PHRASES = 512  # the phrases most alike the value that a probe chooses among
_TOKEN = re.compile(r"\w[\w'./@:-]*\w|\w")
# a parameter's name words that make it a place's (by their start: "startLocation")
PLACE_STEMS = ("locat", "city", "cities", "place", "address", "town", "destination",
               "origin", "region", "venue", "country", "airport")
# its description's words that do, as whole words ("The city and state, e.g. Paris, TX")
PLACE_WORDS = frozenset("""location locations city cities place places address town
destination origin region venue country airport""".split())
# words that make it something else's: an email address, a web address
NOT_PLACE_WORDS = frozenset("email mail url uri web website ip host server path file".split())
# a tool with a parameter for one of these takes a place's qualifier there, not in the place
PART_STEMS = ("state", "country", "region", "province", "zip", "postal", "postcode")
# capitalised words that start a clause, not a place ("Riga, Latvia, Can you tell me...")
CLAUSE_STARTS = frozenset("""I Can Could Would Will Please What How Which When Where Who Why
And But Also Then Is Are Do Does The It This That My We You Tell Give Show Find Get Let
Make Set Thanks Thank Hi Hello Ok Okay Yes No""".split())
_QUALIFIER_WORD = r"[A-Z0-9][\w'-]*(?:\.\w+)*"
_QUALIFIERS = re.compile(rf"(?:, {_QUALIFIER_WORD}(?: {_QUALIFIER_WORD}){{0,2}}){{1,4}}"
                         r"(?=$|[.,?!;:)\n]| +[a-z])")


def _plain_string(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string" \
        and not any(k in schema for k in ("enum", "const", "format", "pattern"))


def garbled(value: str, heard: Heard) -> bool:
    """Whether ``value`` has a word of three or more ASCII letters (no digits: an id or a
    code is not read as words) that begins no word ``heard`` holds, nor does its singular
    ("miles" begins "milesfrom", "inches" is "inch" plural)."""
    def written(w: str) -> bool:
        stems = {w, w[:-1] if w.endswith("s") else w, w[:-2] if w.endswith("es") else w}
        return any(len(stem) >= 3 and heard.begins_a_word(stem) for stem in stems)

    return any(len(w) >= 3 and w.isalpha() and not written(w)
               for w in re.findall(r"[a-z0-9]+", value.lower()))


def phrases(request: str) -> list[str]:
    """Every run of one to :data:`PHRASE_WORDS` words of the request's first
    :data:`PHRASE_CHARS` characters, as written between its first and last word (commas and
    spaces kept, not a line break), of at most :data:`~mlx_agent.probe.PROBE_CHARS`
    characters; sorted."""
    text = request[:PHRASE_CHARS]
    words = list(_TOKEN.finditer(text))
    out = set()
    for i, first in enumerate(words):
        for last in words[i:i + PHRASE_WORDS]:
            phrase = text[first.start():last.end()]
            if len(phrase) > PROBE_CHARS or "\n" in phrase:
                break
            out.add(phrase)
    return sorted(out)


def _alike(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()


def _holds(text: str, others: list[str]) -> bool:
    """Whether ``text`` writes one of ``others`` (lower case) as whole words."""
    return any(o and re.search(rf"(?<!\w){re.escape(o)}(?!\w)", text, re.IGNORECASE)
               for o in others)


def recopied(engine, lm, prompt: Sequence[int], protocol: str, tool: Tool, arguments: dict,
             request: str, heard: str, sampler: Sampler = greedy_sampler,
             stop: Callable[[], bool] = lambda: False) -> dict:
    """``arguments`` with each :func:`garbled` string (of a plain string parameter) replaced
    by the request's phrase the model writes in its place when it may write only those alike
    it (:data:`LIKENESS`; probed after ``prompt`` and the arguments before it), where the
    phrase is no other argument's value, the model finds it about as likely
    (:data:`MARGIN`) and the tool's schema takes it; ``arguments`` itself where none is.
    ``stop`` is asked before each probe. The engine is left wherever the last probe left
    it."""
    out, choices = arguments, None
    said = Heard("\n".join((heard, tool.name, tool.description, str(tool.parameters))))
    for name in [p for p in tool.argument_order() if p in arguments]:
        value = out[name]
        if not isinstance(value, str) or not _plain_string(tool.properties.get(name)) \
                or len(_TOKEN.findall(value)) > PHRASE_WORDS or not garbled(value, said):
            continue
        choices = choices if choices is not None else phrases(request)
        alike = [c for c in choices if _alike(value, c) >= LIKENESS]
        if not alike:
            continue
        if stop():
            break
        alike = sorted(alike, key=lambda c: -_alike(value, c))[:MAX_PHRASES]
        copy = probe(engine, lm, sampler, prompt, protocol, tool, out, name,
                     {"type": "string", "enum": sorted(alike)})
        others = [v.strip().lower() for k, v in out.items() if k != name and isinstance(v, str)]
        if not isinstance(copy, str) or copy.strip().lower() in others \
                or tool.validate({**out, name: copy}):
            continue
        if likelihood(engine, lm, prompt, protocol, tool, out, name, copy) >= \
                likelihood(engine, lm, prompt, protocol, tool, out, name, value) - MARGIN:
            out = {**out, name: copy}
    return out


def is_place(name: str, schema: Any) -> bool:
    """Whether a parameter takes a place: a word of its name begins with one of
    :data:`PLACE_STEMS` (``loc`` as a whole word), or its description uses one of
    :data:`PLACE_WORDS`, and neither uses one of :data:`NOT_PLACE_WORDS`."""
    description = schema.get("description") if isinstance(schema, dict) else None
    named = [w.lower() for w in NAME_WORD.findall(name)]
    described = set(re.findall(r"[a-z]+", description.lower())) \
        if isinstance(description, str) else set()
    if NOT_PLACE_WORDS & (set(named) | described):
        return False
    return any(w == "loc" or w.startswith(PLACE_STEMS) for w in named) \
        or bool(PLACE_WORDS & described)


def _takes_parts(tool: Tool, name: str) -> bool:
    return any(p != name and any(w.lower().startswith(PART_STEMS) for w in NAME_WORD.findall(p))
               for p in tool.properties)


def _qualifiers(text: str, start: int) -> str:
    """The comma-separated qualifiers ``text`` writes from ``start``, up to the clause's end
    and before a word of :data:`CLAUSE_STARTS`; "" where none, or where a list goes on after
    them ("Paris, London and Rome", "Boston, Chicago, and Denver")."""
    m = _QUALIFIERS.match(text, start)
    if not m:
        return ""
    kept = ""  # cut before a clause's start, what is kept ends at that clause's comma
    for part in m.group().split(", ")[1:]:
        if part.split(" ")[0] in CLAUSE_STARTS:
            break
        kept += ", " + part
    more = re.match(r",? +(?:and|or|&) +([A-Z][\w'-]*)", text[start + len(kept):])
    return "" if more and more.group(1) not in CLAUSE_STARTS else kept  # not "..., and I"


def whole_place(value: str, request: str, others: list[str]) -> str:
    """``value`` with the qualifiers the request writes after it (:func:`_qualifiers`),
    the request's own spelling; ``value`` itself where the request does not write it, writes
    nothing after it, or writes one of ``others`` (another argument's value, lower case)
    there as whole words."""
    if not value.strip():
        return value
    found = re.finditer(rf"(?<!\w){re.escape(value.strip())}(?!\w)", request, re.IGNORECASE)
    for m in itertools.islice(found, 8):  # a request that repeats it 10,000 times: 8 reads
        tail = _qualifiers(request, m.end())
        if tail and not _holds(tail, others):
            return m.group() + tail
    return value


def whole_places(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each place (a string argument of a parameter :func:`is_place`)
    that the request writes extended to the qualifiers it writes after it
    (:func:`whole_place`), where the tool's schema takes the longer value; ``arguments``
    itself where none is."""
    out = arguments
    for name, value in arguments.items():
        schema = tool.properties.get(name)
        if not isinstance(value, str) or not is_place(name, schema) \
                or (isinstance(schema, dict) and ("enum" in schema or "const" in schema)) \
                or _takes_parts(tool, name):
            continue
        others = [v.strip().lower() for k, v in out.items() if k != name and isinstance(v, str)]
        whole = whole_place(value, request, others)
        if whole != value and not tool.validate({**out, name: whole}):
            out = {**out, name: whole}
    return out


def _one_off(a: list[float], b: list[float]) -> bool:
    """Whether ``a`` is ``b`` with one item left out, added or changed."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def whole_lists(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each list of numbers (of a parameter whose items are numbers) that
    is one item off a run of numbers the request writes (:func:`mlx_agent.heard.number_runs`:
    one left out, added or changed) made that run, where no other argument holds it and the
    schema takes it; ``arguments`` itself where none is."""
    out, runs = arguments, None
    for name, value in arguments.items():
        schema = tool.properties.get(name)
        items = schema.get("items") if isinstance(schema, dict) else None
        if not isinstance(value, list) or len(value) < 2 or not isinstance(items, dict) \
                or items.get("type") not in ("integer", "number") \
                or any(number(v) is None for v in value):
            continue
        runs = runs if runs is not None else number_runs(request)
        held = [v for k, v in out.items() if k != name]
        for run in runs:
            whole = [int(x) if x.is_integer() else x for x in run]
            if _one_off([number(v) for v in value], run) and whole not in held \
                    and not tool.validate({**out, name: whole}):
                out = {**out, name: whole}
                break
    return out

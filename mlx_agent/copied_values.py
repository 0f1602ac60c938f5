"""A call's strings as the request writes them: a garbled copy copied again, a place whole.

A small model copying a phrase from the request garbles some of it: "Lasagna" for "Los
Angeles", "Hfallia" for "Hyderabad", "Las Angeles", "make the dish to \"extra spicy\"" for
"extra spicy". And copying a place it stops at the first comma: "Riga" for "Riga, Latvia",
"2020 Addison Street" for "2020 Addison Street, Berkeley, CA, USA", "Sousse" for "Sousse,
Tunisia" (7 of the default adapter's misses on BFCL's first 100 ``simple`` and
``live_simple`` questions, and runs of our held-out catalogues). The qualifier the user wrote
is what tells Paris, France from Paris, Texas, and a tool that asks for "the city and state"
needs it.

:func:`recopied`: a string argument with a word of letters that neither the user's
messages, the turn's tool results nor the tool's schema write (:func:`garbled`) is probed
again (:func:`mlx_agent.probe.probe`) under a schema whose values are the request's phrases
(:func:`phrases`: up to :data:`PHRASE_WORDS` words, as written). The phrase the model picks
replaces the value where it is a miscopy of it, not a value the model meant to write
differently: it shares at least :data:`LIKENESS` of its letters
(:class:`difflib.SequenceMatcher`'s ratio; not "Manhattan" for "New York City"), it is not
another argument's value, and the model itself, with no grammar, finds it at most
:data:`MARGIN` nats less likely than what it wrote (:func:`mlx_agent.probe.likelihood`: not
"fresh" for ``language: "english"``, which the request does not write but the model means).
Greedy decoding picks a token at a time, so a garble can be less likely as a whole than the
phrase ("Lasagna", -7.0 nats, against "Los Angeles", -6.1), or a little more ("nucleus",
-1.3, against "neutron", -3.1).

:func:`whole_places`: each string argument of a place parameter (its name or description
says location, city, address...: :func:`is_place`) that the request writes is extended to
the comma-separated qualifiers the request writes right after it (up to four, of one to
three words each, capitalised or a code: "CA", "94704"), up to the end of the clause, and
not the start of a list ("Paris, London and Rome").

Not promised: only top-level strings of a parameter with no ``enum``, ``const``,
``format`` or ``pattern``, and only a value of at most :data:`PHRASE_WORDS` words is copied
again (a longer one is the model's own text, not a copy). Phrases come from the last user
message only, its first :data:`PHRASE_CHARS` characters: a garbled id copied from a tool
result stays garbled. A qualifier is recognised by its capital letter, so one written in
lower case ("paris, france") is not taken, and a clause that starts with a capitalised word
after a comma ("Riga, Latvia, Can you...") is cut before it only where that word is one of
:data:`CLAUSE_STARTS`. A place is not extended where the tool has a parameter of its own for
a place's parts (state, country, region, postal code), where the qualifiers hold another
argument's value, or where the longer value breaks the parameter's schema (the caller
validates).
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import json
import re
from typing import Any, Callable, Sequence

from .engine import Sampler, greedy_sampler
from .probe import PROBE_CHARS, likelihood, probe
from .tools import Tool

LIKENESS = 0.3  # the least SequenceMatcher ratio of a garbled value and its phrase
MARGIN = 2.0  # nats: how much less likely than its own value the model may find the phrase
PHRASE_WORDS = 8  # the longest phrase of the request a copy may take, in words
PHRASE_CHARS = 2000  # phrases come from the request's first so many characters
_TOKEN = re.compile(r"\w[\w'./@:-]*\w|\w")
PLACE_STEMS = ("locat", "city", "cities", "place", "address", "town", "destination",
               "origin", "region", "venue", "country", "state", "area", "where", "airport")
# a tool with a parameter for one of these takes a place's qualifier there, not in the place
PART_STEMS = ("state", "country", "region", "province", "zip", "postal", "postcode")
# capitalised words that start a clause, not a place ("Riga, Latvia, Can you tell me...")
CLAUSE_STARTS = frozenset("""I Can Could Would Will Please What How Which When Where Who Why
And But Also Then Is Are Do Does The It This That My We You Tell Give Show Find Get Let
Make Set Thanks Thank Hi Hello Ok Okay Yes No""".split())
_QUALIFIER_WORD = r"[A-Z0-9][\w'-]*(?:\.\w+)*"
_QUALIFIERS = re.compile(rf"(?:, {_QUALIFIER_WORD}(?: {_QUALIFIER_WORD}){{0,2}}){{1,4}}"
                         r"(?=$|[.,?!;:)\n]| +[a-z])")
_NAME_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def _plain_string(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "string" \
        and not any(k in schema for k in ("enum", "const", "format", "pattern"))


def garbled(value: str, heard: str) -> bool:
    """Whether ``value`` has a word of three or more letters (no digits: an id or a code is
    not read as words) that begins no word ``heard`` writes, nor does its singular."""
    said = sorted(set(re.findall(r"[a-z0-9]+", heard.lower())))

    def begins_a_word(prefix: str) -> bool:
        i = bisect.bisect_left(said, prefix)
        return i < len(said) and said[i].startswith(prefix)

    def heard_word(w: str) -> bool:  # "miles" in "milesfrom", "inches" in "1 inch"
        stems = {w, w[:-1] if w.endswith("s") else w, w[:-2] if w.endswith("es") else w}
        return any(len(stem) >= 3 and begins_a_word(stem) for stem in stems)

    return any(len(w) >= 3 and w.isalpha() and not heard_word(w)
               for w in re.findall(r"[a-z0-9]+", value.lower()))


def phrases(request: str) -> list[str]:
    """Every run of one to :data:`PHRASE_WORDS` words of the request's first
    :data:`PHRASE_CHARS` characters, as written between its first and last word (commas and
    spaces kept), of at most :data:`~mlx_agent.probe.PROBE_CHARS` characters; sorted."""
    text = request[:PHRASE_CHARS]
    words = list(_TOKEN.finditer(text))
    out = set()
    for i, first in enumerate(words):
        for last in words[i:i + PHRASE_WORDS]:
            if last.end() - first.start() > PROBE_CHARS:
                break
            out.add(text[first.start():last.end()])
    return sorted(out)


def recopied(engine, lm, prompt: Sequence[int], protocol: str, tool: Tool, arguments: dict,
             request: str, heard: str, sampler: Sampler = greedy_sampler,
             stop: Callable[[], bool] = lambda: False) -> dict:
    """``arguments`` with each :func:`garbled` string (of a plain string parameter) replaced
    by the request's phrase the model writes in its place when it may write only those
    (probed after ``prompt`` and the arguments before it), where the two are alike
    (:data:`LIKENESS`), the phrase is no other argument's value, and the model finds it
    about as likely (:data:`MARGIN`); ``arguments`` itself where none is. ``stop`` is asked
    before each probe. The engine is left wherever the last probe left it."""
    out, choices = arguments, None
    read = "\n".join((heard, tool.name, tool.description, json.dumps(tool.parameters)))
    for name in [p for p in tool.argument_order() if p in arguments]:
        value = out[name]
        if not isinstance(value, str) or not _plain_string(tool.properties.get(name)) \
                or len(_TOKEN.findall(value)) > PHRASE_WORDS or not garbled(value, read):
            continue
        choices = choices if choices is not None else phrases(request)
        if not choices or stop():
            break
        copy = probe(engine, lm, sampler, prompt, protocol, tool, out, name,
                     {"type": "string", "enum": choices})
        others = {v.strip().lower() for k, v in out.items() if k != name and isinstance(v, str)}
        if not isinstance(copy, str) or copy.lower() in others or \
                difflib.SequenceMatcher(None, value.lower(), copy.lower()).ratio() < LIKENESS:
            continue
        if likelihood(engine, lm, prompt, protocol, tool, out, name, copy) >= \
                likelihood(engine, lm, prompt, protocol, tool, out, name, value) - MARGIN:
            out = {**out, name: copy}
    return out


def _name_words(name: str, description: Any) -> list[str]:
    words = [w.lower() for w in _NAME_WORD.findall(name)]
    if isinstance(description, str):
        words += re.findall(r"[a-z]+", description.lower())
    return words


def is_place(name: str, schema: Any) -> bool:
    """Whether a parameter takes a place: a word of its name or description begins with
    one of :data:`PLACE_STEMS` (``loc`` as a whole word)."""
    description = schema.get("description") if isinstance(schema, dict) else None
    return any(w == "loc" or w.startswith(PLACE_STEMS) for w in _name_words(name,
                                                                          description))


def _takes_parts(tool: Tool, name: str) -> bool:
    return any(p != name and any(w.startswith(PART_STEMS) for w in _name_words(p, None))
               for p in tool.properties)


def _qualifiers(text: str, start: int) -> str:
    """The comma-separated qualifiers ``text`` writes from ``start``, up to the clause's end
    and before a word of :data:`CLAUSE_STARTS`; "" where none."""
    m = _QUALIFIERS.match(text, start)
    if not m:
        return ""
    kept = ""  # cut before a clause's start, what is kept ends at that clause's comma
    for part in m.group().split(", ")[1:]:
        if part.split(" ")[0] in CLAUSE_STARTS:
            break
        kept += ", " + part
    # "Paris, London and Rome" is a list of places, not one place qualified
    return "" if re.match(r" +(?:and|or|&) +[A-Z]", text[start + len(kept):]) else kept


def whole_place(value: str, request: str, others: list[str]) -> str:
    """``value`` with the qualifiers the request writes after it (:func:`_qualifiers`),
    the request's own spelling; ``value`` itself where the request does not write it, writes
    nothing after it, or writes one of ``others`` (another argument's value, lower case)
    there."""
    if not value.strip():
        return value
    found = re.finditer(rf"(?<!\w){re.escape(value.strip())}(?!\w)", request, re.IGNORECASE)
    for m in itertools.islice(found, 8):  # a request that repeats it 10,000 times: 8 reads
        tail = _qualifiers(request, m.end())
        if tail and not any(o and o in tail.lower() for o in others):
            return m.group() + tail
    return value


def whole_places(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each place (a string argument of a parameter :func:`is_place`)
    that the request writes extended to the qualifiers it writes after it
    (:func:`whole_place`); ``arguments`` itself where none is. The caller validates the
    result against the tool's schema."""
    out = arguments
    for name, value in arguments.items():
        schema = tool.properties.get(name)
        if not isinstance(value, str) or not is_place(name, schema) \
                or (isinstance(schema, dict) and ("enum" in schema or "const" in schema)) \
                or _takes_parts(tool, name):
            continue
        others = [v.strip().lower() for k, v in out.items() if k != name and isinstance(v, str)]
        whole = whole_place(value, request, others)
        if whole != value:
            out = {**out, name: whole}
    return out


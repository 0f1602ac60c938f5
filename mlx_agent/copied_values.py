"""A call's values as the request writes them: a garbled copy copied again, a place and a
list whole, the enum's value the request names, a number at the scale and with the sign it
writes, a rate as the fraction its percentage means.

A small model copying a phrase from the request garbles some of it: "Lasagna" for "Los
Angeles", "nucleus" for "neutron", "Bron LeBron James", ``make the dish to "extra spicy"``
for "extra spicy". And copying a place it stops at the first comma: "Riga" for "Riga,
Latvia", "2020 Addison Street" for "2020 Addison Street, Berkeley, CA, USA", "Sousse" for
"Sousse, Tunisia". The qualifier the user wrote is what tells Paris, France from Paris,
Texas, and a tool that asks for "the city and state" needs it. A list of numbers loses
or repeats an item. Of an enum's values, the model picks one the request never wrote
("cat" for "add a vet visit with the hamster option"). And it writes "100 million shares"
as 100, "1e-9" as 1.0, "-122.2730" or "119.5383 W" as 122.273, and "an interest rate of
5%" as 5 where the formula takes 0.05.

:func:`recopied`: a string argument with a word of letters that neither the user's
messages, the turn's tool results nor the tool's schema write (:func:`garbled`) is probed
again (:func:`mlx_agent.probe.probe`) under a schema whose values are the request's phrases
(:func:`phrases`: up to :data:`PHRASE_WORDS` words, as written) that share at least
:data:`LIKENESS` of its letters (:class:`difflib.SequenceMatcher`'s ratio; not "Manhattan"
for "New York City", a value the model meant). The phrase the model picks replaces the
value where it is no other argument's value, the schema takes it, and the model itself,
with no grammar, finds it at most :data:`MARGIN` nats less likely than what it wrote
(:func:`mlx_agent.probe.likelihood`; not "fresh" for ``language: "english"``, which the
request does not write but the model means). Where the phrase it picks runs on past a
shorter one ("Glasgow, the travel" for "Glasgow"), the one the model finds most likely,
its closing quote included, is taken. Greedy decoding commits to a token at a time,
so a garble can be less likely as a whole than the phrase ("Lasagna", -7.0 nats, against
"Los Angeles", -6.1), or a little more ("nucleus", -1.3, against "neutron", -3.1).

:func:`whole_lists`: a list of numbers that is a slipped copy of a run of numbers the
request writes, one item repeated in place or one inner item left out ("85, 90, 88, 92, 86,
89, 91" copied with 91 twice, "[12, 15, 18, 20, 21, 26, 30]" without 18), is made that run.
An item dropped from an end, or one of a repeat, reads as a filter, and one added or
changed as an edit: those lists stay.

:func:`written_choices`: an enum's string that the request does not write (not even as a
word's start: "postgres" is in "PostgreSQL") is made the one other value of that enum it
writes as whole words ("news", "app balance", "hot air" for ``hot_air``), unless it writes
two or another argument holds it.

:func:`assigned_values`: a value the request assigns a parameter by its name ("b=371,
a=806", ``title equal to "Pricing change"``) is that parameter's, not the other's.
:func:`as_cased`: a string the request writes in other capitals is as it writes them;
:func:`as_quoted`: one it quotes is as quoted, without a full stop the model added; a
free string that repeats a path argument is the one span it quotes that no argument holds.
:func:`one_of_repeats`: of optional strings that repeat one another, the one the model finds
likeliest stays.
:func:`whole_identifiers`: an email or web address the request does not write is the one it
writes most alike ("Ximena.Mehta@Mail.example.net" for "arjun.mehta@mail.example.net").
:func:`whole_paths`: a file's path the request writes is copied whole ("users.csv" for
"data/users.csv"; never a name only like it: "notes2.txt" may be a new file).

:func:`named_choices`: a list of an enum's values is the values the request names, in its
order ("the rating and player count" for ``["player count"]``), where the model's list is
empty or left out, or holds only values the request names and fewer of them.

:func:`scaled_numbers`: a number the request writes before a scale word ("213 million") or
with a power of ten ("1e-9", "3.2 x 10^5") is the number it means, not 213 or 1, where the
parameter is not counted in that unit. :func:`signed_numbers`: a number the request writes
only negative ("-122.2730", or the west longitude of "37.8651 N, 119.5383 W") keeps its
sign. :func:`percent_rates`: "an annual interest rate of 5%" is 0.05 for a rate (a return, a
yield, a growth, or a parameter that says it is a decimal), 5 for a parameter that says it
is a percentage.

:func:`whole_places`: each string argument of a place parameter (:func:`is_place`, by its
name: "location", "pickup_city", "loc") that runs on into another parameter (" Tunis, litres
equal to 119.21", "Lang Son in fahrenheit") is cut back to the place
(:func:`place_alone`), and each that the request writes is extended to the
comma-separated qualifiers the request writes right after it (up to four, of one to three
words each, capitalised, a postal code after a word: "Berkeley, CA 94704"), up to the end
of the clause, where the schema takes the longer value.

Not promised: only top-level strings and lists of a parameter with no ``enum``, ``const``,
``format`` or ``pattern`` are read, and only a value of at most :data:`PHRASE_WORDS` words
is copied again (a longer one is the model's own text, not a copy). Words are ASCII
letters: a value in another script is never garbled. Phrases come from the last user
message only, its first :data:`PHRASE_CHARS` characters: a garbled id copied from a tool
result stays garbled. A list the model filtered of an inner item on purpose gets it back.
A qualifier is recognised by its capital letter, so one written in lower case ("paris,
france") is not taken; one that starts with a digit ("2 adults") or a word of
:data:`NOT_QUALIFIERS` (a clause's start, a date, a unit, a title: "Can you", "May 5",
"Celsius") ends the place; a list of places ending in "and" or "or" ("Boston, Chicago, and
Denver") is not a place qualified, but one with neither ("Compare Boston, Chicago,
Denver") reads as one. A place is not extended where the tool has a parameter of its own
for a place's parts (state, country, region, postal code) or another argument holds the
qualifier. Nothing is read where the caller's engine has a rotating KV cache
(:func:`mlx_agent.stated_arguments.complete_reply` leaves such calls as sampled).
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from typing import Any, Callable, Sequence

from .engine import Sampler, greedy_sampler
from .file_paths import file_names, takes_file, takes_path, writes_path, written_paths
from .heard import (NAME_WORD, NUMBER, REQUEST_CHARS, SCALE_WORDS, Heard, leaves, number,
                    number_runs, writes_whole)
from .probe import PROBE_CHARS, likelihood, probe
from .tools import Tool

LIKENESS = 0.3  # the least SequenceMatcher ratio of a garbled value and its phrase
MARGIN = 2.0  # nats: how much less likely than its own value the model may find the phrase
PHRASE_WORDS = 8  # the longest phrase of the request a copy may take, in words
PHRASE_CHARS = 2000  # phrases come from the request's first so many characters
MAX_CHOICES = 256  # an enum's values read against the request (a regex each): its first so many
MAX_PHRASES = 512  # the phrases most alike the value that a probe chooses among
# a value longer than this shares under LIKENESS of its letters with any phrase (of at most
# PROBE_CHARS): 2 * PROBE_CHARS / (length + PROBE_CHARS) < LIKENESS
LONGEST = int((2 / LIKENESS - 1) * PROBE_CHARS)
_TOKEN = re.compile(r"\w[\w'./@:-]*\w|\w")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# a parameter's name words that make it a place's ("startLocation", "pickup_city", "loc")
PLACE_WORDS = frozenset("""loc location locations city cities place places address addresses
town towns destination destinations origin region venue country airport""".split())
# name words that make it something else's: an email address, a web address
NOT_PLACE_WORDS = frozenset("""email mail url uri web website ip mac host server path file
wallet language""".split())
# a tool with a parameter named so takes a place's qualifier there, not in the place
PART_WORDS = frozenset("""state states country countries region province zip zipcode postal
postcode""".split())
# capitalised words that start something else after a place's comma: a clause ("Riga,
# Latvia, Can you tell me..."), a date or a time ("Paris, May 5"), a unit, a person
NOT_QUALIFIERS = frozenset("""I Can Could Would Will Please What How Which When Where Who Why
And But Also Then Is Are Do Does The It This That My We You Tell Give Show Find Get Let
Make Set Thanks Thank Hi Hello Ok Okay Yes No Today Tomorrow Tonight Yesterday Now Next
Last This Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March
April May June July August September October November December Jan Feb Mar Apr Jun Jul Aug
Sep Sept Oct Nov Dec Celsius Fahrenheit Kelvin Mr Mrs Ms Dr Prof Sir""".split())
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
    spaces kept, no line break or other control character), of at most
    :data:`~mlx_agent.probe.PROBE_CHARS` characters; sorted."""
    text = request[:PHRASE_CHARS]
    words = list(_TOKEN.finditer(text))
    out = set()
    for i, first in enumerate(words):
        for last in words[i:i + PHRASE_WORDS]:
            phrase = text[first.start():last.end()]
            # no line break, and no control character: never NUL, which the call's own
            # grammar refuses (a tool's environment cannot hold it)
            if len(phrase) > PROBE_CHARS or _CONTROL.search(phrase):
                break
            out.add(phrase)
    return sorted(out)


def _alike(value: str, choices: list[str]) -> list[str]:
    """The ``choices`` that share at least :data:`LIKENESS` of their letters with
    ``value``, the most alike first, at most :data:`MAX_PHRASES`, sorted."""
    matcher, ratios = difflib.SequenceMatcher(None, value.lower()), {}
    for choice in choices:  # the quick upper bounds first: most phrases are unlike
        matcher.set_seq2(choice.lower())  # the ratio is not symmetric: value first
        if matcher.real_quick_ratio() >= LIKENESS and matcher.quick_ratio() >= LIKENESS \
                and (ratio := matcher.ratio()) >= LIKENESS:
            ratios[choice] = ratio
    return sorted(sorted(ratios, key=ratios.__getitem__, reverse=True)[:MAX_PHRASES])


def _holds(text: str, others: list[str]) -> bool:
    """Whether ``text`` writes one of ``others`` (lower case) as whole words."""
    return any(o and re.search(rf"(?<!\w){re.escape(o)}(?!\w)", text, re.IGNORECASE)
               for o in others)


def _other_strings(arguments: dict, name: str) -> list[str]:
    """The string values of the arguments but ``name``'s, stripped, lower case."""
    return [v.strip().lower() for k, v in arguments.items() if k != name and isinstance(v, str)]

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
                or len(value) > LONGEST or len(_TOKEN.findall(value)) > PHRASE_WORDS \
                or not garbled(value, said):
            continue
        choices = choices if choices is not None else phrases(request)
        alike = _alike(value, choices)
        if not alike:
            continue
        if stop():
            break
        copy = probe(engine, lm, sampler, prompt, protocol, tool, out, name,
                     {"type": "string", "enum": alike})
        if not isinstance(copy, str):
            continue
        # the probe commits a token at a time, and runs on past the copy it meant
        # ("Glasgow, the travel" for "Glasgow"): of the phrases it starts with that may
        # replace the value, the one the model finds most likely (closing quote included)
        others, scored = _other_strings(out, name), {}
        for c in sorted(c for c in alike if c == copy or _starts(copy, c)):
            if c.strip().lower() not in others and not tool.validate({**out, name: c}):
                if stop():
                    return out
                scored[c] = likelihood(engine, lm, prompt, protocol, tool, out, name, c)
        if scored and max(scored.values()) >= \
                likelihood(engine, lm, prompt, protocol, tool, out, name, value) - MARGIN:
            out = {**out, name: max(scored, key=scored.__getitem__)}
    return out


def one_of_repeats(engine, lm, prompt: Sequence[int], protocol: str, tool: Tool,
                   arguments: dict, stop: Callable[[], bool] = lambda: False) -> dict:
    """``arguments`` with optional strings that repeat one another (case and spaces aside;
    no required argument holds it: :func:`mlx_agent.stated_arguments.without_made_up` drops
    those) kept only where the model, with no grammar, finds the value likeliest
    (:func:`mlx_agent.probe.likelihood`, after the call's text before it): ``cast`` and
    ``directed_by`` both "Tzi Ma" keep one. Of BFCL's calls that repeat a string across
    arguments none was right. ``arguments`` itself where none repeats, or ``stop`` says
    so (asked before each scoring). The engine is left wherever the last scoring left
    it."""
    groups: dict[str, list[str]] = {}
    for name, value in arguments.items():
        if isinstance(value, str) and len(value.strip()) > 2 and name not in tool.required:
            groups.setdefault(" ".join(value.lower().split()), []).append(name)
    out = arguments
    for names in (g for g in groups.values() if len(g) > 1):
        scores = {}
        for name in names:
            if stop():
                return arguments
            scores[name] = likelihood(engine, lm, prompt, protocol, tool, arguments, name,
                                      arguments[name])
        best = max(names, key=lambda n: scores[n])
        out = {k: v for k, v in out.items() if k == best or k not in names}
    return out


def _starts(phrase: str, head: str) -> bool:
    """Whether ``phrase`` starts with ``head``, a shorter phrase, at a word's end."""
    return len(head) < len(phrase) and phrase.startswith(head) \
        and not (phrase[len(head)].isalnum() or phrase[len(head)] == "_")


def is_place(name: str) -> bool:
    """Whether a parameter takes a place, by its name: one of its words is one of
    :data:`PLACE_WORDS` ("start_location", "pickupCity", "loc") and none is one of
    :data:`NOT_PLACE_WORDS` ("email_address")."""
    named = {w.lower() for w in NAME_WORD.findall(name)}
    return bool(named & PLACE_WORDS) and not named & NOT_PLACE_WORDS


def takes_parts(tool: Tool, name: str) -> bool:
    """Whether another of the tool's parameters is named for a place's part (a word of
    :data:`PART_WORDS`: ``state``, ``country_code``)."""
    return any(p != name and {w.lower() for w in NAME_WORD.findall(p)} & PART_WORDS
               for p in tool.properties)


def _qualifiers(text: str, start: int) -> str:
    """The comma-separated qualifiers ``text`` writes from ``start``, up to the clause's end
    and before one that starts with a digit ("2 adults") or a word of
    :data:`NOT_QUALIFIERS` ("Can you", "May 5"); "" where none, or where a list goes on
    after them ("Paris, London and Rome", "Boston, Chicago, and Denver")."""
    m = _QUALIFIERS.match(text, start)
    if not m:
        return ""
    kept = ""  # cut before a part that is no qualifier: what is kept ends at its comma
    for part in m.group().split(", ")[1:]:
        first = part.split(" ")[0]
        if first[0].isdigit() or first.split(".")[0] in NOT_QUALIFIERS:
            break
        kept += ", " + part
    more = re.match(r",? +(?:and|or|&) +([A-Z][\w'-]*)", text[start + len(kept):])
    return "" if more and more.group(1) not in NOT_QUALIFIERS else kept  # not "..., and I"


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


# words that join a place to what the request says next ("Tunis, litres equal to ...")
CONNECTORS = frozenset("in with and at for of to the a an by using equal is being".split())


def _mentions(tool: Tool, name: str) -> list[str]:
    """How the request may name the tool's other parameters: their names' words ("plate
    number") and their enum values ("fahrenheit"), lower case, of three letters or more."""
    out = []
    for other, schema in tool.properties.items():
        if other != name:
            out.append(" ".join(w.lower() for w in NAME_WORD.findall(other)))
            enum = schema.get("enum") if isinstance(schema, dict) else None
            out += [v.lower() for v in enum or () if isinstance(v, str)]
    return [m for m in out if len(m) >= 3]


def place_alone(tool: Tool, name: str, value: str, request: str) -> str:
    """``value``, copied from the request as it is, cut before the first mention of another
    of the tool's parameters (:func:`_mentions`) and the words that join it
    (:data:`CONNECTORS`): " Tunis, litres equal to 119.21" is "Tunis", "Lang Son in
    fahrenheit" is "Lang Son"; ``value`` itself where it mentions none, or where nothing
    would be left."""
    if not value.strip() or value.strip().lower() not in request.lower():
        return value
    low = value.lower()
    at = min((m.start() for mention in _mentions(tool, name)
              for m in itertools.islice(re.finditer(rf"(?<!\w){re.escape(mention)}(?!\w)",
                                                    low), 1)), default=None)
    if at is None:
        return value
    head = value[:at].rstrip(" \t\n,;:(")
    while head:
        rest, _, last = head.rpartition(" ")
        if last.lower() not in CONNECTORS:
            break
        head = rest.rstrip(" \t\n,;:(")
    return head.strip() or value


# parameters of a route's ends: "New York to Los Angeles" is a start that ran on into the end
ROUTE_WORDS = PLACE_WORDS | frozenset("""start end from to source departure arrival
pickup dropoff""".split())


# a word that leads into what follows: a value ending so is a phrase ("set an alarm for")
_LEADS = frozenset("for at on in to by of from with and or the a an until before after".split())


def _route(name: str) -> bool:
    return any(w.lower() in ROUTE_WORDS for w in NAME_WORD.findall(name))


def _run_on(value: str, held: str, name: str, other: str) -> str:
    """``value`` (of ``name``) before ``held`` (``other``'s value), where the model ran it
    on into that: ``held`` a date, a year or a time (it has a digit) after a space or a
    comma ("London 2022/08/16", "NBA 2021"); a route's other end after "to" or "from"
    ("New York to Los Angeles"); a place's part (:data:`PART_WORDS`) after a comma
    ("London, United Kingdom" beside ``country``). "" where it did not ("Lunch with
    Sarah", "1 Market St, San Francisco" beside ``city``)."""
    if len(value) <= len(held) or not value.lower().endswith(held.lower()):
        return ""
    head = value[:-len(held)]
    dated = re.search(r"\d", held) and re.search(r"[\s,]+$", head)
    route = _route(name) and _route(other) and re.search(r"\s+(?:to|from)\s+$", head,
                                                          re.IGNORECASE)
    part = is_place(name) and {w.lower() for w in NAME_WORD.findall(other)} & PART_WORDS \
        and re.search(r",\s*$", head)
    join = dated or route or part
    rest = head[:join.start()].rstrip(" ,;:-") if join else ""
    last = rest.split()[-1].lower() if rest.split() else ""
    return rest if re.search(r"[A-Za-z]{3}", rest) and last not in _LEADS else ""


def apart_values(tool: Tool, arguments: dict) -> dict:
    """``arguments`` with each top-level string (of a parameter with no enum or const)
    that ran on into another argument's string, whole at its end, cut to what comes
    before (:func:`_run_on`), where that holds a word of three letters or more ("1st" of
    "1st June 2022" does not) and the schema takes it; ``arguments`` itself where none
    is."""
    strings = {k: v.strip() for k, v in arguments.items()
               if isinstance(v, str) and len(v.strip()) >= 3}
    out = arguments
    for name, value in strings.items():
        schema = tool.properties.get(name)
        if isinstance(schema, dict) and {"enum", "const"} & schema.keys():
            continue
        for other, held in strings.items():
            rest = _run_on(value, held, name, other) if other != name else ""
            if rest and not tool.validate({**out, name: rest}):
                out = {**out, name: rest}
                break
    return out


def whole_places(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each place (a string argument of a parameter :func:`is_place`)
    that runs on into another parameter cut back to the place (:func:`place_alone`), and
    each that the request writes extended to the qualifiers it writes after it
    (:func:`whole_place`), where the tool's schema takes the new value; ``arguments``
    itself where none is."""
    out = arguments
    for name, value in arguments.items():
        schema = tool.properties.get(name)
        if not isinstance(value, str) or not is_place(name) \
                or (isinstance(schema, dict) and ("enum" in schema or "const" in schema)):
            continue
        place = place_alone(tool, name, value, request)
        if not takes_parts(tool, name):
            place = whole_place(place, request, _other_strings(out, name))
        if place != value and not tool.validate({**out, name: place}):
            out = {**out, name: place}
    return out


_SCALE = re.compile(rf"(?<![\w.,])(\d+(?:,\d{{3}})*(?:\.\d+)?)\s*({'|'.join(SCALE_WORDS)})\b",
                    re.IGNORECASE)
# a power of ten: "1e-9", "2.5E+3", "3.2 x 10^5", "6.02×10^23" (not "123e4567" in an id)
_POWER = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)(?:[eE]|\s*[x\u00d7*]\s*10\s*\^\s*)"
                    r"([-+]?\d{1,3})(?![\w.])")


def _scales(text: str) -> list[tuple[float, float, str, int]]:
    """Each number ``text`` writes at a scale: its digits, the scale, the scale's word
    (a power of ten's is "e"), and where it starts."""
    said = [(float(m.group(1).replace(",", "")), SCALE_WORDS[m.group(2).lower()],
             m.group(2).lower(), m.start()) for m in _SCALE.finditer(text)]
    return said + [(float(m.group(1)), 10.0 ** int(m.group(2)), "e", m.start())
                   for m in _POWER.finditer(text) if abs(int(m.group(2))) <= 300]  # a float's


def _bare(text: str, starts: set[int]) -> set[float]:
    """The numbers ``text`` writes with no percent sign, but those starting at ``starts``
    (a scale's, a percentage's): what it writes bare."""
    return {float(m.group().replace(",", "")) for m in NUMBER.finditer(text)
            if m.start() not in starts and not m.group(1)}


def _whole(x: float) -> int | float:
    """``x`` as an int where it is a whole number a float holds exactly."""
    return int(x) if x.is_integer() and abs(x) < 2 ** 53 else x


def scaled_numbers(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level number that the request writes before a scale
    word ("213 million", "1.5 billion": :data:`~mlx_agent.heard.SCALE_WORDS`) or with a
    power of ten ("1e-9", "3.2 x 10^5"), and nowhere without one, made the number it means
    (213000000, 1e-09, to 12 significant digits), unless the parameter's name or
    description has that word ("population in millions"), another argument holds that
    number already ("2 million dollars among 2 heirs" leaves the heirs at 2) or the schema
    refuses it; ``arguments`` itself where none is."""
    head = request[:REQUEST_CHARS]
    said = _scales(head)
    if not said:
        return arguments
    plain = _bare(head, {at for *_, at in said})
    out = arguments
    for name, value in arguments.items():
        x, schema = number(value), tool.properties.get(name)
        about = f"{name} {schema.get('description', '')}".lower() \
            if isinstance(schema, dict) else name.lower()
        scales = {(scale, word) for n, scale, word, _ in said
                  if n == x and (word == "e" or word not in about)}
        if x is None or x in plain or len(scales) != 1:
            continue
        meant = float(f"{x * scales.pop()[0]:.12g}")
        meant = _whole(meant)
        if math.isfinite(meant) and all(number(v) != meant for v in out.values()) \
                and not tool.validate({**out, name: meant}):
            out = {**out, name: meant}
    return out


# a coordinate pair with its hemispheres: "33.4484 N, 112.0740 W", "37.8\u00b0S 144.9\u00b0E"
_HEMISPHERES = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)\s*(?:\u00b0\s*)?([NS])\b[\s,;/]*"
                          r"(?:and\s+)?(\d+(?:\.\d+)?)\s*(?:\u00b0\s*)?([EW])\b")


def _signs(text: str) -> tuple[set[float], set[float]]:
    """The numbers ``text`` writes negative ("-122.27", a south latitude or a west
    longitude of a coordinate pair) and those it writes positive."""
    negative, positive, marked = set(), set(), set()
    for m in _HEMISPHERES.finditer(text):
        for digits, side, at in ((m.group(1), m.group(2), m.start(1)),
                                 (m.group(3), m.group(4), m.start(3))):
            (negative if side in "SW" else positive).add(float(digits))
            marked.add(at)
    for m in NUMBER.finditer(text):
        if m.start() not in marked and not m.group(1):
            x = float(m.group().replace(",", ""))
            (negative if x < 0 else positive).add(abs(x))
    return negative, positive


def signed_numbers(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level number, or number in a list of numbers, that the
    request writes only negative ("-122.2730", or "119.5383 W" in a coordinate pair:
    :data:`_HEMISPHERES`) but the model wrote without its sign, made negative, where no
    other argument holds that negative number and the schema takes it; ``arguments``
    itself where none is."""
    negative, positive = _signs(request[:REQUEST_CHARS])
    only = negative - positive
    if not only:
        return arguments
    held = {number(v) for v in leaves(arguments)}

    def signed(v: Any) -> Any:
        x = number(v)
        if x is None or x <= 0 or x not in only or -x in held:
            return v
        held.add(-x)  # one argument takes it
        return -v

    out = arguments
    for name, value in arguments.items():
        new = [signed(v) for v in value] if _numbers_of(tool, name, value) is not None \
            else signed(value)
        if new != value and not tool.validate({**out, name: new}):
            out = {**out, name: new}
    return out


# a parameter a formula reads as a fraction ("an annual interest rate of 5%": 0.05)
_RATE = re.compile(r"\b(?:rates?|returns?|yields?|growth|decimal|fraction)\b", re.IGNORECASE)
# one that takes the percentage itself ("the yearly yield as a percentage", "volume_percent",
# "rate (%)", "8 for 8%"), unless it says it takes a fraction ("as a decimal: 5% is 0.05")
_PERCENT_WORD = re.compile(r"percent|pct\b|%", re.IGNORECASE)
_FRACTION = re.compile(r"\b(?:decimal|fraction)\b|(?<![\d.])0\.\d", re.IGNORECASE)
_PERCENT = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)\s*(?:%|percent\b|per\s+cent\b)",
                      re.IGNORECASE)


def percent_rates(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level number that the request writes as a percentage
    ("5%", "5 percent"), and nowhere bare, made its fraction (0.05) where the parameter is
    a rate, a return, a yield or a growth, or says it is a decimal or a fraction (its name
    or description), unless it says it is a percentage ("as a percentage", "(%)", "8 for
    8%", ``capture_percentage``) and not a fraction too ("5% is 0.05"); ``arguments``
    itself where none is. A formula's rate is a
    fraction: "5% is 0.05", as the tools that say so write it."""
    head = request[:REQUEST_CHARS]
    percents = {float(m.group(1)): m.start() for m in _PERCENT.finditer(head)}
    if not percents:
        return arguments
    plain = _bare(head, set(percents.values()))
    out = arguments
    for name, value in arguments.items():
        x, schema = number(value), tool.properties.get(name)
        about = f"{' '.join(NAME_WORD.findall(name))} " \
            f"{schema.get('description', '') if isinstance(schema, dict) else ''}"
        if x is None or x not in percents or x in plain or not _RATE.search(about) \
                or _PERCENT_WORD.search(about) and not _FRACTION.search(about):
            continue
        meant = float(f"{x / 100:.12g}")
        if all(number(v) != meant for v in out.values()) \
                and not tool.validate({**out, name: meant}):
            out = {**out, name: meant}
    return out


# a value the request assigns a parameter by its name: "b=371", "a: 806", "title equal to
# \"Pricing change\"", "the minutes being 8", "limit set to 10"
_ASSIGN = r"\s*(?:=|:|\bequal\s+to\b|\bbeing\b|\bset\s+to\b)\s*"
_ASSIGNED = r"(\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|-?\d+(?:,\d{3})*(?:\.\d+)?(?![\w:/-]|\.\d)" \
    r"|(?-i:(?<![\w-])[A-Z0-9][A-Z0-9_:/.-]{0,62}[A-Z0-9](?![\w-])))"  # a code: USD, 20:00


def assigned_values(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level value the request assigns its parameter by name,
    once ("b=371, a=806", ``title equal to "Pricing change"``, "the minutes being 8": its
    words apart or as written), made that value: a number for a number parameter, a quoted
    string or a code of capitals, digits and ``_:/.-`` ("USD", "2024-12-22", "20:00") for a
    string one (of an enum: one of its values, case aside), where the schema takes it;
    ``arguments`` itself where none is. A small model swaps "b=371, a=806" into ``a: 371, b:
    806``."""
    head = request[:REQUEST_CHARS]
    out = arguments
    for name, schema in tool.properties.items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind not in ("integer", "number", "string"):
            continue
        words = NAME_WORD.findall(name)
        if not words:  # "" or "_": it would label any "="
            continue
        label = "|".join({re.escape(name), r"[\s_-]+".join(map(re.escape, words))})
        enum = schema.get("enum")
        said = _ASSIGNED if not isinstance(enum, list) else r"([\w.:/-]+|\"[^\"\n]{1,200}\")"
        found = {m.group(1) for m in re.finditer(rf"(?<![\w.-])(?:{label}){_ASSIGN}{said}",
                                                 head, re.IGNORECASE)}
        if len(found) != 1:
            continue
        written = found.pop()
        if isinstance(enum, list):  # one of its values, as the request writes it: "op=sub"
            value = next((v for v in enum if isinstance(v, str)
                          and v.lower() == written.strip("\"'").rstrip(".:/-").lower()), None)
            if value is not None and out.get(name) != value \
                    and not tool.validate({**out, name: value}):
                out = {**out, name: value}
            continue
        code = written[0] not in "\"'" and not NUMBER.fullmatch(written)
        if kind == "string":
            value: Any = written if code else written[1:-1] if written[0] in "\"'" else None
            if value is None:
                continue
        else:
            if code or written[0] in "\"'":
                continue
            x = float(written.replace(",", ""))
            value = _whole(x)
        if out.get(name) != value and not tool.validate({**out, name: value}):
            out = {**out, name: value}
    return out


def as_cased(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level string (of three characters or more, of a
    parameter with no enum or const) that the request writes once, whole words, but in
    other capitals, made as the request writes it ("order more coffee beans." for
    ``"Order more coffee beans."``); ``arguments`` itself where none is."""
    head = request[:REQUEST_CHARS]
    out = arguments
    for name, value in arguments.items():
        schema = tool.properties.get(name)
        if not isinstance(value, str) or len(value.strip()) < 3 or value.strip() in head \
                or isinstance(schema, dict) and {"enum", "const"} & schema.keys():
            continue
        found = {m.group() for m in re.finditer(rf"(?<!\w){re.escape(value.strip())}(?!\w)",
                                                head, re.IGNORECASE)}
        if len(found) == 1 and not tool.validate({**out, name: (cased := found.pop())}):
            out = {**out, name: cased}
    return out


# a span the request quotes: "…", “…”, or '…' opened after a space or a bracket and closed
# before one or a punctuation mark (the apostrophe of "don't" is no quote)
_QUOTED = re.compile(r"\"([^\"\n]{1,500})\"|\u201c([^\u201d\n]{1,500})\u201d"
                     r"|(?<![\w'])'([^'\n]{1,500})'(?![\w'])")
_QUOTES = "\"'\u2018\u2019\u201c\u201d` "


def as_quoted(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level string (of a parameter with no enum, const or
    format) that is a span the request quotes in other capitals, in quotes of its own or
    with a full stop, "!" or "?" added, made the span as quoted ("Remember the keys." for
    "Save 'remember the keys' into reminder.txt"), where the request quotes no other such
    span; and the one string that repeats a path argument's value, of a parameter that takes
    no path, made the one span the request quotes where no argument holds it (``content:
    "todo.md"`` beside ``path: "todo.md"`` for "Write 'call the bank' to todo.md").
    ``arguments`` itself where none is. A user who quotes text means those words."""
    quoted = {}
    for m in _QUOTED.finditer(request[:REQUEST_CHARS]):
        span = next(g for g in m.groups() if g is not None).strip()
        if span:
            quoted.setdefault(span.lower(), set()).add(span)
    out = arguments
    for name, value in arguments.items() if quoted else ():
        schema = tool.properties.get(name)
        if not isinstance(value, str) \
                or isinstance(schema, dict) and {"enum", "const", "format"} & schema.keys():
            continue
        bare = value.strip(_QUOTES).lower()
        spans = (quoted.get(bare) or quoted.get(bare.rstrip(".!?").strip(_QUOTES), set())) \
            if bare else set()
        if len(spans) == 1 and (span := next(iter(spans))) != value \
                and not tool.validate({**out, name: span}):
            out = {**out, name: span}
    return _unrepeated(tool, out, quoted)


def _unrepeated(tool: Tool, arguments: dict, quoted: dict[str, set[str]]) -> dict:
    """``arguments`` with the one free string that repeats a path argument's value made the
    one span ``quoted`` holds (in one casing) that no argument holds (see :func:`as_quoted`)."""
    if len(quoted) != 1 or len(spans := next(iter(quoted.values()))) != 1 \
            or any(isinstance(v, str) and v.strip(_QUOTES).lower() in quoted
                   for v in arguments.values()):
        return arguments
    paths = {v for k, v in arguments.items()
             if isinstance(v, str) and takes_path(k, tool.properties.get(k))}
    repeats = [k for k, v in arguments.items() if isinstance(v, str) and v in paths
               and isinstance(schema := tool.properties.get(k), dict)
               and schema.get("type") == "string" and not takes_path(k, schema)
               and not {"enum", "const", "format"} & schema.keys()]
    if len(repeats) != 1 or tool.validate(out := {**arguments, repeats[0]: next(iter(spans))}):
        return arguments
    return out


# an identifier a request writes whole: an email address, a web address
_IDENTIFIER = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|https?://[^\s\"'<>]+", re.IGNORECASE)


def whole_identifiers(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each top-level string that is an email or a web address the
    request does not write (case aside) made the one of that kind it writes that is most
    alike (:class:`difflib.SequenceMatcher`; at least :data:`LIKENESS`), where no other
    argument holds it and the schema takes it: "Ximena.Mehta@Mail.example.net" for
    "arjun.mehta@mail.example.net"; ``arguments`` itself where none is."""
    written = [m.group().rstrip(".,;:)?!") for m in _IDENTIFIER.finditer(request[:REQUEST_CHARS])]
    if not written:
        return arguments
    out = arguments
    for name, value in arguments.items():
        if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value.strip()) \
                or any(value.strip().lower() == w.lower() for w in written):
            continue
        kind = "@" in value
        alike = [(difflib.SequenceMatcher(None, value.lower(), w.lower()).ratio(), w)
                 for w in written if ("@" in w) == kind]
        best = max(alike, default=(0.0, ""))
        if best[0] >= LIKENESS and [r for r, _ in alike].count(best[0]) == 1 \
                and best[1].lower() not in _other_strings(out, name) \
                and not tool.validate({**out, name: best[1]}):
            out = {**out, name: best[1]}
    return out


def _without_extension(path: str) -> str:
    """``path`` in lower case, without its name's extension ("" where it has none)."""
    folder, _, name = path.lower().rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else ""
    return f"{folder}/{stem}" if folder and stem else stem


def whole_paths(tool: Tool, arguments: dict, request: str, heard: str,
                suggested: Sequence[str] = (), reads_only: bool = False, said: str = "") -> dict:
    """``arguments`` with each top-level string of a path parameter (:func:`takes_path`)
    that ``heard`` (the request and the turn's tool results) does not write whole, as cased,
    made the one path the request writes (:func:`written_paths`), or a built-in tool's "did
    you mean" ``suggested`` this turn, that ends in it after a folder, or that it is in
    other capitals, with a stray comma or, having no extension, without the path's:
    "users.csv" (or "./users.csv", "users.csv,") for "data/users.csv", "docs/supplies" for
    "docs/supplies.md", where no other such path is written, no other argument holds it (a
    move's target "report.txt" is not made its source "data/report.txt") and the schema
    takes it; ``arguments`` itself where none is. A name the model made up is no copy,
    however alike ("notes2.txt" is never made "notes.txt": the call may write a new file),
    and a tool's output is no source (a file read or a page fetched could name any path).
    Of a tool that ``reads_only`` (a built-in one: reading another file harms nothing), a
    parameter that takes a file (:func:`takes_file`, not a folder) whose value the
    conversation (``said``: every message so far) never wrote is the one file the request
    names (:func:`file_names`): "tube.csv" for "How much does a tube cost? Check
    parts.csv", "what_condition is the hose in?" for "Check tools.csv: what condition is the
    hose in?"."""
    written = list(dict.fromkeys(written_paths(request[:REQUEST_CHARS]) + list(suggested)))
    named = file_names(request[:REQUEST_CHARS]) if reads_only else []
    out = arguments
    for name, value in arguments.items() if written else ():
        if not isinstance(value, str) or not takes_path(name, tool.properties.get(name)) \
                or writes_path(heard, value, cased=True):
            continue
        tail = value.strip().rstrip(",;:").removeprefix("./").lower()
        ends = [w for w in written if w.lower() == tail or w.lower().endswith("/" + tail)] \
            or [w for w in written if "." not in tail.rsplit("/", 1)[-1]  # "docs/supplies"
                and ((x := _without_extension(w)) == tail or x.endswith("/" + tail))] \
            or (named if len(named) == 1 and takes_file(name, tool.properties[name])
                and not writes_path(said, value) else [])
        if len(ends) == 1 and tail and ends[0].lower() not in _other_strings(out, name) \
                and not tool.validate({**out, name: ends[0]}):  # not a move onto itself
            out = {**out, name: ends[0]}
    return out


def _writes_choice(request: str, value: str) -> bool:
    """Whether the request writes an enum's value as whole words, or its words apart
    ("hot air" for ``hot_air``, "non-smoking" for ``non_smoking``)."""
    parts = [p for p in re.split(r"[\s_-]+", value.strip()) if p]
    if len(parts) < 2:
        return writes_whole(request, value)
    apart = r"[\s_-]+".join(map(re.escape, parts))  # no phrase of one letter: none is short
    return re.search(rf"(?<!\w){apart}(?:e?s)?(?!\w)", request, re.IGNORECASE) is not None


def written_choices(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each string of a parameter's enum that the request does not write
    (not even as the start of its words: :meth:`Heard.made_up`) made the one other value of
    the enum it does (:func:`_writes_choice`: "the hamster option" for ``species: "cat"``),
    where no other argument holds that value and the schema takes it; ``arguments`` itself
    where none is. A request that writes two of the enum's other values, or none, leaves
    the value as the model chose it."""
    out, heard = arguments, None
    for name, value in arguments.items():
        schema = tool.properties.get(name)
        enum = schema.get("enum") if isinstance(schema, dict) else None
        if not isinstance(value, str) or not isinstance(enum, list) \
                or not (heard := heard or Heard(request)).made_up(value):
            continue  # "postgres" is written in "PostgreSQL"
        said = [v for v in enum[:MAX_CHOICES] if isinstance(v, str) and v != value
                and _writes_choice(request, v)]
        if len(said) == 1 and said[0].strip().lower() not in _other_strings(out, name) \
                and not tool.validate({**out, name: said[0]}):
            out = {**out, name: said[0]}
    return out


def _choice_at(request: str, value: str) -> int | None:
    """Where the request first names an enum's value by its words, in order, each a whole
    word, singular or plural ("points" names ``Points``, "rebound" names ``Rebounds``; not
    "newest" ``news``), with at most one other word between two of them ("high and low
    temperatures" names ``high_low_temperature``); None where it does not, or where a word
    has fewer than three letters (a value of one word: four; "all" and "new" are said in
    passing)."""
    parts = [w.lower() for w in NAME_WORD.findall(value)]
    if not parts or any(len(w) < 3 for w in parts) or len(parts) == 1 and len(parts[0]) < 4:
        return None
    stems = [re.escape(w[:-1] if w.endswith("s") and len(w) > 3 else w) + r"(?:s|es)?\b"
             for w in parts]
    m = re.search(r"\b" + r"\W+(?:\w+\W+)?".join(stems), request, re.IGNORECASE)
    return m.start() if m else None


def named_choices(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each list of an enum's strings (a parameter whose items have an
    enum) made the values the request names (:func:`_choice_at`), in the order it names
    them, where it names two or more and the model's list holds none it does not name
    ("points and rebounds" for ``metrics: ["Points"]``), or where the list is empty or
    left out and the request names one or more; ``arguments`` itself where none is, or
    where the schema refuses the list."""
    out = arguments
    for name, schema in tool.properties.items():
        items = schema.get("items") if isinstance(schema, dict) \
            and schema.get("type") == "array" else None
        enum = items.get("enum") if isinstance(items, dict) else None
        value = arguments.get(name)
        if not isinstance(enum, list) or not (value is None or isinstance(value, list)
                                              and all(isinstance(v, str) for v in value)):
            continue
        at = {v: i for v in enum[:MAX_CHOICES] if isinstance(v, str)
              and (i := _choice_at(request[:REQUEST_CHARS], v)) is not None}
        named = sorted(at, key=at.get)
        if not named or named == value or value and (len(named) < 2 or set(value) - set(named)):
            continue
        if not tool.validate({**out, name: named}):
            out = {**out, name: named}
    return out


def _miscopied(value: list[float], run: list[float]) -> bool:
    """Whether ``value`` is ``run`` with one item repeated in place ("89, 91, 91") or one
    inner item left out ("12, 15, 20" for "12, 15, 18, 20"), not a repeat of its neighbour:
    how a copy slips, not how a list is edited (an item dropped from an end, or one of a
    repeat, is a filter; one added or changed, an edit)."""
    if len(value) == len(run) + 1:
        i = next((i for i, (x, y) in enumerate(zip(value, run)) if x != y), len(run))
        return i > 0 and value[i] == value[i - 1] and value[i + 1:] == run[i:]
    if len(value) == len(run) - 1:
        i = next((i for i, (x, y) in enumerate(zip(value, run)) if x != y), len(value))
        return 0 < i < len(run) - 1 and run[i] not in (run[i - 1], run[i + 1]) \
            and value[i:] == run[i + 1:]
    return False


def _numbers_of(tool: Tool, name: str, value: Any) -> list[float] | None:
    """``value`` as floats where it is a list of numbers for a parameter of numbers."""
    schema = tool.properties.get(name)
    items = schema.get("items") if isinstance(schema, dict) else None
    if not isinstance(value, list) or not isinstance(items, dict) \
            or items.get("type") not in ("integer", "number"):
        return None
    numbers = [number(v) for v in value]
    return numbers if None not in numbers else None


def whole_lists(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each list of numbers (of a parameter whose items are numbers)
    that is a slipped copy (:func:`_miscopied`) of exactly one run of numbers the request
    writes (:func:`mlx_agent.heard.number_runs`) made that run, where it is no other list's
    run or slip and the schema takes it; ``arguments`` itself where none is."""
    lists = {name: numbers for name, value in arguments.items()
             if (numbers := _numbers_of(tool, name, value)) is not None}
    runs = number_runs(request) if lists else []
    out = arguments
    for name, numbers in lists.items():
        fits = [run for run in runs if _miscopied(numbers, run)] if numbers not in runs else []
        if len(fits) != 1 or any(other != name and (v == fits[0] or _miscopied(v, fits[0]))
                                 for other, v in lists.items()):
            continue
        whole = [int(x) if x.is_integer() else x for x in fits[0]]
        if not tool.validate({**out, name: whole}):
            out = {**out, name: whole}
    return out

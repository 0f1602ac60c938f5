"""Which offered tool a request describes: the one whose name, description and parameter
names write the request's words, as a call's tool is read against them.

Given two or three tools of one field, the bundled model often calls the wrong one where
the request writes the other's words: "the compound interest" calls
``financial.simple_interest``, "the area of a circle" ``plot_sine_wave``, "200 euros to US
dollars" ``unit_conversion.convert`` beside ``currency_exchange.convert`` (51 of the
default adapter's 119 misses on BFCL's 200 ``multiple`` questions).

Each tool scores the request's words (:func:`stems`: function words left out, common
suffixes cut, so "depreciated" is "depreciation"), less the words every offered tool has:
2 for a word of its name, 1 for a word of its description or its parameters' names.
:func:`described_tool` gives the tool that scores highest, alone, at least :data:`MARGIN`
above the one the model called, where the request hardly describes that one by the words
the other lacks (they score under :data:`MARGIN`: no word of its own name; "the magnetic
field" describes ``magnetic_field.calculate``, not ``electric_field.calculate``); the caller
has the model write the call again for it (:func:`mlx_agent.probe.probe_arguments`). A
request that describes no tool, or two alike, leaves the model's choice; so does one that
describes the called tool too (it may ask for both, one after the other: "retrieve the storm
warning, then update the feeding plan", or name it: "use the weather tool"), and one tool
alone.

:func:`mentioned` gives the tools whose name a request writes ("the change in entropy" for
``entropy_change.calculate``): where it writes one and the model would answer from its own
knowledge, the turn's first reply must be a call instead, and so must a later one where a
tool it names has not run (:func:`mlx_agent.stated_arguments.pressed_tools`,
:func:`mlx_agent.probe.would_call`).

Not promised: English words, matched by spelling ("ran" is not "run", "cost" not "price");
a word with a letter outside ASCII counts nothing ("hôtel"), so a request in another
language mostly describes no tool. A request can describe the second tool of a chain more
than the first, where it does not write the first's name ("book a flight to Denver", with
``search_flights`` called first): the caller reads only a turn's first call, and keeps the
model's call where a required string it writes for the other tool is made up (the flight's
id; :mod:`mlx_agent.stated_arguments`).
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

from .file_paths import file_names
from .heard import NAME_WORD, REQUEST_CHARS
from .tools import Tool

MARGIN = 2  # a name word, or two others: the described tool's lead, and what the called
# one scores less than on the words the described one lacks
FUNCTION_WORDS = frozenset("""the and for with from into onto about that this these those
what which who whom whose how many much can could would should will shall may might must
are was were been being have has had does did you your yours our ours they them their its
there then than also please some any all per not but only just very too each every via""".split())
# the longer of two that end alike first ("ations" before "s"); a stem keeps three letters
SUFFIXES = ("ations", "ation", "ating", "ated", "ates", "ate", "ments", "ment", "ings", "ing",
            "ions", "ion", "ities", "ity", "ies", "ied", "ers", "er", "ed", "es", "s", "e", "y")


def stem(word: str) -> str:
    """``word`` (lower case) less its first suffix of :data:`SUFFIXES` that leaves three
    letters: "depreciated" and "depreciation" are "depreci", "goals" is "goal"."""
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


def stems(text: str) -> set[str]:
    """The stems of ``text``'s words of three or more letters or digits that are not
    :data:`FUNCTION_WORDS`; a name's parts are words ("getTopGoalScorers": get, top, goal,
    scor); a word with a letter outside ASCII is none ("Zürich", "hôtel")."""
    found = (w.lower() for word in re.findall(r"[^\W_]+", text) if word.isascii()
             for w in NAME_WORD.findall(word))
    return {stem(w) for w in found if len(w) > 2 and w not in FUNCTION_WORDS}


@functools.lru_cache(maxsize=256)
def _tool_words(name: str, description: str, parameters: tuple[str, ...]
                ) -> tuple[frozenset, frozenset]:
    """A tool's name stems and its other stems: read once per tool, not per reply (a
    server's catalogue recurs in every request). At most 256 tools are kept: a client
    sending a new catalogue of long descriptions each time holds tens of MB, not GB."""
    return frozenset(stems(name)), frozenset(stems(description) | stems(" ".join(parameters)))


def _words(tools: Sequence[Tool], request: str) -> tuple[list, list, set]:
    """Each tool's name stems and its other stems (description, parameters' names), and
    the request's stems less those every tool has (a tool with no words at all aside)."""
    words = [_tool_words(t.name, t.description, tuple(t.properties)) for t in tools]
    names, others = [n for n, _ in words], [o for _, o in words]
    held = [n | o for n, o in words if n | o]  # a tool of no words has them all
    every = frozenset.intersection(*held) if len(held) > 1 else frozenset()
    return names, others, stems(request) - every


def _score(said: set, name: set, other: set) -> int:
    return 2 * len(said & name) + len(said & other - name)


def scores(tools: Sequence[Tool], request: str) -> list[int]:
    """Each tool's score for ``request``: 2 for each of its words the tool's name writes,
    1 for each its description or a parameter's name writes; words every tool writes
    count nothing (a tool with no words at all aside)."""
    names, others, said = _words(tools, request)
    return [_score(said, n, o) for n, o in zip(names, others)]


def described_tool(tools: Sequence[Tool], request: str, called: Tool) -> Tool | None:
    """The tool of ``tools`` that ``request`` describes where the model ``called`` another:
    the one alone with the highest :func:`scores`, at least :data:`MARGIN` above
    ``called``'s, where ``called`` scores under :data:`MARGIN` on the words that tool
    lacks; None where there is none (``called`` itself, a tie, too close, a request that
    describes ``called`` too)."""
    given = [t.name for t in tools]
    if len(tools) < 2 or called.name not in given:
        return None
    names, others, said = _words(tools, request)
    score = [_score(said, n, o) for n, o in zip(names, others)]
    best, i, j = max(score), given.index(called.name), score.index(max(score))
    if score.count(best) > 1 or best - score[i] < MARGIN \
            or _score(said - names[j] - others[j], names[i], others[i]) >= MARGIN:
        return None
    return tools[j]


# words of a tool's name that say what it does, not what it is about: a request that writes
# only these ("get the details") names no tool
DOING = frozenset(stem(w) for w in """get set find fetch search retrieve list create update
delete add remove calculate calc compute lookup look check show info information detail
details data api""".split())


# words of a tool's name that say when, not what: "What's the weather in Boston?" names
# ``get_current_weather`` (a request rarely writes "current"); whole words of the name
QUALIFYING = frozenset("current latest recent live realtime".split())
# what is left of such a name that is current data by nature, and so named without its
# when-word; most nouns are not ("the temperature of the sun's surface", "a quote about
# love", "git branches": get_current_temperature, get_realtime_quote, get_current_branch
# stay named only with theirs)
NOW_NOUNS = frozenset(stem(w) for w in "weather forecast traffic".split())


_QUALIFYING = frozenset(stem(w) for w in QUALIFYING)


@functools.lru_cache(maxsize=256)
def _named_by(name: str) -> frozenset:
    """The stems a request must write to name a tool called ``name``: its name's
    (:func:`stems`) but those of :data:`DOING`, and but its :data:`QUALIFYING` ones where
    what is left is one of :data:`NOW_NOUNS` ("weather" for ``get_current_weather``;
    "current time" for ``get_current_time``)."""
    own = frozenset(stems(name)) - DOING
    kept = own - _QUALIFYING
    return kept if kept and kept <= NOW_NOUNS else own


def mentioned(tools: Sequence[Tool], request: str) -> list[Tool]:
    """The tools whose name ``request`` writes: every stem of the name but those of
    :data:`DOING` (and of :data:`QUALIFYING` before weather: :func:`_named_by`) is one of
    the request's (:func:`stems`: "the roots of" for ``find_roots``, "generate a DNA sequence"
    for ``generate_DNA_sequence``); a name of only such words is written by no request. A
    request that writes a file's name writes "file" ("Write 'hi' to greeting.txt" names
    ``write_file``; not "Node.js" or "km/h": :func:`~mlx_agent.file_paths.file_names`, in
    its first :data:`~mlx_agent.heard.REQUEST_CHARS` characters)."""
    said = stems(request) | ({stem("file")} if file_names(request[:REQUEST_CHARS]) else set())
    return [t for t in tools if (own := _named_by(t.name)) and own <= said]

"""What a request says of a flag (a boolean parameter), by its name's words: asked for,
refused, or neither.

A flag's name holds the words a request uses for it, less verbs such as *include*
(:data:`FLAG_VERBS`: ``include_human_impact`` is "human", "impact"). :func:`flag_stated`:
the request uses them, not after a negation or indifference, so the model may be asked for
the flag's value; :func:`flag_plain`: it asks for the flag plainly, in one clause with no
doubt in it (set ``true`` without asking the model, which wrote ``false`` for "detailed
information" as readily as ``true``); :func:`flag_refused`: it refuses the flag plainly
("don't include hourly"); :func:`flags_as_asked` turns a flag the model wrote against what
the request plainly says; :func:`unheard_flag`: the conversation never speaks of it (the
model made it up); :func:`flags_by_default`: a required flag it never speaks of takes the
default its parameter states. :mod:`mlx_agent.stated_arguments` uses them on a call.

Not promised: English, read by spelling; a flag named for a short negative (``no_cache``,
:data:`NEGATIVE_NAMES`) is never read as asked for or refused, one named for a longer one
(``avoid_tolls``) only where the request writes that word too; a name's words of three
letters or fewer ("new", "all") or with digits ("24h") are never read plainly.
"""

from __future__ import annotations

import re
from typing import Any

from .heard import DESCRIPTION_CHARS, NAME_WORD, Heard
from .heard import words as _words
from .tools import Tool

# words a flag's name may hold that a request need not use ("include_images": "images")
FLAG_VERBS = frozenset("""include includes is has use allow enable show with get should
return want need do flag only add as by in of for to the""".split())
NEGATIONS = r"(?:not|no|without|excluding|exclude|don't|dont|never|skip)"
# "not too concerned about the rating or whether smoking is allowed": no wish either way,
# for what follows in the clause (up to ".", ";", "!", "?" or "but")
INDIFFERENT = r"(?:not\s+(?:\w+\s+){0,2}(?:concerned|bothered|fussed|worried|picky)" \
    r"|(?:don't|dont|do\s+not|doesn't|does\s+not)\s+(?:care|mind|matter))"


def flag_stated(name: str, request: str) -> bool:
    """Every word of a flag's name but :data:`FLAG_VERBS` begins a word of the request
    (up to its sixth letter: "detailed" for ``detailed``, "transfer" for ``allow_transfer``),
    not after a negation nor after indifference (:data:`INDIFFERENT`) in its clause."""
    words = [w.lower() for w in NAME_WORD.findall(name)]
    words = [w for w in words if w not in FLAG_VERBS]
    said = _words(request)
    if not words or not all(any(s.startswith(w[:6]) for s in said) for w in words):
        return False
    # "do not include images", "excluding human impact": the request says false
    if any(re.search(rf"\b{NEGATIONS}\s+(?:\w+\s+){{0,3}}{re.escape(w[:6])}", request,
                     re.IGNORECASE) for w in words):
        return False
    # "I don't mind whether it has a pool": it says neither, for the rest of the clause
    for sentence in re.split(r"[.;!?]|\bbut\b", request, flags=re.IGNORECASE):
        m = re.search(rf"\b{INDIFFERENT}\b", sentence, re.IGNORECASE)
        if m and any(re.search(rf"\b{re.escape(w[:6])}", sentence[m.end():], re.IGNORECASE)
                     for w in words):
            return False
    return True


# a flag named so is false where it is said ("no_cache"): the model decides it
NEGATIVE_NAMES = frozenset("no not non disable disabled skip exclude without hide ignore "
                           "avoid".split())
# a clause that may say false, or neither: "doesn't need", "not required", "optional",
# "non-smoking", "with or without", "either is fine", "whatever"
DOUBT = re.compile(r"n't\b|\b(?:not|no|non|never|dont|without|optional|except|excluding|excluded?"
                   r"|skip|skipping|ignore|ignoring|drop|hide|avoid|omit|leave|rather|either"
                   r"|whatever|any|unless|instead|mind|matter|concerned|bothered|fussed"
                   r"|worried)\b", re.IGNORECASE)
_CLAUSE = re.compile(r"[^.;!?]+[.;!?]?")
_YES_NO = frozenset("is are does did has was were".split())  # "Is smoking allowed?"


def _word(w: str, whole: bool) -> str:
    """A pattern for a word of a flag's name in a request: whole (or as "-s", "-es", "-ed",
    "-d", "-ing"), or not ``whole``, a word that begins with its first six letters; a plural
    name's word also in the singular ("toll" for ``avoid_tolls``)."""
    stem = w[:-1] if w.endswith("s") and len(w) > 4 else w
    return rf"\b{stem}(?:s|es|ed|d|ing)?\b" if whole else rf"\b{stem[:6]}"


def _clause(name: str, request: str, whole: bool = True) -> str | None:
    """The request's first clause that writes every word of a flag's name but
    :data:`FLAG_VERBS` (:func:`_word`, ``whole`` or not: "normalization" for ``normalize``),
    where those words have four letters or more and no digit ("new", "all" and "24h" are
    read in too many senses) and the name does not start with a short word of
    :data:`NEGATIVE_NAMES` (``no_cache``: true where the request says no; a longer one,
    ``avoid_tolls``, is a word the clause must write: "with toll roads avoided"); None
    where there is none."""
    named = [w.lower() for w in NAME_WORD.findall(name)]
    words = [w for w in named if w not in FLAG_VERBS]
    if not words or named[0] in NEGATIVE_NAMES and len(named[0]) < 4 \
            or any(len(w) < 4 or not w.isalpha() for w in words):
        return None
    said = [_word(w, whole) for w in words]
    for m in _CLAUSE.finditer(request.replace("\u2019", "'")):
        if all(re.search(w, m.group(), re.IGNORECASE) for w in said):
            return m.group()
    return None


def _yes_no(clause: str) -> bool:
    """Whether a clause is a yes-no question ("Is smoking allowed?")."""
    first = clause.split(maxsplit=1)[0].lower() if clause.strip() else ""
    return clause.endswith("?") and first in _YES_NO


def flag_plain(name: str, request: str, whole: bool = True) -> bool:
    """Whether the request asks for a flag plainly, so it is set ``true`` without a probe:
    in the clause that writes its name (:func:`_clause`, its words ``whole``) no word
    of :data:`DOUBT` (the name's own negative word aside: "avoided" for ``avoid_tolls``),
    and not as a yes-no question. Where :func:`flag_stated` holds but this does not, the
    model is asked, as for any other parameter."""
    clause = _clause(name, request, whole)
    if clause is None or _yes_no(clause):
        return False
    first = NAME_WORD.findall(name)[0].lower()
    if first in NEGATIVE_NAMES:  # the clause writes it: it asks for the flag
        clause = re.sub(_word(first, whole) + r"\w*", " ", clause, flags=re.IGNORECASE)
    return not DOUBT.search(clause)


def flags_as_asked(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with each flag the model wrote ``false`` where the request asks for it
    plainly, its name's words read as the beginnings of words (:func:`flag_plain` not
    ``whole``: "apply normalization" for ``normalize``, "including visual outputs" for
    ``include_visuals``) made ``true``, and each it wrote ``true`` where the request
    refuses it plainly (:func:`flag_refused`) made ``false``, where the schema takes it;
    ``arguments`` itself where none is."""
    out = arguments
    for name, value in arguments.items():
        if not isinstance(value, bool):
            continue
        refused = flag_refused(name, request)
        flip = not value and not refused and flag_plain(name, request, whole=False) \
            or value and refused
        if flip and not tool.validate({**out, name: not value}):
            out = {**out, name: not value}
    return out


# a negation that asks for what follows: "don't forget the hourly forecast"
KEEP = re.compile(rf"\b{NEGATIONS}\s+(?:forget|miss|hesitate|fail|omit|skip|leave)", re.IGNORECASE)
# a clause that leaves a flag open though it negates: "with or without", "whether or not"
OPEN = re.compile(r"\bwith\s+or\s+without\b|\bor\s+not\b|\bwhether\b|\beither\b",
                  re.IGNORECASE)


def flag_refused(name: str, request: str) -> bool:
    """Whether the request refuses a flag plainly, so it is set ``false`` without a probe
    ("don't include hourly" for ``include_hourly``, "without a pool" for ``has_pool``): in
    the clause that writes its name (:func:`_clause`), one of :data:`NEGATIONS`
    within three words before one of its words, and no indifference (:data:`INDIFFERENT`)
    nor an open choice (:data:`OPEN`), not as a yes-no question."""
    clause = _clause(name, request)
    if clause is None or _yes_no(clause) or OPEN.search(clause) \
            or re.search(rf"\b{INDIFFERENT}\b", clause, re.IGNORECASE):
        return False
    words = [w for w in (w.lower() for w in NAME_WORD.findall(name)) if w not in FLAG_VERBS]
    if words[0] in NEGATIVE_NAMES:  # "skip validation" asks for skip_validation: the name's
        clause = re.sub(_word(words[0], True), " ", clause, flags=re.IGNORECASE)  # own word
        words = words[1:]  # is no negation of it
    return not KEEP.search(clause) and any(
        re.search(rf"\b{NEGATIONS}\s+(?:\w+\s+){{0,3}}{w}", clause, re.IGNORECASE)
        for w in words)


# "Default is true", "defaults to False", "(default: true)", "Default value is 'false'"
_DEFAULT = re.compile(r"\bdefaults?(?:\s+value)?(?:\s+is|\s+to|\s*[:=])?\s*(?:set\s+to\s+)?"
                      r"['\"`]?(true|false)\b['\"`]?(?=[ \t]*(?:[.;,)\n]|$))", re.IGNORECASE)
# any value a description names as a default: "default false in v2" beside "Default is true"
_NAMED = re.compile(r"\bdefaults?\b[^.;]{0,30}?\b(true|false)\b", re.IGNORECASE)
# a default that holds only sometimes: "Default is true if a query is given, else false"
_CONDITIONAL = re.compile(r"\b(?:if|when|unless|else|otherwise|except)\b", re.IGNORECASE)
# a condition that only says the default is the default: "if not specified", "when omitted"
_UNSAID = re.compile(r"\b(?:(?:if|when)\s+(?:it\s+is\s+|it's\s+)?(?:not\s+(?:specified|"
                     r"provided|given|set|supplied|passed)|omitted|unset|absent|missing|"
                     r"left\s+out)|unless\s+(?:otherwise\s+)?(?:specified|stated|set|given))"
                     r"(?:\s+otherwise)?\b", re.IGNORECASE)
# words of a flag's description that say nothing of what it does
_PLAIN = frozenset("""true false default defaults value whether return returns returned
should will this that when with the and for set not otherwise""".split())


def stated_default(schema: Any) -> bool | None:
    """The default a flag's schema gives, as ``default`` (``true``, or the string
    ``"true"``) or in its description's first 2,000 characters ("Default is true",
    "Defaults to false if not specified"), in a sentence with no other condition ("Default
    is true if a query is given" gives none); None where it gives none, or two."""
    if not isinstance(schema, dict):
        return None
    default = schema.get("default")
    if isinstance(default, bool):
        return default
    if isinstance(default, str) and default.strip().lower() in ("true", "false"):
        return default.strip().lower() == "true"
    if "default" in schema:  # null, or a value no flag takes: no default to trust
        return None
    described = schema.get("description")
    if not isinstance(described, str):
        return None
    said, named = set(), set()  # the defaults stated plainly; every value named as one
    # sentence by sentence: "x if not set; y when z"
    for sentence in re.split(r"(?<=\.)\s+", described[:DESCRIPTION_CHARS]):
        named |= {v.lower() for v in _NAMED.findall(sentence)}
        sentence = _UNSAID.sub(" ", sentence)  # "false if not specified" is plain "false"
        for m in _DEFAULT.finditer(sentence):
            if _CONDITIONAL.search(sentence):
                return None
            said.add(m.group(1).lower())
    return said.pop() == "true" if len(said) == 1 and len(named) == 1 else None


def _described(schema: Any) -> list[str]:
    """The words of a flag's description that say what it does ("array" in "Return
    formatted string if true, array if false"), of four letters or more."""
    described = schema.get("description") if isinstance(schema, dict) else None
    if not isinstance(described, str):
        return []
    found = re.findall(r"[A-Za-z]{4,}", described[:DESCRIPTION_CHARS])
    return [w for w in (w.lower() for w in found) if w not in _PLAIN]


def flags_by_default(tool: Tool, arguments: dict, heard: str) -> dict:
    """``arguments`` with each required flag the conversation (``heard``) never speaks of,
    by its name (:func:`unheard_flag`) or its description's words ("as an array" speaks
    of ``formatted``: "array if false"), set to the default its parameter states
    (:func:`stated_default`): the model wrote ``formatted: false`` for "Find the prime
    factors of 450" where the tool says "Default is true" and requires the flag; a default
    is what a user who says nothing of a flag gets (an optional one the model made up is
    dropped instead: :func:`mlx_agent.stated_arguments.without_made_up`). ``arguments``
    itself where none is."""
    out, said = arguments, None
    for name, value in arguments.items():
        if not isinstance(value, bool) or name not in tool.required:
            continue
        schema = tool.properties.get(name)
        default = stated_default(schema)
        if default is None or value == default:
            continue
        if said is None:  # the conversation's words, sorted once, and only if asked
            said = Heard(heard)
        if unheard_flag(name, value, said) \
                and not any(said.begins_a_word(w[:5]) for w in _described(schema)) \
                and not tool.validate({**out, name: default}):
            out = {**out, name: default}
    return out


def unheard_flag(name: str, value: Any, said: Heard) -> bool:
    """Whether ``value`` is a flag whose name no word of ``said`` speaks of: no word of
    the name but :data:`FLAG_VERBS` (of three letters or more) begins a word there, up to
    its fifth letter ("formatted" in "format")."""
    words = [w for w in (w.lower() for w in NAME_WORD.findall(name))
             if w not in FLAG_VERBS and len(w) > 2]
    return isinstance(value, bool) and bool(words) \
        and not any(said.begins_a_word(w[:5]) for w in words)

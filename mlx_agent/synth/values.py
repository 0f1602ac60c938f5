"""Arguments sampled from a tool's JSON schema, with values drawn from pools on one side.

:func:`kind_of` picks what a parameter holds from its ``format``, its name and, failing
those, its description (a ``city`` gets a city, ``to`` of a mail tool an address, a
``timeout_seconds`` a number said in seconds). :class:`Sampler` draws a value of that kind
from the pools of its side (see ``pools.py``), within the schema: types, ``enum``/``const``,
``minimum``/``maximum``/``multipleOf``, ``minLength``/``maxLength``/``pattern``, ``format``,
arrays (``minItems``/``maxItems``/``uniqueItems``), nested objects, ``anyOf``/``oneOf``, and
optional parameters omitted at random. :func:`free_leaves` names the values a split can keep
apart (not the ones the schema fixes: enums, constants, booleans, tiny ranges).

Local ``$ref`` pointers (``#/$defs/Unit``, as Pydantic writes enums and nested models) are
followed, their sibling keywords kept, up to :data:`MAX_REF_DEPTH` links deep on the way to
one value: a recursive schema's optional parts are left out past that.

Promised: the same ``random.Random`` state gives the same arguments. A ``pattern`` no pool
value matches gets a string drawn from the pattern itself (:mod:`.patterns`); a narrow
number range, values with as many decimals as it needs. Not promised: a value for every
``pattern`` (lookarounds and backreferences are not drawn); a ``$ref`` outside the tool's
own parameters.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..json_schema import resolve
from ..tools.schema import Validator
from . import patterns, pools as P

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
MAX_REF_DEPTH = 8  # $ref links followed on the way to one value
MAX_DRAWN = 2000  # values drawn for one call's arguments ($refs can ask for 2^n of them)


class Unsatisfiable(ValueError):
    """A schema no pool value satisfies (a ``pattern``, a ``$ref``, an empty range)."""


def as_schema(schema: Any) -> dict:
    """A subschema as a dict: ``true`` (anything) is ``{}``; so is any other non-object."""
    return schema if isinstance(schema, dict) else {}


def followed(schema: Any, root: Any, links: int = MAX_REF_DEPTH) -> Any:
    """``schema`` with its local ``$ref`` followed into ``root`` (the tool's parameters), up
    to ``links`` in a row, the keywords beside a ``$ref`` kept over its target's; a ``$ref``
    that points at nothing stays."""
    for _ in range(links):
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        target = resolve(root, ref) if isinstance(ref, str) else None
        if target is None:
            break
        if not isinstance(target, dict):  # true or false
            return target
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def words(text: str) -> list[str]:
    """``getUserID_v2`` -> ``["get", "user", "id", "v", "2"]``."""
    return [w.lower() for w in _WORD.findall(text)] if isinstance(text, str) else []


def singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


# (kind, words that select it), tried in order on the parameter's name, then its description
STRING_KINDS = (
    ("email", {"email", "emails", "mail", "cc", "bcc"}),
    ("url", {"url", "uri", "link", "website", "href", "endpoint", "webpage"}),
    ("id", {"id", "ids", "identifier", "sku", "ref", "reference", "ticket", "uuid", "key"}),
    ("path", {"path", "file", "filename", "filepath", "dir", "directory", "folder"}),
    ("datetime", {"datetime", "timestamp"}),
    ("date", {"date", "day", "birthday", "deadline", "due"}),
    ("time", {"time", "clock"}),
    ("country", {"country", "nation", "region"}),  # before city: a destination country
    ("city", {"city", "town", "location", "place", "destination", "origin"}),
    ("language", {"language", "lang", "locale"}),
    ("currency", {"currency"}),
    ("company", {"company", "organization", "organisation", "org", "employer", "vendor",
                 "brand"}),
    ("product", {"product", "item", "goods", "dish", "food", "ingredient"}),
    ("address", {"address", "street"}),
    ("phone", {"phone", "mobile", "tel", "telephone"}),
    ("zip", {"zip", "zipcode", "postcode", "postal"}),
    ("command", {"command", "cmd", "shell"}),
    ("color", {"color", "colour"}),
    ("quantity", {"amount", "quantity", "weight", "distance", "volume", "duration"}),
    ("person", {"name", "person", "user", "username", "author", "owner", "assignee",
                "contact", "recipient", "friend", "customer", "employee", "attendee",
                "guest", "participant", "player", "student", "patient", "member"}),
    ("query", {"query", "q", "search", "keyword", "keywords", "term", "terms", "question",
               "pattern", "regex", "filter", "prompt"}),
    ("title", {"title", "subject", "heading", "headline", "label", "caption", "topic",
               "summary", "tag", "category"}),
    ("text", {"text", "message", "body", "content", "note", "notes", "comment", "msg",
              "reply", "input", "sentence", "paragraph", "details", "reason", "description"}),
)
FORMAT_KINDS = {"date": "date", "date-time": "datetime", "time": "rfc_time", "email": "email",
                "idn-email": "email", "uri": "url", "iri": "url", "uri-reference": "url",
                "iri-reference": "url", "uuid": "uuid", "ipv4": "ipv4", "hostname": "hostname"}
PLACE_QUALIFIERS = {"state", "country", "province"}  # with "city": a "City, Region" value
MAIL_WORDS = {"email", "mail", "emails", "message", "inbox"}
ADDRESSEE = {"to", "from", "sender", "recipient", "recipients", "cc", "bcc", "reply"}
# integer/number ranges by name, when the schema gives none
RANGES = (({"year"}, 1990, 2035), ({"age"}, 1, 99), ({"port"}, 1024, 65535),
          ({"percent", "percentage"}, 0, 100), ({"latitude", "lat"}, -90, 90),
          ({"longitude", "lon", "lng"}, -180, 180), ({"month"}, 1, 12), ({"hour"}, 0, 23),
          ({"minute"}, 0, 59), ({"rating", "stars"}, 1, 5),
          ({"count", "limit", "top", "n", "num", "max", "page", "results", "size"}, 1, 50))
DEFAULT_INT, DEFAULT_NUMBER = (1, 999), (0.5, 999.0)
MAX_ITEMS = 64  # the most items an array argument gets


@dataclass(frozen=True)
class Kind:
    """What a parameter holds: a pool name, and the unit a request says a number in."""

    pool: str
    unit: str = ""


def kind_of(name: str, schema: dict, context: frozenset[str] = frozenset()) -> Kind:
    """The kind of value for parameter ``name`` with ``schema``; ``context`` holds the words
    of the tool's name and description (a ``to`` of a mail tool is an address)."""
    schema = as_schema(schema)
    typ = _type(schema)
    if "enum" in schema or "const" in schema:
        return Kind("enum")
    if typ in ("integer", "number"):
        return Kind(typ, _unit(name, schema))
    if typ != "string":
        return Kind(typ)
    if schema.get("format") in FORMAT_KINDS:
        return Kind(FORMAT_KINDS[schema["format"]])
    name_words = [singular(w) for w in words(name)] + words(name)
    if set(words(name)) & ADDRESSEE and context & MAIL_WORDS:
        return Kind("email")
    said = set(words(schema.get("description", "")))
    if "city" in said and said & PLACE_QUALIFIERS:  # "the city and state, e.g. Reno, NV"
        return Kind("place_state" if "state" in said else "place_country")
    for source in (name_words, words(schema.get("description", ""))):
        for kind, keys in STRING_KINDS:
            if keys & set(source):
                return Kind(kind)
    return Kind("word")


def _unit(name: str, schema: dict) -> str:
    for source in (words(name), words(schema.get("description", ""))):
        for w in source:
            for key, said in P.UNITS:
                if w in (key, key + "s"):
                    return said
    return ""


def _type(schema: dict) -> str:
    t = as_schema(schema).get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if t is None:
        if "properties" in schema:
            return "object"
        if "items" in schema:
            return "array"
        if "enum" in schema or "const" in schema:
            return "enum"
        return "string"
    return t


class Sampler:
    """Draws arguments for tools from the pools of one side (``pools.TRAIN``/``HELDOUT``)."""

    def __init__(self, rng: random.Random, side: str, optional_share: float = 0.5,
                 files: tuple[str, ...] = ()):
        self.rng, self.side, self.optional_share = rng, side, optional_share
        self.files = files  # relative paths that exist where the tools run, if known
        self._root: dict = {}  # the parameters a call's $refs point into
        self._links = self._drawn = 0

    def arguments(self, tool, omit: tuple[str, ...] = ()) -> dict:
        """A full argument object for ``tool`` (a ``Tool``), without the names in ``omit``."""
        context = frozenset(words(tool.name) + words(tool.description))
        self._root, self._links, self._drawn = tool.parameters, 0, 0
        return self._object(tool.parameters, context, omit)

    def value(self, schema: Any, name: str, context: frozenset[str]) -> Any:
        self._drawn += 1
        if self._drawn > MAX_DRAWN:
            raise Unsatisfiable(f"{name}: more than {MAX_DRAWN} values in one call")
        if schema is False:
            raise Unsatisfiable(f"{name}: its schema is false (no value is valid)")
        schema = as_schema(schema)
        if "$ref" in schema:
            target = followed(schema, self._root, 1)
            if target is schema:
                raise Unsatisfiable(f"{name}: $ref {str(schema['$ref'])[:80]!r} is not in "
                                    "the tool's parameters")
            if self._links == MAX_REF_DEPTH:  # a recursive schema: its optional parts end
                raise Unsatisfiable(f"{name}: more than {MAX_REF_DEPTH} $ref links deep")
            self._links += 1
            try:
                return self.value(target, name, context)
            finally:
                self._links -= 1
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if not schema["enum"]:
                raise Unsatisfiable(f"{name}: the enum is empty")
            return self.rng.choice(schema["enum"])
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            usable = [b for b in branches if _type(b) != "null"] or branches
            return self.value(self.rng.choice(usable), name, context)
        typ = _type(schema)
        if typ == "object":
            return self._object(schema, context)
        if typ == "array":
            return self._array(schema, name, context)
        if typ == "boolean":
            return self.rng.random() < 0.5
        if typ == "null":
            return None
        if typ == "integer":
            return self._integer(schema, name)
        if typ == "number":
            return self._number(schema, name)
        return self._string(schema, name, context)

    def _object(self, schema: dict, context: frozenset[str], omit=()) -> dict:
        required = set(schema.get("required", []))
        out = {}
        for prop, sub in schema.get("properties", {}).items():
            if prop in omit:
                continue
            # fewer optional parts past each $ref link: a recursive schema's value stays small
            if prop not in required and \
                    self.rng.random() >= self.optional_share / (1 + self._links):
                continue
            try:
                out[prop] = self.value(sub, prop, context)
            except Unsatisfiable:
                if prop in required:
                    raise
        return out

    def _array(self, schema: dict, name: str, context: frozenset[str]) -> list:
        items = schema.get("items", {"type": "string"})
        lo = schema.get("minItems", 1)
        if lo > MAX_ITEMS:  # 10^9 items grew in memory until the process was killed
            raise Unsatisfiable(f"{name}: at least {lo} items, more than synthesis writes "
                                f"({MAX_ITEMS})")
        hi = max(lo, min(schema.get("maxItems", 3), lo + 2))
        item_name = " ".join(singular(w) for w in words(name))
        out: list = []
        for _ in range(self.rng.randint(lo, hi) * 4):
            if len(out) == hi:
                break
            v = self.value(items, item_name, context)
            if not (schema.get("uniqueItems") and v in out):
                out.append(v)
        if len(out) < lo:
            raise Unsatisfiable(f"{name}: cannot find {lo} distinct items")
        return out

    def _bounds(self, schema: dict, name: str, default: tuple) -> tuple:
        """The schema's range; a missing end comes from the name's usual range."""
        lo, hi = next(((a, b) for keys, a, b in RANGES if keys & set(words(name))), default)
        span = hi - lo
        smin = schema.get("minimum", schema.get("exclusiveMinimum"))
        smax = schema.get("maximum", schema.get("exclusiveMaximum"))
        if smin is not None and smax is not None:
            return smin, smax
        if smin is not None:
            lo = max(lo, smin)
            return lo, max(hi, lo + span)
        if smax is not None:
            hi = min(hi, smax)
            return min(lo, hi - span), hi
        return lo, hi

    def _integer(self, schema: dict, name: str) -> int:
        lo, hi = self._bounds(schema, name, DEFAULT_INT)
        step = schema.get("multipleOf", 1)
        try:
            first = math.ceil(lo / step) + ("exclusiveMinimum" in schema and lo % step == 0)
            last = math.floor(hi / step) - ("exclusiveMaximum" in schema and hi % step == 0)
        except (OverflowError, ValueError):  # a multipleOf of 1e-300 over a huge range
            raise Unsatisfiable(f"{name}: multipleOf {step} over that range") from None
        if last < first:
            raise Unsatisfiable(f"{name}: the integer range is empty")
        if last - first < 2:  # too few values to split: the schema fixes them
            return int(self.rng.randint(first, last) * step)
        for _ in range(64):
            v = int(self.rng.randint(first, last) * step)
            if P.side_of(v) == self.side:
                return v
        return int(self.rng.randint(first, last) * step)

    def _number(self, schema: dict, name: str) -> float:
        lo, hi = self._bounds(schema, name, DEFAULT_NUMBER)
        step = schema.get("multipleOf")
        validator = Validator(schema)
        places = 2 if step else _places(lo, hi)  # a dose of 0.001-0.004 mg: four
        fixed = _fixed_number(schema)  # minimum == maximum: no sides to keep apart
        if fixed and validator.is_valid(lo):
            return lo  # as the schema writes it (5, not 5.0)
        for _ in range(64):
            v = self.rng.uniform(lo, hi)
            try:
                v = round(round(v / step) * step, 6) if step else round(v, places)
                if validator.is_valid(v) and \
                        (fixed or P.side_of(round(v * 10 ** places)) == self.side):
                    return v
            except (OverflowError, ValueError):  # 1e-300 steps: v / step is infinite
                break
        raise Unsatisfiable(f"{name}: no number in range")

    def _string(self, schema: dict, name: str, context: frozenset[str]) -> str:
        kind = kind_of(name, schema, context)
        validator = Validator(schema)
        for _ in range(24):
            v = self.draw(kind.pool, words(name))
            if validator.is_valid(v):
                return v
        if isinstance(schema.get("pattern"), str):  # a code or a date no pool holds
            for _ in range(16):
                try:
                    v = patterns.draw(schema["pattern"], self.rng)
                except patterns.NoMatch:
                    break
                if validator.is_valid(v):
                    return v
        for pool in GENERATORS:  # a pattern or length the usual pool misses: any pool
            for _ in range(8):
                v = self.draw(pool, words(name))
                if validator.is_valid(v):
                    return v
        raise Unsatisfiable(f"{name}: no pool value satisfies its schema")

    def on_side(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi] on this sampler's side."""
        while True:
            n = self.rng.randint(lo, hi)
            if P.side_of(n) == self.side:
                return n

    def pick(self, pool: tuple):
        return self.rng.choice(P.split(pool, self.side))

    def draw(self, kind: str, name_words: list[str]) -> str:
        return GENERATORS.get(kind, GENERATORS["word"])(self, name_words)


def _date(s: Sampler) -> dt.date:
    return dt.date(2024, 1, 1) + dt.timedelta(days=s.on_side(0, 729))


def _person_ascii(s: Sampler) -> str:
    return s.pick(P.PEOPLE).lower().replace(" ", ".")


def _path(s: Sampler, w: list[str]) -> str:
    want_dir = bool(set(w) & {"dir", "directory", "folder"})
    if s.files:  # paths that exist in the tools' directory, split between the sides
        dirs = sorted({f.rsplit("/", 1)[0] for f in s.files if "/" in f})
        pool = tuple(dirs if want_dir and dirs else s.files)
        return s.rng.choice(P.split(pool, s.side) or pool)
    if want_dir:
        return f"{s.pick(P.DIRS)}/{s.pick(P.DIRS)}"
    return f"{s.pick(P.DIRS)}/{s.pick(P.FILES)}"


def files_under(directory: str | Path, limit: int = 1000) -> tuple[str, ...]:
    """The regular files under ``directory`` as sorted relative paths (hidden ones and
    links left out, at most ``limit``): what a path parameter can name there."""
    root = Path(directory)
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and not p.is_symlink()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return tuple(found[:limit])


def _id(s: Sampler, w: list[str]) -> str:
    stem = next((x for x in w if x not in {"id", "ids", "identifier", "key", "ref"}), "")
    prefix = stem[:3].upper() if len(stem) >= 3 else s.rng.choice(P.ID_PREFIXES)
    return f"{prefix}-{s.on_side(100, 9999)}"


def _person(s: Sampler, w: list[str]) -> str:
    name = s.pick(P.PEOPLE)
    if set(w) & {"username", "handle", "login"}:
        first, last = name.lower().split(" ", 1)
        return f"{first}{last[0]}"
    return name


GENERATORS = {
    "email": lambda s, w: f"{_person_ascii(s)}@{s.rng.choice(P.DOMAINS)}",
    "url": lambda s, w: f"https://{s.pick(P.SITES)}/{s.pick(P.URL_PATHS)}",
    "id": _id,
    "uuid": lambda s, w: str(uuid.UUID(int=s.rng.getrandbits(128), version=4)),
    "path": _path,
    "datetime": lambda s, w: f"{_date(s).isoformat()}T{s.rng.randint(7, 20):02d}:"
                             f"{s.rng.choice((0, 15, 30, 45)):02d}:00Z",
    "date": lambda s, w: _date(s).isoformat(),
    "time": lambda s, w: (lambda t: f"{t // 4:02d}:{t % 4 * 15:02d}")(s.on_side(28, 87)),
    "rfc_time": lambda s, w: (lambda t: f"{t // 4:02d}:{t % 4 * 15:02d}:00Z")(s.on_side(28, 87)),
    "city": lambda s, w: s.pick(P.CITIES),
    "country": lambda s, w: s.pick(P.COUNTRIES),
    "place_state": lambda s, w: s.pick(P.STATE_PLACES),
    "place_country": lambda s, w: s.pick(P.COUNTRY_PLACES),
    "language": lambda s, w: s.pick(P.LANGUAGES),
    "currency": lambda s, w: s.pick(P.CURRENCIES),
    "company": lambda s, w: s.pick(P.COMPANIES),
    "product": lambda s, w: s.pick(P.PRODUCTS),
    "address": lambda s, w: f"{s.on_side(1, 299)} {s.pick(P.STREETS)}",
    "phone": lambda s, w: f"+1-555-{s.on_side(1000, 9999)}",
    "zip": lambda s, w: f"{s.on_side(10000, 99999)}",
    "command": lambda s, w: s.pick(P.COMMANDS),
    "color": lambda s, w: s.pick(P.COLORS),
    "quantity": lambda s, w: f"{s.on_side(1, 500)} {s.rng.choice(P.STRING_UNITS)}",
    "person": _person,
    "query": lambda s, w: s.pick(P.QUERIES),
    "title": lambda s, w: s.pick(P.TITLES),
    "text": lambda s, w: s.pick(P.SENTENCES) + ".",
    "ipv4": lambda s, w: f"10.{s.rng.randint(0, 255)}.{s.rng.randint(0, 255)}.{s.on_side(1, 254)}",
    "hostname": lambda s, w: f"{s.pick(P.WORDS)}.example.com",
    "word": lambda s, w: s.pick(P.WORDS),
}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def free_leaves(schema: dict, value: Any, root: Any = None) -> Iterator[str]:
    """The canonical JSON of each leaf of ``value`` that a split keeps apart: not enum or
    const values, booleans, nulls, or integers from a range of fewer than three. ``root``:
    what a ``$ref`` points into (default: ``schema``, the tool's parameters)."""
    root = schema if root is None else root
    schema = as_schema(followed(schema, root))
    if "enum" in schema or "const" in schema or value is None or isinstance(value, bool):
        return
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        whole = Validator(root)  # a branch's $refs point into the root
        match = next((b for b in branches if whole.evolve(schema=b).is_valid(value)), None)
        if match is not None:
            yield from free_leaves(match, value, root)
        return
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for k, v in value.items():
            yield from free_leaves(props.get(k, {}), v, root)
    elif isinstance(value, list):
        for v in value:
            yield from free_leaves(schema.get("items", {}), v, root)
    elif not (isinstance(value, int) and _tiny_range(schema)) and \
            not (isinstance(value, (int, float)) and _fixed_number(schema)):
        yield canonical(value)


def _places(lo: float, hi: float) -> int:
    """Decimals a number in [lo, hi] is written with: two, or as many as it takes to fit a
    few values in a narrower range (at most twelve)."""
    places = 2
    while places < 12 and hi - lo < 3 * 10 ** -places:
        places += 1
    return places


def _fixed_number(schema: dict) -> bool:
    """A number schema whose range holds one value (``minimum == maximum``)."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    return lo is not None and lo == hi


def _tiny_range(schema: dict) -> bool:
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    return lo is not None and hi is not None and (hi - lo) / schema.get("multipleOf", 1) < 2

"""Tool catalogues generated from domain vocabularies: the corpus of a general tool caller.

:func:`generate_tools` turns every noun of every domain in :mod:`.domains` into tools by
the actions that fit it (a ``record`` noun is created, fetched by id, and listed, updated or
cancelled; an ``info`` noun is looked up from the domain's key parameters, and searched or
computed), choosing verbs, description templates, parameter subsets, enum subsets and which
parameters are required with a ``random.Random`` seeded by the seed and the noun. Every tool
has an ``_exec`` whose one-line result is a pure function of its arguments (a checksum:
a number, an id, a count), so ``mlx_agent synth`` can build chained and stated-result tasks
from it. :func:`catalogues` groups the tools into small catalogues, most of a domain with a
few tools of other domains mixed in; :func:`write` puts each in ``DIR/NAME/tools.json``.

Promised: the same seed gives the same tools and files, byte for byte; tool names are
distinct; every schema is valid JSON Schema that ``load_tools`` accepts. Not promised: that a
tool's result means anything (it is a checksum), or the exact count under another seed.
"""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..fileio import atomic_path
from .domains import DOMAINS
from .pools import PLACE_EXAMPLES

SHAPES = {  # obj:NAME -> (properties as field specs, required)
    "address": ({"street": "str:address", "city": "str:city", "postal_code": "str:zip",
                 "country": "str:country"}, ("street", "city")),
    "window": ({"start": "datetime", "end": "datetime"}, ("start", "end")),
    "coordinates": ({"latitude": "num:-90:90:degrees", "longitude": "num:-180:180:degrees"},
                    ("latitude", "longitude")),
}
KIND_HINTS = {  # str:KIND -> the words a description adds, so a reader knows what goes in
    "city": "a city", "title": "a short title", "text": "free text", "person": "a person's name",
    "query": "search terms", "id": "an ID", "path": "a file path", "product": "a product",
    "company": "a company", "country": "a country", "phone": "a phone number",
    "zip": "a postal code", "word": "one word", "address": "a street address",
}
PLACE_SHARE = 0.5  # city fields that ask for "the city and state/country, e.g. ..."
FORMATS = {"date": "date", "datetime": "date-time", "time": "time", "email": "email",
           "url": "uri", "uuid": "uuid", "hostname": "hostname", "ipv4": "ipv4"}
VERBS = {
    "create": ("create", "add", "register", "new", "submit"),
    "get": ("get", "show", "fetch", "read", "view"),
    "lookup": ("check", "look_up", "query", "retrieve", "report"),
    "list": ("list", "search", "find", "browse"),
    "update": ("update", "edit", "modify", "change"),
    "cancel": ("cancel", "delete", "remove", "withdraw", "archive"),
    "compute": ("estimate", "work_out", "project", "compare", "calculate_expected"),
}
DESCRIPTIONS = {
    "create": ("Create a new {noun} with the given {fields}.", "Add a {noun} ({domain}).",
               "Register a {noun}; returns its reference.",
               "Set up a {noun} from {fields}."),
    "get": ("Get one {noun} by its ID.", "Show the details of a {noun}.",
            "Fetch a single {noun} record ({domain})."),
    "lookup": ("Get the {noun} for a {key}.", "Look up the current {noun} of a given {key}.",
               "Return the {noun} for the {key} given ({domain}).", "Check the {noun} by {key}."),
    "list": ("List {nouns}, optionally filtered by {fields}.", "Search {nouns} ({domain}).",
             "Find {nouns} that match {fields}; returns how many matched."),
    "update": ("Change an existing {noun}; only the fields given change.",
               "Edit a {noun} by ID: {fields}.", "Update the {fields} of a {noun}."),
    "cancel": ("Cancel a {noun} by ID.", "Delete a {noun}; this cannot be undone.",
               "Remove a {noun} ({domain})."),
    "compute": ("Estimate the {noun} from {fields}.", "Compute the {noun} for a {key}.",
                "Work out the {noun} given {fields} ({domain})."),
}
RESULTS = {  # action -> the echo that follows the checksum n of all arguments
    "create": 'echo "{prefix}-$((n % 90000 + 10000))"',
    "get": 'echo "$((n % 1000))"', "lookup": 'echo "$((n % 1000))"',
    "compute": 'echo "$((n % 5000))"',
    "list": 'echo "$((n % 20 + 1)) {nouns} found"',
    "update": 'echo "saved as revision $((n % 40 + 2))"',
    "cancel": 'echo "done, reference $((n % 9000 + 1000))"',
}


@dataclass(frozen=True)
class Catalogue:
    name: str
    domains: tuple[str, ...]
    tools: tuple[dict, ...]  # OpenAI function entries with an ``_exec``


def human(name: str) -> str:
    return name.replace("_", " ")


def plural(noun: str) -> str:
    if noun.endswith("is"):  # synopsis
        return noun[:-2] + "es"
    if noun.endswith(("ss", "us", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("s"):  # already plural: facts, series, statistics
        return noun
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def field_schema(name: str, spec: str, rng: random.Random, top: bool = True) -> dict:
    """The JSON Schema of field ``name`` from its spec (see :mod:`.domains`); ``top`` is
    false for an object's fields (an address's city stays a plain city)."""
    kind, _, rest = spec.partition(":")
    label = human(name).capitalize()
    if kind == "str":
        if rest == "city" and top and rng.random() < PLACE_SHARE:  # a "City, Region" value
            region = rng.choice(sorted(PLACE_EXAMPLES))
            example = rng.choice(PLACE_EXAMPLES[region])
            return {"type": "string",
                    "description": f"{label}: the city and {region}, e.g. {example}"}
        return {"type": "string", "description": f"{label} ({KIND_HINTS[rest]})"}
    if kind in FORMATS:
        return {"type": "string", "format": FORMATS[kind], "description": label}
    if kind in ("int", "num"):
        lo, hi, *unit = rest.split(":")
        cast = int if kind == "int" else float
        unit_text = f" in {unit[0]}" if unit and unit[0] not in label.lower() else ""
        return {"type": "integer" if kind == "int" else "number", "minimum": cast(lo),
                "maximum": cast(hi), "description": f"{label}{unit_text}"}
    if kind == "enum":
        values = rest.split("|")
        keep = sorted(rng.sample(range(len(values)), rng.randint(min(3, len(values)),
                                                                 len(values))))
        return {"type": "string", "enum": [values[i] for i in keep], "description": label}
    if kind == "bool":
        return {"type": "boolean", "description": f"{label} (true or false)"}
    if kind == "list":
        items = field_schema(name, rest, rng)
        items.pop("description", None)
        schema = {"type": "array", "items": items, "minItems": 1,
                  "maxItems": rng.randint(3, 6), "description": f"{label} (a list)"}
        if "enum" in items:
            schema["uniqueItems"] = True
        return schema
    if kind == "obj":
        fields, required = SHAPES[rest]
        return {"type": "object", "description": label,
                "properties": {k: field_schema(k, v, rng, top=False)
                               for k, v in fields.items()},
                "required": list(required), "additionalProperties": False}
    raise ValueError(f"field {name!r}: unknown spec {spec!r}")


def _actions(record: bool, rng: random.Random) -> list[str]:
    if record:
        return ["create", "get", *rng.sample(["list", "update", "cancel"], rng.randint(1, 2))]
    return ["lookup", *rng.sample(["list", "compute"], rng.randint(1, 2))]


def _parameters(action: str, noun: str, keys: tuple[str, ...], fields: dict[str, str],
                rng: random.Random) -> tuple[dict[str, str], list[str]]:
    """(field specs in order, required names) of one tool."""
    others = [f for f in fields if f not in keys]
    numeric = [f for f in others if fields[f].startswith(("int:", "num:"))]
    pick = lambda pool, lo, hi: rng.sample(pool, min(len(pool), rng.randint(lo, hi)))  # noqa: E731
    id_field = {f"{noun}_id": "str:id"}
    if action in ("get", "update", "cancel"):
        extra = pick(others, 0 if action == "get" else 1, 3 if action == "update" else 1)
        specs = {**id_field, **{f: fields[f] for f in extra}}
        if action == "cancel":
            specs["reason"] = "str:text"
        return specs, [f"{noun}_id"]
    if action == "list":
        chosen = pick([*keys, *others], 1, 3)
        specs = {f: fields[f] for f in chosen}
        specs["max_results"] = f"int:1:{rng.choice([20, 50, 100])}"
        return specs, chosen[:rng.randint(0, 1)]
    if action == "create":
        chosen = pick([*keys, *others], 2, 4)
        return {f: fields[f] for f in chosen}, chosen[:rng.randint(1, len(chosen))]
    if action == "compute":
        chosen = [*keys, *pick(numeric or others, 1, 2)]
        return {f: fields[f] for f in chosen}, chosen
    chosen = [*keys, *pick(others, 0, 2)]  # lookup
    return {f: fields[f] for f in chosen}, list(keys)


def _exec(action: str, noun: str, names: list[str]) -> str:
    """A command whose one-line result is a checksum of every argument (all quoted)."""
    args = " ".join(f'"${a}"' for a in sorted(names))
    prefix = "".join(w[0] for w in noun.split("_")).upper() + noun[:2].upper()
    result = RESULTS[action].format(prefix=prefix, nouns=human(plural(noun)))
    return f"n=$(printf '%s|' {args} | cksum | cut -d ' ' -f 1); {result}"


def _tool(domain: str, noun: str, action: str, rng: random.Random) -> dict:
    _, _, keys, fields = DOMAINS[domain]
    specs, required = _parameters(action, noun, keys, fields, rng)
    verb = rng.choice(VERBS[action])
    name = f"{verb}_{plural(noun) if action == 'list' else noun}"
    shown = [human(f) for f in specs if f not in keys and not f.endswith("_id")][:2]
    description = rng.choice(DESCRIPTIONS[action]).format(
        noun=human(noun), nouns=human(plural(noun)), domain=human(domain),
        key=" and ".join(human(k) for k in keys), fields=" and ".join(shown) or "its details")
    properties = {f: field_schema(f, spec, rng) for f, spec in specs.items()}
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required},
        "_exec": _exec(action, noun, list(properties))}}


def generate_tools(seed: int = 0) -> list[tuple[str, dict]]:
    """(domain, tool) for every tool of every domain, in a fixed order."""
    out, names = [], set()
    for domain, (records, infos, _, _) in DOMAINS.items():
        for noun in (*records, *infos):
            rng = random.Random(f"{seed}:{domain}:{noun}")
            for action in _actions(noun in records, rng):
                tool = _tool(domain, noun, action, rng)
                name = tool["function"]["name"]
                if name in names:  # two verbs met on one noun: say the domain
                    tool["function"]["name"] = name = f"{name}_in_{domain}"
                names.add(name)
                out.append((domain, tool))
    return out


def catalogues(seed: int = 0, size: tuple[int, int] = (4, 8), mixed: int = 2) -> list[Catalogue]:
    """Every tool in exactly one catalogue's own domain: each domain's tools shuffled and cut
    into catalogues of ``size`` tools, each with up to ``mixed`` tools of other domains."""
    rng = random.Random(f"{seed}:catalogues")
    tools = generate_tools(seed)
    by_domain: dict[str, list[dict]] = {}
    for domain, tool in tools:
        by_domain.setdefault(domain, []).append(tool)
    out = []
    for domain, own in by_domain.items():
        own = list(own)
        rng.shuffle(own)
        while own:
            n = rng.randint(*size)
            take, own = own[:n], own[n:]
            guests = [(d, t) for d, t in rng.sample(tools, mixed * 4) if d != domain][:mixed]
            picked = take + [t for _, t in guests]
            rng.shuffle(picked)
            domains = tuple(sorted({domain, *(d for d, _ in guests)}))
            out.append(Catalogue(f"{domain}-{len(out):03d}", domains, tuple(picked)))
    return out


def write(cats: list[Catalogue], out: str | Path) -> list[Path]:
    """``out/NAME/tools.json`` for each catalogue; all are written, or none."""
    out = Path(out)
    paths = [out / c.name / "tools.json" for c in cats]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for c, p in zip(cats, paths):
            text = json.dumps({"tools": list(c.tools)}, indent=1, ensure_ascii=False) + "\n"
            stack.enter_context(atomic_path(p)).write_text(text, encoding="utf-8")
    return paths

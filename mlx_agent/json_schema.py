"""Checks on a JSON Schema that a validator of schemas does not make, for schemas that become
grammars: its size, integers that JSON numbers do not carry exactly, and recursion that no
finite value ends.

- :func:`too_many_nodes`: validating a schema costs about 0.15 ms a node in ``jsonschema``,
  so a request with 100,000 properties held a server's threads for half a minute; counted
  first, without recursion.
- :func:`inexact_integer`: a ``const`` or ``enum`` integer past 2^53 cannot be written back
  exactly (llguidance reads numbers as doubles: 9007199254740993 came out ...992), and one
  past the 64-bit range anywhere cannot be handed to llguidance at all.
- :func:`unusable`: counts that are not whole numbers, remote or dangling ``$ref``s and
  ``$ref`` chains that loop, which JSON Schema allows and llguidance cannot compile.
- :func:`endless`: ``{"properties": {"a": {"$ref": "#"}}, "required": ["a"]}`` admits only
  an infinite object; llguidance compiles it and the grammar dead-ends after ``{``. A value
  is finite when some choice of its schema needs nothing endless: computed as a least fixed
  point over the schema's local ``$ref`` targets. Bounds that no value meets at all
  (``minItems: 2`` with one ``prefixItems`` entry and ``items: false``) fail the same test,
  without recursion.

Not promised: ``endless`` reads ``required`` properties, ``minItems`` with ``items`` and
``prefixItems``, ``allOf``/``anyOf``/``oneOf`` and local ``$ref`` pointers, and treats
anything else (``not``, ``if``/``then``, ``dependentSchemas``, remote refs) as satisfiable;
llguidance's own checks and the grammar's ``admitting`` catch some of the rest.
"""

from __future__ import annotations

from typing import Any, Iterator

# values a schema may hold: the checks below, jsonschema's validation (about 0.1 ms a value)
# and endless()'s passes (one per link of the longest $ref chain) all grow with it
MAX_VALUES = 20_000
MAX_DEPTH = 512  # levels of nesting, $ref links counted (JSON nesting is capped by parsers)
EXACT = 2 ** 53  # integers a double holds exactly, and so JSON parsers that read doubles
INT64 = (-(2 ** 63), 2 ** 64 - 1)  # what llguidance takes at all (i64 and u64)


def too_many_nodes(schema: Any, limit: int) -> bool:
    """Whether ``schema`` has more than ``limit`` values (objects, arrays and scalars)."""
    todo, seen = [schema], 0
    while todo:
        node = todo.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(node, dict):
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return False


def _walk(schema: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """Every value in ``schema`` with its path and the key it sits under, without recursion."""
    todo = [(schema, path, "")]
    while todo:
        node, where, key = todo.pop()
        yield where, key, node
        if isinstance(node, dict):
            todo.extend((v, f"{where}.{k}" if where else str(k), str(k))
                        for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, f"{where}[{i}]", key) for i, v in enumerate(node))


def inexact_integer(schema: Any) -> tuple[str, str] | None:
    """An integer in ``schema`` that cannot become part of a grammar: its path and why, or
    None."""
    for where, key, value in _walk(schema):
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key in ("const", "enum") and abs(value) > EXACT:
            return where, (f"is {value}, past 2^53, which JSON numbers do not carry exactly; "
                           "give it as a string")
        if not INT64[0] <= value <= INT64[1]:
            return where, f"is {value}, past the 64-bit range; give a smaller number"
    return None


_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
           "minContains", "maxContains")
# where JSON Schema keeps subschemas: lists of them, maps of names to them, and single ones
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties",
                  "dependentSchemas")
SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
              "propertyNames", "additionalItems", "unevaluatedItems", "unevaluatedProperties")


def subschemas(node: dict, where: str = "") -> Iterator[tuple[str, Any]]:
    """``node``'s direct subschemas with their paths, found by keyword: a property named
    ``enum`` or ``default`` is a schema like any other, and ``const``, ``enum``, ``default``
    and ``examples`` stay data."""
    def at(*keys) -> str:
        return ".".join([where, *map(str, keys)] if where else map(str, keys))

    for key in SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            yield from ((at(key, i), s) for i, s in enumerate(node[key]))
    for key in SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            yield from ((at(key, name), s) for name, s in node[key].items())
    for key in SUBSCHEMAS:
        if isinstance(node.get(key), dict):
            yield at(key), node[key]


def unusable(schema: Any) -> tuple[str, str] | None:
    """A keyword JSON Schema allows that no grammar can be made of, as its path and why, or
    None: a count given as a non-integer number (``"maxLength": 5.0`` is valid JSON Schema;
    llguidance wants an integer), a ``$ref`` that is not local (nothing is fetched) or points
    at nothing, and a chain of ``$ref``s that comes back to itself before reaching a schema
    (``a`` is ``b``, ``b`` is ``a``): these compiled nowhere, after the tools file loaded."""
    judged: dict[str, str | None] = {}  # each $ref followed once, however many use it
    todo = [("", schema)]
    while todo:
        where, node = todo.pop()
        if not isinstance(node, dict):
            continue
        for key in _COUNTS:
            if isinstance(node.get(key), float):
                return f"{where}.{key}".lstrip("."), (f"is {node[key]!r}; give a whole number "
                                                      "without a decimal point")
        ref = node.get("$ref")
        if isinstance(ref, str):
            problem = _ref_problem(schema, ref, judged)
            if problem:
                return f"{where}.$ref".lstrip("."), problem
        todo.extend(reversed(list(subschemas(node, where))))  # in the order written
    return None


def _ref_problem(root: Any, ref: str, judged: dict[str, str | None]) -> str | None:
    """What is wrong with following ``ref`` to a schema, or None; every ``$ref`` on the way
    is entered in ``judged``."""
    if not ref.startswith("#"):
        return f"is {ref[:80]!r}, not a reference inside the schema (#/...); nothing is fetched"
    chain: list[str] = []
    on_chain: set[str] = set()
    problem = None
    while ref not in judged:
        if ref in on_chain:
            loop = " -> ".join([*chain[chain.index(ref):], ref])
            problem = f"starts a chain of references that loops without a schema ({loop[:160]})"
            break
        chain.append(ref)
        on_chain.add(ref)
        target = resolve(root, ref)
        if target is None:
            problem = f"is {ref[:80]!r}, which points at nothing in the schema"
            break
        nxt = target.get("$ref") if isinstance(target, dict) else None
        if not isinstance(nxt, str) or not nxt.startswith("#"):
            break  # a schema (or a remote ref, judged where it is written)
        ref = nxt
    else:
        problem = judged[ref]
    for r in chain:
        judged[r] = problem
    return problem


TOO_DEEP = (f"nests more than {MAX_DEPTH} levels deep, counting the $ref links it follows; "
            "flatten it")
TOO_MANY = (f"holds more than {MAX_VALUES:,} JSON values, more than a schema needs; make "
            "it smaller")
# endless() finds both: a value every choice of which recurses, and bounds nothing meets
ENDLESS = ("admits no value the grammar can finish: a recursion with no optional way out "
           "(through a required property, a required array item or a $ref), or bounds no "
           "value meets (minItems past what prefixItems and items allow, a required property "
           "of schema false); give the recursion a way out or loosen the bounds")


def resolve(root: Any, ref: str) -> Any:
    """The schema a local ``$ref`` (``#``, ``#/$defs/A``) points at, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isascii() and part.isdigit() and \
                len(part) < 10 and int(part) < len(node):  # not "²", nor 5,000 digits
            node = node[int(part)]
        else:
            return None
    return node


def too_deep(schema: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``schema`` nests more than ``limit`` levels, counting each ``$ref`` it
    follows (not around a cycle) as a level: a chain of a thousand ``$defs``, each naming
    the next, is shallow as JSON and crashed llguidance's compiler (a segfault)."""
    heights: dict[str, int] = {}
    active: set[str] = set()

    def height(node: Any) -> int:
        best = 0
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref not in active:
                if ref not in heights:
                    target = resolve(schema, ref) if ref.startswith("#") else None
                    active.add(ref)
                    heights[ref] = height(target) if target is not None else 0
                    active.discard(ref)
                best = heights[ref] + 1
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            return 0
        for child in children:
            if best > limit:
                break
            best = max(best, height(child) + 1)
        return best

    try:
        return height(schema) > limit
    except RecursionError:  # deeper than Python's own limit: deeper than ours
        return True


def endless(schema: Any) -> bool:
    """Whether ``schema`` admits no finite value: every value it admits is infinite (a
    required property, or a required array item, that refers back to its own schema with no
    way out), or none meets its bounds (``minItems`` past what ``prefixItems`` and ``items:
    false`` allow, a required property of schema ``false``). A schema with a nested ``$id``
    (its refs resolve against another base) is not judged."""
    if any(key == "$id" and where != "$id" for where, key, _ in _walk(schema)):  # nested
        return False
    refs = sorted({v for _, key, v in _walk(schema) if key == "$ref" and isinstance(v, str)
                   and v.startswith("#")})
    finite = dict.fromkeys(refs, False)  # least fixed point: nothing finite until shown
    changed = True
    while changed:
        changed = False
        for ref in refs:
            if not finite[ref]:
                target = resolve(schema, ref)
                if target is None or _finite(target, finite):
                    finite[ref] = changed = True
    return not _finite(schema, finite)


def _finite(schema: Any, finite: dict[str, bool], depth: int = 0) -> bool:
    """Whether ``schema`` admits a finite value, given which ``$ref`` targets do."""
    if depth > 200 or not isinstance(schema, dict):
        return schema is not False
    ref = schema.get("$ref")
    if isinstance(ref, str) and not finite.get(ref, True):
        return False
    for key, need in (("allOf", all), ("anyOf", any), ("oneOf", any)):
        parts = schema.get(key)
        if isinstance(parts, list) and parts and \
                not need(_finite(p, finite, depth + 1) for p in parts):
            return False
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if any(t not in ("object", "array") for t in types):
        return True  # a string, a number, null, ... or no type given: a finite value exists
    ok = {}
    if "object" in types:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        ok["object"] = all(_finite(props[name], finite, depth + 1)
                           for name in (required if isinstance(required, list) else [])
                           if isinstance(name, str) and name in props)
    if "array" in types:
        at_least = schema.get("minItems", 0)
        at_least = at_least if isinstance(at_least, int) else 0
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = schema.get("items", True)
        ok["array"] = all(_finite(p, finite, depth + 1) for p in prefix[:at_least]) and (
            at_least <= len(prefix) or _finite(items, finite, depth + 1))
    return any(ok.values())

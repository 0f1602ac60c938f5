"""Strings drawn to match a JSON Schema ``pattern``, read by Python's regex parser.

A parameter such as ``{"type": "string", "pattern": "^[A-Z]{2}\\d{3,4}$"}`` (a flight code)
or ``"^\\d{2}/\\d{2}/\\d{4}$"`` (a date as a form writes it) gets a value that no pool holds:
:func:`draw` walks the parsed pattern and picks each piece at random (a class's members, a
repeat's count, an alternative), letters and digits where a class allows anything.

Not promised: a match for every pattern. Lookarounds are skipped and a backreference repeats
nothing, so the caller validates what comes back (and draws again, or gives up); an
unbounded repeat is drawn up to three past its minimum; ECMA-262 syntax Python reads
otherwise (rare in tool schemas) gives strings of Python's reading. Deterministic for a given
``random.Random`` state.
"""

from __future__ import annotations

import random
import re
import string

try:  # what re.compile reads a pattern with (Python 3.11 on)
    from re import _constants as C, _parser as parser
except ImportError:  # Python 3.10
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as parser  # type: ignore[no-redef]

MAX_EXTRA = 3  # repeats drawn past a repeat's minimum, where it has no maximum
MAX_CHARS = 256  # a drawn string longer than this is given up on
MAX_STEPS = 20_000  # pieces of a pattern walked for one string, a repeat's turns among them
MAX_CLASS = 4096  # characters of a class drawn from (its first ranges, where it has more)

_PLAIN = string.ascii_letters + string.digits  # what "any character" is drawn from
_CATEGORIES = {
    C.CATEGORY_DIGIT: string.digits,
    C.CATEGORY_NOT_DIGIT: string.ascii_letters,
    C.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
    C.CATEGORY_NOT_WORD: " -.,/",
    C.CATEGORY_SPACE: " ",
    C.CATEGORY_NOT_SPACE: _PLAIN,
}
_PRINTABLE = [chr(c) for c in range(32, 127)]
_REPEATS = {C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", C.MAX_REPEAT)}
_GROUPS = {C.SUBPATTERN, getattr(C, "ATOMIC_GROUP", C.SUBPATTERN)}


class NoMatch(ValueError):
    """A pattern this module does not draw from (it does not parse, or grows too long)."""


def draw(pattern: str, rng: random.Random) -> str:
    """A string meant to match ``pattern`` (validate it: see the module's promises)."""
    try:
        parsed = parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise NoMatch(f"pattern {pattern[:60]!r} does not parse: {e}") from None
    out: list[str] = []
    _walk(list(parsed), rng, out, [MAX_STEPS], {})
    text = "".join(out)
    if len(text) > MAX_CHARS:
        raise NoMatch(f"pattern {pattern[:60]!r} asks for more than {MAX_CHARS} characters")
    return text


def _walk(items: list, rng: random.Random, out: list[str], budget: list[int],
          classes: dict) -> None:
    for op, arg in items:
        _spend(out, budget)
        if op is C.LITERAL:
            out.append(chr(arg))
        elif op is C.NOT_LITERAL:
            out.append(rng.choice([c for c in _PLAIN if ord(c) != arg]))
        elif op is C.ANY:
            out.append(rng.choice(_PLAIN))
        elif op is C.IN:
            if id(arg) not in classes:  # a class is listed once, not at each repeat
                classes[id(arg)] = _members(arg)
            out.append(_choose(classes[id(arg)], rng))
        elif op in _REPEATS:
            lo, hi, body = arg
            hi = lo + MAX_EXTRA if hi is C.MAXREPEAT else hi
            for _ in range(rng.randint(lo, min(hi, lo + MAX_CHARS))):
                _spend(out, budget)  # "(?:){99999999}" walks an empty body each turn
                _walk(list(body), rng, out, budget, classes)
        elif op in _GROUPS:  # a group's body is its argument's last part, or the argument
            _walk(list(arg[-1] if isinstance(arg, tuple) else arg), rng, out, budget, classes)
        elif op is C.BRANCH:
            _walk(list(rng.choice(arg[1])), rng, out, budget, classes)
        # AT (anchors), ASSERT/ASSERT_NOT (lookarounds), GROUPREF: nothing drawn


def _spend(out: list[str], budget: list[int]) -> None:
    budget[0] -= 1
    if len(out) > MAX_CHARS or budget[0] < 0:  # "((\b{999}){999}){999}" draws nothing
        raise NoMatch(f"a pattern that asks for more than {MAX_CHARS} characters, or "
                      f"{MAX_STEPS} pieces")


def _members(items: list) -> tuple[list[str], list[str], bool]:
    """What a ``[...]`` class (or an escape such as ``\\d``) is drawn from: its characters,
    its letters and digits, and whether it is negated."""
    chars: set[str] = set()
    negate = False
    for op, arg in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            chars.add(chr(arg))
        elif op is C.RANGE:
            lo, hi = arg
            chars.update(chr(c) for c in range(lo, min(hi, lo + 1000) + 1))
        elif op is C.CATEGORY:
            chars.update(_CATEGORIES.get(arg, _PLAIN))
        if len(chars) >= MAX_CLASS and not negate:  # "[\u0000-\u03e7...]" of 6,000 ranges
            break
    if negate:
        allowed = [c for c in _PRINTABLE if c not in chars]
        return [c for c in allowed if c in _PLAIN] or allowed or ["_"], [], True
    pool = sorted(chars)
    return pool, [c for c in pool if c.isalnum()], False


def _choose(members: tuple[list[str], list[str], bool], rng: random.Random) -> str:
    """A character of a class listed by :func:`_members`."""
    pool, plain, negated = members
    if negated:
        return rng.choice(pool)
    if not pool:
        raise NoMatch("an empty character class")
    return rng.choice(plain if plain and rng.random() < 0.8 else pool)  # "[\w.-]": names

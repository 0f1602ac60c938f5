"""What the model would write for one parameter of a call: a probe.

The engine syncs to the prompt and the call's text up to where the grammar writes the
parameter, ``"name":`` included, and the model writes a value under a schema (the
parameter's own, bounded, or one the caller gives, such as a choice of the request's
phrases), up to the ``,`` or ``}`` that ends it. :mod:`mlx_agent.stated_arguments` probes
the optional parameters a call left out; :mod:`mlx_agent.copied_values` probes again a
string the call garbled. :func:`probe_arguments` has the model write a whole call's
arguments the same way, for the tool :mod:`mlx_agent.described_tool` finds the request
describes. :func:`would_call` reads whether the model, free to answer, would open a call.

Not promised: a value longer than :data:`PROBE_TOKENS` tokens (strings longer than
:data:`PROBE_CHARS` characters), or arguments longer than the reply's token budget, are not
written; the engine is left where the probe left it, and the caller syncs it back.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Sequence

from llguidance import LLMatcher

from .engine import Sampler, greedy_sampler
from .formats.messages import unspaced
from .grammar import (Constraint, GrammarError, _arguments_schema, _bound, _guidance, _ordered,
                      call_text, check_compiles, ll_tokenizer, string_budget, written_json)
from .tools import Tool

PROBE_TOKENS = 24  # the longest value a probe decodes; a longer one is not written
PROBE_CHARS = 64  # strings are bounded so, in the probe's grammar
_SENTINEL = "\x00probe\x00"


@functools.lru_cache(maxsize=256)
def _value_grammar(schema_json: str, tokenizer, ends: str = ",}") -> str:
    """A value of the schema, then one of ``ends``, which ends it in the call: a bare
    number's grammar is never done (another digit may follow), so the probe ends at the
    delimiter instead, as the call's own grammar does."""
    schema = json.dumps({**json.loads(schema_json), "x-guidance": _guidance("json")})
    try:
        grammar = LLMatcher.grammar_from_lark(f"start: value /[{ends}]/\nvalue: %json {schema}\n")
    except ValueError as e:
        raise GrammarError(f"a parameter's schema is not usable: {e}") from None
    check_compiles(grammar, tokenizer, "a parameter's schema")
    return grammar


def _probe_schema(tool: Tool, name: str) -> dict | None:
    """The parameter's schema as a probe writes it: bounded, and a string or a list never
    empty (asked for a city the request names, the model wrote ``""``, which no request
    states: with one character required it wrote the city)."""
    schema = tool.properties.get(name)
    if not isinstance(schema, dict) or schema.get("type") == "object":  # never added
        return None
    bound = _bound(schema, PROBE_CHARS)
    types = bound.get("type") if isinstance(bound.get("type"), list) else [bound.get("type")]
    if "enum" not in bound and "const" not in bound:  # ["string", "null"]: its string
        for kind, least in (("string", "minLength"), ("array", "minItems")):
            if kind in types and not (isinstance(bound.get(least), int) and bound[least] >= 1):
                bound = {**bound, least: 1}
    defs = tool.parameters.get("$defs")
    return {**bound, "$defs": defs} if isinstance(defs, dict) and "$defs" not in bound \
        else bound


def probe(engine, lm, sampler: Sampler, prompt: Sequence[int], protocol: str, tool: Tool,
          arguments: dict, name: str, schema: dict | None = None) -> Any:
    """The value the model writes for ``name`` after ``prompt`` and the call's text up to
    it (``arguments`` before it, in the grammar's order), drawn by ``sampler`` under
    ``schema`` (the parameter's own, bounded, where None), or None where it writes none."""
    # a parameter's own schema recurs across requests and is cached; one the caller gives
    # (a request's phrases) is the request's alone, and would only push those out
    grammar_of = _value_grammar if schema is None else _value_grammar.__wrapped__
    schema = _probe_schema(tool, name) if schema is None else schema
    if schema is None:
        return None
    prefix = _before(protocol, tool, arguments, name)
    try:
        grammar = grammar_of(json.dumps(schema, sort_keys=True), ll_tokenizer(lm))
        constraint = Constraint(ll_tokenizer(lm), grammar, lm.vocab_size)
        engine.sync(list(prompt) + reply_ids(lm, protocol, prefix))
        ids = list(engine.generate(sampler, max_tokens=PROBE_TOKENS,
                                   stop_ids=lm.end_ids, constraint=constraint))
    except GrammarError:  # a schema it cannot compile, or llguidance gave up mid-value
        return None
    text = lm.decode(ids)
    if not constraint.done or (ids and ids[-1] in lm.end_ids) or text[-1:] not in (",", "}"):
        return None
    try:
        return unspaced(json.loads(text[:-1]))
    except ValueError:
        return None


def probe_arguments(engine, lm, sampler: Sampler, prompt: Sequence[int], protocol: str,
                    tool: Tool, max_tokens: int,
                    stop: Callable[[], bool] = lambda: False) -> dict | None:
    """The arguments the model writes for a call of ``tool`` after ``prompt`` and the
    call's text up to them, drawn by ``sampler`` under the tool's parameters as the reply's
    grammar binds them (in the order it writes them, strings bounded by
    :func:`~mlx_agent.grammar.string_budget`), or None where it writes none within
    ``max_tokens`` tokens (the call's opening text aside) or ``stop`` says so (asked after
    each token)."""
    written = call_text(protocol, tool, {})
    prefix = written[:written.rindex("{}")]
    schema = _arguments_schema(_ordered(tool, protocol), string_budget(max_tokens))
    try:
        grammar = _value_grammar(json.dumps(schema), ll_tokenizer(lm), "}")
        constraint = Constraint(ll_tokenizer(lm), grammar, lm.vocab_size)
        engine.sync(list(prompt) + reply_ids(lm, protocol, prefix))
        ids = []
        tokens = engine.generate(sampler, max_tokens=max_tokens, stop_ids=lm.end_ids,
                                 constraint=constraint)
        try:  # closed at once on a stop: a batched engine's row leaves its batch
            for token in tokens:
                if stop():
                    return None
                ids.append(token)
        finally:
            tokens.close()
    except GrammarError:
        return None
    text = lm.decode(ids)
    if not constraint.done or (ids and ids[-1] in lm.end_ids) or text[-1:] != "}":
        return None
    try:
        arguments = unspaced(json.loads(text[:-1]))
    except ValueError:
        return None
    return arguments if isinstance(arguments, dict) else None


def _before(protocol: str, tool: Tool, arguments: dict, name: str) -> str:
    """The call's text up to where the grammar writes ``name``'s value."""
    written = call_text(protocol, tool, {**arguments, name: _SENTINEL})
    return written[:written.index(json.dumps(_SENTINEL))]


def likelihood(engine, lm, prompt: Sequence[int], protocol: str, tool: Tool, arguments: dict,
               name: str, value: Any) -> float:
    """The log-probability the model gives ``value`` (its tokens as the grammar writes it)
    for ``name`` after ``prompt`` and the call's text up to it, with no grammar
    (:meth:`~mlx_agent.engine.Engine.logprob`): how readily the model itself writes it. The
    engine is left wherever that leaves it."""
    engine.sync(list(prompt) + reply_ids(lm, protocol, _before(protocol, tool, arguments, name)))
    return engine.logprob(lm.encode_text(written_json(value, protocol)))


def would_call(engine, lm, protocol: str, prompt: Sequence[int],
               constraint: Constraint | None) -> bool:
    """Whether the model, free to answer under ``constraint`` (the reply's grammar, tool
    choice auto), opens a call after ``prompt``, decoding greedily (what it finds most
    likely, whatever the reply's sampler): the json protocol's ``{"tool"`` rather than
    ``{"answer"``, hermes's ``<tool_call>`` token first. A few tokens at most (True where the
    context has no room for one: nothing is pressed then); the engine is left holding
    ``prompt``, the constraint reset."""
    engine.sync(list(prompt))
    if engine.room is not None and engine.room < 1:
        return True
    if constraint is not None:
        constraint.reset()
    opening = '{"tool"' if protocol == "json" else None
    text, ids = "", []
    tokens = engine.generate(greedy_sampler, max_tokens=8, stop_ids=lm.end_ids,
                             constraint=constraint)
    try:
        for token in tokens:
            ids.append(token)
            if opening is None:  # hermes: the first token says
                break
            text = lm.decode(ids)
            if len(text) >= len(opening) or not opening.startswith(text):
                break
    finally:
        tokens.close()
    if constraint is not None:
        constraint.reset()
    engine.sync(list(prompt))
    if opening is None:
        return bool(ids) and ids[0] == lm.encode("<tool_call>")[0]
    return text.startswith(opening)


def reply_ids(lm, protocol: str, text: str) -> list[int]:
    """The ids of a reply (or its start) the runtime writes: text, but hermes's
    ``<tool_call>`` tags as the grammar writes them, one special token each where the
    tokenizer has them (the text between is never read as control tokens)."""
    if protocol != "hermes" or not text.startswith("<tool_call>"):
        return lm.encode_text(text)
    body, closed = text[len("<tool_call>"):], text.endswith("</tool_call>")
    body = body[:-len("</tool_call>")] if closed else body
    return lm.encode("<tool_call>") + lm.encode_text(body) + \
        (lm.encode("</tool_call>") if closed else [])


def hold(engine, ids: list[int]) -> None:
    """Sync ``engine`` to ``ids`` where a probe moved it (a batched engine's sync waits
    for the model thread, so it is skipped where nothing was probed or changed)."""
    if engine.tokens != ids:
        engine.sync(ids)

"""Constrained decoding with llguidance: grammars for tool calls, and a per-step token mask.

- :func:`ll_tokenizer` adapts every tokenizer we load (GGUF BPE, Hugging Face, byte-level,
  SentencePiece) to llguidance, once per tokenizer.
- :func:`json_protocol_grammar` and :func:`hermes_grammar` build one grammar per tool set
  (cached in memory): the json protocol allows exactly ``{"tool": <name>, "arguments": <that
  tool's parameters>}`` for each tool or ``{"answer": <string>}``; hermes allows free text, or
  ``<tool_call>`` blocks each holding one tool's ``{"name", "arguments"}``.
  String values without a ``maxLength`` get one, scaled to the step's token budget (a small
  model can otherwise repeat inside a string until the token limit) but never below their
  ``minLength``, nor below 64 for one with a ``format`` (a uuid is 36), and one without a
  ``pattern`` gets one that excludes NUL (no shell variable or path holds it); arguments
  objects without ``additionalProperties`` get ``false``, as in OpenAI's strict mode, and so
  does every nested object that declares properties (one that declares none stays free).
  ``uniqueItems``, which llguidance does not implement, a fractional ``multipleOf``, whose
  multiples it spells oddly, and ``oneOf``'s exclusivity (its members are read as
  ``anyOf``'s) are left to the schema check a call passes before it runs.
  Calls are written with no free white space and the separators of :data:`SEPARATORS`
  (the json prompt's examples use the same), the json protocol's arguments in the order its
  prompt lists them, numbers as llguidance spells them (:func:`call_text` writes a call
  exactly so, for the loop guard; :func:`written_json` its JSON, for the formats).
  Parameters with local ``$ref`` pointers move to the grammar root's ``$defs``, re-rooted.
  A tool whose schema no arguments satisfy is an error that names it (and names the token
  limit when only the budget's ``maxLength`` is in the way; llguidance reports some long
  patterns as not compilable instead).
- ``choice`` narrows either grammar the way OpenAI's ``tool_choice`` does: ``"auto"`` (calls
  or an answer), ``"required"`` (calls only), ``"none"`` (an answer only) or a tool's name
  (a call of that tool only). :func:`tool_constraint` builds the constraint for a protocol.
  The json protocol's answer may not end on white space or an opening bracket (a model
  that starts a quotation there, ``got: "``, would close its answer with that quote).
- :class:`Constraint` is what the engine consults: ``mask()`` for the next token (an int32
  bitmask, applied with :mod:`mlx_agent.kernels`; no word right after a lone space, see
  :mod:`mlx_agent.lone_space`), ``consume(token)``, and ``done`` once the grammar has
  reached its end state, which ends the turn.

A schema llguidance cannot compile is a :class:`GrammarError` naming the tool, raised when the
grammar is built (at start-up), not mid-conversation.
"""

from __future__ import annotations

import decimal
import functools
import json
import re
from typing import Any, Callable, Sequence

import mlx.core as mx
import numpy as np
from llguidance import LLMatcher

from . import json_schema
from .errors import UserFacingError
from .fileio import read_regular
from .lone_space import Rule, lone_space_rule
from .tokenizer import special_tokens
from .tools import Tool
from .tools.schema import Validator, meta_schema_problem

DEFAULT_MAX_STRING = 128  # characters per string value: fits a 256-token step even at a
# token per character (digits are split one by one), with room for the JSON around it


SEPARATORS = {"json": (",", ":"), "hermes": (",", ":")}  # (item, key) each grammar forces,
# compact; the json prompt's examples are written with them (scripts/prompt_variants.py)


def _guidance(protocol: str) -> dict:
    """llguidance's options for the JSON inside ``protocol``'s replies: no free white
    space, the separators of :data:`SEPARATORS`; ``oneOf`` read as ``anyOf`` (llguidance
    refuses it otherwise), its exclusivity left to the schema check a call passes before
    it runs."""
    item, key = SEPARATORS[protocol]
    return {"whitespace_flexible": False, "item_separator": item, "key_separator": key,
            "coerce_one_of": True}


def _written_order(tool: Tool, protocol: str) -> list[str]:
    """The order a call of ``tool`` writes its arguments in: the json protocol's prompt
    lists them in :meth:`Tool.argument_order`, hermes' chat template shows the schema."""
    return tool.argument_order() if protocol == "json" else list(tool.properties)


def _ordered(tool: Tool, protocol: str) -> dict:
    """``tool``'s parameters with the properties in :func:`_written_order`; llguidance
    writes an object's properties in the schema's order."""
    props = tool.properties
    order = _written_order(tool, protocol)
    return {**tool.parameters, "properties": {k: props[k] for k in order}}


# a JSON string (kept as it is) or a number with a fraction or an exponent
_STRING_OR_NUMBER = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|-?\d+(?:\.\d+)?[.eE][-+0-9]*')


def _spelt(match: re.Match) -> str:
    text = match.group()
    if text[0] == '"':
        return text
    x = float(text)
    if x.is_integer():
        return str(int(x))
    return format(decimal.Decimal(text), "f") if "e" in text.lower() else text


def written_json(value: Any, protocol: str) -> str:
    """``value`` as the grammar makes the model write JSON: the protocol's separators,
    non-ASCII as it is, and numbers as llguidance spells them: a whole float as an integer
    (an enum's ``1.0`` is written ``1``, and an integer's must be), and no exponent
    (``3e-05`` is ``0.00003``; llguidance has none)."""
    text = json.dumps(value, ensure_ascii=False, separators=SEPARATORS[protocol])
    return _STRING_OR_NUMBER.sub(_spelt, text)  # a pass over the text: no recursion


def written_arguments(protocol: str, tool: Tool, arguments: Any) -> Any:
    """``arguments`` (a dict) in :func:`_written_order`, keys the tool lacks last."""
    if not isinstance(arguments, dict):
        return arguments
    order = {name: i for i, name in enumerate(_written_order(tool, protocol))}
    return dict(sorted(arguments.items(), key=lambda kv: order.get(kv[0], len(order))))


def call_text(protocol: str, tool: Tool, arguments: Any) -> str:
    """A call exactly as the grammar makes the model write it: the name first, the
    arguments in :func:`_written_order`, the protocol's separators and numbers
    (:func:`written_json`; hermes: in its tags)."""
    key = "tool" if protocol == "json" else "name"
    text = written_json({key: tool.name, "arguments": written_arguments(protocol, tool,
                                                                        arguments)}, protocol)
    return text if protocol == "json" else f"<tool_call>\n{text}\n</tool_call>"


def string_budget(max_tokens: int) -> int:
    """The maxLength given to unbounded strings for replies of ``max_tokens`` tokens."""
    return max(32, max_tokens // 2)


class GrammarError(UserFacingError, ValueError):
    """A grammar (or a tool's schema) that llguidance cannot compile."""


class _SentencePieceForLL:
    """llguidance's generic tokenizer interface over our SentencePiece adapter."""

    def __init__(self, spm, eos: int):
        sp = spm.sp
        self.eos_token_id = eos
        self.bos_token_id = spm.bos_token_id
        self.tokens = []
        for i in range(len(spm)):
            piece = sp.id_to_piece(i)
            if sp.is_byte(i):
                self.tokens.append(bytes([int(piece[3:5], 16)]))
            elif sp.is_control(i) or sp.is_unknown(i):
                self.tokens.append(piece.encode())
            else:
                self.tokens.append(piece.replace("\u2581", " ").encode())
        self.special_token_ids = [i for i in range(len(spm)) if sp.is_control(i)]
        self._sp = self._without_dummy_prefix(spm.model_proto)

    @staticmethod
    def _without_dummy_prefix(model_proto: bytes):
        """llguidance tokenizes fragments of text: SentencePiece must not prepend '▁'."""
        import sentencepiece as spm_lib
        from sentencepiece import sentencepiece_model_pb2

        m = sentencepiece_model_pb2.ModelProto()
        m.ParseFromString(model_proto)
        m.normalizer_spec.add_dummy_prefix = False
        return spm_lib.SentencePieceProcessor(model_proto=m.SerializeToString())

    def __call__(self, text):
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._sp.encode(text)


@functools.lru_cache(maxsize=8)
def _ll_tokenizer_cached(tokenizer, n_vocab: int, eos: tuple[int, ...]):
    import llguidance
    import llguidance.hf
    from transformers import PreTrainedTokenizerFast

    from .tokenizer import SentencePieceTokenizer

    inner = tokenizer._tokenizer
    eos_list = list(eos) or [0]
    if isinstance(inner, PreTrainedTokenizerFast):
        return llguidance.hf.from_tokenizer(inner, n_vocab=n_vocab, eos_token=eos_list)
    if isinstance(inner, SentencePieceTokenizer):
        wrapped = llguidance.TokenizerWrapper(_SentencePieceForLL(inner, eos_list[0]))
        return llguidance.LLTokenizer(wrapped, n_vocab=n_vocab, eos_token=eos_list)
    raise GrammarError(f"no llguidance adapter for tokenizer {type(inner).__name__}")


def ll_tokenizer(lm):
    """The llguidance tokenizer for a loaded model (built once, ~1 s)."""
    n_vocab = lm.vocab_size
    return _ll_tokenizer_cached(lm.tokenizer, n_vocab,
                                tuple(sorted(lm.stop_ids)))


_NUMBER_BOUND = 10**12  # integers beyond a trillion are not what a tool call needs
NO_NUL = "^[^\\x00]*$"  # anchored: llguidance, like JSON Schema, otherwise searches
ANSWER_END = "^([^\\x00]*[^\\x00\\s{\\[(])?$"  # no answer ends on a space or an opening
# bracket: the model's ' "' or ' {"' meant a quotation's start, and its quote closed the string


def _each_subschema(schema: dict, rule: Callable[[Any], Any]) -> dict:
    """A copy of ``schema`` with ``rule`` applied to each of its direct subschemas (found by
    keyword, so a property named ``enum`` or ``default`` is a schema like any other, and
    ``const``, ``enum``, ``default`` and ``examples`` stay data)."""
    out = dict(schema)
    for key in json_schema.SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [rule(s) for s in out[key]]
    for key in json_schema.SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: rule(s) for name, s in out[key].items()}
    for key in json_schema.SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = rule(out[key])
    return out


def _close(schema: dict) -> dict:
    """``schema`` (changed in place) closed to keys it does not declare, unless it says what
    others may be: an object that declares no properties stays free-form."""
    if schema.get("properties") and not {"additionalProperties", "patternProperties"} & set(schema):
        schema["additionalProperties"] = False
    return schema


def closed(schema: Any) -> Any:
    """A copy of ``schema`` with every object that declares properties closed (see
    :func:`_close`), at every depth: a response format's or ``--json-schema``'s. llama.cpp's
    JSON-schema grammars (and so Ollama's and LM Studio's) read a missing
    ``additionalProperties`` so, and OpenAI's strict mode requires it; left open, a small
    model wrote invented keys, the same key again, until its token limit cut the JSON off."""
    if not isinstance(schema, dict):
        return schema
    return _close(_each_subschema(schema, closed))


def _bound(schema: Any, max_len: int) -> Any:
    """``schema`` as the grammar binds it, at every depth: strings with a maxLength and no
    NUL, numbers with bounds, and every object that declares properties closed to other
    keys (``additionalProperties: false``) unless it says otherwise, as OpenAI's strict mode
    has it: a model otherwise invents keys (``"temperature"`` where the tool declares
    ``"targetTemperature"``). An object that declares no properties stays free-form."""
    if not isinstance(schema, dict):
        return schema
    out = _each_subschema(schema, lambda s: _bound(s, max_len))
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "enum" not in out and "const" not in out:
        if "string" in types:  # a format (a uuid is 36 characters) or a minLength may need more
            least = out.get("minLength") if isinstance(out.get("minLength"), int) else 0
            out.setdefault("maxLength", max(max_len, least, 64 if "format" in out else 0))
            out.setdefault("pattern", NO_NUL)
        if "integer" in types or "number" in types:
            out.setdefault("minimum", -_NUMBER_BOUND)
            out.setdefault("maximum", _NUMBER_BOUND)
    _close(out)
    # llguidance refuses uniqueItems; a call with a repeated item fails the schema check
    # before it runs instead (the model is told why)
    out.pop("uniqueItems", None)
    # so does a fractional multipleOf's: llguidance spells its multiples oddly (for 0.25 it
    # takes 2.50 and 3, not 2.5 or 3.0; for 0.1 not 0.30), where a model writes JSON's
    # usual 2.5. A whole one it spells as integers are, and keeps.
    step = out.get("multipleOf")
    if isinstance(step, float) and not step.is_integer():
        del out["multipleOf"]
    return out


def _arguments_schema(parameters: dict, max_len: int) -> dict:
    """A tool's parameters as the grammar binds them: strings bounded, and no keys beyond
    the declared properties, at any depth, unless the schema itself allows them (OpenAI's
    strict mode). ``parameters`` is left as it was (the walk copies every schema it
    changes)."""
    params = _bound(parameters, max_len)
    params.setdefault("type", "object")
    if "$ref" not in params:  # one the tool kept (see tools.schema) declares the properties
        params.setdefault("properties", {})
        params.setdefault("additionalProperties", False)
    return params


def _local_ref(schema: dict) -> bool:
    """A JSON-pointer ``$ref`` into its own document (``#``, ``#/$defs/City``); an anchor
    (``#city``) names a place, not a path, and needs no re-rooting."""
    ref = schema.get("$ref")
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _local_refs(schema: Any) -> bool:
    """Whether ``schema`` or a subschema at any depth has a ``$ref`` into its own document
    (data such as a ``const`` that holds a ``$ref`` key is not a schema, and is not read)."""
    if not isinstance(schema, dict):
        return False
    found = [_local_ref(schema)]
    _each_subschema(schema, lambda s: found.append(_local_refs(s)))
    return any(found)


def _rerooted(schema: Any, root: str) -> Any:
    """``schema`` with its local ``$ref`` pointers (``#/$defs/City``) made to start at
    ``root`` (``#/$defs/tool0/$defs/City``)."""
    if not isinstance(schema, dict):
        return schema
    out = _each_subschema(schema, lambda s: _rerooted(s, root))
    if _local_ref(schema):
        out["$ref"] = root + schema["$ref"][1:]
    return out


def _arguments_schemas(params_list: Sequence[dict], max_len: int) -> tuple[list[dict], dict]:
    """Each tool's :func:`_arguments_schema`, and the ``$defs`` the grammar's root needs:
    parameters with local ``$ref`` pointers (Pydantic and zod write ``#/$defs/City``) would
    point at nothing nested under a call's ``arguments``, so they move to the root's
    ``$defs/tool<i>``, their pointers rewritten to match, and ``arguments`` refers there."""
    schemas, defs = [], {}
    for i, params in enumerate(params_list):
        bound = _arguments_schema(params, max_len)
        if _local_refs(bound):
            defs[f"tool{i}"] = _rerooted(bound, f"#/$defs/tool{i}")
            bound = {"$ref": f"#/$defs/tool{i}"}
        schemas.append(bound)
    return schemas, defs


def _with_defs(schema: dict, defs: dict) -> dict:
    return {**schema, "$defs": defs} if defs else schema


def check_compiles(grammar: str, tokenizer, what: str, err: str | None = None) -> None:
    """Raises GrammarError naming ``what`` unless ``grammar`` compiles (``err``: llguidance's
    report when the caller has it already)."""
    err = LLMatcher.validate_grammar(grammar, tokenizer) if err is None else err
    if err and not err.startswith("WARNING"):
        detail = " ".join(err.split())  # llguidance's multi-line report, on one line
        raise GrammarError(f"{what} cannot be compiled by llguidance: {detail[:240]}")


def _signature(tools: Sequence[Tool], protocol: str) -> str:
    """What a grammar depends on (names and parameter schemas), as a hashable cache key."""
    return json.dumps([[t.name, _ordered(t, protocol)] for t in tools])  # key order matters


@functools.lru_cache(maxsize=32)
def _check_tools(signature: str, tokenizer, max_len: int) -> None:
    """Compile each tool's parameters alone, to name the tool whose schema fails."""
    for name, params in json.loads(signature):
        grammar, err = _one_tool(params, max_len, tokenizer)
        if err.startswith("Unsatisfiable"):  # among others it would silently never be called
            if max_len < _UNBOUNDED and \
                    not _one_tool(params, _UNBOUNDED, tokenizer)[1].startswith("Unsatisfiable"):
                raise GrammarError(f"tool {name!r}: its strings need more than the "
                                   f"{max_len} characters a reply's token limit allows; "
                                   "raise the token limit (max_tokens)")
            raise GrammarError(f"tool {name!r}: no arguments satisfy its parameters schema "
                               "(a minimum above its maximum, an empty enum, a minLength "
                               "above its maxLength, ...); fix the schema")
        check_compiles(grammar, tokenizer, f"tool {name!r} (its parameters schema)", err)


_UNBOUNDED = 1 << 20


def _special_literal(schema: Any, specials: Sequence[str]) -> tuple[str, str] | None:
    """The first text the grammar of ``schema`` may have to write (a property name, a
    ``const`` or ``enum`` value, a ``pattern``'s literal text) that holds one of
    ``specials``, with that special token."""
    todo = [schema]
    while todo:
        node = todo.pop()
        if not isinstance(node, dict):
            continue
        texts = list(node["properties"]) if isinstance(node.get("properties"), dict) else []
        if "const" in node:
            texts.append(json.dumps(node["const"], ensure_ascii=False))
        if isinstance(node.get("enum"), list):
            texts += [json.dumps(v, ensure_ascii=False) for v in node["enum"]]
        if isinstance(node.get("pattern"), str):  # its literal text, escapes dropped
            texts.append(node["pattern"].replace("\\", ""))
        for text in texts:
            for special in specials:
                if special in text:
                    return text, special
        _each_subschema(node, todo.append)
    return None


@functools.lru_cache(maxsize=64)
def _check_literals(signature: str, specials: tuple[str, ...]) -> None:
    """Refuses a schema (``signature``: JSON ``[[what, schema], ...]``) that makes the model
    write a special token's text: llguidance writes it as the special token itself, which
    ends the reply (the stop token) or is no text at all (a tester's enum of "<|im_end|>"
    gave a reply of one quote)."""
    for what, schema in json.loads(signature):
        found = _special_literal(schema, specials)
        if found is not None:
            text, special = found
            raise GrammarError(f"{what} has {text[:80]!r}, which holds the special token "
                               f"{special!r}: the model can write it only as that token, "
                               "which ends or breaks the reply; reword it")


def _one_tool(params: dict, max_len: int, tokenizer) -> tuple[str, str]:
    """The grammar of one call's arguments (required) and llguidance's report on it."""
    (arguments,), defs = _arguments_schemas([params], max_len)
    one = _with_defs({"type": "object", "properties": {"arguments": arguments},
                      "required": ["arguments"]}, defs)
    grammar = LLMatcher.grammar_from_json_schema(one, defaults=_guidance("json"))
    return grammar, LLMatcher.validate_grammar(grammar, tokenizer)


def schema_problem(params: dict, max_len: int = DEFAULT_MAX_STRING) -> str | None:
    """What llguidance refuses in a tool's ``params`` (None when it compiles), judged with
    no tokenizer: what ``synth`` checks before it writes tasks for a tool that ``agent``
    and ``eval`` would refuse at start-up. Literals that need the tokenizer are not judged."""
    err = _one_tool(params, max_len, None)[1]
    return " ".join(err.split())[:240] if err and not err.startswith("WARNING") else None


def forced_call(name: str, arguments: dict) -> str:
    """The choice that allows exactly one call, ``name(arguments)``: the model still
    samples every token, but only that path is open (guided rollouts, corrections)."""
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True)


def is_forced(choice: str) -> bool:
    return choice.startswith("{")


def _forced(pairs: list, choice: str) -> tuple[str, dict]:
    """A forced call's (name, parameters schema): each argument a constant, in the order of
    the tool's own properties (the order the unforced grammar requires)."""
    forced = json.loads(choice)
    name, args = forced["name"], forced["arguments"]
    tool = dict(pairs).get(name)
    if tool is None:
        known = ", ".join(n for n, _ in pairs) or "none"
        raise GrammarError(f"the forced call names {name!r}, which is not a tool here "
                           f"(tools: {known})", param="tool_choice")
    problems = [e.message for e in Validator(tool).iter_errors(args)]
    if problems:
        raise GrammarError(f"the forced call of {name!r} does not fit its schema: {problems[0]}",
                           param="tool_choice")
    order = list(tool.get("properties", {}))
    keys = sorted(args, key=lambda k: order.index(k) if k in order else len(order))
    return name, {"type": "object", "properties": {k: {"const": args[k]} for k in keys},
                  "required": keys}


def _chosen(pairs: list, choice: str) -> tuple[list, bool]:
    """The (name, parameters) pairs a reply may call under ``choice``, and whether it may
    answer instead."""
    if is_forced(choice):
        return [_forced(pairs, choice)], False
    if choice == "auto":
        return pairs, True
    if choice == "none":
        return [], True
    if choice == "required":
        if not pairs:
            raise GrammarError("tool_choice 'required' needs at least one tool",
                               param="tool_choice")
        return pairs, False
    named = [p for p in pairs if p[0] == choice]
    if not named:
        known = ", ".join(name for name, _ in pairs) or "none"
        raise GrammarError(f"tool_choice names {choice!r}, which is not a tool here "
                           f"(tools: {known}); use auto, required, none or a tool's name",
                           param="tool_choice")
    return named, False


def _json_protocol_schema(pairs: list, max_len: int, choice: str = "auto",
                          bound_answer: bool = True) -> dict:
    pairs, may_answer = _chosen(pairs, choice)
    arguments, defs = _arguments_schemas([params for _, params in pairs], max_len)
    shapes = [{
        "type": "object",
        "properties": {"tool": {"const": name}, "arguments": args},
        "required": ["tool", "arguments"], "additionalProperties": False,
    } for (name, _), args in zip(pairs, arguments)]
    if may_answer:
        answer = {"type": "string", "pattern": ANSWER_END,
                  **({"maxLength": max_len} if bound_answer else {})}
        shapes.append({"type": "object", "properties": {"answer": answer},
                       "required": ["answer"], "additionalProperties": False})
    return _with_defs({"anyOf": shapes}, defs)


@functools.lru_cache(maxsize=32)
def _json_grammar(signature: str, tokenizer, max_len: int, choice: str, parallel: bool,
                  bound_answer: bool) -> str:
    pairs = json.loads(signature)
    _check_tools(signature, tokenizer, max_len)
    schema = _json_protocol_schema(pairs, max_len, choice, bound_answer)
    if parallel and choice != "none" and not is_forced(choice):  # calls, one object per line
        calls = _with_defs({"anyOf": [s for s in schema["anyOf"] if "tool" in s["properties"]]},
                           schema.get("$defs", {}))
        answer = [s for s in schema["anyOf"] if "answer" in s["properties"]]
        guidance = {"x-guidance": _guidance("json")}
        lark = 'start: calls\ncalls: call ("\\n" call)*\n' + \
            f"call: %json {json.dumps({**calls, **guidance})}\n"
        if answer:
            lark = lark.replace("start: calls", "start: calls | answer") + \
                f"answer: %json {json.dumps({**answer[0], **guidance})}\n"
        grammar = LLMatcher.grammar_from_lark(lark)
    else:
        grammar = LLMatcher.grammar_from_json_schema(schema, defaults=_guidance("json"))
    check_compiles(grammar, tokenizer, "the tool-call grammar")
    return grammar


def json_protocol_grammar(tools: Sequence[Tool], tokenizer, max_len: int = DEFAULT_MAX_STRING,
                          choice: str = "auto", parallel: bool = False,
                          bound_answer: bool = True) -> str:
    """The json protocol's grammar for ``tools`` (compiled once per tool set and choice);
    ``parallel`` allows several calls in one reply, a line each; ``bound_answer=False``
    leaves the answer's length to the token limit (the server reports that as "length")."""
    return _json_grammar(_signature(tools, "json"), tokenizer, max_len, choice, parallel,
                         bound_answer)


def _tag(text: str, special_ids: dict[str, int]) -> str:
    """A Lark terminal for a tag: the special token itself when the tokenizer has one."""
    return f"<[{special_ids[text]}]>" if text in special_ids else json.dumps(text)


def hermes_grammar(tools: Sequence[Tool], tokenizer, max_len: int = DEFAULT_MAX_STRING,
                   special_ids: dict[str, int] | None = None, choice: str = "auto",
                   parallel: bool = True) -> str:
    """Free text, or ``<tool_call>`` blocks with a valid call each (one block only when
    ``parallel`` is false).

    ``special_ids`` maps tag strings that are single special tokens (``<tool_call>`` in
    Qwen's vocabulary, say) to their ids, so the grammar matches the token, not the text.
    """
    key = json.dumps(sorted((special_ids or {}).items()))
    return _hermes_grammar(_signature(tools, "hermes"), tokenizer, max_len, key, choice,
                           parallel)


@functools.lru_cache(maxsize=32)
def _hermes_grammar(signature: str, tokenizer, max_len: int, special_key: str, choice: str,
                    parallel: bool) -> str:
    special_ids = dict(json.loads(special_key))
    pairs, may_answer = _chosen(json.loads(signature), choice)
    arguments, defs = _arguments_schemas([params for _, params in pairs], max_len)
    calls = _with_defs({"anyOf": [{
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": args},
        "required": ["name", "arguments"], "additionalProperties": False}
        for (name, _), args in zip(pairs, arguments)]}, defs)
    open_tag, close_tag = _tag("<tool_call>", special_ids), _tag("</tool_call>", special_ids)
    start = [alt for alt, on in (("TEXT", may_answer), ("calls", bool(pairs))) if on]
    lark = f"start: {' | '.join(start)}\n" + "TEXT: /[^<\\s][^<]*/\n"
    if pairs:
        several = parallel and not is_forced(choice)  # a forced call is made once
        lark += (
            ('calls: (call "\\n"?)+\n' if several else "calls: call\n")
            + f'call: {open_tag} "\\n" json_call "\\n" {close_tag}\n'
            + f"json_call: %json {json.dumps({**calls, 'x-guidance': _guidance('hermes')})}\n"
        )
    grammar = LLMatcher.grammar_from_lark(lark)
    check_compiles(grammar, tokenizer, "the hermes tool-call grammar")
    return grammar


def tool_constraint(lm, protocol: str, tools: Sequence[Tool], max_tokens: int,
                    choice: str = "auto", parallel: bool = False,
                    bound_answer: bool = True) -> "Constraint":
    """The constraint for one reply of ``protocol`` ("json" or "hermes") over ``tools``;
    the grammar is compiled once per tool set, choice and budget, the matcher is new."""
    tokenizer = ll_tokenizer(lm)
    budget = string_budget(max_tokens)
    _check_literals(json.dumps([[f"tool {t.name!r}: its parameters schema", t.parameters]
                                for t in tools]), tuple(special_tokens(lm.tokenizer)))
    if protocol == "json":
        grammar = json_protocol_grammar(tools, tokenizer, budget, choice, parallel,
                                        bound_answer)
    else:
        specials = set(special_tokens(lm.tokenizer))
        ids = {tag: lm.encode(tag)[0] for tag in ("<tool_call>", "</tool_call>")
               if tag in specials and len(lm.encode(tag)) == 1}
        grammar = hermes_grammar(tools, tokenizer, budget, special_ids=ids, choice=choice,
                                 parallel=parallel)
    return Constraint(tokenizer, grammar, lm.vocab_size)


def grammar_from_file(path: str, kind: str, tokenizer) -> str:
    """A grammar from a JSON Schema file (``kind="json-schema"``) or a Lark file."""
    try:
        text = read_regular(path).decode("utf-8")
    except OSError as e:
        raise GrammarError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise GrammarError(f"cannot read {path}: it is not UTF-8 text") from None
    if not text.strip():
        raise GrammarError(f"{path} is empty; write a {kind.replace('-', ' ')} in it")
    if kind == "json-schema":
        try:
            schema = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise GrammarError(f"{path} is not a JSON schema: {e}") from None
        _check_schema(schema, str(path))  # first: llguidance crashed on some
        try:
            grammar = LLMatcher.grammar_from_json_schema(json.dumps(closed(schema)))
        except ValueError as e:
            raise GrammarError(f"{path} is not a JSON schema: {e}") from None
    else:
        grammar = LLMatcher.grammar_from_lark(text)
    check_compiles(grammar, tokenizer, path)
    return grammar


def _check_schema(schema, what: str) -> None:
    """Raises GrammarError naming ``what`` for a schema no grammar should be made of (see
    :mod:`mlx_agent.json_schema`): a response_format's or a file's is bounded as the tools a
    request declares are."""
    if json_schema.too_many_nodes(schema, json_schema.MAX_VALUES):
        raise GrammarError(f"{what} {json_schema.TOO_MANY}")
    inexact = json_schema.inexact_integer(schema) or json_schema.unusable(schema)
    if inexact:
        raise GrammarError(f"{what}: '{inexact[0]}' {inexact[1]}")
    if json_schema.too_deep(schema):
        raise GrammarError(f"{what} {json_schema.TOO_DEEP}")
    if json_schema.endless(schema):
        raise GrammarError(f"{what} {json_schema.ENDLESS}")


class Constraint:
    """One decoding constraint: mask before each token, consume after it."""

    def __init__(self, tokenizer, grammar: str, vocab_size: int):
        self.matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32  # int32 words in a mask
        self._buf = np.full(self.words, -1, dtype=np.int32)
        self._after_space: Rule | None = None  # lone_space_rule's, after a lone space
        self._masked = False  # _buf holds the mask for the next token

    def reset(self) -> None:
        self.matcher.reset()
        self._after_space = None
        self._masked = False

    def mask_words(self) -> np.ndarray:
        """The allowed-token bitmask for the next token as int32 words (computed on the
        CPU, into a buffer reused by the next call). After a lone space, tokens that start
        with a letter are masked too, where the grammar would take a token that starts with
        a space instead (:mod:`mlx_agent.lone_space`)."""
        self.matcher.unsafe_compute_mask_ptr(self._buf.ctypes.data, self._buf.nbytes)
        self._check_failed()
        self._masked = True  # the mask the next token is sampled under: see consume()
        rule = self._after_space
        if rule is not None:
            n = min(len(rule.allowed), self.words)
            if (self._buf[:n] & rule.space_led[:n]).any():
                self._buf[:n] &= rule.allowed[:n]
        return self._buf

    def mask(self) -> mx.array:
        return mx.array(self.mask_words())

    def admitting(self, what: str, kind: str = "text") -> "Constraint":
        """``self``, or a GrammarError when ``what`` admits no ``kind`` at all: its grammar
        is over before the first token (say, a JSON schema ``$ref`` that only refers to
        itself), where generating would return nothing and call it done."""
        self.mask_words()
        if self.done:
            raise GrammarError(f"{what} admits no {kind}")
        return self

    def consume(self, token: int) -> None:
        offered = self._masked and 0 <= token < 32 * self.words and \
            bool((int(self._buf[token // 32]) >> (token % 32)) & 1)
        self._masked = False
        self.matcher.consume_token(token)
        if offered:  # a token the grammar offered, and then it failed: it gave up. A token
            self._check_failed()  # it never offered (a script's) just ends it, as before
        text = self.tokenizer.decode_bytes([token])
        self._after_space = None
        if text.endswith(b" ") and not text.strip():
            rule = lone_space_rule(self.tokenizer)
            if rule is not None and token in rule.ends:
                self._after_space = rule

    @property
    def done(self) -> bool:
        """The grammar reached its end state (or failed): no more tokens."""
        return self.matcher.is_stopped() or self.matcher.is_error()

    def _check_failed(self) -> None:
        """A GrammarError when llguidance gave up mid-reply: a schema that compiled can
        still be too much for its lexer a few tokens in ("too many expressions
        constructed"); the reply used to end there as if finished (an empty "stop")."""
        if self.matcher.is_error():
            raise GrammarError(f"the grammar gave up mid-reply ({self.matcher.get_error()[:200]})"
                               "; simplify the schema (fewer or shorter lengths, patterns or "
                               "references)")


@functools.lru_cache(maxsize=16)
def _schema_grammar(schema_json: str, tokenizer, what: str) -> str:
    try:
        grammar = LLMatcher.grammar_from_json_schema(
            schema_json, defaults={"whitespace_flexible": False})
    except ValueError as e:
        raise GrammarError(f"{what} is not usable: {e}") from None
    check_compiles(grammar, tokenizer, what)
    return grammar


def schema_constraint(lm, schema: dict, field: str = "response_format") -> Constraint:
    """A constraint that allows JSON of ``schema`` only (a request's ``field``: OpenAI's
    ``response_format``, Ollama's ``format``, named in errors)."""
    tokenizer = ll_tokenizer(lm)
    what = f"the {field} schema"
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        raise GrammarError(f"{what} is not JSON a grammar can use") from None
    _check_schema(schema, what)  # first: its size bounds the validation below
    bad = _meta_schema_problem(key)  # as a tool's parameters are checked
    if bad:
        where = f": '{bad[0]}'" if bad[0] else ""
        raise GrammarError(f"{what}{where} is not valid JSON Schema: {bad[1]}")
    _check_literals(json.dumps([[what, schema]]), tuple(special_tokens(lm.tokenizer)))
    grammar = _schema_grammar(json.dumps(closed(schema), sort_keys=True), tokenizer, what)
    constraint = Constraint(tokenizer, grammar, lm.vocab_size)
    return constraint.admitting(what, "JSON value")


@functools.lru_cache(maxsize=64)
def _meta_schema_problem(key: str) -> tuple[str, str] | None:
    """Checked once per distinct schema: a client sends the same one with every request."""
    return meta_schema_problem(json.loads(key))

"""Grammar-constrained decoding: what the grammars accept, and what models emit under them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from llguidance import LLMatcher

from mlx_agent.formats import make_format
from mlx_agent.engine import SamplingParams
from mlx_agent.grammar import (Constraint, GrammarError, json_protocol_grammar, ll_tokenizer)
from mlx_agent.models import load
from mlx_agent.models import tinygpt_format as fmt
from mlx_agent.tools import ToolSchemaError, load_tools, parse_tools

from .conftest import random_tinygpt_file

DATA = Path(__file__).parent / "data"
TOOLS = load_tools(DATA / "catalogue.json")
BY_NAME = {t.name: t for t in TOOLS}

VALID = [
    '{"tool":"get_weather","arguments":{"city":"Paris"}}',
    '{"tool":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}',
    '{"tool":"add_numbers","arguments":{"a":2,"b":-3}}',
    '{"tool":"send_email","arguments":{"to":"a@b.c","subject":"Hi","body":"x\\ny \\"q\\""}}',
    '{"tool":"set_timer","arguments":{"minutes":5}}',
    '{"answer":"The capital of France is Paris."}',
    '{"answer":""}',
]
INVALID = [
    '{"tool":"get_wether","arguments":{"city":"Paris"}}',  # wrong tool name
    '{"tool":"get_weather","arguments":{}}',  # missing required argument
    '{"tool":"add_numbers","arguments":{"a":"2","b":3}}',  # wrong type
    '{"tool":"add_numbers","arguments":{"a":1.5,"b":3}}',  # number for an integer
    '{"tool":"get_weather","arguments":{"city":"Paris","unit":"kelvin"}}',  # not in the enum
    '{"tool":"get_weather","arguments":{"city":"Paris","extra":1}}',  # unknown key
    '{"answer":"x"} and more',  # extra text after the object
    '{"answer":5}',  # answer must be a string
    'Sure, here you go',  # no object
]


@pytest.fixture(scope="module")
def smol(real_model):
    tok = ll_tokenizer(real_model)
    return real_model, tok, json_protocol_grammar(TOOLS, tok)


def accepts(lm, tok, grammar, text) -> bool:
    c = Constraint(tok, grammar, lm.vocab_size)
    ids = lm.encode(text)
    return c.matcher.validate_tokens(ids) == len(ids) and (
        c.matcher.consume_tokens(ids) and c.matcher.is_accepting())


@pytest.mark.parametrize("text", VALID)
def test_grammar_accepts_valid_calls_and_answers(smol, text):
    assert accepts(*smol, text)


@pytest.mark.parametrize("text", INVALID)
def test_grammar_rejects_invalid_ones(smol, text):
    assert not accepts(*smol, text)


def test_real_model_calls_always_parse_and_validate_at_temperature_1(smol):
    lm, tok, grammar = smol
    c = Constraint(tok, grammar, lm.vocab_size)
    engine = lm.engine(context_length=1024)
    seen_calls = cut = 0
    for seed in range(8):
        for prompt in ("What's the weather in Rome?", "Add 4 and 9."):
            engine.sync(make_format("json", lm).prompt_ids(
                [{"role": "user", "content": prompt}], TOOLS))
            c.reset()
            ids = list(engine.generate(SamplingParams(temperature=1.0, seed=seed).sampler(),
                                       max_tokens=128, stop_ids=lm.stop_ids, constraint=c))
            if not c.done:  # at temperature 1 an answer may ramble past the token limit
                assert len(ids) == 128, lm.decode(ids)  # ... but only then is it unfinished
                cut += 1
                continue
            obj = json.loads(lm.decode(ids))
            if "tool" in obj:
                seen_calls += 1
                assert BY_NAME[obj["tool"]].validate(obj["arguments"]) == []
            else:
                assert set(obj) == {"answer"} and isinstance(obj["answer"], str)
    assert seen_calls > 0 and cut <= 4


@pytest.mark.parametrize("tokenizer", ["byte-level", "sentencepiece"])
def test_random_tiny_models_emit_valid_json_under_the_grammar(tmp_path, tokenizer):
    """Even a random model writes only valid calls: the adapter works for every tokenizer."""
    f = random_tinygpt_file(seed=5)
    if tokenizer == "sentencepiece":
        import io

        import sentencepiece as spm

        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(['{"tool": "add_numbers", "arguments": {"a": 1}}'] * 50
                                   + ["hello world tools"] * 50),
            model_writer=buf, vocab_size=300, model_type="unigram", byte_fallback=True,
            hard_vocab_limit=False, minloglevel=2)
        proto = buf.getvalue()
        n = spm.SentencePieceProcessor(model_proto=proto).get_piece_size()
        f = random_tinygpt_file(config={**f.config, "vocabSize": n}, seed=5)
        f.sentencepiece = proto
    path = tmp_path / "m.tinygpt"
    fmt.write(path, f)
    lm = load(path)
    tok = ll_tokenizer(lm)
    c = Constraint(tok, json_protocol_grammar(TOOLS, tok, max_len=8), lm.vocab_size)
    finished = 0
    for seed in range(4):
        engine = lm.engine()
        engine.prefill(lm.encode("{"))
        c.reset()
        ids = list(engine.generate(SamplingParams(temperature=1.0, seed=seed).sampler(),
                                   max_tokens=120, constraint=c))
        assert not c.matcher.is_error(), (lm.decode(ids), c.matcher.get_error()[:300])
        if not c.done:  # a random model may still be inside a (bounded) value: a valid prefix
            continue
        finished += 1
        obj = json.loads(lm.decode(ids))
        if "tool" in obj:
            assert BY_NAME[obj["tool"]].validate(obj["arguments"]) == []
    assert finished >= 2


def test_an_uncompilable_schema_names_the_tool(smol):
    lm, tok, _ = smol
    tools = parse_tools(json.dumps([{"name": "lookahead", "_exec": "x", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)b"}}}}]))
    with pytest.raises(GrammarError, match="tool 'lookahead'.*regex parse error"):
        json_protocol_grammar(tools, tok)


@pytest.mark.parametrize("prop", [{"type": "integer", "minimum": 10, "maximum": 1},
                                  {"enum": []},
                                  {"type": "string", "minLength": 5, "maxLength": 2}])
def test_a_tool_no_arguments_satisfy_is_named_not_silently_never_called(smol, prop):
    lm, tok, _ = smol
    tools = parse_tools(json.dumps([
        {"name": "fine", "_exec": "x", "parameters": {"type": "object", "properties": {}}},
        {"name": "never", "_exec": "x", "parameters": {
            "type": "object", "properties": {"p": prop}, "required": ["p"]}}]))
    with pytest.raises(GrammarError, match="tool 'never': no arguments satisfy its parameters"):
        json_protocol_grammar(tools, tok)


def test_strings_get_the_room_their_format_or_pattern_needs_or_the_limit_is_named(smol):
    lm, tok, _ = smol
    tools = parse_tools(json.dumps([{"name": "get", "_exec": "x", "parameters": {
        "type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                         "code": {"type": "string", "minLength": 40}},
        "required": ["id", "code"]}}]))
    grammar = json_protocol_grammar(tools, tok, max_len=32)  # a 36-character uuid fits
    uuid = "123e4567-e89b-12d3-a456-426614174000"
    assert accepts(lm, tok, grammar, '{"tool":"get","arguments":{"id":"%s","code":"%s"}}'
                   % (uuid, "x" * 40))
    tools = parse_tools(json.dumps([{"name": "spell", "_exec": "x", "parameters": {
        "type": "object", "properties": {"w": {"type": "string", "pattern": "^[a-z]{40}$"}},
        "required": ["w"]}}]))
    with pytest.raises(GrammarError, match="its strings need more than the 32 characters"):
        json_protocol_grammar(tools, tok, max_len=32)


def test_nested_objects_that_declare_properties_take_no_other_keys(smol):
    lm, tok, _ = smol
    body = {"type": "object", "properties": {"targetTemperature": {"type": "integer"}}}
    tools = parse_tools(json.dumps([{"name": "set_ac", "_exec": "x", "parameters": {
        "type": "object", "properties": {
            "body": body, "rooms": {"type": "array", "items": body},
            "extra": {"type": "object"},  # declares nothing: free-form
            "labels": {"type": "object", "properties": {"a": {"type": "string"}},
                       "additionalProperties": {"type": "string"}}}}}]))
    grammar = json_protocol_grammar(tools, tok)
    call = '{"tool":"set_ac","arguments":%s}'
    assert accepts(lm, tok, grammar, call % '{"body":{"targetTemperature":20}}')
    assert not accepts(lm, tok, grammar, call % '{"body":{"temperature":20}}')
    assert not accepts(lm, tok, grammar, call % '{"rooms":[{"temp":20}]}')
    assert accepts(lm, tok, grammar, call % '{"extra":{"anything":1}}')
    assert accepts(lm, tok, grammar, call % '{"labels":{"a":"x","b":"y"}}')


def test_unique_items_arrays_compile_and_duplicates_are_left_to_validation(smol):
    # llguidance does not implement uniqueItems: every tool with a set-like array (a
    # Pydantic set[str], synth's generated catalogues' lists of enums) was refused at
    # start-up, so `eval` could not run the tasks `synth` wrote for those catalogues
    from mlx_agent.grammar import hermes_grammar
    from mlx_agent.synth.catalogues import generate_tools

    lm, tok, _ = smol
    tags = {"type": "array", "items": {"enum": ["red", "blue"]}, "uniqueItems": True}
    tools = parse_tools(json.dumps([{"name": "tag", "_exec": "x", "parameters": {
        "type": "object", "properties": {"tags": tags}, "required": ["tags"]}}]))
    grammar = json_protocol_grammar(tools, tok)
    assert accepts(lm, tok, grammar, '{"tool":"tag","arguments":{"tags":["red","blue"]}}')
    assert not accepts(lm, tok, grammar, '{"tool":"tag","arguments":{"tags":["green"]}}')
    assert tools[0].validate({"tags": ["red", "red"]})  # the check before a call runs
    hermes_grammar(tools, tok)
    unique = [t for _, t in generate_tools(0) if "uniqueItems" in json.dumps(t)]
    assert unique
    json_protocol_grammar(parse_tools(json.dumps(unique)), tok)


def test_a_fractional_multiple_of_is_left_to_validation_and_numbers_are_written_as_taken(smol):
    # llguidance took 2.50 and 3 for a multipleOf of 0.25, not 2.5 or 3.0 (JSON's usual
    # spellings, and what the training rows wrote)
    from mlx_agent.grammar import call_text, hermes_grammar

    lm, tok, _ = smol
    tools = parse_tools(json.dumps([{"name": "pay", "_exec": "x", "parameters": {
        "type": "object", "required": ["amount"], "properties": {
            "amount": {"type": "number", "multipleOf": 0.25},
            "count": {"type": "integer", "multipleOf": 3},
            "size": {"type": "integer", "enum": [1.0, 2.0]}}}}]))
    grammar = json_protocol_grammar(tools, tok)
    for args, want in [({"amount": 2.5}, True), ({"amount": 3.0}, True), ({"amount": 2.3}, True),
                       ({"amount": -0.0, "count": 6.0, "size": 2.0}, True),
                       ({"amount": 1e-05}, True), ({"amount": 1, "count": 4}, False)]:
        text = call_text("json", tools[0], args)
        assert accepts(lm, tok, grammar, text) == want, text
    assert call_text("json", tools[0], {"amount": 1e-05, "size": 2.0}) == \
        '{"tool":"pay","arguments":{"amount":0.00001,"size":2}}'
    assert tools[0].validate({"amount": 2.3})  # the check before a call runs
    hermes = hermes_grammar(tools, tok)
    assert accepts(lm, tok, hermes, call_text("hermes", tools[0], {"amount": 2.5, "size": 1.0}))


def test_one_of_compiles_as_any_of_and_exclusivity_is_left_to_validation(smol):
    # llguidance refuses oneOf unless told to read it as anyOf: every tool with a Pydantic
    # union or an OpenAPI oneOf was refused at start-up
    from mlx_agent.grammar import hermes_grammar

    lm, tok, _ = smol
    # members llguidance cannot prove apart: "7" would fit both
    target = {"oneOf": [{"type": "string", "pattern": "^[0-9]+$"},
                        {"type": "string", "maxLength": 3}]}
    tools = parse_tools(json.dumps([{"name": "find", "_exec": "x", "parameters": {
        "type": "object", "properties": {"who": target}, "required": ["who"]}}]))
    grammar = json_protocol_grammar(tools, tok)
    assert accepts(lm, tok, grammar, '{"tool":"find","arguments":{"who":"12345"}}')
    assert accepts(lm, tok, grammar, '{"tool":"find","arguments":{"who":"ab"}}')
    assert not accepts(lm, tok, grammar, '{"tool":"find","arguments":{"who":"abcd"}}')
    assert not tools[0].validate({"who": "12345"})
    # both members at once: the grammar's anyOf takes it, the check before the call does not
    assert tools[0].validate({"who": "7"})
    hermes_grammar(tools, tok)


def test_parameters_with_local_refs_are_read_where_they_point(smol):
    # Pydantic and zod write $defs and #/$defs/... pointers, which nested under a call's
    # "arguments" pointed at nothing: every such tool was refused
    from mlx_agent.grammar import hermes_grammar

    lm, tok, _ = smol
    city = {"type": "object", "properties": {"name": {"type": "string"},
                                             "country": {"type": "string"}},
            "required": ["name"]}
    node = {"type": "object", "properties": {"v": {"type": "integer"},
                                             "next": {"$ref": "#/$defs/Node"}}}
    tools = parse_tools(json.dumps([
        {"name": "book", "_exec": "x", "parameters": {
            "type": "object", "$defs": {"City": city, "Node": node},
            "properties": {"origin": {"$ref": "#/$defs/City"},
                           "dest": {"$ref": "#/$defs/City"}, "chain": {"$ref": "#/$defs/Node"}},
            "required": ["origin", "dest"]}},
        {"name": "pick", "_exec": "x", "parameters": {  # draft-07's "definitions"
            "type": "object", "definitions": {"C": {"type": "string", "enum": ["a", "b"]}},
            "properties": {"c": {"$ref": "#/definitions/C"}}, "required": ["c"]}}]))
    ok = ['{"tool":"book","arguments":{"origin":{"name":"Oslo"},"dest":{"name":"Rome",'
          '"country":"IT"},"chain":{"v":1,"next":{"v":2}}}}',
          '{"tool":"pick","arguments":{"c":"b"}}']
    bad = ['{"tool":"book","arguments":{"origin":{"name":"Oslo"},"dest":{"town":"Rome"}}}',
           '{"tool":"book","arguments":{"origin":{"name":"Oslo"},"dest":{"name":"Rome"},'
           '"chain":{"v":"one"}}}', '{"tool":"pick","arguments":{"c":"z"}}']
    for parallel in (False, True):
        grammar = json_protocol_grammar(tools, tok, parallel=parallel)
        assert all(accepts(lm, tok, grammar, text) for text in ok)
        assert not any(accepts(lm, tok, grammar, text) for text in bad)
    grammar = hermes_grammar(tools, tok)
    for text, want in [(t, True) for t in ok] + [(t, False) for t in bad]:
        text = text.replace('{"tool":', '{"name":')
        assert accepts(lm, tok, grammar, f"<tool_call>\n{text}\n</tool_call>") == want, text
    forced = json_protocol_grammar(tools, tok, choice=json.dumps(
        {"name": "pick", "arguments": {"c": "a"}}))
    assert accepts(lm, tok, forced, '{"tool":"pick","arguments":{"c":"a"}}')


PARAMS = {"type": "object", "properties": {"x": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["x"]}


@pytest.mark.parametrize("parameters", [
    {"type": "object", "$ref": "#/$defs/P", "$defs": {"P": PARAMS}},
    # zod-to-json-schema's form, a chain of two links
    {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/Args",
     "definitions": {"Args": {"$ref": "#/definitions/P"}, "P": PARAMS}}])
def test_a_top_level_ref_is_read_where_it_points(smol, parameters):
    # the grammar set "properties": {} and "additionalProperties": false beside the $ref, so
    # no arguments fitted ("no arguments satisfy its parameters schema"), and the prompt
    # showed the tool as t(): no parameters
    from mlx_agent.grammar import hermes_grammar
    from mlx_agent.synth.values import Sampler
    from mlx_agent.tools import declared_tools

    lm, tok, _ = smol
    entry = {"name": "t", "_exec": 'echo "$x"', "parameters": parameters}
    declared = {"type": "function", "function": {"name": "t", "parameters": parameters}}
    for tools in (parse_tools(json.dumps([entry])), declared_tools([declared])):
        (tool,) = tools
        assert tool.signature() == "t(x: string, n?: integer)"
        assert tool.validate({"x": "a"}) == [] and tool.validate({"n": 1})
        ok, bad = ['{"x":"a"}', '{"x":"a","n":2}'], ['{}', '{"n":2}', '{"x":"a","y":1}']
        grammar = json_protocol_grammar(tools, tok)
        for args, want in [(a, True) for a in ok] + [(a, False) for a in bad]:
            assert accepts(lm, tok, grammar, f'{{"tool":"t","arguments":{args}}}') == want, args
        grammar = hermes_grammar(tools, tok)
        for args, want in [(a, True) for a in ok] + [(a, False) for a in bad]:
            text = f'<tool_call>\n{{"name":"t","arguments":{args}}}\n</tool_call>'
            assert accepts(lm, tok, grammar, text) == want, args
    assert tools[0].validate(Sampler(random.Random(0), "train").arguments(tools[0])) == []
    assert parse_tools(json.dumps([entry]))[0].exec_args == ("n", "x")


def test_a_top_level_ref_kept_beside_other_keywords_still_admits_its_calls(smol):
    # merged with minProperties the $ref would mean something else: it stays, and the
    # grammar no longer closes the top level to every key beside it
    lm, tok, _ = smol
    entry = {"name": "t", "parameters": {"$ref": "#/$defs/P", "minProperties": 2,
                                         "$defs": {"P": PARAMS}}}
    tools = parse_tools(json.dumps([entry]), runnable=False)  # a client's: it runs them
    assert "$ref" in tools[0].parameters
    grammar = json_protocol_grammar(tools, tok)
    assert accepts(lm, tok, grammar, '{"tool":"t","arguments":{"x":"a","n":1}}')
    assert not accepts(lm, tok, grammar, '{"tool":"t","arguments":{"x":"a","y":1}}')
    # one we run would get no arguments in _exec's variables (it read no properties): refused
    with pytest.raises(ToolSchemaError, match=r"tool 't': field 'parameters' is a \$ref with "
                                              r"'minProperties' beside it, so its properties "
                                              r"cannot be read"):
        parse_tools(json.dumps([{**entry, "_exec": 'echo "$x"'}]))


def test_hermes_grammar_binds_only_inside_tool_call_tags(smol):
    from mlx_agent.grammar import hermes_grammar

    lm, tok, _ = smol
    grammar = hermes_grammar(TOOLS, tok)
    assert accepts(lm, tok, grammar, "The capital of France is Paris.")
    ok = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    assert accepts(lm, tok, grammar, ok)
    assert accepts(lm, tok, grammar, ok + "\n" + ok.replace("Paris", "Oslo"))
    assert not accepts(lm, tok, grammar, ok.replace("get_weather", "get_wether"))
    assert not accepts(lm, tok, grammar, ok.replace('"city":"Paris"', '"town":"Paris"'))


def test_hermes_tags_that_are_special_tokens_match_the_token(smol):
    """As in Qwen's vocabulary; here SmolLM2's control tokens <repo_name> and <file_sep>
    (ids 3 and 5) stand in."""
    from mlx_agent.grammar import hermes_grammar

    lm, tok, _ = smol
    assert lm.encode("<repo_name><file_sep>") == [3, 5]
    grammar = hermes_grammar(TOOLS, tok, special_ids={"<tool_call>": 3, "</tool_call>": 5})
    call = '\n{"name":"set_timer","arguments":{"minutes":5}}\n'
    assert accepts(lm, tok, grammar, "<repo_name>" + call + "<file_sep>")
    assert not accepts(lm, tok, grammar, "<tool_call>" + call + "</tool_call>")


WEATHER = '{"tool":"get_weather","arguments":{"city":"Paris"}}'
TIMER = '{"tool":"set_timer","arguments":{"minutes":5}}'
ANSWER = '{"answer":"Paris."}'


@pytest.mark.parametrize("choice,allowed", [
    ("auto", {WEATHER, TIMER, ANSWER}),
    ("required", {WEATHER, TIMER}),
    ("none", {ANSWER}),
    ("set_timer", {TIMER}),
])
def test_tool_choice_narrows_the_json_grammar(smol, choice, allowed):
    lm, tok, _ = smol
    grammar = json_protocol_grammar(TOOLS, tok, choice=choice)
    assert {t for t in (WEATHER, TIMER, ANSWER) if accepts(lm, tok, grammar, t)} == allowed


def test_tool_choice_narrows_the_hermes_grammar(smol):
    from mlx_agent.grammar import hermes_grammar

    lm, tok, _ = smol
    call = '<tool_call>\n{"name":"%s","arguments":%s}\n</tool_call>'
    weather, timer = call % ("get_weather", '{"city":"Paris"}'), call % ("set_timer", '{"minutes":5}')
    text = "It is sunny."

    def allowed(**kw):
        g = hermes_grammar(TOOLS, tok, **kw)
        return {name for name, t in (("weather", weather), ("timer", timer), ("text", text),
                                     ("two", weather + "\n" + timer)) if accepts(lm, tok, g, t)}

    assert allowed() == {"weather", "timer", "text", "two"}
    assert allowed(choice="required") == {"weather", "timer", "two"}
    assert allowed(choice="none") == {"text"}
    assert allowed(choice="get_weather") == {"weather"}
    assert allowed(parallel=False) == {"weather", "timer", "text"}


def test_tool_choice_naming_an_unknown_tool_is_an_error(smol):
    lm, tok, _ = smol
    with pytest.raises(GrammarError, match="'get_time', which is not a tool"):
        json_protocol_grammar(TOOLS, tok, choice="get_time")


def test_parallel_json_grammar_allows_calls_a_line_each(smol):
    lm, tok, _ = smol
    grammar = json_protocol_grammar(TOOLS, tok, parallel=True)
    for text in (WEATHER, ANSWER, WEATHER + "\n" + TIMER):
        assert accepts(lm, tok, grammar, text), text
    for text in (ANSWER + "\n" + WEATHER, WEATHER + " " + TIMER, WEATHER.replace(":", ": ")):
        assert not accepts(lm, tok, grammar, text), text
    one = json_protocol_grammar(TOOLS, tok)
    assert not accepts(lm, tok, one, WEATHER + "\n" + TIMER)


def test_a_forced_call_allows_that_call_only(smol):
    from mlx_agent.grammar import forced_call

    lm, tok, _ = smol
    grammar = json_protocol_grammar(TOOLS, tok, choice=forced_call("get_weather", {"city": "Paris"}))
    assert accepts(lm, tok, grammar, WEATHER)
    for text in (ANSWER, TIMER, WEATHER.replace("Paris", "Pari"),
                 WEATHER.replace('"Paris"}', '"Paris","unit":"celsius"}')):
        assert not accepts(lm, tok, grammar, text), text
    with pytest.raises(GrammarError, match="not a tool"):
        json_protocol_grammar(TOOLS, tok, choice=forced_call("nope", {}))


def test_a_forced_call_keeps_the_schema_order_is_checked_and_made_once(smol):
    from mlx_agent.grammar import forced_call, hermes_grammar

    lm, tok, _ = smol
    # given out of order: the grammar writes them in the tool's order (city, unit)
    choice = forced_call("get_weather", {"unit": "celsius", "city": "Oslo"})
    grammar = json_protocol_grammar(TOOLS, tok, choice=choice, parallel=True)
    ok = '{"tool":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}'
    assert accepts(lm, tok, grammar, ok)
    assert not accepts(lm, tok, grammar, ok + "\n" + ok)  # parallel or not: one call
    hermes = hermes_grammar(TOOLS, tok, choice=choice, parallel=True)
    block = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo","unit":"celsius"}}\n</tool_call>'
    assert accepts(lm, tok, hermes, block) and not accepts(lm, tok, hermes, block + "\n" + block)
    with pytest.raises(GrammarError, match="does not fit its schema"):
        json_protocol_grammar(TOOLS, tok, choice=forced_call("set_timer", {"minutes": "five"}))


def test_constants_are_data_and_a_property_named_like_a_keyword_is_a_schema():
    import copy

    from mlx_agent.grammar import _bound

    schema = {"type": "object", "properties": {"x": {"const": {"type": "string"}},
                                               "y": {"enum": [{"type": "integer"}]},
                                               "default": {"type": "string"},
                                               "enum": {"type": "integer"}}}
    before = copy.deepcopy(schema)
    bound = _bound(schema, 8)
    assert schema == before  # the caller's schema is not changed
    assert bound["properties"]["x"] == schema["properties"]["x"]
    assert bound["properties"]["y"] == schema["properties"]["y"]
    assert bound["properties"]["default"]["maxLength"] == 8
    assert bound["properties"]["enum"]["maximum"] == 10**12
    assert bound["additionalProperties"] is False


def test_arguments_cannot_hold_a_nul_character(smol):
    # a shell variable cannot hold NUL: the grammar does not offer it (other controls stay)
    call = '{"tool":"send_email","arguments":{"to":"a@b.c","subject":"Hi","body":"%s"}}'
    assert not accepts(*smol, call % "x\\u0000y")
    assert accepts(*smol, call % "x\\u0001\\ty\\n")


def test_the_prompt_shows_the_spacing_the_grammar_forces(smol):
    from mlx_agent.formats import system_prompt
    from mlx_agent.grammar import SEPARATORS, call_text

    item, key = SEPARATORS["json"]
    shown = [line for line in system_prompt(TOOLS).splitlines() if '"tool"' in line]
    assert shown and all(f'"tool"{key}"<name>"{item}"arguments"' in line for line in shown)
    written = call_text("json", BY_NAME["get_weather"], {"unit": "celsius", "city": "Oslo"})
    assert written == f'{{"tool"{key}"get_weather"{item}"arguments"{key}{{"city"{key}"Oslo"' \
                      f'{item}"unit"{key}"celsius"}}}}'
    assert accepts(*smol, written)
    other = written.replace(key, key.strip() if key.endswith(" ") else key + " ")
    assert not accepts(*smol, other)  # one spacing only: the one the prompt shows


def test_the_grammar_writes_arguments_in_the_order_the_prompt_lists_them(smol):
    from mlx_agent.grammar import SEPARATORS, call_text

    lm, tok, _ = smol
    book = parse_tools(json.dumps([{"name": "book_room", "description": "Book a room.",
                                    "_exec": "true", "parameters": {"type": "object",
        "properties": {"notes": {"type": "string"}, "when": {"type": "string"},
                       "attendees": {"type": "integer"}, "room": {"type": "string"}},
        "required": ["room", "when"]}}]))
    assert book[0].signature() == \
        "book_room(room: string, when: string, attendees?: integer, notes?: string)"
    grammar = json_protocol_grammar(book, tok)
    args = {"notes": "n", "when": "9am", "attendees": 3, "room": "A"}
    written = call_text("json", book[0], args)
    assert list(json.loads(written)["arguments"]) == ["room", "when", "attendees", "notes"]
    assert accepts(lm, tok, grammar, written)
    declared = json.dumps({"tool": "book_room", "arguments": args},
                          separators=SEPARATORS["json"])  # the schema's own order
    assert declared != written and not accepts(lm, tok, grammar, declared)


@pytest.mark.parametrize("text,ok", [
    ('{"answer":"Here is what I got: {"}', False),  # a copied JSON object's first byte
    ('{"answer":"Here is what I got: "}', False),  # the opening quote of a quotation
    ('{"answer":"Items: ["}', False),
    ('{"answer":"done\\n"}', False),
    ('{"answer":"a {b} (c) [d]"}', True),
    ('{"answer":"She said \\"hi\\""}', True),
])
def test_an_answer_cannot_end_on_white_space_or_an_opening_bracket(smol, text, ok):
    # the model writes ' {"' or ' "' meaning the start of a quotation; in a JSON string
    # that quote closes the answer, which would end as "Here is what I got: {"
    assert accepts(*smol, text) is ok


def _allowed(words, token: int) -> bool:
    return bool(words.view("uint32")[token >> 5] >> (token & 31) & 1)


def test_after_a_lone_space_the_mask_offers_no_word_but_digits_and_spaced_tokens(smol):
    lm, tok, grammar = smol
    (space,), (word,), (spaced,), (digit,) = (lm.encode(t) for t in (" ", "urns", " hello", "4"))
    assert lm.encode(" urns") == [space, word]  # a pair the tokenizer itself writes
    c = Constraint(tok, grammar, lm.vocab_size)
    for t in lm.encode('{"answer":"Here is what I got:'):
        c.consume(t)
    assert _allowed(c.mask_words(), word) and _allowed(c.mask_words(), space)
    c.consume(space)  # what the bundled model wrote next, then "urns" (its first choice)
    words = c.mask_words()
    assert not _allowed(words, word)
    assert _allowed(words, spaced) and _allowed(words, digit)  # " 42" is ' ', '4', '2'
    c.consume(digit)
    assert _allowed(c.mask_words(), word)


@pytest.mark.parametrize("lark", ['start: "a" " " "hello"', 'start: "a" " " /[a-z0-9]+/'])
def test_the_space_rule_stands_aside_where_no_space_could_come_next(smol, lark):
    # a user's grammar that puts a word right after its literal space: the word stays
    # allowed (the rule would otherwise leave no token, or only digits)
    lm, tok, _ = smol
    c = Constraint(tok, LLMatcher.grammar_from_lark(lark), lm.vocab_size)
    for t in lm.encode("a") + lm.encode(" "):
        c.consume(t)
    (hello,) = lm.encode("hello")
    assert _allowed(c.mask_words(), hello)


def test_a_grammar_or_mcp_config_file_that_is_a_fifo_is_refused_at_once(smol, tmp_path):
    import os

    from mlx_agent.grammar import grammar_from_file
    from mlx_agent.tools.mcp import McpError, load_config

    lm, tok, _ = smol
    os.mkfifo(tmp_path / "fifo")  # reading it would wait for a writer
    with pytest.raises(GrammarError, match="not a regular file"):
        grammar_from_file(str(tmp_path / "fifo"), "json-schema", tok)
    with pytest.raises(McpError, match="not a regular file"):
        load_config(tmp_path / "fifo")


PERSON = {"type": "object", "properties": {
    "name": {"type": "string"},
    "address": {"type": "object", "properties": {"city": {"type": "string"}}},
    "tags": {"type": "object"}},  # declares no properties: stays free-form
    "required": ["name"]}


@pytest.mark.parametrize("text,ok", [
    ('{"name":"Ava"}', True),
    ('{"name":"Ava","age":3}', False),  # a key the schema does not declare
    ('{"name":"Ava","address":{"city":"Oslo","zip":"0150"}}', False),  # nor a nested one
    ('{"name":"Ava","tags":{"any":"thing"}}', True),
])
def test_a_response_format_closes_objects_that_declare_properties(real_model, text, ok):
    # llama.cpp's schema grammars (Ollama's, LM Studio's) read a missing
    # additionalProperties as false
    from mlx_agent.grammar import schema_constraint

    c = schema_constraint(real_model, PERSON)
    ids = real_model.encode(text)
    assert (c.matcher.validate_tokens(ids) == len(ids) and c.matcher.consume_tokens(ids)
            and c.matcher.is_accepting()) == ok


def test_a_response_format_object_ends_instead_of_running_to_the_token_limit(real_model):
    # left open, the bundled model wrote invented and repeated keys ("nbsp_free_free" ten
    # times) until its token limit cut the JSON off
    from mlx_agent.grammar import closed, schema_constraint

    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.25}},
              "required": ["n"]}
    assert closed(schema)["additionalProperties"] is False and "additionalProperties" \
        not in schema  # a copy: the request's schema is left as it came
    # at every depth (the token test of a nested key above is refused by llguidance's
    # tokenization either way): closed where properties are declared, free where none are
    props = closed(PERSON)["properties"]
    assert props["address"]["additionalProperties"] is False
    assert "additionalProperties" not in props["tags"]
    engine = real_model.engine()
    engine.prefill(real_model.prompt_ids(real_model.chat.render(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True)))
    ids = list(engine.generate(max_tokens=64, constraint=schema_constraint(real_model, schema)))
    assert len(ids) < 64 and list(json.loads(real_model.decode(ids))) == ["n"]


def test_generate_json_schema_closes_objects_too(real_model, tmp_path):
    from mlx_agent.grammar import grammar_from_file

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    tok = ll_tokenizer(real_model)
    compiled = grammar_from_file(str(schema), "json-schema", tok)
    assert accepts(real_model, tok, compiled, '{"name": "Ava"}')
    assert not accepts(real_model, tok, compiled, '{"name": "Ava", "age": 3}')

"""The generated tool corpus: enough distinct tools and domains, valid schemas that load and
run, the same files under the same seed, nothing named as a BFCL function, and catalogues
that `mlx_agent synth` turns into every kind of task."""

from __future__ import annotations

from collections import Counter

import pytest
from jsonschema import Draft202012Validator

from mlx_agent.bfcl import CATEGORIES, BFCLMissing, bfcl
from mlx_agent.synth.catalogues import catalogues, generate_tools, write
from mlx_agent.synth.synthesis import SynthConfig, synthesize
from mlx_agent.tools import load_tools, run_tool


def test_at_least_300_distinct_tools_across_20_domains_for_any_seed():
    for seed in range(5):
        tools = generate_tools(seed)
        names = [t["function"]["name"] for _, t in tools]
        assert len(tools) >= 300
        assert len({d for d, _ in tools}) >= 20
        assert len(set(names)) == len(names)
        shapes = {repr(t["function"]["parameters"]) for _, t in tools}
        assert len(shapes) >= 0.9 * len(tools)  # parameters differ, not just names


def test_schemas_use_types_enums_ranges_formats_arrays_and_objects():
    kinds = Counter()
    for _, tool in generate_tools(0):
        params = tool["function"]["parameters"]
        Draft202012Validator.check_schema(params)
        for p in params["properties"].values():
            kinds[p["type"]] += 1
            kinds.update(k for k in ("enum", "format", "minimum", "uniqueItems") if k in p)
        assert set(params["required"]) <= set(params["properties"])
    for kind in ("string", "integer", "number", "boolean", "array", "object", "enum",
                 "format", "minimum", "uniqueItems"):
        assert kinds[kind] >= 5, kind


def test_written_catalogues_load_run_and_repeat_byte_for_byte(tmp_path):
    cats = catalogues(0)
    paths = write(cats, tmp_path / "a")
    assert all(c.name.split("-")[0] in c.domains and 1 <= len(c.domains) <= 3 for c in cats)
    own = [t["function"]["name"] for c in cats for t in c.tools]
    assert len(set(own)) == len(generate_tools(0))  # every tool lands in a catalogue
    for path in paths:
        tools = load_tools(path)
        assert not [w for t in tools for w in t.warnings]  # every variable quoted
    tools = load_tools(paths[0])
    outputs = [run_tool(t, {k: _value(s) for k, s in t.properties.items()}, timeout=10,
                        cwd=tmp_path) for t in tools]
    assert all(o.exit_code == 0 and o.stdout.strip() and "\n" not in o.stdout.strip()
               for o in outputs)
    again = write(catalogues(0), tmp_path / "b")
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]
    other = write(catalogues(1), tmp_path / "c")
    assert [p.read_bytes() for p in other] != [p.read_bytes() for p in paths]


def _value(schema):
    """Some valid value for the schemas this generator writes."""
    t = schema["type"]
    if "enum" in schema:
        return schema["enum"][0]
    if t in ("integer", "number"):
        return schema["minimum"]
    if t == "boolean":
        return True
    if t == "array":
        return [_value(schema["items"])]
    if t == "object":
        return {k: _value(s) for k, s in schema["properties"].items()}
    return {"date": "2026-01-02", "date-time": "2026-01-02T10:00:00Z", "time": "10:00:00Z",
            "email": "a@b.example", "uri": "https://b.example", "uuid":
            "12345678-1234-1234-1234-123456789abc", "hostname": "db1.example",
            "ipv4": "10.0.0.1"}.get(schema.get("format"), "x")


def test_no_tool_is_named_like_a_bfcl_function():
    try:
        b = bfcl()
    except BFCLMissing:
        pytest.skip("bfcl-eval is not installed")
    theirs = {f["name"] for c in CATEGORIES.values()
              for q in b.questions(c, include_prereq=False) for f in q["function"]}
    for seed in range(20):
        ours = {t["function"]["name"] for _, t in generate_tools(seed)}
        assert not ours & theirs, (seed, sorted(ours & theirs))


def test_synth_makes_calls_chains_answers_and_no_tool_tasks_from_a_catalogue(tmp_path):
    path = write(catalogues(0)[:1], tmp_path)[0]
    result = synthesize(load_tools(path), SynthConfig(n_train=40, n_heldout=10))
    kinds = Counter(t.kind for t in result.train)
    assert all(kinds[k] > 0 for k in ("call", "none", "chain", "answer")), kinds
    assert result.report["overlap"] == {"values": 0, "templates": 0, "prompts": 0, "calls": 0,
                                        "outside tools": 0}

"""Tool catalogues: OpenAI-compatible tool schemas with the ``_exec`` / ``_handler`` extensions.

A file holds ``{"tools": [...]}`` or a bare array. Each entry is an OpenAI
``{"type": "function", "function": {...}}`` block or the function fields at the top level.
Extensions (ignored by OpenAI clients): ``_exec``, a bash template run with the arguments
pre-assigned as shell variables; ``_exec_args``, their order (default: the properties in
alphabetical order); ``_handler``, ``"package.module:function"`` called with the arguments
as keyword arguments. Built-in tools carry a Python callable instead.

Parsing goes through msgspec structs; every error names the file, the tool and the field,
and a file's tool with a field it cannot have (a misspelling) is an error.
An ``_exec`` tool whose variables would be names the shell treats specially (``PATH``,
``IFS``, ``LD_PRELOAD``, ...) is refused; one whose template uses a variable outside double
quotes loads with a line in :attr:`Tool.warnings` (see :mod:`.exec_checks`). Arguments the
model sends are checked with ``jsonschema`` against the tool's ``parameters`` before anything
runs. This module runs nothing and knows nothing of models.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import msgspec
import regex
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError

from .. import json_schema
from ..errors import UserFacingError
from ..fileio import read_regular
from ..json_errors import json_problem
from .exec_checks import special_variable, unquoted_references

# used with fullmatch: with match, "$" also matched before a final newline ("echo\n" passed)
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CLIENT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's rule, plus dots (BFCL uses them)
RESERVED = frozenset({"auto", "none", "required"})  # tool_choice's own words
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
# values in the tools a request declares: validating 10,000 schema values takes about 1 s
# here, on a thread every request passes through (a file's tools are the user's own)
MAX_DECLARED_VALUES = json_schema.MAX_VALUES
MAX_FILE_BYTES = 16 << 20  # a tools file; a catalogue of thousands of tools is a few MiB
EXTENSIONS = ("_exec", "_exec_args", "_handler")
# a tool's fields in a file (OpenAI's, ours): any other is a misspelling, which msgspec drops
FILE_FIELDS = frozenset({"type", "function", "name", "description", "parameters", "strict",
                         *EXTENSIONS})


PATTERN_SECONDS = 0.5  # a schema's pattern gets this long to match a value


def _pattern(validator, pattern: str, instance: Any, schema: dict):
    """jsonschema's ``pattern`` with a time limit: a tools file's ``^(a|a)*$`` against
    forty a's and a b backtracks for hours, and ``re`` cannot be interrupted."""
    if not validator.is_type(instance, "string"):
        return
    try:
        if regex.search(pattern, instance, timeout=PATTERN_SECONDS) is None:
            yield ValidationError(f"{instance!r} does not match {pattern!r}")
    except TimeoutError:
        yield ValidationError(f"{pattern!r} took more than {PATTERN_SECONDS} s to check "
                              "against the value; simplify the pattern")
    except regex.error as e:
        yield ValidationError(f"{pattern!r} is not a regular expression ({e})")


# Draft 2020-12 with the bounded pattern: for values a model or a file wrote
Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})


def _described(e: ValidationError) -> str:
    """A validation error as one line, led by where in the arguments it is."""
    where = ".".join(str(p) for p in e.path)
    return f"{where}: {e.message}" if where else e.message


# A schema's formats as jsonschema checks them, but "regex" by the module that matches the
# values: ``re`` refused ``\p{L}``, which JSON Schema's regex dialect (ECMA-262) has
_FORMATS = FormatChecker()
_FORMATS.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
_FORMATS.checks("regex", raises=regex.error)(  # _small first: regex.compile cannot be stopped
    lambda value: not isinstance(value, str) or _small(value) and bool(regex.compile(value)))

MAX_UNROLLED = 100_000  # pieces a pattern's counted repeats unroll into, at most
EMPTY_GROUP = 100  # pieces an empty group counts for: "(){9999}" took 1 s, "(){999}" 8 ms
_COUNT = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def _small(pattern: str) -> bool:
    """``pattern`` unrolls into at most :data:`MAX_UNROLLED` pieces (an atom is one, a group
    one more than its contents, an empty one :data:`EMPTY_GROUP`; a counted repeat
    multiplies what it repeats by its larger bound). ``regex`` compiles repeated empty
    groups in time that grows with the square of the count, and nested ones with the
    product, past any request timeout and uninterruptibly: ``^((){999}){999}$`` took 7 s,
    ``^(){99999}$`` minutes."""
    stack, last, i = [0], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            last, i = 1, i + 2
        elif c == "[":  # a class is one atom: skip to its end
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            last, i = 1, j + 1
        elif c == "(":
            stack.append(0)
            i += 1
            continue
        elif c == ")" and len(stack) > 1:  # an empty group costs regex the most to repeat
            inner = stack.pop()
            last, i = inner + 1 if inner else EMPTY_GROUP, i + 1
        elif c == "{" and (found := _COUNT.match(pattern, i)) and any(found.groups()):
            bound = max(int(g) if len(g) < 8 else 10**8 for g in found.groups() if g)
            stack[-1] += last * (bound - 1)
            last, i = last * bound, found.end()
            if sum(stack) > MAX_UNROLLED:
                raise regex.error(f"its counted repeats unroll to more than {MAX_UNROLLED:,} "
                                  "pieces; use smaller counts")
            continue
        else:
            last, i = 1, i + 1
        stack[-1] += last
    return True


class ToolSchemaError(UserFacingError, ValueError):
    """A tools file that cannot be used; the message names file, tool and field."""


class Function(msgspec.Struct, frozen=True):
    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: dict(EMPTY_PARAMETERS))
    exec_template: str | None = msgspec.field(default=None, name="_exec")
    exec_args: list[str] | None = msgspec.field(default=None, name="_exec_args")
    handler: str | None = msgspec.field(default=None, name="_handler")


class Tool(msgspec.Struct, frozen=True):
    """One callable tool: its schema plus how to run it (exactly one of the three)."""

    name: str
    description: str
    parameters: dict[str, Any]
    exec_template: str | None = None
    exec_args: tuple[str, ...] = ()
    handler: str | None = None
    builtin: Callable[..., Any] | None = None
    warnings: tuple[str, ...] = ()  # found at load time, for the user (the CLI prints them)

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    @property
    def properties(self) -> dict[str, Any]:
        return dict(self.parameters.get("properties", {}))

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry, without our extensions (for chat templates)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def argument_order(self) -> list[str]:
        """Required arguments in ``required`` order, then optional ones alphabetically: the
        order the json protocol's prompt lists them in and its grammar writes them in."""
        props = self.properties
        required = [r for r in self.required if r in props]
        return required + sorted(p for p in props if p not in required)

    def signature(self) -> str:
        """``name(req: type, opt?: type)`` in :meth:`argument_order`, optional ones marked
        ``?``; a missing type shows as ``string``; a required name with no property last."""
        props = self.properties

        def typ(name):
            return "|".join(self._types(props.get(name, {}))) or "string"

        required = set(self.required)
        args = [f"{a}{'' if a in required else '?'}: {typ(a)}" for a in self.argument_order()]
        args += [f"{r}: string" for r in self.required if r not in props]
        return f"{self.name}({', '.join(args)})"

    def _types(self, schema: Any, depth: int = 0) -> list[str]:
        """A parameter's type names: its ``type``, through a local ``$ref`` (as Pydantic
        writes nested models) and the members of ``anyOf``/``oneOf`` (``integer|null``)."""
        if not isinstance(schema, dict):  # JSON Schema allows true (anything) and false
            return ["any"]
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/") and depth < 8:
            target: Any = self.parameters
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, dict) else None
            return self._types(target, depth + 1) if target is not None else []
        t = schema.get("type")
        if t is not None:
            return [str(x) for x in t] if isinstance(t, list) else [str(t)]
        names: list[str] = []
        for member in schema.get("anyOf") or schema.get("oneOf") or []:
            names += [n for n in self._types(member, depth + 1) if n not in names]
        return names

    def unreachable(self, arguments: dict) -> list[str]:
        """Why no call that satisfies the schema can hold ``arguments``, some of a call's
        (an eval task's expected ones): a name that is not a parameter, where the schema
        admits no others, or a value the schema refuses where it stands. What the rest of
        a call would need (``required``, ``anyOf`` over the whole object) is not judged."""
        params = self.parameters
        declared = params.get("properties") or {}
        extra = params.get("additionalProperties")  # absent: the grammar admits no other
        closed = (extra is None or extra is False) and not params.get("patternProperties")
        out = [f"{name}: not one of the tool's parameters ({', '.join(declared) or 'none'})"
               for name in arguments if closed and name not in declared]
        return out + [_described(e) for e in self._errors(arguments)
                      if e.path and e.path[0] in arguments]

    def validate(self, arguments: Any) -> list[str]:
        """Why ``arguments`` do not satisfy the schema (empty when they do)."""
        if not isinstance(arguments, dict):
            return [f"arguments must be a JSON object, got {type(arguments).__name__}"]
        return [_described(e) for e in self._errors(arguments)]

    def _errors(self, arguments: dict) -> list[ValidationError]:
        return sorted(Validator(self.parameters).iter_errors(arguments),
                      key=lambda e: list(e.path))

    def resolve_handler(self) -> Callable[..., Any]:
        if self.builtin is not None:
            return self.builtin
        module_name, _, attr = (self.handler or "").partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr)


def _tool_from(function: Function, where: str, runnable: bool = True) -> Tool:
    name = function.name
    if runnable and not IDENTIFIER.fullmatch(name):
        raise ToolSchemaError(f"{where}: tool name {name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)")
    if not runnable and not CLIENT_NAME.fullmatch(name):
        raise ToolSchemaError(f"{where}: tool name {name!r} must be 1-64 letters, digits, "
                              "'_', '-' or '.'")
    if name in RESERVED:
        raise ToolSchemaError(f"{where}: tool name {name!r} is reserved (a tool_choice value); "
                              "rename the tool")
    where = f"{where}: tool {name!r}"
    params = function.parameters
    _check_schema(params, where)
    params = _ref_followed(params)
    if params.get("type", "object") != "object":
        raise ToolSchemaError(f"{where}: field 'parameters' must be a JSON Schema of type object")
    props = params.get("properties", {})
    for req in params.get("required", []):
        if req not in props:
            raise ToolSchemaError(f"{where}: field 'required' names {req!r}, which is not a property")
    if not runnable:  # a client's tool: its schema is all there is
        return Tool(name=name, description=function.description, parameters=params)
    if "$ref" in params:  # not followed: the arguments would never reach _exec's variables
        beside = sorted(set(params) - _BESIDE_REF)
        why = f"with {beside[0]!r} beside it" if beside else "to a schema that cannot stand in " \
            "for it (another type, or one with an $id)"
        raise ToolSchemaError(f"{where}: field 'parameters' is a $ref {why}, so its properties "
                              "cannot be read; write the parameters out, or move what stands "
                              "beside the $ref into the schema it points to")
    if not function.exec_template and not function.handler:
        raise ToolSchemaError(f"{where}: has neither '_exec' nor '_handler', so it cannot run")
    if function.exec_template and function.handler:
        raise ToolSchemaError(f"{where}: has both '_exec' and '_handler'; keep one")
    if function.exec_args is not None:
        exec_args = tuple(function.exec_args)
    else:  # _exec gets every property as a variable; a _handler gets keyword arguments
        exec_args = tuple(sorted(props)) if function.exec_template else ()
        for arg in exec_args:
            if not IDENTIFIER.fullmatch(arg):
                raise ToolSchemaError(
                    f"{where}: property {arg!r} is not a shell variable's name, and _exec gets "
                    "every property as one; rename it, or list in '_exec_args' the properties "
                    "the command reads")
    for arg in exec_args:
        if not IDENTIFIER.fullmatch(arg):
            raise ToolSchemaError(f"{where}: field '_exec_args' entry {arg!r} is not an identifier")
        if arg not in props:  # it would always be empty
            raise ToolSchemaError(f"{where}: field '_exec_args' names {arg!r}, which is not a "
                                  f"property (properties: {', '.join(sorted(props)) or 'none'})")
        if function.exec_template and special_variable(arg):
            raise ToolSchemaError(
                f"{where}: property {arg!r} is a variable the shell or the environment treats "
                f"specially; as the argument's value it would change how the command runs: "
                f"rename the property")
    if function.handler:
        module, _, attr = function.handler.partition(":")
        if not module or not attr:
            raise ToolSchemaError(
                f"{where}: field '_handler' must look like 'package.module:function'")
    return Tool(name=name, description=function.description, parameters=params,
                exec_template=function.exec_template, exec_args=exec_args,
                handler=function.handler,
                warnings=_template_warnings(function.exec_template, props, exec_args, where))


# keywords that may stand beside a top-level $ref that is followed: none constrains a call
# beyond what the schema it points at does (a "type" must be that schema's own, or absent)
_BESIDE_REF = frozenset({"$ref", "$defs", "definitions", "$schema", "$comment", "$id",
                         "title", "description", "type"})
_ROOT_ONLY = ("$id", "$anchor", "$dynamicAnchor")  # a schema that holds one stays where it is


def _ref_followed(params: dict) -> dict:
    """``params`` with a top-level local ``$ref`` replaced by the schema it points at
    (zod-to-json-schema writes ``{"$ref": "#/definitions/Args", "definitions": {...}}``), its
    ``$defs``/``definitions`` kept for the pointers inside: the properties, the prompt's
    signature, the grammar and the sampler all read the top level, and found nothing there.
    Left as written where other keywords stand beside the ``$ref`` (merged, they would mean
    something else) or the target is not a plain schema; checked (:func:`_check_schema`)
    first, so a chain of links ends."""
    out = params
    for _ in range(json_schema.MAX_DEPTH):
        ref = out.get("$ref")
        target = json_schema.resolve(params, ref) if isinstance(ref, str) else None
        if not isinstance(target, dict) or set(out) - _BESIDE_REF or \
                "type" in out and target.get("type", out["type"]) != out["type"] or \
                any(k in target for k in _ROOT_ONLY):
            break
        out = {**{k: v for k, v in target.items() if k not in ("$defs", "definitions")},
               **{k: v for k, v in out.items() if k != "$ref"}}
    return out


def _check_schema(params: dict, where: str) -> None:
    """``params`` is valid JSON Schema that a grammar can be made of (see
    :mod:`mlx_agent.json_schema`); checked once per distinct schema (a client sends the same
    tools with every request)."""
    try:
        key = msgspec.json.encode(params)
    except (TypeError, msgspec.EncodeError, RecursionError):
        key = None
    error = _schema_error(key) if key is not None else _schema_problem(params)
    if error:
        raise ToolSchemaError(f"{where}: {error}")


@functools.lru_cache(maxsize=1024)
def _schema_error(key: bytes) -> str | None:
    return _schema_problem(msgspec.json.decode(key))


def meta_schema_problem(schema: Any) -> tuple[str, str] | None:
    """Where ``schema`` breaks JSON Schema's meta-schema (a dotted path, "" for the root) and
    how, or None. Bound its size first (:func:`json_schema.too_many_nodes`): this costs about
    0.1 ms a value."""
    try:
        Draft202012Validator.check_schema(schema, format_checker=_FORMATS)
    except SchemaError as e:
        return ".".join(str(p) for p in e.path), e.message
    return None


def _schema_problem(params: dict) -> str | None:
    """What is wrong with ``params`` (naming the field), or None."""
    bad = meta_schema_problem(params)
    if bad:
        return (f"field 'parameters{'.' + bad[0] if bad[0] else ''}' is not valid JSON Schema: "
                f"{bad[1]}")
    inexact = json_schema.inexact_integer(params) or json_schema.unusable(params)
    if inexact:
        return f"field 'parameters.{inexact[0]}' {inexact[1]}"
    if json_schema.too_deep(params):
        return f"field 'parameters' {json_schema.TOO_DEEP}"
    if json_schema.endless({**params, "type": "object"}):  # arguments are an object
        return f"field 'parameters' {json_schema.ENDLESS}"
    return None


def _template_warnings(template: str | None, props: dict, exec_args: tuple[str, ...],
                       where: str) -> tuple:
    if not template:
        return ()
    splittable = [a for a in exec_args if not _scalar(props.get(a))]
    return tuple(
        f"{where}: _exec uses ${name} outside double quotes, so the shell splits and globs "
        f"its value; write \"${name}\" (after -- if the command takes options)"
        for name in unquoted_references(template, splittable))


def _scalar(schema: Any) -> bool:
    """Whether a property can only be a number or a boolean (nothing to split or glob)."""
    types = schema.get("type") if isinstance(schema, dict) else None
    types = types if isinstance(types, list) else [types]
    return all(t in ("integer", "number", "boolean") for t in types)


def parse_tools(data: bytes | str, source: str = "<tools>", runnable: bool = True) -> list[Tool]:
    """Tools from the text of a tools file; ``source`` names it in errors; ``runnable=False``:
    schemas only (a server offers them, its clients run them)."""
    if isinstance(data, bytes) and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte-order mark, as some Windows editors write
    try:
        raw = msgspec.json.decode(data)
        return tools_from_entries(raw.get("tools") if isinstance(raw, dict) else raw, source,
                                  runnable, known_fields_only=True)
    except msgspec.DecodeError as e:
        raise ToolSchemaError(f"{source}: not valid JSON ({json_problem(e, data)})") from None
    except RecursionError:
        raise ToolSchemaError(f"{source}: JSON nested too deeply to read") from None


def declared_tools(entries: Any, source: str = "tools") -> list[Tool]:
    """Tools a client declares (an OpenAI request's ``tools``): schemas the model may call,
    which the client runs itself, so nothing here can run them. At most
    :data:`MAX_DECLARED_VALUES` values in all, counted before any is validated."""
    if json_schema.too_many_nodes(entries, MAX_DECLARED_VALUES):
        raise ToolSchemaError(f"{source}: the tools hold more than {MAX_DECLARED_VALUES:,} JSON "
                              "values, more than a catalogue needs; declare fewer or smaller "
                              "tools")
    return tools_from_entries(entries, source, runnable=False)


def tools_from_entries(entries: Any, source: str, runnable: bool = True,
                       known_fields_only: bool = False) -> list[Tool]:
    """``known_fields_only``: a field outside :data:`FILE_FIELDS` is an error (a file's;
    a client's request may carry fields of its own)."""
    if not isinstance(entries, list):
        raise ToolSchemaError(f"{source}: expected {{\"tools\": [...]}} or a JSON array of tools")
    tools: list[Tool] = []
    for i, entry in enumerate(entries):
        label = f"{source}: tools[{i}]"
        if not isinstance(entry, dict):
            raise ToolSchemaError(f"{label} is not an object")
        function = entry.get("function", entry)
        if not isinstance(function, dict):
            raise ToolSchemaError(f"{label}: \"function\" must be an object with a name, "
                                  f"a description and parameters, not {_kind(function)}")
        fields = dict(function)
        # extensions may sit beside the "function" block as well as inside it
        for key in EXTENSIONS:
            if key in entry and key not in fields:
                fields[key] = entry[key]
        if isinstance(fields.get("name"), str):
            label = f"{source}: tool {fields['name']!r}"
        unknown = sorted({*entry, *fields} - FILE_FIELDS)
        if known_fields_only and unknown:
            raise ToolSchemaError(f"{label}: unknown field {unknown[0]!r} (a tool has name, "
                                  "description, parameters and _exec, _exec_args or _handler)")
        fields.pop("type", None)
        fields.pop("strict", None)
        try:
            function = msgspec.convert(fields, Function)
        except msgspec.ValidationError as e:
            raise ToolSchemaError(f"{label}: {_field_message(e)}") from None
        tools.append(_tool_from(function, source, runnable))
    names = Counter(t.name for t in tools)  # not list.count per name: 40,000 tools took 40 s
    dupes = sorted(n for n, k in names.items() if k > 1)
    if dupes:
        raise ToolSchemaError(f"{source}: tool {dupes[0]!r} is defined twice")
    return tools


def _kind(value: Any) -> str:
    return {str: "a string", list: "an array", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _field_message(e: msgspec.ValidationError) -> str:
    msg = str(e)
    m = re.search(r"at `\$\.?([^`]*)`", msg)
    field = m.group(1) if m else ""
    text = msg.split(" - at ")[0]
    return f"field {field!r}: {text}" if field else text


HANDLERS = ("import", "list", "refuse")


def load_tools(path: str | Path, runnable: bool = True, handlers: str = "refuse") -> list[Tool]:
    """The tools of the file at ``path``. A ``_handler`` is Python that runs in this process,
    outside any sandbox, and importing its module runs code already: ``handlers`` says what
    to do with one. ``"import"`` (the file is the user's own: ``agent --tools``): import it
    now, so a wrong name fails at start-up; ``"list"`` (``tools ls``, or a file read for its
    schemas only): check its form only; ``"refuse"`` (the default: a file that came as data,
    an eval task's, or ``synth``'s and ``specialize``'s without ``--trust-handlers``): an
    error naming the tool. A caller must ask to import one."""
    if handlers not in HANDLERS:  # fail closed: a misspelt "refuse" must not admit them
        raise ValueError(f"handlers must be one of {', '.join(HANDLERS)}, not {handlers!r}")
    path = Path(path)
    try:
        data = read_regular(path, max_bytes=MAX_FILE_BYTES)
    except OSError as e:
        raise ToolSchemaError(f"cannot read tools file {path}: {e.strerror}") from None
    tools = parse_tools(data, source=str(path), runnable=runnable)
    for tool in tools:
        if tool.handler and handlers == "refuse":
            raise ToolSchemaError(
                f"{path}: tool {tool.name!r} is a Python _handler ({tool.handler}), which "
                "runs in this process, outside any sandbox; pass --trust-handlers if you "
                "trust the file, or give the tool an _exec command")
        if tool.handler and handlers == "import":
            _import_handler(tool, f"{path}: tool {tool.name!r}")
    return tools


def _import_handler(tool: Tool, where: str) -> None:
    try:
        handler = tool.resolve_handler()
    except Exception as e:  # the module's own code runs: any error, a SyntaxError too
        raise ToolSchemaError(f"{where}: field '_handler' {tool.handler!r} cannot be imported "
                              f"({e})") from None
    if not callable(handler):
        raise ToolSchemaError(f"{where}: field '_handler' {tool.handler!r} is not callable")

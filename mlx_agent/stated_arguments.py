"""A call's optional arguments as the request states them: added where stated, dropped where
made up.

A small model closes a call once the required arguments are written, and leaves out the
optional ones a request states in passing ("in Celsius", "using the simpson method",
"including human impact"): 16 of the default adapter's 50 misses on BFCL's first 100
``simple`` questions, and 15 of its 40 failed runs on the held-out synthetic catalogues.
The grammar offers each optional argument in turn; the model takes the closing brace.

After a reply of one call, :func:`complete_call` asks the model what it would write for each
optional parameter the call left out and the request could state a value of
(:func:`_may_state`), with a probe (:func:`mlx_agent.probe.probe`: the engine syncs to the
prompt and the call's text up to where the grammar writes that parameter, and the model
writes a value under the parameter's schema; greedy by default, the value it finds most
likely). A value the request states (:func:`stated`) is added, and the call reads as the
grammar writes it (:func:`mlx_agent.grammar.call_text`) with the additions, unless that is a
call that already ran this turn (:func:`complete_reply`'s ``made``: completing never makes a
repeat). A value that is one of the turn's tool results whole counts as stated where the
request names the parameter it passes it on as ("then cancel the booking, passing its output
as the reason": :func:`_piped`); the model, probed, writes the result.

The other way round, the model also fills optional parameters with values nobody wrote
(``distance_km: 20``, ``species: "parrot"``, ``service_date: "2022-01-01"``); in a chain the
made-up value changes the first result, and so the second call. Before probing,
:func:`without_made_up` drops each optional argument whose value neither the request nor a
tool result of the turn writes (:meth:`Heard.made_up`, a looser reading than
:func:`stated`'s: a word that begins one of theirs counts), and each optional flag whose
name they never speak of (``is_unisex: false`` for "find a salon in Fremont"), and each
optional path they never write whole (``path: "this_folder"`` for "What files are in this
folder?", ``"budget.json"`` for "Which file mentions the budget?"), so the tool's own
default stands; a path they write the end of is first made theirs ("users.csv" for
"data/users.csv": :func:`~mlx_agent.copied_values.whole_paths`). An object, a required
argument, or a flag whose name's words they use, is never dropped.

The same pass reads the call's values against the request (:mod:`mlx_agent.copied_values`):
a garbled copy ("Lasagna" for "Los Angeles") is copied again, a place cut at its comma
("Riga" for "Riga, Latvia") or a list of numbers one item off is copied whole, an enum's
value the request does not write is the one it does ("hamster", not "cat"), a list of an
enum's values holds each the request names ("points and rebounds"), a value the request
assigns a parameter by name is that parameter's ("b=371, a=806"), a string is cased as the
request writes it, an email or web address is copied whole, and a number is taken at the
scale and with the sign the request writes it ("213 million": 213000000, not 213; "119.5383
W": -119.5383), a rate written as a percentage as its fraction ("5%": 0.05), a result the
request passes on as a parameter ("passing its output as the title") that parameter's value
(:func:`piped_results`); after the probes, a date in words ("April 11th, 2023") is written
in the format its parameter asks ("2023-04-11", :mod:`mlx_agent.dates`). Before all that, a
turn's first call of a tool other than the one the request describes
(:mod:`mlx_agent.described_tool`) is written again for that one. Before the probes, where
the reply may answer, a call on a required number no one gave becomes a question to the user
(:mod:`mlx_agent.unfounded`), and so does one on a required string no one gave where the
reply was pressed to be a call: :func:`pressed_tools` tells the agent and the server when a
reply may be pressed, and to which tools (the request writes a tool's name; after a tool
result, one no call has called yet; they press where the model would answer,
:func:`mlx_agent.probe.would_call`).

Not promised: a reply of more than one call, or with text beside its call, is left as it was
sampled, and so is every call with a rotating KV cache; a value the request implies without
writing it ("next week" for 7 days, "from rest" for 0) is not added, nor an object. A flag
is added only where the request uses every word of its name but a verb such as *include*
(``include_human_impact``: "human", "impact"): as ``true``, not after a negation (within
three words) or indifference ("not too concerned about the rating or whether smoking is
allowed", :data:`~mlx_agent.flags.INDIFFERENT`, within its clause); where the request asks
for it plainly (:func:`~mlx_agent.flags.flag_plain`) without a probe (asked, the model wrote
``false`` for "detailed information" as readily as ``true``), elsewhere the model is asked.
It is added as ``false`` only where the request refuses it plainly ("don't include hourly",
:func:`~mlx_agent.flags.flag_refused`), without a probe. A flag the model wrote is turned
only where the request plainly says otherwise (:func:`~mlx_agent.flags.flags_as_asked`).
Each probe costs a short prefill and a few decoded tokens, up to :data:`MAX_PROBES` a call;
a changed call's ids are its text's, tokenized (:func:`mlx_agent.probe.reply_ids`), not ids
the model sampled.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Collection, NamedTuple, Sequence

from .cache import ContextFull
from .copied_values import (apart_values, as_cased, as_quoted, assigned_values, named_choices,
                            one_of_repeats, percent_rates, recopied, scaled_numbers,
                            signed_numbers, whole_identifiers, whole_lists, whole_paths,
                            whole_places, written_choices)
from .clock_hours import clock_hours
from .dates import dated_values
from .described_tool import DOING, described_tool, mentioned, stem, stems
from .flags import (flag_plain, flag_refused, flag_stated, flags_as_asked, flags_by_default,
                    unheard_flag)
from .engine import Sampler, greedy_sampler
from .file_intent import about_files, asked_instead, asked_tool
from .file_paths import takes_path, writes_path
from .formats import GET_TOOL_INFO, text_of
from .formats.messages import Call, Reply
from .grammar import call_text, written_arguments, written_json
from .heard import NAME_WORD, NUMBER, REQUEST_CHARS, Heard, json_text, leaves, writes_whole
from .heard import number as _number
from .heard import numbers as _numbers
from .heard import words as _words
from .place_region import country_codes, regional_places
from .probe import hold, probe, probe_arguments, reply_ids
from .runaway_list import closed_call
from .tools import Tool, reads_only
from .unfounded import question, unfounded

MAX_PROBES = 8  # optional parameters probed a call, in Tool.argument_order
def _taken(arguments: dict) -> tuple[list[str], set[float]]:
    """The strings (stripped, lower case) and numbers the arguments hold, at any depth."""
    strings, numbers = [], set()
    for v in leaves(arguments):
        if isinstance(v, str):
            strings.append(v.strip().lower())
            numbers |= _numbers(v)  # "March 3" holds 3
        elif (x := _number(v)) is not None:  # not a flag
            numbers.add(x)
    return strings, numbers


def _subject(tool: Tool, name: str, text: str) -> bool:
    """Whether ``text`` is what the tool or another of its parameters is about: whole words
    of the tool's name or description ("triangle" for ``calculate_triangle_area``), or of
    another parameter's description ("kilometers" where ``distance`` is "typically in
    kilometers")."""
    own = [tool.name.replace("_", " ").replace(".", " "), tool.description]
    own += [s.get("description", "") for p, s in tool.properties.items()
            if p != name and isinstance(s, dict) and isinstance(s.get("description"), str)]
    return any(writes_whole(o, text) for o in own)


def _names_a_parameter(tool: Tool, name: str, text: str, request: str) -> bool:
    """Whether ``text``, a free value of ``name`` (no enum or const: ``sort_by: "price"``
    beside a ``price`` parameter is one), is a parameter's name instead: its words are the
    name's, plural or not ("trophies" for ``mission`` or for ``trophy`` itself, from "with
    different missions and trophies"), unless it is this parameter's own and the request
    writes it right after a number, as a unit (``unit: "units"`` for "a base of 10
    units")."""
    schema = tool.properties.get(name)
    one = schema.get("items") if isinstance(schema, dict) and schema.get("type") == "array" \
        else schema
    if isinstance(one, dict) and {"enum", "const"} & one.keys():
        return False
    said = stems(text)
    if not said or not any(stems(p) == said for p in tool.properties):
        return False
    unit = rf"\d\s*{re.escape(text.strip())}(?!\w)"  # a number's unit: this parameter's value
    return stems(name) != said or re.search(unit, request, re.IGNORECASE) is None


def _unit_of_another(tool: Tool, name: str, text: str, request: str, arguments: dict) -> bool:
    """Whether the request writes ``text`` right after a number another argument took
    ("15 m\u00b3" where ``volume`` is 15): that argument's unit, not this parameter's,
    unless this parameter's description names that argument ("the unit of the radius")."""
    schema = tool.properties.get(name)
    about = (schema.get("description") or "") if isinstance(schema, dict) else ""
    about = about if isinstance(about, str) else ""
    unit = rf"(?<![\w.,])(-?\d+(?:,\d{{3}})*(?:\.\d+)?)\s*{re.escape(text.strip())}(?!\w)"
    for m in re.finditer(unit, request, re.IGNORECASE):  # a number's start only: linear
        number = float(m.group(1).replace(",", ""))
        owners = [p for p, v in arguments.items() if _number(v) == number]
        if any(not writes_whole(about, p.replace("_", " ")) for p in owners):
            return True
    return False


def stated(tool: Tool, name: str, value: Any, request: str, arguments: dict,
           results: Sequence[str] = ()) -> bool:
    """Whether ``request`` states ``value`` for ``tool``'s parameter ``name``, which none of
    the call's ``arguments`` holds: a string the request writes as whole words (case aside)
    that shares no text with an argument's string and no number with its numbers, and is
    neither what the tool is about (:func:`_subject`), another parameter's name
    (:func:`_names_a_parameter`) nor another argument's unit (:func:`_unit_of_another`); a
    number it writes that no argument has; a list of such items; ``true`` for a flag whose
    name's words it uses (:func:`~mlx_agent.flags.flag_stated`); or one of the turn's tool
    ``results`` that the request passes on as this parameter (:func:`_piped`)."""
    if _piped(name, value, request, results, arguments):
        return True
    strings, numbers = _taken(arguments)
    said = _numbers(request)

    def one(v: Any) -> bool:
        if isinstance(v, bool):
            return False
        if isinstance(v, str):
            low = v.strip().lower()
            return writes_whole(request, v) \
                and not any(low in s or (len(s) > 2 and s in low) for s in strings) \
                and not (_numbers(low) & numbers) \
                and not _subject(tool, name, v) \
                and not _names_a_parameter(tool, name, v, request) \
                and not _unit_of_another(tool, name, v, request, arguments)
        x = _number(v)
        return x is not None and x in said and x not in numbers

    if value is True:
        return flag_stated(name, request)
    if isinstance(value, list):
        return bool(value) and len({json.dumps(v) for v in value}) == len(value) \
            and all(one(v) for v in value)
    return one(value)


def _names(name: str, request: str) -> bool:
    """Whether the request writes a parameter's name, its words apart ("odometer km" for
    ``odometer_km``, "reason")."""
    return writes_whole(request, " ".join(w.lower() for w in NAME_WORD.findall(name)))


def _result_number(result: str) -> float | None:
    """A tool result that is one number and nothing else ("63"), as that number."""
    m = NUMBER.fullmatch(result)
    return next(iter(_numbers(result)), None) if m and not m.group(1) else None


def _piped(name: str, value: Any, request: str, results: Sequence[str],
           arguments: dict) -> bool:
    """Whether ``value`` is one of the turn's tool ``results`` whole (stripped; a number as
    the one number a result is) that the request passes on as this parameter: it writes the
    parameter's name ("passing its output as the reason", "its answer as the odometer km")
    and no argument holds the value already."""
    if not results or isinstance(value, bool) or not _names(name, request):
        return False
    strings, numbers = _taken(arguments)
    if isinstance(value, str):
        return bool(value.strip()) and value.strip() in results \
            and value.strip().lower() not in strings
    x = _number(value)
    return x is not None and x not in numbers and x in map(_result_number, results)


# what a request calls the result it passes on: "the answer you got", "its output"
_RESULT = r"(?:(?:the|its|that|this|your)\s+)?(?:output|result|answer|response|reply)" \
    r"(?:\s+(?:you|it)\s+(?:got|gave|returned|returns|get))?|what\s+(?:you|it)\s+" \
    r"(?:got|gave|returned|returns)"


def _passes_on(name: str, request: str) -> bool:
    """Whether the request passes the turn's result on as the parameter ``name`` (its words
    apart): "feeding in the answer you got as its title", "passing its output as the
    text", "use the result for the label", "with the title set to the output", "use it
    as the title" (a pronoun right before "as"); not "translate the text to that
    language", "the body set to this", "schedule it for the date"."""
    words = [w.lower() for w in NAME_WORD.findall(name)]
    if not words or any(len(w) < 3 for w in words) and len(words) == 1:
        return False
    param = r"\s+".join(map(re.escape, words))
    link = rf"\b(?:{_RESULT})\b[^.;!?\n]{{0,40}}?\b(?:as|for|in|into)\s+(?:the|its|a|an)\s+" \
        rf"{param}\b|\b(?:it|that|this)\s+as\s+(?:the|its|a|an)\s+{param}\b" \
        rf"|\b{param}\s+(?:=|being|equal\s+to|set\s+to|as)\s+(?:{_RESULT})\b"
    return re.search(link, request, re.IGNORECASE) is not None


NOT_JSON = object()  # a ToolMessage's value where its text is no JSON


class ToolMessage(NamedTuple):
    """A tool result of the turn as every rule reads it: the tool's name (where the message
    gives it), its text, and its JSON (:data:`NOT_JSON` where it is none). Each reader
    (:func:`heard_text`, :func:`turn_results`, ...) parses the messages again: a result is
    at most a few KiB, and a reply reads them a handful of times."""

    name: str | None
    text: str
    value: Any

    @property
    def agent(self) -> dict | None:
        """The agent's ``{"stdout": ..., "stderr": ..., "exit_code": ...}`` it holds, or None."""
        value = self.value
        return value if isinstance(value, dict) and isinstance(value.get("stdout"), str) \
            else None

    @property
    def result(self) -> str | None:
        """Its text, stripped: the agent's result as its output (none where its exit code is
        not 0), a JSON string as that string; None where it is other JSON (an object or a
        list: which of its values is meant is not said)."""
        if (agent := self.agent) is not None:
            return agent["stdout"].strip() if agent.get("exit_code", 0) == 0 else None
        if isinstance(self.value, str):
            return self.value.strip()
        return None if isinstance(self.value, (dict, list)) else self.text.strip()

    @property
    def heard(self) -> str:
        """Its text as a value may be heard in it: the agent's result as its output and its
        error, or, with an exit code other than 0, its output alone ("no file 'this_folder'"
        echoes the call that made the name up, and is no source of it)."""
        if (agent := self.agent) is None:
            return self.text
        stderr = agent.get("stderr") if isinstance(agent.get("stderr"), str) else ""
        return agent["stdout"] + ("\n" + stderr if agent.get("exit_code", 0) == 0 else "")


def turn_tool_messages(messages: Sequence[dict]) -> list[ToolMessage]:
    """The tool results after the last user message (not the server's get_tool_info
    answers, which hold the tools' schemas), each a :class:`ToolMessage`."""
    last = last_user(messages) or 0
    return [_tool_message(m) for m in messages[last + 1:]
            if m["role"] == "tool" and m.get("name") != GET_TOOL_INFO]


def _tool_message(message: dict) -> ToolMessage:
    text = text_of(message.get("content"))
    try:
        value = json.loads(text.strip())  # str.strip's spaces, not only JSON's
    except (ValueError, RecursionError):
        value = NOT_JSON
    name = message.get("name")
    return ToolMessage(name if isinstance(name, str) else None, text, value)


def last_result(messages: Sequence[dict]) -> str | None:
    """The last tool result after the last user message as :attr:`ToolMessage.result`
    reads it; None where there is none."""
    results = turn_tool_messages(messages)
    return results[-1].result if results else None


def piped_results(tool: Tool, arguments: dict, request: str, result: str | None) -> dict:
    """``arguments`` with each parameter the request passes the turn's last ``result`` on
    as (:func:`_passes_on`) holding that result: the text for a string, the one number a
    result of one number holds for a number, where the schema takes it; ``arguments``
    itself where none is (or there is no result)."""
    if not result:
        return arguments
    out = arguments
    for name, schema in tool.properties.items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        value = result if kind == "string" else _result_number(result) \
            if kind in ("number", "integer") else None
        if kind == "integer" and isinstance(value, float):
            value = int(value) if value.is_integer() else None
        if value is None or out.get(name) == value or not _passes_on(name, request):
            continue
        if not tool.validate({**out, name: value}):
            out = {**out, name: value}
    return out


def _may_state(tool: Tool, name: str, request: str, arguments: dict,
               results: Sequence[str] = ()) -> bool:
    """False where no value the probe could write would pass :func:`stated`, so the probe
    is not run: a flag whose name the request does not use, an enum none of whose values
    it writes, a number parameter where it writes no number that no argument has (and no
    result is a number it passes on as this parameter)."""
    schema = tool.properties.get(name)
    if not isinstance(schema, dict):
        return False
    items = schema.get("items") if schema.get("type") == "array" else None
    one = items if isinstance(items, dict) else schema
    kind = one.get("type")
    if kind == "boolean":
        return flag_stated(name, request)
    enum = one.get("enum")
    if isinstance(enum, list):
        return any(isinstance(v, str) and writes_whole(request, v) for v in enum) or \
            any(not isinstance(v, (str, bool)) for v in enum)
    if kind in ("integer", "number"):
        return bool(_numbers(request) - _taken(arguments)[1]) or _names(name, request) \
            and any(_result_number(r) is not None for r in results)
    return True


def complete_call(engine, lm, prompt: Sequence[int], protocol: str, tool: Tool,
                  arguments: dict, request: str, sampler: Sampler = greedy_sampler,
                  stop: Callable[[], bool] = lambda: False,
                  results: Sequence[str] = ()) -> dict:
    """``arguments`` with the optional parameters the request states added, each probed (in
    :meth:`Tool.argument_order`, where :func:`_may_state`) after ``prompt`` (the reply's
    prompt ids) and the call with the additions before it, a flag the request asks for
    plainly (:func:`~mlx_agent.flags.flag_plain`) set ``true`` and one it refuses plainly
    (:func:`~mlx_agent.flags.flag_refused`) ``false``, without a probe; ``arguments`` itself
    where none is. A value one of the turn's tool ``results`` is whole is stated where the
    request passes it on as that parameter (:func:`_piped`). ``stop`` is asked before each
    probe. The engine is left wherever the last probe left it: sync before generating again."""
    left = [p for p in tool.argument_order() if p not in arguments and p not in tool.required]
    flags = [p for p in left if isinstance(tool.properties[p], dict)
             and tool.properties[p].get("type") == "boolean"]
    # asked, the model wrote false as often as true: where the request is plain, no probe
    added = {p: True for p in flags if flag_plain(p, request)} | \
        {p: False for p in flags if flag_refused(p, request)}
    for name in [p for p in left if p not in added
                 and _may_state(tool, p, request, arguments, results)][:MAX_PROBES]:
        if stop():  # the client left: no more probes for a reply no one will read
            break
        value = probe(engine, lm, sampler, prompt, protocol, tool, {**arguments, **added},
                       name)
        if value is not None and stated(tool, name, value, request, {**arguments, **added},
                                        results):
            added[name] = value
    return {**arguments, **added} if added else arguments


def last_user(messages: Sequence[dict]) -> int | None:
    """The index of the last user message: where the turn began (None: no user message)."""
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)


def request_text(messages: Sequence[dict]) -> str:
    """The last user message's text: what a stated value must be written in."""
    return next((text_of(m.get("content")) for m in reversed(messages)
                 if m["role"] == "user"), "")


def pressed_tools(tools: Sequence[Tool], messages: Sequence[dict],
                  tried: Collection[str] | None = None) -> list[Tool]:
    """The ``tools`` the reply to ``messages`` should call one of rather than answer from
    the model's own knowledge: where the last user message writes one of their names
    (:func:`mlx_agent.described_tool.mentioned`), or is about files and asks for a built-in
    file tool's work (:mod:`mlx_agent.file_intent`: "What is in the orders folder?"), all of
    them for the turn's first reply.
    After a tool result, the one the message names first (each word of its name but a verb
    whole: :func:`_named_at`) that no call since has tried, nor named as a tried one is
    ("check adoption listing" names ``search_adoption_listings`` too, by the words
    ``check_adoption_listing`` was named by), in a clause with no negation or condition
    ("get the weather in Mumbai, then create an event with it as the title":
    ``create_event``, once ``get_weather`` ran; not "don't create an event", "if it rains,
    create an event"). ``tried``: the tools the turn's calls tried (ran, failed or were
    denied), where the caller knows them; else those the messages' ``tool_calls`` and named
    tool results show. Empty where there are none."""
    last = last_user(messages)
    if last is None:
        return []
    request = text_of(messages[last].get("content"))
    named = mentioned(tools, request)
    if not any(m["role"] == "tool" for m in messages[last:]):
        return list(tools) if named or about_files(request) and asked_tool(tools, request) \
            else []
    if not named:
        return []
    if tried is None:
        tried = {(c.get("function") or {}).get("name") for m in messages[last:]
                 if m["role"] == "assistant" for c in m.get("tool_calls") or ()
                 if isinstance(c, dict)} | \
            {m.get("name") for m in messages[last:] if m["role"] == "tool"}
    done = [_content(t.name) for t in tools if t.name in tried]
    left = [(at, t) for t in named if t.name not in tried
            and not any(_content(t.name) <= words for words in done)
            and (at := _named_at(t.name, request)) is not None]
    return [min(left, key=lambda pair: pair[0])[1]] if left else []


def _content(name: str) -> set[str]:
    """The stems of a tool's name but :data:`DOING`'s: what a request names it by."""
    return stems(name) - DOING


# a clause that does not ask for the call it names: "don't create an event", "if it rains,
# create an event", "tell me whether I should", "draft it but do not send it"
_NOT_ASKED = re.compile(r"n't\b|\b(?:not|never|no|without|if|whether|unless|in\s+case|maybe|"
                        r"perhaps|myself)\b", re.IGNORECASE)


def _named_at(name: str, request: str) -> int | None:
    """Where the request first names a tool, each word of its name but :data:`DOING`'s a
    whole word (a plural name's also singular: "create an event" for ``create_event``; not
    "start time" for ``set_timer``, whose stems it shares; not "new" for ``get_news``), in
    a clause (up to ``.``, ``;``, ``!``, ``?`` or "but") free of :data:`_NOT_ASKED`; None
    where it does not."""
    words = [w.lower() for w in NAME_WORD.findall(name) if stem(w.lower()) not in DOING]
    if not words:
        return None
    start = 0
    for clause in re.split(r"([.;!?]|\bbut\b)", request[:REQUEST_CHARS]):
        if not _NOT_ASKED.search(clause) and all(
                writes_whole(clause, w) or w.endswith("s") and len(w) > 4
                and writes_whole(clause, w[:-1]) for w in words):
            return start
        start += len(clause)
    return None


def heard_text(messages: Sequence[dict]) -> str:
    """Every user message and the tool results after the last one, a line each: where a
    kept value may come from (not the server's get_tool_info answers, which hold the
    tools' schemas); the agent's results as :attr:`ToolMessage.heard` reads them."""
    users = [text_of(m.get("content")) for m in messages if m["role"] == "user"]
    return "\n".join(users + [r.heard for r in turn_tool_messages(messages)])


# the paths a built-in tool's not-found error suggests (mlx_agent.tools.builtin._missing)
_SUGGESTED = re.compile(r"did you mean ('[^'\n]{1,300}'(?: or '[^'\n]{1,300}'){0,2})\?\s*\Z")


def suggested_paths(messages: Sequence[dict], tools: Sequence[Tool]) -> list[str]:
    """The paths the built-in tools' not-found errors of the turn suggest ("did you mean
    'data/users.csv'?"), in order: another tool's error is no source (its text could name
    any path)."""
    builtin = {t.name for t in tools if t.builtin is not None}
    out = []
    for result in turn_tool_messages(messages):
        agent = result.agent if result.name in builtin else None
        if agent is not None and agent.get("exit_code", 0) != 0 \
                and isinstance(agent.get("stderr"), str) \
                and (found := _SUGGESTED.search(agent["stderr"][-1_000:])):
            out += re.findall(r"'([^'\n]{1,300})'", found.group(1))
    return out


def turn_results(messages: Sequence[dict]) -> list[str]:
    """What the tool results after the last user message hold whole (not the server's
    get_tool_info answers): each one's text, stripped, and where it is JSON (as the agent
    writes a result: ``{"tool": ..., "stdout": ...}``), each string in it, stripped, and
    each number but 0 and 1 (an exit code), as JSON writes it: what a call may pass on."""
    out = []
    for result in turn_tool_messages(messages):
        out.append(result.text.strip())
        if result.value is not NOT_JSON:
            out += [v.strip() if isinstance(v, str) else json.dumps(v)
                    for v in leaves(result.value) if isinstance(v, str) and v.strip()
                    or _number(v) is not None and _number(v) not in (0, 1)]
    return out


def without_made_up(tool: Tool, arguments: dict, heard: str) -> dict:
    """``arguments`` without the optional ones whose value ``heard`` (the user's messages
    and the turn's tool results) never writes (:meth:`Heard.made_up`), without the
    optional flags it never speaks of (:func:`~mlx_agent.flags.unheard_flag`: ``is_unisex:
    false`` for "find a salon in Fremont"), without an optional string that repeats a
    required argument's (``cinema_hall: "Noida"`` beside ``location: "Noida"``; of BFCL's
    calls that repeat a string, none was right), and, of a built-in tool (read-only where a
    path is optional: list_files, grep), without an optional path it never writes whole
    (:func:`~mlx_agent.file_paths.writes_path`: ``path: "this_folder"``): the tool's own
    default stands for a value the model made up. ``arguments`` itself where none is. Where
    the tool requires nothing only a built-in tool's paths are read (its schema then says
    nothing of what is optional). Another tool's path is read as any string: its default
    may be wider than the user meant (a ``clean`` tool's, the whole folder)."""
    paths = {k for k, v in arguments.items() if k not in tool.required and isinstance(v, str)
             and takes_path(k, tool.properties.get(k)) and not writes_path(heard, v)} \
        if tool.builtin is not None else set()
    if not tool.required:
        return {k: v for k, v in arguments.items() if k not in paths} if paths else arguments
    said = Heard(heard)
    required = {v.strip().lower() for k, v in arguments.items()
                if k in tool.required and isinstance(v, str) and len(v.strip()) > 2}
    kept = {k: v for k, v in arguments.items() if k in tool.required
            or not said.made_up(v) and not unheard_flag(k, v, said)
            and not (isinstance(v, str) and v.strip().lower() in required) and k not in paths}
    return arguments if len(kept) == len(arguments) else kept


def timed(tool: Tool, arguments: dict, request: str) -> dict:
    """``arguments`` with their dates in the formats their parameters ask
    (:func:`~mlx_agent.dates.dated_values`) and their hours on the clocks they count
    (:func:`~mlx_agent.clock_hours.clock_hours`)."""
    return clock_hours(tool, dated_values(tool, arguments, request), request)


def complete_reply(engine, lm, protocol: str, prompt: Sequence[int], reply: Reply,
                   text: str, ids: list[int], tail: list[int], tools: Sequence[Tool],
                   messages: Sequence[dict], sampler: Sampler = greedy_sampler,
                   made: Collection[str] = (), stop: Callable[[], bool] = lambda: False,
                   choices: Sequence[Tool] = (), max_tokens: int = 256,
                   may_answer: bool = False, pressed: bool = False
                   ) -> tuple[Reply, str, list[int]]:
    """``reply`` (``text``, sampled as ``ids`` and then ``tail``: its end token, if it had
    one; the reply to ``messages``) with its one call written again for the tool of
    ``choices`` the request describes (a reply cut off in a list that repeats itself first
    closed: :mod:`mlx_agent.runaway_list`), where that is another and this is the turn's
    first call (:mod:`mlx_agent.described_tool`; ``choices`` are the tools the reply's
    grammar let it call, none where a tool was named; ``max_tokens`` the reply's budget), an
    enum's value made the one the request names
    (:func:`~mlx_agent.copied_values.written_choices`) and a list of an enum's values the
    ones it names (:func:`~mlx_agent.copied_values.named_choices`), its made-up optional
    arguments dropped (:func:`without_made_up`, against :func:`heard_text`), each value the
    request assigns by name its parameter's, its garbled copies copied again, its places,
    lists, capitals, emails and web addresses as the request writes them, its numbers at the
    request's scale and sign, its rates as fractions (:mod:`mlx_agent.copied_values`), a
    city's bare name with the region its parameter asks and a country as the code it asks
    (:mod:`mlx_agent.place_region`), a result the request passes on where it says
    (:func:`piped_results`), its flags as the request asks, and at their stated defaults
    where nobody speaks of them (:mod:`mlx_agent.flags`), the stated optional arguments
    added (:func:`complete_call`, from :func:`request_text` and :func:`turn_results`) and
    its dates and hours as their parameters ask (:func:`timed`);
    where ``may_answer`` (the tool choice is auto), a call that is then
    :func:`~mlx_agent.unfounded.unfounded` becomes an answer that asks the user for its
    made-up values (its made-up strings too where ``pressed``: the reply had to be a call
    because the request wrote a tool's name, not because the user asked for one); and the
    text and ids it now reads as. All three as they were where nothing changed, where the
    reply is not one complete call of a known tool with no text beside it, or where the new
    call is one of ``made`` (calls that ran this turn, as the loop guard writes them: this
    must not turn a new call into a repeat). ``stop`` is asked before each probe (a client
    that left). Afterwards the engine holds ``prompt``, the reply's ids and ``tail``, as if
    the reply had been sampled so (the next turn reuses all of it)."""
    unchanged, sampled = (reply, text, ids), ids
    if getattr(engine, "cache_mode", None) == "rotating":  # a rotated window cannot be cut
        return unchanged  # back to the reply: each probe would prefill it all again
    opening = "{" if protocol == "json" else "<tool_call>"
    if not reply.complete and not reply.calls and text.lstrip().startswith(opening):
        try:  # cut off: a list that repeats itself, closed
            closed = closed_call(engine, lm, protocol, prompt, text, tools, sampler, stop)
        except ContextFull:
            closed = None
        except KeyboardInterrupt:  # the caller keeps the reply as sampled: so does the engine
            hold(engine, list(prompt) + ids + tail)
            raise
        if closed is None or closed[1] in made:
            hold(engine, list(prompt) + ids + tail)
            return unchanged
        unchanged = closed  # from here, "as it was" is the call as closed
        reply, text, ids = closed
    tool = next((t for t in tools if reply.calls and t.name == reply.calls[0].name), None)
    if tool is None or len(reply.calls) != 1 or not reply.complete \
            or reply.content is not None or reply.calls[0].error \
            or not isinstance(reply.calls[0].arguments, dict) \
            or not text.lstrip().startswith(opening):
        return unchanged
    request, call = request_text(messages), reply.calls[0]
    if not request.strip():
        hold(engine, list(prompt) + ids + tail)
        return unchanged
    heard = heard_text(messages)
    try:
        moved, arguments = _described(engine, lm, protocol, prompt, tool, call.arguments,
                                      messages, heard, sampler, stop, choices, max_tokens)
        # an enum's value the request names before what it never wrote is dropped
        arguments = named_choices(moved, written_choices(moved, arguments, request), request)
        arguments = assigned_values(moved, arguments, request)
        suggested = suggested_paths(messages, tools)
        arguments = whole_paths(moved, arguments, request, heard, suggested,
                                reads_only(moved),  # the conversation is read only for it
                                said=_said(messages) if reads_only(moved) else "")
        arguments = without_made_up(moved, arguments, "\n".join([heard, *suggested]))
        if moved is tool:  # a moved call's copies were read before it was moved
            arguments = recopied(engine, lm, prompt, protocol, tool, arguments, request,
                                 heard, sampler, stop)
        arguments = one_of_repeats(engine, lm, prompt, protocol, moved, arguments, stop)
        tool = moved
        arguments = whole_places(tool, apart_values(tool, arguments), request)
        arguments = country_codes(tool, regional_places(tool, arguments, heard))
        arguments = as_quoted(tool, as_cased(tool, arguments, request), request)
        arguments = whole_identifiers(tool, arguments, request)
        arguments = whole_lists(tool, arguments, request)
        arguments = piped_results(tool, arguments, request, last_result(messages))
        arguments = signed_numbers(tool, scaled_numbers(tool, arguments, request), request)
        arguments = percent_rates(tool, arguments, request)
        arguments = flags_by_default(tool, flags_as_asked(tool, arguments, request), heard)
        if may_answer and (made_up := unfounded(tool, arguments, messages,
                                                heard if pressed else None)):
            # no probe for a call that will not be made: the user is asked instead
            content = question(tool, made_up)
            text = written_json({"answer": content}, "json") if protocol == "json" else content
            reply, ids = Reply(content=content), reply_ids(lm, protocol, text)
            hold(engine, list(prompt) + ids + tail)
            return reply, text, ids
        read = arguments
        arguments = complete_call(engine, lm, prompt, protocol, tool, arguments, request,
                                  sampler, stop, turn_results(messages))
        arguments = timed(tool, arguments, request)  # added ones too
        if arguments is not call.arguments:
            arguments = written_arguments(protocol, tool, arguments)
            if tool.builtin is not None and read is not call.arguments \
                    and call_text(protocol, tool, arguments) in made:
                # a built-in tool's call completed back into one that ran this turn (a path
                # the model made up, dropped, probed back in: list_files(path="here")
                # failed): the call as read
                arguments = written_arguments(protocol, tool, timed(tool, read, request))
            if not tool.validate(arguments) and \
                    call_text(protocol, tool, arguments) not in made:
                text = call_text(protocol, tool, arguments)
                reply, ids = Reply(calls=[Call(tool.name, arguments)]), \
                    reply_ids(lm, protocol, text)
        hold(engine, list(prompt) + ids + tail)
        return reply, text, ids
    except ContextFull:  # a probe, or the longer call, past the context: as it was sampled,
        hold(engine, list(prompt) + unchanged[2] + tail)  # which fitted
        return unchanged
    except KeyboardInterrupt:  # the caller keeps the reply as sampled: so does the engine
        hold(engine, list(prompt) + sampled + tail)
        raise


def _described(engine, lm, protocol: str, prompt: Sequence[int], tool: Tool, arguments: dict,
               messages: Sequence[dict], heard: str, sampler: Sampler,
               stop: Callable[[], bool], choices: Sequence[Tool], max_tokens: int
               ) -> tuple[Tool, dict]:
    """The tool of ``choices`` the request describes (:func:`described_tool`; of a built-in
    file tool, the one it asks for: :func:`~mlx_agent.file_intent.asked_instead`) and the
    arguments the model writes for it, where the turn's first call is another's and no
    required string it writes is made up (:func:`_invents`: a chain's second tool, whose
    id the first call would find, is not called first); ``tool`` and ``arguments`` as
    they were otherwise (a later call of a chain is read as the model made it)."""
    last = last_user(messages) or 0
    if any(m["role"] == "tool" for m in messages[last:]):
        return tool, arguments
    request = request_text(messages)
    described = described_tool(choices, request, tool)
    if described is None:  # one built-in file tool for another
        described = asked_instead(choices, request, tool)
    if described is None or stop():
        return tool, arguments
    written = probe_arguments(engine, lm, sampler, prompt, protocol, described, max_tokens,
                              stop)
    if written is None or described.validate(written):
        return tool, arguments
    written = recopied(engine, lm, prompt, protocol, described, written, request, heard,
                       sampler, stop)  # "SanDiego" is no id
    return (tool, arguments) if _invents(described, written, heard) else (described, written)


def _said(messages: Sequence[dict]) -> str:
    """Every message's text, a line each: what the conversation has written so far."""
    return "\n".join(text_of(m.get("content")) for m in messages)


def _invents(tool: Tool, arguments: dict, heard: str) -> bool:
    """Whether a required string of ``arguments``, or a list of strings (free of an enum or
    a const), is one neither ``heard`` nor the tool's schema writes: no word of it begins
    one of theirs (:meth:`Heard.made_up`), or a word of it with a digit is none of theirs
    whole ("flight_1234"): an id or a name the model made up. A number may be worked out
    ("monthly": 12 a year), and is not read; nor is an object."""
    said = Heard("\n".join((heard, tool.description, json_text(tool.parameters))))
    whole = set(said.words)

    def made_up(value: str) -> bool:
        return said.made_up(value) or any(w not in whole for w in _words(value)
                                           if not w.isalpha())

    free = [arguments[k] for k in tool.required if k in arguments
            and (not isinstance(tool.properties.get(k), dict)
                 or not {"enum", "const"} & tool.properties[k].keys())]
    return any(made_up(v) for value in free
               for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))

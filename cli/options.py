"""Arguments and option groups shared by commands, each default defined once.

Imports only the light modules that define those defaults, so ``--help`` and usage errors
answer without loading MLX or mlx-lm."""

from __future__ import annotations

import functools
import math
import os
import re
from fractions import Fraction

import click

from mlx_agent.agent.limits import MAX_STEPS, MAX_TOKENS, RETRY_AFTER_ERROR
from mlx_agent.formats import NAMES as PROTOCOLS
from mlx_agent.models.registry import MODEL_ENV, WEIGHT_FORMATS, WEIGHTS_ENV, default_adapter
from mlx_agent.synth.config import MAX_TASKS

from .errors import UserError, warn


def _compose(*decorators):
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


MODEL_HELP = ("GGUF file, Hugging Face directory, .tinygpt file or model name "
              f"[default: ${MODEL_ENV}, else smollm2-135m]")


def model_argument(name: str = "model_spec", metavar: str = "[MODEL]"):
    """The optional MODEL argument, read from $MLX_AGENT_MODEL when not given."""
    return click.argument(name, required=False, metavar=metavar, envvar=MODEL_ENV)


def protocol_option(f):
    return click.option("--protocol", type=click.Choice(PROTOCOLS), default="auto",
                        show_default=True,
                        help="How tools are shown to the model: auto = hermes when the chat "
                             "template renders tools, else json.")(f)


# Sequences decoded together (--batch, --max-batch): each holds a KV cache of its own (22 MB
# for the bundled model, allocated up front), and on the CPU batches past 8 gain nothing
# (docs/batched-decoding.md); 999999999 ended in a segfault or the OOM killer.
MAX_BATCH = 256
BATCH = click.IntRange(1, MAX_BATCH)
TASKS = click.IntRange(1, MAX_TASKS)  # synth's and specialize's --n-train and --n-heldout
# Training processes: each loads the model and keeps one core busy; more than the CPUs only
# contend for them, and --processes 64 would have loaded 64 copies of the model.
PROCESSES = click.IntRange(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else os.cpu_count() or 1)  # the CPUs this process may use


def processes_option(f):
    """--processes: training processes on this machine (sft and specialize)."""
    return click.option(
        "--processes", type=PROCESSES, default=1, show_default=True,
        help="Train in N processes on this machine (at most its CPUs), each a share of every "
             "batch (on the CPU, 2 on 2 cores train about 1.4x as many rows a minute).")(f)


def max_tokens_option(default: int = MAX_TOKENS, help: str = "Tokens per assistant step."):
    return click.option("--max-tokens", type=click.IntRange(min=1), default=default,
                        show_default=True, help=help)


ALLOW_REPEAT_HELP = ("Let the model repeat a call that already ran in this turn (by "
                     "default the grammar no longer offers it).")


RETRY_HELP = ("After a tool call fails, make the model's next reply a call (another one: "
              "the loop guard keeps it from the same; of the built-in tool a built-in "
              "tool's error advises, if it does), up to N times a turn; 0 lets it answer at "
              "once.")

NAMED_HELP = ("Let the model choose freely even when the request tells it to use a tool by "
              "name (\"Use the echo tool to ...\" makes the first step call echo) or "
              "writes a tool's name and the model would answer without a call (\"the "
              "weather in Oslo\" then makes it call a tool; after a result, one the request "
              "names that no call of the turn has tried; after a built-in tool's error, the "
              "built-in tool it advises).")


STATED_HELP = ("Leave a call (and an answer) as the model wrote it; by default a turn's "
               "first call of a tool other than the one the request describes is written "
               "again for that "
               "one, each optional argument left out is asked of the model and added when "
               "the request states its value (\"in Celsius\"), one whose value neither the "
               "request nor a tool result wrote is dropped, a garbled copy of the request's "
               "words is copied again, a place or a list of numbers it copies is copied "
               "whole, an enum's value or a flag is the one the request names, and where the "
               "reply may answer, a call on a number no one gave becomes a question asking "
               "the user for it; where the tool choice is auto, a turn's first reply is a "
               "call where the request writes a tool's name and the model would answer, "
               "and so is a later reply where it names a tool not yet called (asking the "
               "user for what the call would make up; in agent and eval, "
               "--ignore-named-tool turns that off alone); a result the request passes on "
               "as a parameter is that parameter's value; dates are written in the format "
               "their parameter asks; a path is the one the request writes, and one made up "
               "for an optional parameter is dropped; in agent and eval, an answer that "
               "states nothing of a short tool result is followed by it.")


def loop_options(f):
    """--protocol, --max-steps, --max-tokens, --no-grammar, --allow-repeat-calls,
    --retry-after-error, --ignore-named-tool and --no-stated-arguments: how the agent loop
    runs."""
    return _compose(
        protocol_option,
        click.option("--max-steps", type=click.IntRange(min=1), default=MAX_STEPS,
                     show_default=True, help="Assistant steps (tool rounds) per user turn."),
        max_tokens_option(),
        click.option("--no-grammar", is_flag=True,
                     help="Do not constrain replies to valid tool calls and answers."),
        click.option("--allow-repeat-calls", is_flag=True, help=ALLOW_REPEAT_HELP),
        click.option("--retry-after-error", type=click.IntRange(min=0),
                     default=RETRY_AFTER_ERROR, show_default=True, metavar="N", help=RETRY_HELP),
        click.option("--ignore-named-tool", is_flag=True, help=NAMED_HELP),
        click.option("--no-stated-arguments", is_flag=True, help=STATED_HELP),
    )(f)


def model_options(f):
    """-m MODEL, adapter, weight format and context length, for a command that calls no
    tools (``generate``): no adapter unless --adapter names one, as the one a named model
    ships with is a tool-calling adapter, which puts filler in plain chat."""

    @functools.wraps(f)
    def without_shipped(*args, no_adapter: bool = False, **kwargs):
        if no_adapter and kwargs.get("adapter"):
            raise click.UsageError("give --adapter DIR or --no-adapter, not both")
        return f(*args, **kwargs)

    return _compose(
        click.option("-m", "--model", "model_spec", envvar=MODEL_ENV, metavar="MODEL",
                     help=MODEL_HELP),
        click.option("--adapter", type=click.Path(file_okay=False), default=None,
                     help="LoRA adapter directory (mlx-lm format) [default: none; the "
                          "adapter a model ships with is for calling tools]."),
        click.option("--no-adapter", is_flag=True, hidden=True),  # the default here
        weight_options,
    )(without_shipped)


def load_options(f):
    """Adapter, weight format and context length, for a command whose model parameter is
    ``model_spec``: it gets the model's default adapter
    (:func:`mlx_agent.models.default_adapter`) as ``adapter`` unless --adapter or
    --no-adapter says otherwise."""

    @functools.wraps(f)
    def with_adapter(*args, no_adapter: bool = False, **kwargs):
        if no_adapter and kwargs.get("adapter"):
            raise click.UsageError("give --adapter DIR or --no-adapter, not both")
        if not no_adapter and not kwargs.get("adapter"):
            found = default_adapter(kwargs["model_spec"])
            kwargs["adapter"] = str(found) if found else None
        return f(*args, **kwargs)

    return _compose(
        click.option("--adapter", type=click.Path(file_okay=False), default=None,
                     help="LoRA adapter directory (mlx-lm format) [default: the model's "
                          "own, if it ships one: see `mlx_agent models`]."),
        click.option("--no-adapter", is_flag=True,
                     help="The raw model, without the adapter it ships with."),
        weight_options,
    )(with_adapter)


def weight_options(f):
    """Weight format and context length."""
    return _compose(
        click.option("--weights", type=click.Choice(WEIGHT_FORMATS), envvar=WEIGHTS_ENV,
                     default="auto", show_default=True,
                     help="Weight format: auto = quantized on Metal and where the CPU kernels "
                          "run (see `mlx_agent models`), else float32."),
        click.option("--context-length", type=int, default=None,
                     help="Tokens the KV cache holds [default: the model's context length]."),
    )(f)


def prompt_cache_dtype_option(f):
    """--prompt-cache-dtype: how --prompt-cache-dir files store the KV state."""
    return click.option(
        "--prompt-cache-dtype", type=click.Choice(["float16", "float32", "int8"]),
        default="float16", show_default=True,
        help="How --prompt-cache-dir files store the KV state: int8 takes about half of "
             "float16's bytes (logits drift about 4e-3); float32 loads exactly when the KV "
             "cache is float32 (a float16 cache is stored as it is).")(f)


def cache_options(f):
    return _compose(
        click.option("--no-kv-preallocate", is_flag=True,
                     help="Grow the KV cache as needed instead of allocating it up front."),
        click.option("--kv-window", type=click.IntRange(min=0), default=0,
                     help="Rotating KV window of N tokens; the system prompt stays pinned "
                          "(0 = off: the context length is a hard limit)."),
    )(f)


def _not_utf8(text: str) -> str | None:
    """Why ``text`` is not UTF-8 (Python keeps such bytes from argv and stdin as lone
    surrogates, which no tokenizer takes), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        try:
            bad = f"byte 0x{text[e.start].encode('utf-8', 'surrogateescape')[0]:02x}"
        except UnicodeEncodeError:
            bad = "a lone surrogate"
        return f"not valid UTF-8 ({bad} at character {e.start}); give UTF-8 text"
    return None


def utf8_text(text: str, what: str) -> str:
    """``text`` (from standard input or a REPL line), or a UserError naming ``what``."""
    why = _not_utf8(text)
    if why:
        raise UserError(f"{what} is {why}")
    return text


class Utf8Text(click.ParamType):
    """Free text from the command line, refused in one line when it is not UTF-8."""

    name = "text"

    def convert(self, value, param, ctx):
        why = _not_utf8(value) if isinstance(value, str) else None
        if why:
            self.fail(why, param, ctx)
        return value


TEXT = Utf8Text()


class Bytes(click.ParamType):
    """A size in bytes: a whole number, or one with a binary unit as ``du -h`` writes it
    (``512K``, ``1.5G``; ``KB``/``KiB``, ``MB``/``MiB``, ... are read the same: 1024 a step)."""

    name = "bytes"
    UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}

    def __init__(self, min: int = 0):
        self.min = min

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            number = value
        else:
            found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(value), re.I)
            if not found or (found[2] == "" and "." in found[1]):
                self.fail(f"{value!r} is not a size: give bytes (500000000) or a number with "
                          "K, M, G or T (500M, 1.5G)", param, ctx)
            try:  # exact: a float lost the last digits of a big number, and was inf past 1e308
                number = int(Fraction(found[1]) * 1024 ** self.UNITS[found[2].lower()])
            except ValueError:  # past Python's 4300 digits for an int
                self.fail(f"{value[:20]!r}... is too large a size", param, ctx)
        if number < self.min:
            self.fail(f"{value!r} is less than {self.min} bytes", param, ctx)
        return number


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan and inf (Python's float() reads both)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.min is None and self.max is None:
            self.name = "float"  # shown as FLOAT, not FLOAT RANGE

    def _describe_range(self) -> str:
        # click describes an unbounded range as "x<=None"; its help then shows nothing
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def sampling_options(f):
    return _compose(
        click.option("-t", "--temperature", type=Finite(min=0), default=0.0,
                     show_default=True, help="0 = greedy."),
        click.option("--top-p", type=Finite(0, 1, min_open=True), default=1.0,
                     show_default=True),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
                     help="0 = off."),
        click.option("--min-p", type=Finite(0, 1, max_open=True), default=0.0,
                     show_default=True),
        click.option("--seed", type=int, default=None,
                     help="Same seed, same tokens (any integer; taken modulo 2**64)."),
    )(f)


def cache_mode(no_kv_preallocate: bool, kv_window: int | None) -> str:
    """The engine's cache mode for these options (a window of 0 means no window)."""
    if kv_window:
        return "rotating"
    return "growing" if no_kv_preallocate else "preallocated"


def sandbox_options(f):
    """--sandbox and --allow-network: how tool processes are confined."""
    return _compose(
        click.option("--sandbox", type=click.Choice(["auto", "bwrap", "seatbelt", "none"]),
                     default="auto", show_default=True, envvar="MLX_AGENT_SANDBOX",
                     help="Confine tool processes: auto = bwrap on Linux, seatbelt on macOS, "
                          "else none with a warning (see README, Security)."),
        click.option("--allow-network", is_flag=True,
                     help="Let sandboxed tools use the network."),
    )(f)


def trust_handlers_option(f):
    """--trust-handlers: whether tools files read as data may hold Python _handler tools."""
    return click.option(
        "--trust-handlers", is_flag=True,
        help="Run the tools files' _handler tools (Python, in this process, outside the "
             "sandbox); without it such a tool is an error.")(f)


def handler_mode(trust_handlers: bool) -> str:
    """``load_tools``'s ``handlers`` for a tools file read as data."""
    return "import" if trust_handlers else "refuse"


def make_sandbox(choice: str, allow_network: bool, root: str | None, write_cwd: bool = True):
    """The resolved sandbox for these options; an unavailable explicit one is a user error.
    ``write_cwd=False``: tools may write ``root`` only, not the directory they run in."""
    from mlx_agent.tools import SandboxUnavailable, resolve_sandbox

    try:
        return resolve_sandbox(choice, network=allow_network, writable=[root] if root else [],
                               write_cwd=write_cwd, warn=warn)
    except SandboxUnavailable as e:
        raise UserError(str(e)) from None


def mcp_options(f):
    """--mcp and --mcp-config: tools from Model Context Protocol servers."""
    return _compose(
        click.option("--mcp", "mcp_commands", multiple=True, metavar="'COMMAND ARGS...'",
                     help="Add the tools of this stdio MCP server (repeatable)."),
        click.option("--mcp-config", type=click.Path(dir_okay=False), default=None,
                     help='MCP servers in the {"mcpServers": {...}} shape other clients use.'),
    )(f)


def start_mcp(commands, config: str | None, sandbox, timeout: float, cwd: str | None):
    """The started MCP servers of these options, stopped when the command ends (however it
    ends); None when there are none."""
    if not commands and not config:
        return None
    from mlx_agent.tools.mcp import McpServers, load_config, spec_from_command

    specs = [spec_from_command(c) for c in commands] + (load_config(config) if config else [])
    servers = McpServers(specs, sandbox=sandbox, call_timeout=timeout, cwd=cwd)
    return click.get_current_context().with_resource(servers)

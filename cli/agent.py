"""``mlx_agent agent``: the conversation loop on the command line (single shot or REPL).

The command builds the tools (:func:`build_tools`), an event sink that shows or records what
happens (:class:`Sink`), the agent, and then runs one turn or the REPL (:func:`repl`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

import click

from . import paths
from .errors import Terminated, UserError, warn
from .terminal import for_terminal
from .options import (TEXT, Bytes, Finite, cache_mode, cache_options, load_options, loop_options,
                      make_sandbox, mcp_options, model_argument, prompt_cache_dtype_option,
                      sampling_options, sandbox_options, start_mcp, utf8_text)


class Sink:
    """Where agent events go: one JSON line each (``--json-out``) or what a person reads
    (tool calls on stderr, answers on stdout), and every event to the transcript file."""

    def __init__(self, json_out: bool, single: bool, transcript):
        self.json_out, self.single, self.transcript = json_out, single, transcript

    def __call__(self, event) -> None:
        from mlx_agent.agent import events as ev

        if self.transcript:
            self._record(ev.encode(event) + b"\n")
        if self.json_out:
            if not isinstance(event, ev.ToolResult):
                sys.stdout.buffer.write(ev.encode(event) + b"\n")
                sys.stdout.flush()
        elif isinstance(event, ev.ToolCall):
            self._tool_call(event)
        elif isinstance(event, ev.Answer):
            self._answer(event)

    def _record(self, line: bytes) -> None:
        """Append ``line`` whole, or end the run saying so (a full disk), the file cut back
        to its last whole line."""
        f, view = self.transcript, memoryview(line)
        at = f.tell()
        try:
            while view:
                view = view[f.write(view):]
        except OSError as e:
            with contextlib.suppress(OSError):
                f.truncate(at)
            raise UserError(f"cannot write the transcript {f.name}: {e.strerror or e}") from None

    @staticmethod
    def _tool_call(event) -> None:
        args = json.dumps(event.arguments, ensure_ascii=False)
        if len(args) > 120:
            args = args[:117] + "..."
        status = "timed out" if event.timed_out else f"exit {event.exit_code}"
        stderr = event.stderr.strip()
        detail = f": {stderr.splitlines()[0]}" if event.exit_code and stderr else ""
        click.secho(for_terminal(f"  ↳ {event.tool}({args}) → {status} "
                                 f"({event.duration_sec:.2f} s){detail}"), err=True, fg="cyan")
        for line in stderr.splitlines():  # what the sandbox undid is the user's to know too
            if line.startswith("sandbox: "):
                click.secho(for_terminal(f"    {line}"), err=True, fg="yellow")

    def _answer(self, event) -> None:
        mark = "(fallback: the reply had no valid shape)" if event.fallback else ""
        text = for_terminal(event.text)
        click.echo(text if self.single else f"agent> {text}")
        if mark:
            click.secho(f"note {mark}" if self.single else f"      {mark}", err=True,
                        fg="yellow")


def build_tools(tools_file: str | None, builtin: bool, root: str | None, timeout: float,
                env_names, sandbox, mcp=None, handlers: str = "import") -> list:
    """The tools of ``--tools`` (its ``_handler`` tools as ``handlers`` says: see
    ``load_tools``), ``--builtin-tools`` (``run_tests`` under ``sandbox``) and the started
    MCP servers ``mcp``, checked for clashing names; warnings about their templates and
    schemas are printed."""
    from mlx_agent.tools import builtin_tools, load_tools

    if not tools_file and not builtin and mcp is None:
        raise click.UsageError("give --tools FILE, or --builtin-tools with --root DIR, or --mcp")
    if builtin and not root:
        raise click.UsageError("--builtin-tools needs --root DIR")
    tools = load_tools(tools_file, handlers=handlers) if tools_file else []
    for warning in (w for t in tools for w in t.warnings):
        warn(warning)
    if builtin:
        try:
            tools += builtin_tools(root, timeout=timeout, env_names=env_names, sandbox=sandbox)
        except NotADirectoryError as e:
            raise UserError(str(e)) from None
    names = Counter(t.name for t in tools)  # not list.count per name: 40,000 tools took 40 s
    clash = sorted(n for n, k in names.items() if k > 1)
    if clash:
        raise UserError(f"tool {clash[0]!r} is defined twice (a --tools entry and a built-in)")
    if mcp is not None:  # after the check: a server's tool that clashes gets its server's prefix
        served, warnings = mcp.tools(taken=names.keys())
        for warning in warnings:
            warn(warning)
        tools += served
    return tools


def repl(turn, json_out: bool = False) -> None:
    """Read user turns until end of input or ``:quit``. Ctrl-C at the prompt drops the line
    and asks again, as Python's REPL and Ollama do: it stops a reply, never the session.
    With ``json_out`` the prompt goes to stderr, so stdout holds only JSON lines; a line
    that is not UTF-8, or a colon and a word that is not ``:quit``/``:q`` (a mistyped
    command), is refused and the session goes on."""
    if hasattr(sys.stdin, "reconfigure"):  # a strict UTF-8 locale would raise on such a line
        sys.stdin.reconfigure(errors="surrogateescape")
    while True:
        try:
            if json_out:
                click.echo("you> ", nl=False, err=True)
                text = input()
            else:
                text = input("you> ")
        except EOFError:
            click.echo(err=json_out)
            return
        except Terminated:  # SIGTERM ends the session, as it ends any other command
            raise
        except KeyboardInterrupt:
            click.echo("\n(:quit or Ctrl-D to leave)", err=True)
            continue
        if text.strip() in (":quit", ":q"):
            if not sys.stdin.isatty():  # no Enter echoed: end the prompt's line, as at EOF
                click.echo(err=json_out)
            return
        if re.fullmatch(r":[A-Za-z]+", text.strip()):  # a mistyped command is no request
            warn(f"unknown command {text.strip()!r}: :quit (or Ctrl-D) leaves; "
                 "anything else is sent to the model")
            continue
        if text.strip():
            try:
                text = utf8_text(text, "the line")
            except UserError as e:
                warn(e.format_message())
                continue
            turn(text)  # its errors (a transcript the disk cannot hold) end the session


@click.command()
@model_argument()
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="OpenAI-style tools JSON with _exec/_handler (see README).")
@click.option("--builtin-tools", is_flag=True,
              help="Add read_file, list_files, grep, write_file, run_tests over --root.")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Directory the built-in tools work in (and where _exec tools run).")
@click.option("--single", type=TEXT, default=None, metavar="TEXT",
              help="Ask once, print the answer, exit (1 when the turn ended without one).")
@click.option("--system", type=TEXT, default=None,
              help="System prompt (json: replaces the persona line).")
@loop_options
@click.option("--tool-timeout", type=Finite(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds before a tool's process group is killed.")
@click.option("--tool-env", multiple=True, metavar="NAME",
              help="Pass this environment variable to tools (repeatable).")
@click.option("--confirm-tools", is_flag=True, help="Ask y/N before each tool call.")
@click.option("--tool-choice", type=TEXT, default="auto", show_default=True,
              metavar="CHOICE",
              help="auto, required, none or a tool's name, enforced by the grammar; "
                   "comma-separated for one per step, the last repeated (read_file,none).")
@click.option("--json-out", is_flag=True, help="Print one JSON event per line on stdout.")
@click.option("--transcript", type=click.Path(dir_okay=False), default=None,
              help="Append every event, tool results included, to this JSONL file.")
@click.option("--prompt-cache-dir", type=click.Path(file_okay=False), default=None,
              envvar="MLX_AGENT_PROMPT_CACHE_DIR",
              help="Keep the system prompt's KV state here and load it instead of prefilling.")
@click.option("--prompt-cache-max-bytes", type=Bytes(), default=None,
              help="After saving, prune the cache directory to this size (LRU; 500M, 2G).")
@prompt_cache_dtype_option
@click.option("--save-session", type=click.Path(dir_okay=False), default=None,
              help="At exit, write the conversation and its KV state here.")
@click.option("--resume", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Continue a conversation saved with --save-session, without prefill.")
@click.option("--trajectory-dir", type=click.Path(file_okay=False), default=None,
              help="Write this rollout as a token-exact <uuid>.atraj file here.")
@click.option("--trajectory-task", type=TEXT, default=None, metavar="NAME",
              help="Task name recorded in the trajectory.")
@sandbox_options
@mcp_options
@load_options
@cache_options
@sampling_options
def agent(model_spec, tools_file, builtin_tools, root, single, system, protocol, max_steps,
          max_tokens, no_grammar, allow_repeat_calls, retry_after_error, ignore_named_tool,
          no_stated_arguments, tool_timeout, tool_env, confirm_tools, tool_choice, json_out,
          transcript, prompt_cache_dir, prompt_cache_max_bytes, prompt_cache_dtype, save_session,
          resume,
          trajectory_dir, trajectory_task, sandbox, allow_network,
          mcp_commands, mcp_config, adapter, weights, context_length,
          no_kv_preallocate, kv_window, temperature, top_p, top_k, min_p, seed):
    """Run the model as an agent that calls tools.

    \b
    Examples:
      mlx_agent agent --tools examples/echo.json --single "Echo hello"
      mlx_agent agent --builtin-tools --root . --single "Which files mention TODO?"
      mlx_agent agent model.gguf --tools tools.json --json-out --transcript run.jsonl
    """
    from mlx_agent.agent import Agent, AgentConfig, agent_format
    from mlx_agent.engine import SamplingParams
    from mlx_agent.models import load

    if single is not None and not single.strip():
        raise UserError("--single is empty; give the request to ask")
    if prompt_cache_max_bytes is not None and not prompt_cache_dir:
        raise click.UsageError("--prompt-cache-max-bytes needs --prompt-cache-dir")
    for name in tool_env:
        if not name.isidentifier() or not name.isascii():
            raise click.BadParameter(f"{name!r} is not an environment variable's name",
                                     param_hint="--tool-env")
    read = {"--tools": tools_file, "--mcp-config": mcp_config}  # --resume may be saved over
    paths.appendable_file(transcript, "--transcript", not_same_as={**read, "--resume": resume})
    paths.writable_file(save_session, "--save-session",
                        not_same_as={**read, "--transcript": transcript})
    paths.writable_dir(trajectory_dir, "--trajectory-dir")
    box = make_sandbox(sandbox, allow_network, root, write_cwd=False)  # only --root is theirs
    with contextlib.ExitStack() as stack:
        # the outputs are pinned (the transcript opened) before any tool or MCP server runs:
        # inside --root, one could swap a folder for a link elsewhere
        log = stack.enter_context(_transcript(transcript)) if transcript else None
        trajectories = _pinned(trajectory_dir, "the trajectory folder")
        session_folder = _pinned(save_session and Path(save_session).parent,
                                 "the --save-session folder")
        servers = start_mcp(mcp_commands, mcp_config, box, tool_timeout, root)
        tools = build_tools(tools_file, builtin_tools, root, tool_timeout, tool_env, box,
                            servers)
        choices = _tool_choices(tool_choice, tools)
        if no_grammar and set(choices) != {"auto"}:
            raise click.UsageError("--tool-choice needs the grammar; drop --no-grammar")
        lm = load(model_spec, adapter=adapter, weights=weights, context_length=context_length)
        mode = cache_mode(no_kv_preallocate, kv_window)
        engine = lm.engine(cache_mode=mode, kv_window=kv_window or None)
        config = AgentConfig(
            max_steps=max_steps, max_tokens=max_tokens, tool_timeout=tool_timeout,
            tool_env=tool_env, tool_cwd=root, sandbox=box,
            sampling=SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                    min_p=min_p, seed=seed),
            confirm=_confirm if confirm_tools else None, grammar=not no_grammar,
            tool_choice=choices, allow_repeat_calls=allow_repeat_calls,
            retry_after_error=retry_after_error, follow_named_tool=not ignore_named_tool,
            stated_arguments=not no_stated_arguments)
        recorder = _recorder(trajectories, trajectory_task, lm, config)
        bot = Agent(lm, engine, tools, agent_format(protocol, lm, system), config,
                    emit=Sink(json_out, single is not None, log), recorder=recorder)
        if not json_out:
            count = f"{len(tools)} tool" + ("" if len(tools) == 1 else "s")
            click.secho(f"[{for_terminal(lm.identity.name)}, {bot.fmt.name} protocol, {count}, "
                        f"{mode} KV cache, grammar {'off' if no_grammar else 'on'}, "
                        f"{box.describe()}]", err=True, dim=True)
        if prompt_cache_dir:
            _prime(bot, prompt_cache_dir, prompt_cache_max_bytes, prompt_cache_dtype)
        if resume:
            _resume(bot, resume, saved_over=bool(save_session)
                    and paths.same_file(resume, save_session))
        if save_session:
            stack.push(_saver(bot, session_folder, Path(save_session).name))

        def turn(text: str) -> int:
            """One user turn; its exit status: 0 answered (an answer --max-tokens cut is
            one, with a warning, as a completion's finish_reason "length" is), 130 Ctrl-C, 1
            otherwise, a reply the end of the context cut off included (what it wrote is
            shown, but the context is spent); SIGTERM cutting the reply ends the session:
            the turn raises it on."""
            out = bot.ask(text)
            if isinstance(out.interrupt, Terminated):
                raise out.interrupt
            _warn_stop(out, max_steps, max_tokens, json_out)
            stop = out.stats.stop
            return 130 if stop == "interrupted" else \
                0 if out.answer is not None and stop != "context" else 1

        if single is not None:
            sys.exit(turn(single))
        repl(turn, json_out)


def _tool_choices(text: str, tools) -> tuple[str, ...]:
    """``--tool-choice``'s comma-separated steps, each checked before the model loads."""
    choices = tuple(c.strip() for c in text.split(","))
    names = [t.name for t in tools]
    for choice in choices:
        if not choice:
            raise UserError(f"--tool-choice {text!r} has an empty step; give auto, required, "
                            "none or a tool's name, comma-separated for one per step")
        if choice not in ("auto", "required", "none", *names):
            known = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") or "none"
            raise UserError(f"--tool-choice names {choice!r}, which is not a tool here "
                            f"(tools: {known}); use auto, required, none or a tool's name")
        if choice == "required" and not names:
            raise UserError("--tool-choice required needs a tool, and there is none here; "
                            "give --tools, or use auto or none")
    return choices


def _confirm(name: str, arguments: dict) -> bool:
    # the model wrote the arguments: a bidi override or an escape sequence in them could make
    # the call read as another one
    call = for_terminal(f"{name}({json.dumps(arguments, ensure_ascii=False)})")
    try:
        return click.confirm(f"run {call}?", default=False, err=True)
    except click.Abort as e:  # click's answer to both Ctrl-C and the end of input
        if isinstance(e.__context__, EOFError):
            click.echo("(end of input: not run)", err=True)
            return False  # as the default, N, says
        raise KeyboardInterrupt from None  # the agent's own Ctrl-C: the turn stops


@contextlib.contextmanager
def _transcript(path: str):
    """The transcript, open to append; one this run made and left empty (it failed before
    its first event: a model that did not load) is removed again."""
    existed = os.path.lexists(path)
    with open(path, "ab", buffering=0) as f:  # each event reaches the file as it happens
        try:
            yield f
        finally:
            if not existed and f.tell() == 0:  # nothing written (the file is new)
                with contextlib.suppress(FileNotFoundError):  # a tool in --root removed it
                    os.unlink(path)


def _pinned(path, what: str):
    """A :class:`~mlx_agent.fileio.PinnedFolder` for ``path`` (None without one)."""
    from mlx_agent.fileio import PinnedFolder

    if not path:
        return None
    try:
        return PinnedFolder(path, what)
    except OSError as e:
        raise UserError(f"cannot write to {what} {path}: {e.strerror or e}") from None


def _recorder(folder, task, lm, config):
    if folder is None:
        return None
    import dataclasses

    from mlx_agent.trajectory import Recorder

    return Recorder(folder, task=task, model_fingerprint=lm.identity.fingerprint,
                    sampling=dataclasses.asdict(config.sampling), checkpoint_path=str(lm.path))


def _prime(bot, directory: str, max_bytes: int | None, storage: str) -> None:
    from mlx_agent.prompt_cache import PromptCache

    primed = bot.prime(PromptCache(directory, warn=warn, max_bytes=max_bytes, storage=storage))
    if primed.hit:
        click.echo(f"loaded system-prompt cache ({primed.tokens} tokens) — skipping prefill",
                   err=True)


def _resume(bot, path: str, saved_over: bool) -> None:
    """Continue the session at ``path``; one that cannot be used starts a new conversation,
    unless that would be saved over it at exit (``saved_over``): then it is an error."""
    try:
        n = bot.resume(path)
        click.echo(f"resumed session {path} ({n} tokens) — skipping prefill" if n else
                   f"resumed session {path} (its conversation only: prefilled again)", err=True)
    except ValueError as e:
        if saved_over:
            raise UserError(f"cannot resume {path}: {e}; not starting a new conversation, "
                            "which --save-session would replace it with (name another file "
                            "to start one)") from None
        warn(f"cannot resume {path}: {e}; starting a new conversation")


def _saver(bot, folder, name: str):
    """The exit callback that saves the session: one that cannot be saved fails the run
    (exit 2), unless the run is failing already (an error, Ctrl-C, SIGTERM): then a warning."""
    def save(kind, error, tb) -> None:
        try:
            _save(bot, folder, name)
        except UserError as e:
            if kind is not None and not issubclass(kind, SystemExit):
                warn(e.format_message())
            else:
                raise
    return save


def _save(bot, folder, name: str) -> None:
    from mlx_agent.fileio import FolderReplaced

    path = folder.path / name
    try:
        path = folder.check() / name
        bot.save_session(path)
    except FolderReplaced as e:
        raise UserError(f"cannot save the session: {e}") from None
    except OSError as e:
        raise UserError(f"cannot save the session to {path}: {e.strerror or e}") from None


def _warn_stop(out, max_steps: int, max_tokens: int, json_out: bool) -> None:
    stop = out.stats.stop
    if stop == "steps" and not json_out:
        warn(f"no answer within --max-steps {max_steps}")
    elif stop == "context" and out.dropped:
        warn(f"the message does not fit the context ({out.warning}); it was left out: "
             "send a shorter one, or start a new session")
    elif stop == "context":
        warn(f"the context is full ({out.warning}); start a new session, raise "
             "--context-length, or use a rotating --kv-window")
    elif stop == "grammar":
        warn(out.warning)
    elif out.cut:
        warn(f"the answer reached --max-tokens {max_tokens} before it ended; it is shown as "
             "it stands: raise --max-tokens for a whole answer")
    elif stop == "interrupted" and not json_out:
        click.secho("(interrupted)", err=True, fg="yellow")

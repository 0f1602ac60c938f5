"""``mlx_agent agent``: the conversation loop on the command line (single shot or REPL)."""

from __future__ import annotations

import json
import sys

import click

from .options import (cache_mode, cache_options, load_options, make_sandbox, sampling_options,
                      sandbox_options)


def _human(event, *, single: bool) -> None:
    """What a person sees: tool calls on stderr; answers on stdout."""
    from mlx_agent.agent import events as ev

    if isinstance(event, ev.ToolCall):
        args = json.dumps(event.arguments, ensure_ascii=False)
        if len(args) > 120:
            args = args[:117] + "..."
        status = "timed out" if event.timed_out else f"exit {event.exit_code}"
        detail = f": {event.stderr.strip().splitlines()[0]}" if event.exit_code and event.stderr.strip() else ""
        click.secho(f"  ↳ {event.tool}({args}) → {status} ({event.duration_sec:.2f} s){detail}",
                    err=True, fg="cyan")
    elif isinstance(event, ev.Answer):
        mark = " (fallback: the reply had no valid shape)" if event.fallback else ""
        if single:
            click.echo(event.text)
            if mark:
                click.secho(f"note{mark}", err=True, fg="yellow")
        else:
            click.echo(f"agent> {event.text}")
            if mark:
                click.secho(f"      {mark.strip()}", err=True, fg="yellow")


@click.command()
@click.argument("model_spec", required=False, metavar="[MODEL]", envvar="MLX_AGENT_MODEL")
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="OpenAI-style tools JSON with _exec/_handler (see README).")
@click.option("--builtin-tools", is_flag=True,
              help="Add read_file, list_files, grep, write_file, run_tests over --root.")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Directory the built-in tools work in (and where _exec tools run).")
@click.option("--single", default=None, metavar="TEXT", help="Ask once, print the answer, exit.")
@click.option("--system", default=None, help="System prompt (json: replaces the persona line).")
@click.option("--protocol", type=click.Choice(["auto", "json", "hermes"]), default="auto",
              show_default=True, help="auto = hermes when the chat template renders tools.")
@click.option("--max-steps", type=click.IntRange(min=1), default=8, show_default=True,
              help="Assistant steps (tool rounds) per user turn.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="Tokens per assistant step.")
@click.option("--tool-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds before a tool's process group is killed.")
@click.option("--tool-env", multiple=True, metavar="NAME",
              help="Pass this environment variable to tools (repeatable).")
@click.option("--confirm-tools", is_flag=True, help="Ask y/N before each tool call.")
@click.option("--no-grammar", is_flag=True,
              help="Do not constrain replies to valid tool calls and answers.")
@click.option("--tool-choice", default="auto", show_default=True, metavar="CHOICE",
              help="auto, required, none or a tool's name, enforced by the grammar; "
                   "comma-separated for one per step, the last repeated (read_file,none).")
@click.option("--json-out", is_flag=True, help="Print one JSON event per line on stdout.")
@click.option("--transcript", type=click.Path(dir_okay=False), default=None,
              help="Append every event, tool results included, to this JSONL file.")
@click.option("--prompt-cache-dir", type=click.Path(file_okay=False), default=None,
              envvar="MLX_AGENT_PROMPT_CACHE_DIR",
              help="Keep the system prompt's KV state here and load it instead of prefilling.")
@click.option("--prompt-cache-max-bytes", type=click.IntRange(min=0), default=None,
              help="After saving, prune the cache directory to this size (LRU).")
@click.option("--save-session", type=click.Path(dir_okay=False), default=None,
              help="At exit, write the conversation and its KV state here.")
@click.option("--resume", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Continue a conversation saved with --save-session, without prefill.")
@click.option("--trajectory-dir", type=click.Path(file_okay=False), default=None,
              help="Write this rollout as a token-exact <uuid>.atraj file here.")
@click.option("--trajectory-task", default=None, metavar="NAME",
              help="Task name recorded in the trajectory.")
@sandbox_options
@load_options
@cache_options
@sampling_options
def agent(model_spec, tools_file, builtin_tools, root, single, system, protocol, max_steps,
          max_tokens, tool_timeout, tool_env, confirm_tools, no_grammar, tool_choice, json_out, transcript,
          prompt_cache_dir, prompt_cache_max_bytes, save_session, resume, trajectory_dir,
          trajectory_task, sandbox, allow_network, adapter, weights, context_length,
          no_kv_preallocate, kv_window, temperature, top_p, top_k, min_p, seed):
    """Run the model as an agent that calls tools.

    \b
    Examples:
      mlx_agent agent --tools examples/echo.json --single "Echo hello"
      mlx_agent agent --builtin-tools --root . --single "Which files mention TODO?"
      mlx_agent agent model.gguf --tools tools.json --json-out --transcript run.jsonl
    """
    from mlx_agent.agent import Agent, AgentConfig, events as ev, make_protocol
    from mlx_agent.engine import SamplingParams
    from mlx_agent.models import load
    from mlx_agent.tools import builtin_tools as make_builtins
    from mlx_agent.tools import load_tools

    from .main import UserError

    if not tools_file and not builtin_tools:
        raise click.UsageError("give --tools FILE, or --builtin-tools with --root DIR")
    if builtin_tools and not root:
        raise click.UsageError("--builtin-tools needs --root DIR")
    tools = load_tools(tools_file) if tools_file else []
    box = make_sandbox(sandbox, allow_network, root)
    if builtin_tools:
        try:
            tools += make_builtins(root, timeout=tool_timeout, env_names=tool_env, sandbox=box)
        except NotADirectoryError as e:
            raise UserError(str(e)) from None
    names = [t.name for t in tools]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise UserError(f"tool {clash[0]!r} is defined twice (a --tools entry and a built-in)")

    lm = load(model_spec, adapter=adapter, weights=weights, context_length=context_length)
    proto = make_protocol(protocol, lm, tools, system)
    mode = cache_mode(no_kv_preallocate, kv_window)
    if mode == "rotating" and kv_window <= len(proto.system_ids):
        raise UserError(f"--kv-window {kv_window} does not hold the {len(proto.system_ids)}-token"
                        " system prompt; use a larger window")
    engine = lm.engine(cache_mode=mode, kv_window=kv_window or None)

    log = open(transcript, "ab") if transcript else None

    def emit(event):
        if log:
            log.write(ev.encode(event) + b"\n")
            log.flush()
        if json_out:
            if not isinstance(event, ev.ToolResult):
                sys.stdout.buffer.write(ev.encode(event) + b"\n")
                sys.stdout.flush()
        else:
            _human(event, single=single is not None)

    def confirm(name, arguments):
        return click.confirm(f"run {name}({json.dumps(arguments, ensure_ascii=False)})?",
                             default=False, err=True)

    config = AgentConfig(
        max_steps=max_steps, max_tokens=max_tokens, tool_timeout=tool_timeout,
        tool_env=tool_env, tool_cwd=root, sandbox=box,
        sampling=SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                min_p=min_p, seed=seed),
        confirm=confirm if confirm_tools else None, grammar=not no_grammar,
        tool_choice=tuple(c.strip() for c in tool_choice.split(",")))
    if no_grammar and config.choices() != {"auto"}:
        raise click.UsageError("--tool-choice needs the grammar; drop --no-grammar")
    recorder = None
    if trajectory_dir:
        import dataclasses

        from mlx_agent.trajectory import Recorder

        try:
            recorder = Recorder(trajectory_dir, task=trajectory_task,
                                model_fingerprint=lm.identity.fingerprint,
                                sampling=dataclasses.asdict(config.sampling),
                                checkpoint_path=str(lm.path))
        except OSError as e:
            raise UserError(f"cannot write trajectories to {trajectory_dir}: "
                            f"{e.strerror or e}") from None
    bot = Agent(lm, engine, tools, proto, config, emit=emit, recorder=recorder)
    if not json_out:
        click.secho(f"[{lm.identity.name}, {proto.name} protocol, {len(tools)} tools, "
                    f"{mode} KV cache, grammar {'off' if no_grammar else 'on'}, "
                    f"{box.describe()}]", err=True, dim=True)
    if prompt_cache_dir:
        from mlx_agent.prompt_cache import PromptCache

        def warn(message):
            click.secho(f"warning: {message}", err=True, fg="yellow")

        primed = bot.prime(PromptCache(prompt_cache_dir, warn=warn,
                                       max_bytes=prompt_cache_max_bytes))
        if primed.hit:
            click.echo(f"loaded system-prompt cache ({primed.tokens} tokens) — skipping prefill",
                       err=True)

    if resume:
        try:
            n = bot.resume(resume)
            click.echo(f"resumed session {resume} ({n} tokens) — skipping prefill", err=True)
        except ValueError as e:
            click.secho(f"warning: cannot resume {resume}: {e}; starting a new conversation",
                        err=True, fg="yellow")

    def turn(text) -> bool:
        out = bot.ask(text)
        if out.stats.stop == "steps" and not json_out:
            click.secho(f"warning: no answer within --max-steps {max_steps}", err=True, fg="yellow")
        elif out.stats.stop == "context":
            click.secho(f"warning: the context is full ({bot.turn_warning}); start a new session "
                        "or use --kv-window", err=True, fg="yellow")
        elif out.stats.stop == "interrupted" and not json_out:
            click.secho("(interrupted)", err=True, fg="yellow")
        return out.answer is not None

    try:
        if single is not None:
            sys.exit(0 if turn(single) else 1)
        while True:
            try:
                text = input("you> ")
            except EOFError:
                click.echo()
                break
            if text.strip() in (":quit", ":q"):
                break
            if text.strip():
                turn(text)
    finally:
        if save_session:
            try:
                bot.save_session(save_session)
            except OSError as e:
                click.secho(f"warning: cannot save the session to {save_session}: "
                            f"{e.strerror or e}", err=True, fg="yellow")
        if log:
            log.close()

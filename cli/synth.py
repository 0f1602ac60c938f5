"""``mlx_agent synth``: training and held-out tasks for a tool catalogue."""

from __future__ import annotations

import click

from mlx_agent.synth.config import SynthConfig

from . import paths
from .options import (TASKS, Finite, handler_mode, make_sandbox, mcp_options, sandbox_options,
                      start_mcp, trust_handlers_option)

DEFAULTS = SynthConfig()
SHARE = Finite(0, 1)


@click.command()
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="Tools file (JSON, as for `agent --tools`).")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Directory for train.jsonl, heldout.jsonl, tools.json and report.json.")
@click.option("--n-train", type=TASKS, default=DEFAULTS.n_train,
              show_default=True, help="Training tasks.")
@click.option("--n-heldout", type=TASKS, default=DEFAULTS.n_heldout,
              show_default=True, help="Held-out tasks.")
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True)
@click.option("--no-tool-share", type=SHARE, default=DEFAULTS.no_tool_share, show_default=True,
              help="Share of requests that no tool answers (no call is the right reply).")
@click.option("--outside-share", type=SHARE, default=DEFAULTS.outside_share, show_default=True,
              help="Share of requests for a tool the catalogue lacks (a generated tool that "
                   "shares no noun with the catalogue): no call is the right reply.")
@click.option("--two-call-share", type=SHARE, default=DEFAULTS.chain_share, show_default=True,
              help="Share of tasks needing two calls, the second on the first one's result.")
@click.option("--answer-share", type=SHARE, default=DEFAULTS.answer_share, show_default=True,
              help="Share of tasks whose answer must state the tool's result.")
@click.option("--no-run-tools", is_flag=True,
              help="Do not run the tools (then no two-call or answer tasks).")
@mcp_options
@sandbox_options
@trust_handlers_option
def synth(tools_file, out, n_train, n_heldout, seed, no_tool_share, outside_share,
          two_call_share, answer_share, no_run_tools, mcp_commands, mcp_config, sandbox,
          allow_network, trust_handlers):
    """Synthesise tasks for the tools of --tools FILE and of MCP servers: a training and a
    held-out set for `eval`.

    Arguments come from each tool's schema, values from pools chosen by parameter name and
    description; requests are phrased through many templates. The held-out set uses other
    values and other template families than training; report.json measures the overlap.
    To learn their results, each tool runs a few times, as `eval` would run it, in an empty
    temporary directory, in the sandbox (--no-run-tools skips that).

    The tools of MCP servers (--mcp, --mcp-config) join the file's; the tasks then need the
    same servers in `eval`, which the tasks file cannot name: pass the same options there.

    \b
    Examples:
      mlx_agent synth --tools tools.json --out tasks/ --n-train 300 --n-heldout 60
      mlx_agent eval --tasks tasks/heldout.jsonl
      mlx_agent synth --mcp "python server.py" --out tasks/
      mlx_agent eval --tasks tasks/heldout.jsonl --mcp "python server.py"
    """
    import contextlib
    from pathlib import Path

    from mlx_agent.progress import Progress
    from mlx_agent.synth.synthesis import report_lines, synthesize, write
    from mlx_agent.tools import load_tools

    from .errors import UserError, warn

    if no_tool_share + outside_share + two_call_share + answer_share > 1:
        raise click.BadParameter("the shares add up to more than 1", param_hint="--*-share")
    if not tools_file and not mcp_commands and not mcp_config:
        raise click.UsageError("give --tools FILE, or MCP servers with --mcp / --mcp-config")
    tools = load_tools(tools_file, handlers=handler_mode(trust_handlers)) \
        if tools_file else []  # a bad file: one line, exit 2
    box = make_sandbox(sandbox, allow_network, None)
    servers = start_mcp(mcp_commands, mcp_config, box, 10.0, None)
    if servers is not None:
        served, warnings = servers.tools(taken=[t.name for t in tools])
        for warning in warnings:
            warn(warning)
        tools += served
    if not tools:
        raise UserError("the catalogue has no tools; give at least one")
    config = SynthConfig(n_train=n_train, n_heldout=n_heldout, seed=seed,
                         no_tool_share=no_tool_share, outside_share=outside_share,
                         chain_share=two_call_share,
                         answer_share=answer_share, run_tools=not no_run_tools)
    made = not Path(out).exists()
    paths.writable_dir(out, "--out")  # before the work: a directory that cannot take the files
    try:
        with Progress(n_train + n_heldout, "synth", unit="task") as bar:
            result = synthesize(tools, config, sandbox=box, done=lambda n: bar.advance(n=n))
    except BaseException:  # Ctrl-C or an error: no empty directory left behind
        if made:
            with contextlib.suppress(OSError):
                Path(out).rmdir()
        raise
    try:  # the file's tools only: a server's tools come from the server, in eval as here
        written = write(result, Path(tools_file).read_bytes() if tools_file else b"[]\n", out)
    except OSError as e:
        raise UserError(f"cannot write to {out}: {e.strerror or e}; "
                        "choose a directory you can write") from None
    for line in report_lines(result.report):
        click.echo(line)
    click.echo("wrote " + ", ".join(str(p) for p in written))

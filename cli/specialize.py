"""``mlx_agent specialize``: synth -> written rows -> LoRA -> held-out eval, for a catalogue."""

from __future__ import annotations

import click

from mlx_agent.synth.config import SynthConfig

from .errors import UserError, warn
from .fanout import check_combination, check_ray_options, ray_options
from .options import (BATCH, TASKS, Finite, handler_mode, load_options, make_sandbox,
                      mcp_options, model_argument, processes_option, protocol_option,
                      sandbox_options, start_mcp, trust_handlers_option)

SYNTH = SynthConfig()
NO_TOOLS_FILE = b'{"tools": []}\n'  # the tasks' tools file when no tool is a file's


@click.command()
@model_argument()
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="Tools file (JSON, as for `agent --tools`).")
@click.option("--out", type=click.Path(), required=True,
              help="Directory for the adapter, tasks/, rows.jsonl and results.json "
                   "(written whole at the end; a previous result there is replaced).")
@click.option("--fixture", type=click.Path(exists=True, file_okay=False), default=None,
              help="Directory the tools run in (a fresh copy for every call and task).")
@click.option("--builtin-tools", is_flag=True,
              help="Add read_file, list_files, grep, write_file, run_tests, each call and "
                   "task over a fresh copy of --fixture (as `agent --builtin-tools`).")
@click.option("--n-train", type=TASKS, default=SYNTH.n_train,
              show_default=True, help="Training tasks (one written conversation each).")
@click.option("--n-heldout", type=TASKS, default=60, show_default=True,
              help="Held-out tasks, evaluated before and after.")
@click.option("--seed", type=int, default=SYNTH.seed, show_default=True)
@click.option("--iters", type=click.IntRange(min=1), default=150, show_default=True,
              help="Training iterations (batches of 4).")
@click.option("--minutes", type=Finite(min=0, min_open=True), default=None,
              help="Stop training after this many minutes, whatever --iters says.")
@processes_option
@click.option("--max-steps", type=click.IntRange(min=1), default=4, show_default=True,
              help="Assistant steps per held-out task.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens per assistant step.")
@click.option("--batch", type=BATCH, default=1, show_default=True,
              help="Held-out runs at a time, decoded together in one batch.")
@protocol_option
@sandbox_options
@trust_handlers_option
@mcp_options
@load_options
@ray_options
def specialize(model_spec, tools_file, out, fixture, builtin_tools, n_train, n_heldout, seed,
               iters, minutes, processes, max_steps, max_tokens, batch, protocol, sandbox,
               allow_network, trust_handlers, mcp_commands, mcp_config, adapter, weights,
               context_length, ray_address, ray_workers):
    """Fine-tune a specialist for the tools in FILE and measure it on held-out tasks.

    Synthesises tasks from the catalogue (as `synth`), writes a conversation for each
    training task with the tool's real result where it runs (else one made up from its
    schema), trains a LoRA adapter on them (from --adapter when given: a general one),
    and prints the starting model against the specialist on the held-out tasks.

    \b
    Example:
      mlx_agent specialize --tools examples/everyday.json --out build/everyday --minutes 20
      mlx_agent specialize --builtin-tools --fixture my/repo --out build/files
      mlx_agent specialize --tools tools.json --out build/mine --batch 8   # faster evals
      mlx_agent specialize --tools tools.json --out build/mine --ray auto  # evals on Ray
      mlx_agent agent --adapter build/everyday --tools examples/everyday.json
    """
    import dataclasses
    from pathlib import Path

    from mlx_agent.fileio import check_tree
    from mlx_agent.models import load
    from mlx_agent.specialize import (RECIPE, Cluster, Models, SpecializeConfig, prepare_out,
                                      table)
    from mlx_agent.specialize import specialize as run_specialize
    from mlx_agent.tools import load_tools

    if not tools_file and not (mcp_commands or mcp_config or builtin_tools):
        raise click.UsageError("give --tools FILE, --builtin-tools, or --mcp / --mcp-config")
    check_ray_options(ray_address, ray_workers)
    if RECIPE.batch_size % processes:
        divisors = [str(d) for d in range(1, RECIPE.batch_size + 1) if RECIPE.batch_size % d == 0]
        raise UserError(f"--processes must divide the batch of {RECIPE.batch_size} rows "
                        f"({', '.join(divisors)})")
    check_combination(ray_address, mcp=mcp_commands or mcp_config)
    tools = load_tools(tools_file, handlers=handler_mode(trust_handlers)) \
        if tools_file else []  # a bad file: one line, exit 2
    for warning in (w for t in tools for w in t.warnings):
        warn(warning)
    if fixture:
        try:  # copied for every rollout and task: files, folders and links only
            check_tree(fixture)
        except OSError as e:
            raise UserError(f"--fixture {fixture} cannot be copied: {e.filename}: "
                            f"{e.strerror}") from None
    prepare_out(out).rmdir()  # before any work: an --out that cannot be written fails now
    box = make_sandbox(sandbox, allow_network, None)
    servers = start_mcp(mcp_commands, mcp_config, box, 30.0, fixture)
    served = []
    if servers is not None:
        served, warnings = servers.tools(taken=[t.name for t in tools])
        for warning in warnings:
            warn(warning)
    if not tools and not served and not builtin_tools:
        raise UserError("the catalogue has no tools; give at least one")
    config = SpecializeConfig(
        synth=dataclasses.replace(SYNTH, n_train=n_train, n_heldout=n_heldout, seed=seed),
        sft=dataclasses.replace(RECIPE, iters=iters, minutes=minutes, seed=seed,
                                processes=processes),
        protocol=protocol, max_steps=max_steps, max_tokens=max_tokens, sandbox=box,
        fixture=fixture, builtin=builtin_tools, extra_tools=tuple(served), batch=batch,
        cluster=Cluster(ray_address, ray_workers, model_spec, weights, context_length, sandbox,
                        allow_network, batch) if ray_address else None)

    def loader(adapter=None):
        return load(model_spec, adapter=adapter, weights=weights, context_length=context_length)

    data = Path(tools_file).read_bytes() if tools_file else NO_TOOLS_FILE
    try:
        results = run_specialize(Models(loader, adapter), tools, data, out, config,
                                 log=lambda m: click.echo(m, err=True))
    except ValueError as e:  # the training's own (it diverged, no row left), as sft says them
        raise UserError(str(e)) from None
    for line in table(results):
        click.echo(line)
    click.echo(f"{results['rows']} training rows, {results['sft']['iters']} iterations, "
               f"{results['minutes']} minutes; adapter and results in {out}")

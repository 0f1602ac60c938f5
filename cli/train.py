"""``mlx_agent traces-to-data`` and ``mlx_agent sft``: from trajectories to a LoRA adapter."""

from __future__ import annotations

from pathlib import Path

import click

from mlx_agent.models.registry import MAX_LORA_RANK

from . import paths
from .errors import UserError, warn
from .fanout import (WorkerTally, check_combination, check_ray_options, ray_options, run_line,
                     runs_file)
from .options import (BATCH, Finite, handler_mode, load_options, loop_options, make_sandbox,
                      mcp_options, model_argument, processes_option, sandbox_options,
                      start_mcp, trust_handlers_option, weight_options)
from .terminal import for_terminal


@click.command("traces-to-data")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="JSONL file to write (required unless --dry-run).")
@click.option("--mode", type=click.Choice(["sft", "dpo"]), default="sft", show_default=True)
@click.option("--min-reward", type=Finite(), default=None,
              help="Keep only trajectories with at least this reward.")
@click.option("--dry-run", is_flag=True, help="Count what each filter drops; write nothing.")
def traces_to_data(directory, out, mode, min_reward, dry_run):
    """Turn a directory of .atraj trajectories into training rows, token-exact.

    \b
    Examples:
      mlx_agent traces-to-data runs/ --out sft.jsonl --min-reward 1
      mlx_agent traces-to-data runs/ --mode dpo --out dpo.jsonl
    """
    from pathlib import Path

    from mlx_agent.progress import Progress
    from mlx_agent.training_data import convert

    if not out and not dry_run:
        raise click.UsageError("give --out FILE, or --dry-run")
    if not dry_run:
        paths.writable_file(out, "--out")
        if Path(out).suffix == ".atraj" and \
                Path(out).resolve().parent == Path(directory).resolve():
            raise UserError(f"--out {out} would replace one of the trajectories it reads; "
                            "write the rows elsewhere")
    try:
        with Progress(len(list(Path(directory).glob("*.atraj"))), "read", unit="file") as bar:
            counts = convert(directory, out, mode=mode, min_reward=min_reward, dry_run=dry_run,
                             on_file=lambda path: bar.advance(for_terminal(path.name)))
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    for why in counts.unreadable_why:
        warn(for_terminal(f"unreadable: {why}"))
    if counts.not_token_exact:
        warn(f"{counts.not_token_exact} trajectories left out: their ids are not what the model "
             "was fed (no prefix_len: the original posttrainllm's); record them again with "
             "mlx_agent agent or eval --trajectory-dir")
    for line in counts.lines():
        click.echo(line)
    if not dry_run:
        click.echo(f"wrote {counts.rows} {mode} rows to {out}")


@click.command()
@model_argument("base", "[BASE]")
@click.option("--data", type=click.Path(exists=True, dir_okay=False), required=True,
              help="traces-to-data sft rows (JSONL).")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Adapter directory to write (mlx-lm format).")
@click.option("--iters", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--learning-rate", type=Finite(min=0, min_open=True), default=1e-4,
              show_default=True)
@click.option("--rank", type=click.IntRange(1, MAX_LORA_RANK), default=8, show_default=True)
@click.option("--num-layers", type=click.IntRange(min=1), default=16, show_default=True,
              help="Layers (from the top) that get LoRA.")
@click.option("--val-fraction", type=Finite(0, 0.5), default=0.1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@processes_option
@weight_options
def sft(base, data, out, iters, batch_size, learning_rate, rank, num_layers, val_fraction,
        seed, processes, weights, context_length):
    """LoRA fine-tune BASE on traces-to-data rows (loss only where the model sampled).

    \b
    Example:
      mlx_agent sft --data sft.jsonl --out adapters/specialist --iters 300
      mlx_agent agent --adapter adapters/specialist --tools tools.json
    """
    from mlx_agent.models import load
    from mlx_agent.sft import SFTConfig, check_vocabulary, read_rows, train

    if batch_size % processes:
        raise UserError(f"--processes {processes} must divide --batch-size {batch_size}")
    paths.writable_dir(out, "--out")
    try:
        rows = read_rows(data)
    except ValueError as e:
        raise UserError(str(e)) from None
    lm = load(base, weights=weights, context_length=context_length)
    try:
        check_vocabulary(rows, lm.vocab_size, data)
        stats = train(lm, rows, out, SFTConfig(iters=iters, batch_size=batch_size,
                                               learning_rate=learning_rate, rank=rank,
                                               num_layers=num_layers, val_fraction=val_fraction,
                                               seed=seed, processes=processes))
    except (ValueError, RuntimeError) as e:
        raise UserError(str(e)) from None
    if stats["cut_rows"]:
        cut = stats["cut_rows"]
        warn(f"left out {cut} row{'s' if cut != 1 else ''} with no scored token within the first "
             f"{SFTConfig.max_seq_length} tokens, where training cuts rows")
    click.echo(f"trained on {stats['train_rows']} rows ({stats['val_rows']} held out for "
               f"validation); loss {stats['first_loss']:.4f} → {stats['last_loss']:.4f}; "
               f"adapter written to {out}")


@click.command("eval")
@model_argument()
@click.option("--tasks", "tasks_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help="Tasks JSONL (see README: prompt, tools, fixture, check).")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per task, with seeds 0..N-1.")
@click.option("--trajectory-dir", type=click.Path(file_okay=False), default=None,
              help="Write each run's .atraj here, with its reward.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="JSONL file: one row per run (task, seed, reward, calls, turns, answered, "
                   "tool_errors, guarded_steps, retried_steps, named_steps, mentioned_steps, "
                   "stated_calls, unfounded_calls, stated_answers, seconds).")
@loop_options
@click.option("-t", "--temperature", type=Finite(min=0), default=0.0, show_default=True)
@click.option("--batch", type=BATCH, default=1, show_default=True,
              help="Runs at a time, decoded together in one batch.")
@sandbox_options
@trust_handlers_option
@mcp_options
@load_options
@ray_options
def eval_cmd(model_spec, tasks_file, seeds, trajectory_dir, out, protocol, max_steps, max_tokens,
             no_grammar, allow_repeat_calls, retry_after_error, ignore_named_tool,
             no_stated_arguments, temperature,
             batch, sandbox, allow_network, trust_handlers, mcp_commands, mcp_config, adapter,
             weights, context_length, ray_address, ray_workers):
    """Run the agent on every task, check the outcomes, print the success table.

    \b
    Example:
      mlx_agent eval --tasks tasks.jsonl --seeds 3 --trajectory-dir runs/ --out runs.jsonl
      mlx_agent eval --adapter adapters/specialist --tasks heldout.jsonl
      mlx_agent eval --tasks heldout.jsonl --mcp "python server.py"   # its tools in every task
      mlx_agent eval --tasks tasks.jsonl --batch 8
      mlx_agent eval --tasks tasks.jsonl --ray auto      # over a Ray cluster
    """
    from mlx_agent.engine import SamplingParams
    from mlx_agent.evaluate import (MAX_RUNS, TaskFile, check_expected_tools, check_handlers,
                                    run, tool_names)
    from mlx_agent.models import load
    from mlx_agent.progress import Progress

    check_ray_options(ray_address, ray_workers)
    paths.writable_dir(trajectory_dir, "--trajectory-dir")  # first: --out may be inside it
    paths.writable_file(out, "--out", not_same_as={"--tasks": tasks_file})
    box = make_sandbox(sandbox, allow_network, None)
    check_combination(ray_address, mcp=mcp_commands or mcp_config)
    tasks = TaskFile.of(tasks_file)  # read once; a bad tasks file fails before the model loads
    check_handlers(tasks, handler_mode(trust_handlers))  # before any of its tools loads
    total = len(tasks.tasks) * seeds
    if total > MAX_RUNS:  # --seeds 99999999999 met the OOM killer listing its runs
        raise UserError(f"--seeds {seeds} for {len(tasks.tasks)} tasks is {total:,} runs, more "
                        f"than the {MAX_RUNS:,} one eval takes; give fewer seeds")
    served = _served_tools(mcp_commands, mcp_config, box, sorted(tool_names(tasks)))
    check_expected_tools(tasks, served)
    overrides = {"max_steps": max_steps, "max_tokens": max_tokens, "grammar": not no_grammar,
                 "allow_repeat_calls": allow_repeat_calls, "retry_after_error": retry_after_error,
                 "follow_named_tool": not ignore_named_tool,
                 "stated_arguments": not no_stated_arguments,
                 "sampling": SamplingParams(temperature=temperature)}
    tally = WorkerTally()
    order = {task.id: i for i, task in enumerate(tasks.tasks)}
    with runs_file(out, order) as rows, Progress(total, "eval", unit="run") as bar:
        def show(r, worker=None):
            rows.append(r.row())
            bar.advance(tally(run_line(r), worker))

        if ray_address:
            from mlx_agent.cluster_eval import EvalWorker, ModelSpec, run_eval

            worker = EvalWorker(ModelSpec(model_spec, adapter, weights, context_length),
                                str(Path(tasks_file).resolve().parent), protocol, overrides,
                                sandbox, allow_network, trajectories=bool(trajectory_dir),
                                batch=batch)
            summary = run_eval(worker, tasks, seeds=seeds, trajectory_dir=trajectory_dir,
                               address=ray_address, workers=ray_workers, on_run=show)
        else:
            lm = load(model_spec, adapter=adapter, weights=weights,
                      context_length=context_length)
            summary = run(lm, tasks, seeds=seeds, protocol=protocol,
                          trajectory_dir=trajectory_dir, on_run=show, batch=batch,
                          extra_tools=served, config_overrides={**overrides, "sandbox": box},
                          handlers=handler_mode(trust_handlers))
    for line in _table(summary.row()):
        click.echo(line)


def _served_tools(mcp_commands, mcp_config, box, taken: list[str]) -> list:
    """The MCP servers' tools (started now, stopped at exit); a name the tasks define too
    gets its server's prefix."""
    servers = start_mcp(mcp_commands, mcp_config, box, 30.0, None)
    if servers is None:
        return []
    served, warnings = servers.tools(taken=taken)
    for warning in warnings:
        warn(warning)
    return served


def _table(row: dict) -> list[str]:
    return [f"{'runs':>5} {'success':>8} {'answered':>9} {'valid calls':>12} {'calls/run':>10} "
            f"{'turns/run':>10} {'from cache':>11} {'seconds':>8}",
            f"{row['runs']:>5} {row['success']:>8.0%} {row['answered']:>9.0%} "
            f"{row['valid_calls']:>12.0%} {row['mean_calls']:>10.2f} {row['mean_turns']:>10.2f} "
            f"{row['cache_share']:>11.0%} {row['seconds']:>8.1f}"]

"""``mlx_agent traj``: look at ``.atraj`` trajectories."""

from __future__ import annotations

import click

from .errors import Group

_COLOURS = {"system": "magenta", "user": "green", "assistant": "cyan", "tool": "yellow"}


@click.group(cls=Group)
def traj():
    """Inspect token-exact trajectories written with --trajectory-dir."""


@traj.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--ids", is_flag=True, help="Also print the token ids of each step.")
def show(paths, ids):
    """Print trajectories as readable, coloured conversations: each PATH a .atraj file or a
    directory of them. A file that cannot be read is skipped with a warning, as
    traces-to-data does; the exit status is 2 only when none could be read.

    \b
    Examples:
      mlx_agent traj show runs/6f8b9d4a-....atraj
      mlx_agent traj show runs/
    """
    from pathlib import Path

    from mlx_agent.trajectory import TrajectoryError, read

    from .errors import UserError, warn
    from .terminal import for_terminal

    files = [f for p in map(Path, paths)
             for f in (sorted(p.glob("*.atraj")) if p.is_dir() else [p])]
    if not files:
        raise UserError(f"no .atraj files in {', '.join(paths)}")
    trajectories, bad = [], []
    for f in files:
        try:
            trajectories.append(read(f))
        except TrajectoryError as e:
            bad.append(str(e))
    if not trajectories:
        raise UserError(bad[0] if len(bad) == 1 else
                        f"none of the {len(bad)} .atraj files could be read ({bad[0]}, ...)")
    for why in bad:
        warn(for_terminal(f"skipped: {why}"))
    for i, t in enumerate(trajectories):
        if i:
            click.echo()
        _show(t, ids)


def _show(t, ids: bool) -> None:
    from .terminal import for_terminal

    head = f"trajectory {t.id}" + (f"  task {t.task}" if t.task else "")
    click.secho(for_terminal(head), bold=True)  # every string in the file is the file's
    if t.summary:
        click.echo(for_terminal("  " + ", ".join(f"{k}={v}" for k, v in t.summary.items())))
    for i, step in enumerate(t.steps):
        fed = len(step.input_ids or [])
        sampled = len(step.output_ids or [])
        counts = ", ".join(x for x in (f"{fed} fed" if fed else "",
                                        f"{sampled} sampled" if sampled else "") if x)
        click.secho(for_terminal(f"[{i}] {step.role}") + (f" ({counts})" if counts else ""),
                    fg=_COLOURS.get(step.role), bold=True)
        text = step.content if len(step.content) < 2000 else step.content[:2000] + " …"
        click.echo("    " + for_terminal(text).replace("\n", "\n    "))
        if step.tool_call:
            call = f"{step.tool_call.name}({step.tool_call.arguments_json})"
            click.secho(f"    → {for_terminal(call)}", fg="cyan")
        if step.reward is not None:
            click.secho(f"    reward {step.reward}", fg="red")
        if ids:
            if step.input_ids:
                click.echo(f"    input_ids {step.input_ids}")
            if step.output_ids:
                click.echo(f"    output_ids {step.output_ids}")
    click.echo(f"{len(t.token_sequence())} tokens in the cache at the end")

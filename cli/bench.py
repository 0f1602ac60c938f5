"""``mlx_agent bench``: measurements that compare ours with the alternatives, in one run."""

from __future__ import annotations

import click

from .errors import Group, UserError
from .options import model_argument


@click.group(cls=Group)
def bench():
    """Benchmarks (speed is measured here, never in tests)."""


@bench.command()
@model_argument()
@click.option("--tools", "tools_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Your tools file, measured beside the synthetic 256/1k/2k/4k-token prompts.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG plot here (needs matplotlib).")
def prefill(model_spec, tools_file, plot):
    """Time to first token with no prompt cache, a cold one and a warm one.

    \b
    Example:
      mlx_agent bench prefill --tools examples/debugger.json --plot prefill.png
    """
    from mlx_agent.bench import WorkerError, run

    try:
        run(model_spec, tools_file, echo=click.echo, plot=plot)
    except WorkerError as e:  # a bug of ours in a launch: its last line, exit status 1
        raise _Failed(str(e)) from None


class _Failed(UserError):
    exit_code = 1

"""``--ray`` for ``eval``, ``eval-bfcl`` and ``specialize``: the options, the progress lines
and the run rows.

Ray is imported only when ``--ray`` is given (by :mod:`mlx_agent.cluster_eval`).
"""

from __future__ import annotations

import contextlib
from collections import Counter

import click

from .options import _compose
from .terminal import for_terminal


def ray_options(f):
    """--ray and --ray-workers: fan the runs out over a Ray cluster."""
    return _compose(
        click.option("--ray", "ray_address", metavar="auto|HOST:PORT", default=None,
                     help="Run on a Ray cluster: HOST:PORT as `ray start --head` prints it, "
                          "or auto (this machine's cluster, else a new local one).  "
                          "Needs `pip install 'mlx-agent[ray]'`."),
        click.option("--ray-workers", type=click.IntRange(min=1), default=None,
                     help="Workers with --ray (one model each) [default: one per CPU of "
                          "the cluster]."),
    )(f)


def check_ray_options(ray_address: str | None, ray_workers: int | None) -> None:
    if ray_workers and not ray_address:
        raise click.UsageError("--ray-workers needs --ray")
    if ray_address:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise click.UsageError("--ray needs Ray: pip install 'mlx-agent[ray]'") from None


class WorkerTally:
    """A finished run's progress message, with the runs its worker has done so far."""

    def __init__(self):
        self.done = Counter()

    def __call__(self, line: str, worker: str | None = None) -> str:
        if worker is None:
            return line
        self.done[worker] += 1
        return f"{line}  [{worker}: {self.done[worker]} done]"


def check_combination(ray_address: str | None, **others) -> None:
    """Options ``--ray`` does not take yet (each worker would need its own)."""
    if ray_address:
        for name, value in others.items():
            if value:
                raise click.UsageError(f"--{name} does not work with --ray yet; "
                                       "drop one of them")


def run_line(r) -> str:
    """An ``eval`` run's progress line."""
    mark = "✓" if r.reward else "✗"
    # a run that passed may still have stopped early (the context filled after its call)
    tail = f" ({'stopped early' if r.reward else 'failed'}: {r.error})" if r.error else ""
    return for_terminal(f"{mark} {r.task} seed {r.seed}: {r.calls} calls, {r.turns} turns, "
                        f"{r.seconds:.1f} s{tail}")  # a task's id is the tasks file's text


@contextlib.contextmanager
def runs_file(out: str | None, order: dict[str, int] | None = None):
    """A list to append run rows to, written to ``out`` (JSONL, atomically) when the block
    ends, however it ends: an interrupted run leaves a complete file of the runs done (and
    a run that failed before its first run leaves no file). Rows are written by ``order``
    (a row's ``task`` to its place) and then seed, not as they finished (``--batch`` and
    Ray finish runs out of order)."""
    from mlx_agent.fileio import write_jsonl

    rows: list[dict] = []
    ended = False
    try:
        yield rows
        ended = True
    finally:
        if out and (rows or ended):
            if order is not None:
                rows.sort(key=lambda r: (order.get(r["task"], len(order)), r["seed"]))
            write_jsonl(out, rows)

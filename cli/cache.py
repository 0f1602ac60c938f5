"""``mlx_agent cache``: list, remove and prune persistent prompt caches."""

from __future__ import annotations

import datetime

import click

from .errors import Group, UserError, warn
from .options import Bytes


def _when(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


@click.group(cls=Group)
def cache():
    """Manage a --prompt-cache-dir directory.

    \b
    Examples:
      mlx_agent cache ls ~/.cache/mlx_agent/kv
      mlx_agent cache rm ~/.cache/mlx_agent/kv 3fa2c81b
      mlx_agent cache prune ~/.cache/mlx_agent/kv --max-bytes 500M
    """


@cache.command("ls")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def ls(directory):
    """List entries, most recently used first, then the files that can never load."""
    from mlx_agent.cache_file import printable
    from mlx_agent.prompt_cache import entries

    listed = entries(directory)
    rows = [e for e in listed if not e.problem]
    click.echo(f"{'key':<16}  {'model':<24} {'tokens':>7} {'bytes':>12}  {'created':<19}  last used")
    for e in rows:
        click.echo(f"{e.key[:16]:<16}  {e.model[:24]:<24} {e.tokens:>7} {e.bytes:>12}  "
                   f"{_when(e.created):<19}  {_when(e.last_used)}")
    bad = [e for e in listed if e.problem]
    for e in bad:
        click.echo(f"bad: {printable(e.path.name)}: {e.problem}")
    click.echo(f"{len(rows)} entries, {sum(e.bytes for e in rows)} bytes"
               + (f"; {len(bad)} bad files, never loaded" if bad else ""))


@cache.command("rm")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument("key")
def rm(directory, key):
    """Remove the entry whose key starts with KEY (6+ characters)."""
    from mlx_agent.prompt_cache import remove

    failed = []
    try:
        gone, matched = remove(directory, key, warn=failed.append)
    except ValueError as e:
        raise UserError(str(e)) from None
    if not matched:
        raise UserError(f"no entry with a key starting {key!r} in {directory}")
    if not gone:  # nothing done: the first reason is the error
        raise UserError(failed[0])
    for e in gone:
        click.echo(f"removed {e.path.name} ({e.bytes} bytes)")
    for message in failed:  # the others were removed, and are listed above
        warn(message)
    if failed:
        raise click.exceptions.Exit(1)


@cache.command("prune")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--max-bytes", type=Bytes(), required=True,
              help="Keep at most this many bytes (500000000, 500M, 2G), removing least "
                   "recently used entries first.")
def prune_cmd(directory, max_bytes):
    """Remove least recently used entries until the directory fits --max-bytes."""
    from mlx_agent.prompt_cache import entries, prune

    failed = []
    gone = prune(directory, max_bytes, warn=lambda m: (failed.append(m), warn(m)))
    for e in gone:
        click.echo(f"removed {e.path.name} ({e.bytes} bytes)")
    listed = entries(directory)
    left = [e for e in listed if e.key]
    others = len(listed) - len(left)  # files that are not prompt caches are never deleted
    click.echo(f"{len(left)} entries, {sum(e.bytes for e in left)} bytes left"
               + (f"; {others} other files left alone (see cache ls)" if others else ""))
    if failed:  # the directory may still be over --max-bytes
        raise click.exceptions.Exit(1)

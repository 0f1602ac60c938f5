"""How the command line fails: one line on stderr, exit code 2, never a traceback.

:class:`UserError` is for mistakes the CLI itself finds; the runtime's own user-facing
errors (:class:`mlx_agent.errors.UserFacingError`: a model that does not load, a schema that
does not compile, a prompt that does not fit, ...) are turned into one by :class:`Group`.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading

import click
from click.core import ParameterSource

from mlx_agent.errors import UserFacingError

from .terminal import for_terminal


MAX_MESSAGE = 600  # characters of an error shown (a library's may list hundreds of names)


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file=None):
        """One line, whatever the message holds: its lines joined, control characters
        escaped (a name read from a hostile file may hold an escape sequence), and cut."""
        text = "; ".join(line.strip() for line in self.format_message().splitlines()
                         if line.strip())
        text = for_terminal(text)
        if len(text) > MAX_MESSAGE:
            text = text[:MAX_MESSAGE - 3] + "..."
        click.echo(f"mlx_agent: error: {text}", err=True)


# a group run with no arguments shows its help through a UsageError (click >= 8.2)
_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())


def warn(message: str) -> None:
    click.secho(f"warning: {message}", err=True, fg="yellow")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt is, so that what Ctrl-C cleans up
    (runs done written, cut runs' files removed, temporary folders) is cleaned up for it too."""


def _terminate(signum, frame):
    raise Terminated()


class Group(click.Group):
    """Turns the runtime's user-facing errors and click's usage errors (a subcommand's
    options and arguments) into one-line messages with exit code 2; SIGTERM into
    :class:`Terminated` (exit 143), and a standard output that cannot be written (a full
    disk, ``>/dev/full``) into one line on stderr."""

    def main(self, *args, **kwargs):
        main_thread = threading.current_thread() is threading.main_thread()
        if main_thread:  # signals go to the main thread only; serve's uvicorn sets its own
            previous = signal.signal(signal.SIGTERM, _terminate)
        try:
            return super().main(*args, **kwargs)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EDQUOT):
                raise
            _stdout_failed(e)
        finally:
            if main_thread:  # a process that runs the CLI in-process gets its own back
                signal.signal(signal.SIGTERM, previous)
            try:
                sys.stdout.flush()
            except OSError as e:
                _stdout_failed(e)

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except _NoArgsIsHelp:
            raise
        except click.UsageError as e:  # the group's own options
            raise _one_line(e, ctx) from None

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:
            refuse_repeats(cmd, rest, click.Context(cmd, info_name=name, parent=ctx))
        return name, cmd, rest

    def invoke(self, ctx):
        from . import paths  # paths raises this module's UserError
        try:
            return self._invoke(ctx)
        except click.exceptions.Exit as e:
            if e.exit_code:
                paths.remove_made()
            raise
        except BaseException:  # a failed command leaves no empty folders its checks made
            paths.remove_made()
            raise

    def _invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserFacingError as e:
            raise UserError(str(e)) from None
        except _NoArgsIsHelp:
            raise
        except click.UsageError as e:  # click's own: usage, a hint and the error, 4 lines
            raise _one_line(e, ctx) from None
        except KeyboardInterrupt as e:
            click.echo("", err=True)
            ctx.exit(143 if isinstance(e, Terminated) else 130)


def _stdout_failed(e: OSError) -> None:
    """Says so on stderr, and exits 2 with nothing left for the interpreter to flush."""
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 — the interpreter flushes it at exit
    with contextlib.suppress(OSError):
        click.echo(f"mlx_agent: error: cannot write the output ({e.strerror or e})", err=True)
    sys.exit(2)


def refuse_repeats(cmd: click.Command, args: list[str], ctx: click.Context) -> None:
    """Click keeps the last of a repeated single-valued option: ``--tools a.json --tools
    b.json`` would drop a.json without a word. Refused instead; click's own parser tells
    options from their values (``--system -t``), ``--opt=v`` and ``-tV`` alike."""
    if isinstance(cmd, click.Group):
        return
    try:
        _, _, order = cmd.make_parser(ctx).parse_args(args=list(args))
    except click.UsageError:
        return  # click says what is wrong when it parses the arguments for real
    seen: set[str] = set()
    for param in order:
        if isinstance(param, click.Option) and not (param.multiple or param.count
                                                    or param.is_flag):
            if param.name in seen:
                spellings = "/".join(param.opts + param.secondary_opts)  # -t/--temperature
                raise click.UsageError(f"{spellings} is given twice; give it once", ctx)
            seen.add(param.name)


def _one_line(e: click.UsageError, ctx: click.Context) -> UserError:
    """Click's usage error as one line that names the --help to read, and the environment
    variable a bad value came from (click names only the option, which was not given)."""
    where = (e.ctx or ctx).command_path
    if isinstance(e, click.BadParameter) and e.param is not None and e.param_hint is None:
        c = e.ctx or ctx
        if c.get_parameter_source(e.param.name) is ParameterSource.ENVIRONMENT:
            envvar = e.param.envvar
            names = [envvar] if isinstance(envvar, str) else list(envvar or ())
            var = next((n for n in names if n in os.environ), None)
            if var:
                e.param_hint = f"{e.param.get_error_hint(c)} (from ${var})"
    return UserError(f"{e.format_message()} (see {where} --help)")

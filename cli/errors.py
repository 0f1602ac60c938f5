"""How the command line fails: one line on stderr, exit code 2, never a traceback.

:class:`UserError` is for mistakes the CLI itself finds; the runtime's own user-facing
errors (:class:`mlx_agent.errors.UserFacingError`: a model that does not load, a schema that
does not compile, a prompt that does not fit, ...) are turned into one by :class:`Group`.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import click

from mlx_agent.errors import UserFacingError


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file=None):
        click.echo(f"mlx_agent: error: {self.format_message()}", err=True)


# a group run with no arguments shows its help through a UsageError (click >= 8.2)
_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())


def utf8_text(text: str, what: str) -> str:
    """``text`` from the command line or standard input, refused when it is not UTF-8:
    Python keeps such bytes as lone surrogates, which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        try:
            bad = f"byte 0x{text[e.start].encode('utf-8', 'surrogateescape')[0]:02x}"
        except UnicodeEncodeError:
            bad = "a lone surrogate"
        raise UserError(f"{what} is not valid UTF-8 ({bad} at character {e.start}); "
                        "give UTF-8 text") from None
    return text


def warn(message: str) -> None:
    click.secho(f"warning: {message}", err=True, fg="yellow")


class Group(click.Group):
    """Turns the runtime's user-facing errors and click's usage errors (a subcommand's
    options and arguments) into one-line messages with exit code 2."""

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
        try:
            return super().invoke(ctx)
        except UserFacingError as e:
            raise UserError(str(e)) from None
        except _NoArgsIsHelp:
            raise
        except click.UsageError as e:  # click's own: usage, a hint and the error, 4 lines
            raise _one_line(e, ctx) from None
        except KeyboardInterrupt:
            click.echo("", err=True)
            ctx.exit(130)


def refuse_repeats(cmd: click.Command, args: list[str], ctx: click.Context) -> None:
    """Click keeps the last of a repeated single-valued option: ``--tools a.json --tools
    b.json`` would drop a.json without a word. Refused instead (in the command's own args,
    before a ``--``, in the long and ``--opt=value`` forms and short flags alike)."""
    if isinstance(cmd, click.Group):
        return
    single = {opt: param for param in cmd.params if isinstance(param, click.Option)
              and not (param.multiple or param.count or param.is_flag)
              for opt in param.opts + param.secondary_opts}
    seen: dict[str, str] = {}
    for arg in args:
        if arg == "--":
            break
        param = single.get(arg.split("=", 1)[0])
        if param is not None:
            if param.name in seen:
                raise click.UsageError(f"{seen[param.name]} is given twice; give it once",
                                       ctx)
            seen[param.name] = arg.split("=", 1)[0]


def _one_line(e: click.UsageError, ctx: click.Context) -> UserError:
    """Click's usage error as one line that names the --help to read."""
    where = (e.ctx or ctx).command_path
    return UserError(f"{e.format_message()} (see {where} --help)")

"""``mlx_agent tools ls``: the tool catalogue the agent would get, one line per tool.

A description comes from a tools file or an MCP server: its controls are shown escaped (see
:func:`.terminal.for_terminal`) and its newlines as spaces, so each tool stays one line."""

from __future__ import annotations

import click

from .agent import build_tools
from .errors import Group
from .options import make_sandbox, mcp_options, sandbox_options, start_mcp
from .terminal import for_terminal


@click.group(cls=Group)
def tools():
    """Inspect tool catalogues (tools files, built-ins, MCP servers)."""


@tools.command("ls")
@click.option("--tools", "tools_file", type=click.Path(dir_okay=False), default=None,
              help="OpenAI-style tools JSON with _exec/_handler.")
@click.option("--builtin-tools", is_flag=True, help="Include the built-in tools over --root.")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Directory the built-in tools work in.")
@mcp_options
@sandbox_options
def ls(tools_file, builtin_tools, root, mcp_commands, mcp_config, sandbox, allow_network):
    """Print each tool as the model sees it (signature and description) and its source.

    \b
    Examples:
      mlx_agent tools ls --tools examples/echo.json
      mlx_agent tools ls --mcp "npx -y @modelcontextprotocol/server-filesystem ."
      mlx_agent tools ls --mcp-config ~/.config/mcp.json --builtin-tools --root .
    """
    box = make_sandbox(sandbox, allow_network, root)
    servers = start_mcp(mcp_commands, mcp_config, box, 30.0, root)
    # a listing imports no _handler's module: that would run its code
    catalogue = build_tools(tools_file, builtin_tools, root, 30.0, (), box, servers,
                            handlers="list")
    if not catalogue:  # an empty file, servers with no tools: a line, where nothing showed
        sources = ([str(tools_file)] if tools_file else []) + \
            (["the MCP servers"] if servers is not None else [])
        click.echo(for_terminal(f"no tools to list: the catalogue ({', '.join(sources)}) is "
                                "empty"), err=True)
    for tool in catalogue:
        if servers is not None and tool.name in servers.origin:
            source = f"mcp:{servers.origin[tool.name]}"
        else:
            source = "built-in" if tool.builtin is not None else tools_file
        line = f"{tool.signature()}  {tool.description}".rstrip() + f"  [{source}]"
        click.echo(for_terminal(line).replace("\n", " "))

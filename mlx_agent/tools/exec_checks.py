"""Load-time checks of ``_exec`` tools: variable names the shell owns, unquoted references.

Each argument becomes a shell variable of the property's name, so a property named ``PATH``,
``IFS``, ``BASH_ENV`` or ``LD_PRELOAD`` would let the model change how the command runs:
:func:`special_variable` names them (bash's own variables and the loader's prefixes), and
schema loading refuses them. :func:`unquoted_references` finds ``$name`` and ``${name}``
outside double quotes, where the shell splits and globs the value.

The scan knows bash's quoting (single, double, ``$'...'``, backslashes), comments, ``$(...)``
and backticks. It does not parse here-documents or ``case`` patterns inside ``$(...)``: a
reference there may be reported when it is harmless. Quoting stops the shell, not the
command's own option parsing; that needs ``--`` in the template, which no scan can check.
"""

from __future__ import annotations

import re
from typing import Iterable

_BASH_VARIABLES = frozenset("""
    _ BASH BASHOPTS BASHPID CDPATH CHILD_MAX COLUMNS COMPREPLY COPROC DIRSTACK EMACS ENV
    EPOCHREALTIME EPOCHSECONDS EUID EXECIGNORE FCEDIT FIGNORE FUNCNAME FUNCNEST GLOBIGNORE
    GLOBSORT GROUPS HISTCMD HISTCONTROL HISTFILE HISTFILESIZE HISTIGNORE HISTSIZE
    HISTTIMEFORMAT HOME HOSTFILE HOSTNAME HOSTTYPE IFS IGNOREEOF INPUTRC INSIDE_EMACS LANG
    LANGUAGE LINENO LINES MACHTYPE MAIL MAILCHECK MAILPATH MAPFILE OLDPWD OPTARG OPTERR OPTIND
    OSTYPE PATH PIPESTATUS POSIXLY_CORRECT PPID PROMPT_COMMAND PROMPT_DIRTRIM PS0 PS1 PS2 PS3
    PS4 PWD RANDOM REPLY SECONDS SHELL SHELLOPTS SHLVL SRANDOM TIMEFORMAT TMOUT TMPDIR TZ UID
    histchars
""".split())
_PREFIXES = ("BASH_", "LD_", "DYLD_", "LC_", "COMP_", "READLINE_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_WORD_START = " \t\n;|&()"


def special_variable(name: str) -> bool:
    """Whether bash, the dynamic loader or the locale treats ``name`` specially."""
    return name in _BASH_VARIABLES or name.startswith(_PREFIXES)


def unquoted_references(template: str, names: Iterable[str]) -> list[str]:
    """Which of ``names`` the template references outside double quotes, in order."""
    wanted, found = set(names), []
    stack = [""]  # the open contexts: "" the top, "(" a $( or (, "`" backticks, '"' quotes
    i = 0
    while i < len(template):
        c, ctx = template[i], stack[-1]
        if c == "\\":
            i += 2
            continue
        if c == "$":
            name, i = _reference(template, i + 1, stack)
            if name in wanted and ctx != '"' and name not in found:
                found.append(name)
            continue
        if ctx == '"':
            if c == '"':
                stack.pop()
            elif c == "`":
                stack.append("`")
        elif c == "'":
            end = template.find("'", i + 1)
            i = len(template) if end < 0 else end
        elif c == '"':
            stack.append('"')
        elif c == "#" and (i == 0 or template[i - 1] in _WORD_START):
            end = template.find("\n", i)
            i = len(template) if end < 0 else end
        elif c == "(":
            stack.append("(")
        elif (c == ")" and ctx == "(") or (c == "`" and ctx == "`"):
            stack.pop()
        elif c == "`":
            stack.append("`")
        i += 1
    return found


def _reference(text: str, i: int, stack: list[str]) -> tuple[str, int]:
    """The variable a ``$`` at ``i - 1`` names ('' if none) and where scanning goes on."""
    nxt = text[i:i + 1]
    if nxt == "(":  # $( or $((: the inside is unquoted again
        stack.append("(")
        return "", i + 1
    if nxt == "'" and stack[-1] != '"':  # $'...': ANSI-C quoting
        j = i + 1
        while j < len(text) and text[j] != "'":
            j += 2 if text[j] == "\\" else 1
        return "", j + 1
    if nxt == "{":
        end = text.find("}", i)
        end = len(text) if end < 0 else end
        m = _NAME.match(text, i + 1)  # ${#x} and ${!x} start otherwise: not a plain use
        return (m.group() if m else ""), end + 1
    m = _NAME.match(text, i)
    return (m.group(), m.end()) if m else ("", i)

"""File paths in text: what a request writes as a path, whether a text writes a given one
whole, and which parameters take one (by their names and descriptions).

A small model copying a path copies a part of it ("users.csv" for "data/users.csv") or
makes one up from the request's words ("this_folder", "budget.json");
:func:`mlx_agent.copied_values.whole_paths` and
:func:`mlx_agent.stated_arguments.without_made_up` read a call's paths with these, and
:func:`mlx_agent.described_tool.mentioned` reads a request that writes a file's name as
one about a file.

Not promised: a path is recognised by its shape, not on any disk: a folder in it, or a name
with an extension of letters ("notes.txt"); a file with no extension and no folder
("Makefile", "README") is a word, and "and/or" reads as a path. Names of one letter before
the extension ("a.c") are not read, so "e.g." is not a file.
"""

from __future__ import annotations

import re

from .heard import NAME_WORD
from .tools import Tool

# a parameter whose name ends in one of these words takes a file's or a folder's path
PATH_WORDS = frozenset("path paths file filename filepath pathname dir directory folder".split())
_PATH_NAMED = re.compile(r"\b(?:file|folder|directory)\s*(?:path|name)\b|\bpath\s+(?:to|of)\b",
                         re.IGNORECASE)
_PATH_CHARS = re.compile(r"[\w~./-]+")
_FILE_NAME = re.compile(r"\w[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7}")


def takes_path(tool: Tool, name: str) -> bool:
    """Whether the string parameter ``name`` takes a file's or a folder's path: its name ends
    in a word of :data:`PATH_WORDS` or in "file name" ("path", "output_dir", "sourceFile",
    "file_name"; not "file_type"), or its description says "file path", "directory name",
    "path to" or "path of"."""
    schema = tool.properties.get(name)
    if not isinstance(schema, dict) or schema.get("type", "string") != "string" \
            or {"enum", "const", "format"} & schema.keys():
        return False
    named = [w.lower() for w in NAME_WORD.findall(name)]
    description = schema.get("description")
    return bool(named) and (named[-1] in PATH_WORDS or named[-2:] == ["file", "name"]) \
        or isinstance(description, str) and _PATH_NAMED.search(description) is not None


def written_paths(text: str) -> list[str]:
    """The paths ``text`` writes, each once, in order: a token with a folder in it
    ("data/users.csv", "src/", "~/notes", "./run.sh") or a file name with an extension of a
    letter and up to seven more ("notes.txt", "Makefile.am"; not "3.5", "e.g."), with a
    letter, not part of an email or a web address."""
    out: dict[str, None] = {}
    for m in _PATH_CHARS.finditer(text):
        token = m.group().rstrip(".")
        if text[m.start() - 1:m.start()] in ("@", ":") or text[m.end():m.end() + 1] == "@" \
                or token.startswith("//") or not re.search(r"[A-Za-z]", token):
            continue
        if "/" in token and token.strip("/") or _FILE_NAME.fullmatch(token):
            out[token] = None
    return list(out)


def writes_path(text: str, path: str, cased: bool = False) -> bool:
    """Whether ``text`` writes ``path`` whole (case aside, unless ``cased``): not as a part
    of a longer path ("users.csv" is not in "data/users.csv") or a word ("notes" is not in
    "notes.txt"). A path with no letter or digit ("." for the working folder) is always
    written."""
    path = path.strip()
    return not re.search(r"[^\W_]", path) or re.search(
        rf"(?<![\w~./-]){re.escape(path)}(?![\w/-]|\.\w)", text,
        0 if cased else re.IGNORECASE) is not None

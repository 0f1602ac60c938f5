"""Which built-in file tool a request asks for, by how it asks: "Save 'call Mateo' in
reminders.md" is a write, "Display CHANGELOG" or "What port does config.yaml set?" a read,
"What is in the orders folder?" a listing, "Where is flour mentioned?" a search.

The bundled model calls ``grep`` for most file requests, whatever they ask ("Put the line
'closed on Sunday' in hours.txt" grepped for "hours.txt"), and answers a question about a
folder from its own knowledge. The built-in tools are the runtime's own, so what each one
does is known here: :func:`asked_tool` reads the request for it, and the caller has the model
write the call again for that tool where it called another built-in one
(:mod:`mlx_agent.stated_arguments`), and presses a first call where a request that names a
file or a folder would be answered without one.

The request (its first :data:`~mlx_agent.heard.REQUEST_CHARS` characters) decides, in this
order: a write verb its first sentence begins with ("write", "create", "make", "save",
"store", "put", "overwrite", "update"; "replace the contents of") where it names a file (or
the verb is one only files take: save, store, overwrite); words of a search ("search",
"grep", "find", "look for", "mentions", "contains", "talks about", "where is", "anywhere");
a folder's contents ("list", "folder", "directory", "which files are ...", "everything in");
a read verb the first sentence begins with ("read", "show", "display", "print", "open",
"view") or a file's name (``notes.txt``) anywhere else.

Not promised: English only, matched by spelling; a request with two actions ("read X and
write it to Y") is read for its first; a file named without an extension or a folder ("Show
VERSION") is read as a file only after a read verb. Tools other than the built-in ones are
never asked for here (their names say nothing certain):
:mod:`mlx_agent.described_tool` reads those.
"""

from __future__ import annotations

import re
from typing import Sequence

from .file_paths import file_names
from .heard import REQUEST_CHARS
from .tools import Tool

_WRITE = re.compile(r"(?:please\s+)?(?:(write|create|make|put|save|store|overwrite|update)\b"
                    r"|replace\s+the\s+contents?\s+of\b)", re.IGNORECASE)
_FILE_ONLY_VERBS = ("save", "store", "overwrite")  # a file's, whatever the request names
_SEARCH = re.compile(r"\b(?:search|grep|find|locate|look\s+for|mention(?:s|ed)?|contains?"
                     r"|containing|talks?\s+about|anywhere|occurrences?|where\s+(?:is|are|does|"
                     r"do)\b)", re.IGNORECASE)
_LISTING = re.compile(r"^\s*(?:please\s+)?list\b|\b(?:folder|directory|dir)\b|\bwhich\s+files"
                      r"\s+(?:are|does|do|is)\b|\bwhat\s+files\b|\beverything\s+(?:in|under|"
                      r"inside)\b|\bfiles\s+(?:are\s+)?(?:here|in|under|inside)\b",
                      re.IGNORECASE)
_READ = re.compile(r"(?:please\s+)?(?:read|show|display|print|open|view|cat)\b", re.IGNORECASE)
_FILE_WORD = re.compile(r"\bfiles?\b", re.IGNORECASE)
BUILTIN_FILE_TOOLS = ("read_file", "write_file", "list_files", "grep")


def asked_tool(tools: Sequence[Tool], request: str) -> Tool | None:
    """The built-in tool of ``tools`` that ``request`` asks for (see the module's rules), or
    None: a request that asks for no file work, or for a tool not offered."""
    offered = {t.name: t for t in tools if t.builtin is not None and t.name in
               BUILTIN_FILE_TOOLS}
    name = asked_name(request)
    return offered.get(name) if name else None


def asked_name(request: str) -> str | None:
    """The name of the built-in file tool ``request`` asks for, or None."""
    text = request[:REQUEST_CHARS]
    first, names = _first_sentence(text), file_names(text)
    if (m := _WRITE.match(first)) and (names or _FILE_WORD.search(text) or m.group(1) is None
                                       or m.group(1).lower() in _FILE_ONLY_VERBS):
        return "write_file"
    if _SEARCH.search(text):
        return "grep"
    if _LISTING.search(text) and not (names and _READ.match(first)):
        return "list_files"
    if _READ.match(first) or names:
        return "read_file"
    return None


def names_a_file(request: str) -> bool:
    """Whether ``request`` names a file (``notes.txt``) or a folder, or speaks of files:
    where a request would be answered from the model's own knowledge, one that does is about
    the files here."""
    text = request[:REQUEST_CHARS]
    return bool(file_names(text) or _FILE_WORD.search(text)
                or re.search(r"\b(?:folder|directory)\b", text, re.IGNORECASE))


def _first_sentence(text: str) -> str:
    """``text`` up to its first sentence's end (a ``.``, ``!`` or ``?`` before a space or the
    end; not the dot of ``notes.txt``), leading space dropped."""
    text = text.lstrip()
    m = re.search(r"[.!?](?=\s|\Z)", text)
    return text[:m.end()] if m else text

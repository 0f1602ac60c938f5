"""Which built-in file tool a request asks for, by how it asks: "Save 'call Mateo' in
reminders.md" is a write, "Display CHANGELOG" or "What port does config.yaml set?" a read,
"What is in the orders folder?" a listing, "Where is flour mentioned?" a search.

The bundled model calls ``grep`` for most file requests, whatever they ask ("Put the line
'closed on Sunday' in hours.txt" grepped for "hours.txt"), and answers a question about a
folder from its own knowledge. The built-in tools are the runtime's own, so what each one
does is known here: :func:`asked_tool` reads the request for it, and the caller has the model
write the call again for that tool where it called another built-in file tool
(:mod:`mlx_agent.stated_arguments`), and presses a first call where a request about files
(:func:`about_files`: one that names a file or a folder, or asks where words are written)
would be answered without one.

The request (its first :data:`~mlx_agent.heard.REQUEST_CHARS` characters) decides, in this
order:

- of a write and a read of a named file, the first the text writes: a clause that begins
  with a write verb ("write", "create", "make", "put", "save", "store", "update", after
  "please", "can you", "now" or "then"; "overwrite" and "replace the contents of" alone), in
  a sentence that says what it writes (a quoted span, "the text ...", "a line ...",
  "containing", "so it says"), in a request that names a file or says "file"; or a clause
  that begins "read", "show", "display", "print", "open", "view" or "cat" and the file's
  name ("Read notes.txt and find the line about Mateo"; "Open notes.txt, then write
  'done'");
- a search: "search", "grep", "find", "locate", "look for", "mentions", "contains", "talks
  about", "where is", "anywhere", "occurrences";
- a folder's contents: "list" first, "folder", "directory", "which files are", "what
  files", "everything in", "files here";
- a read: a clause that begins with a read verb, or a file's name anywhere.

A call of ``write_file`` is never moved where a clause begins with a verb that writes or adds
(:func:`asked_instead`), and only the four file tools are read so (``run_tests`` is not).

Not promised: English only, matched by spelling; of a request with two actions, the one
first in the order above; a file named without an extension or a folder ("Show VERSION") is
read as a file only after a read verb. Tools other than the built-in ones are never asked
for here (their names say nothing certain): :mod:`mlx_agent.described_tool` reads those.
"""

from __future__ import annotations

import re
from typing import Sequence

from .file_paths import file_names
from .heard import REQUEST_CHARS
from .tools import Tool

# a request's words before its verb: "Please write ...", "Can you save ..."
_OPENER = r"(?:(?:please|kindly|now|then|also|and|(?:can|could|would|will)\s+you)\s+)*"
_WRITE = re.compile(_OPENER + r"(write|create|make|put|save|store|update|overwrite"
                    r"|replace\s+the\s+contents?\s+of)\b", re.IGNORECASE)
_SURE_WRITES = ("overwrite", "replace")  # verbs only a file's content takes
# a clause that writes something (or adds to it): a call of write_file is not moved from it
_WRITES = re.compile(_OPENER + r"(?:write|create|make|put|save|store|update|overwrite|replace"
                     r"|add|append|insert|change|edit|set)\b", re.IGNORECASE)
# what a write writes: a quoted span, "the text ...", "a line ...", "containing", "so it says"
_CONTENT = re.compile(r"(?<![\w'])'[^'\n]+'(?![\w'])|\"[^\"\n]+\"|\u201c[^\u201d\n]+\u201d"
                      r"|\b(?:the|a|an|new|single)\s+(?:\w+\s+)?(?:text|words?|lines?|note"
                      r"|content|contents|message|string|sentence)\b|\bcontaining\b"
                      r"|\b(?:it|that)\s+says\b|\bsaying\b", re.IGNORECASE)
_SEARCH = re.compile(r"\b(?:search|grep|find|locate|look\s+for|mention(?:s|ed)?|contains?"
                     r"|containing|talks?\s+about|anywhere|occurrences?|where\s+(?:is|are|does|"
                     r"do)\b)", re.IGNORECASE)
_LISTING = re.compile(r"^\s*(?:please\s+)?list\b|\b(?:folder|directory|dir)\b|\bwhich\s+files"
                      r"\s+(?:are|does|do|is)\b|\bwhat\s+files\b|\beverything\s+(?:in|under|"
                      r"inside)\b|\bfiles\s+(?:are\s+)?(?:here|in|under|inside)\b",
                      re.IGNORECASE)
_READ = re.compile(_OPENER + r"(?:read|show|display|print|open|view|cat)\b", re.IGNORECASE)
# a read verb and the file it reads: "Read notes.txt", "Open the file docs/a.md"
_READ_NAMED = re.compile(_OPENER + r"(?:read|show|display|print|open|view|cat)\s+(?:me\s+)?"
                         r"(?:the\s+)?(?:file\s+)?[\w./~-]*\w\.[A-Za-z][A-Za-z0-9]{0,7}\b",
                         re.IGNORECASE)
_FILE_WORD = re.compile(r"\bfiles?\b", re.IGNORECASE)
# a folder by its name ("the orders folder", "this directory"), or words looked for in files:
# "Where is flour mentioned?", "Find the word spade." (not "I mentioned my dog", "Find the
# word that rhymes with orange")
_ABOUT_FILES = re.compile(r"\b(?:the|this|that|my|our)\s+(?:[\w.-]+\s+)?(?:folder|directory)\b"
                          r"|\bwhere\s+(?:is|are|was|were)\s+[^.?!,;]{1,60}?\s+mentioned\b"
                          r"|\bmentioned\s+anywhere\b|\bwhich\s+\w+\s+mentions\b"
                          r"|^(?:find|search\s+for|grep\s+for|look\s+for)\s+the\s+words?\s+"
                          r"(?!that\b|which\b|for\b)[^\s.?!]+(?:\s+(?:and|or)\s+[^\s.?!]+)?"
                          r"(?:\s+in\s+[^.?!]{1,60})?[.?!]?$", re.IGNORECASE)
BUILTIN_FILE_TOOLS = ("read_file", "write_file", "list_files", "grep")


def asked_tool(tools: Sequence[Tool], request: str) -> Tool | None:
    """The built-in tool of ``tools`` that ``request`` asks for (see the module's rules), or
    None: a request that asks for no file work, or for a tool not offered."""
    offered = {t.name: t for t in tools if _file_tool(t)}
    name = asked_name(request)
    return offered.get(name) if name else None


def asked_instead(tools: Sequence[Tool], request: str, called: Tool) -> Tool | None:
    """The built-in file tool of ``tools`` to call instead of ``called``, another built-in
    file tool, where ``request`` asks for it (:func:`asked_tool`); None where it asks for
    ``called`` or for nothing certain. A call of ``write_file`` stays where a clause of the
    request begins with a verb that writes or adds ("I need to call Mateo. Save that in
    reminders.md.", "Add 'milk' to todo.md": what the model wrote may be meant)."""
    if not _file_tool(called):
        return None
    asked = asked_tool(tools, request)
    if asked is None or asked.name == called.name or called.name == "write_file" and any(
            _WRITES.match(c) for c in _clauses(request[:REQUEST_CHARS])):
        return None
    return asked


def asked_name(request: str) -> str | None:
    """The name of the built-in file tool ``request`` asks for, or None."""
    text = request[:REQUEST_CHARS]
    names = file_names(text)
    clauses = [(sentence, clause) for sentence in _sentences(text)
               for clause in _clauses(sentence)]
    for sentence, clause in clauses:  # the first action the text writes, of these two
        if _READ_NAMED.match(clause):
            return "read_file"
        if (m := _WRITE.match(clause)) and (
                m.group(1).split()[0].lower() in _SURE_WRITES
                or _CONTENT.search(sentence) and (names or _FILE_WORD.search(text))):
            return "write_file"
    if _SEARCH.search(text):
        return "grep"
    if _LISTING.search(text):
        return "list_files"
    if any(_READ.match(clause) for _, clause in clauses) or names:
        return "read_file"
    return None


def about_files(request: str) -> bool:
    """Whether ``request`` names a file (``notes.txt``) or a folder ("the orders folder"),
    speaks of files, or asks where words are written ("Where is flour mentioned?", "Find the
    word spade."): where a request would be answered from the model's own knowledge, one
    that does is about the files here."""
    text = request[:REQUEST_CHARS]
    return bool(file_names(text) or _FILE_WORD.search(text)
                or any(_ABOUT_FILES.search(c) for c in _clauses(text)))


def _file_tool(tool: Tool) -> bool:
    return tool.builtin is not None and tool.name in BUILTIN_FILE_TOOLS


def _sentences(text: str) -> list[str]:
    """``text``'s sentences (ended by ``.``, ``!`` or ``?`` before a space or the end; not the
    dot of ``notes.txt``), stripped."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _clauses(text: str) -> list[str]:
    """``text``'s clauses, stripped: its sentences, cut after each comma, semicolon or colon
    ("In todo.md, write 'milk'" holds "write 'milk'")."""
    return [part.strip() for sentence in _sentences(text)
            for part in re.split(r"(?<=[,;:])\s+", sentence) if part.strip()]

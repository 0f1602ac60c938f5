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

# the last word of a parameter's name that makes it a path's: "path", "output_dir"; "path"
# after another word only after one of FILE_WORDS ("image_path"; not "career_path")
PATH_WORDS = frozenset("""file files filename filenames filepath pathname dir directory
folder""".split())
FILE_WORDS = frozenset("""file folder dir directory src source dest destination target input
output in out save local log config data img image photo doc document audio video
model""".split())
_PATH_NAMED = re.compile(r"\b(?:file|folder|directory)\s*(?:path|name)\b"
                         r"|\bpath\s+(?:to|of)\s+(?:the\s+|a\s+|an\s+)?(?:file|folder|directory)\b",
                         re.IGNORECASE)
_PATH_CHARS = re.compile(r"[\w~./-]+")
_FILE_NAME = re.compile(r"\w[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7}")
# extensions that make a name a file's for a request about files ("notes.txt"; not "Node.js",
# "amazon.com", "Ph.D")
EXTENSIONS = frozenset("""txt md rst csv tsv json jsonl yaml yml toml ini cfg conf log py
ipynb sh c h cc cpp hpp rs go java rb ts tsx html htm css xml pdf doc docx xls xlsx ppt pptx
png jpg jpeg gif svg zip tar gz tgz sql db sqlite env lock""".split())


def takes_path(name: str, schema: object) -> bool:
    """Whether the string parameter ``name`` (of JSON schema ``schema``) takes a file's or a
    folder's path: its name ends in a word of :data:`PATH_WORDS` or in "file name" ("file",
    "output_dir", "sourceFile", "file_name"; not "file_type"), is "path", or ends in "path"
    after a word of :data:`FILE_WORDS` ("image_path"; not "career_path"), or its description
    says "file path", "directory name" or "path to the file"."""
    if not isinstance(schema, dict) or schema.get("type", "string") != "string" \
            or {"enum", "const", "format"} & schema.keys():
        return False
    named = [w.lower() for w in NAME_WORD.findall(name)]
    description = schema.get("description")
    return bool(named) and (named[-1] in PATH_WORDS or named[-2:] == ["file", "name"]
                            or named[-1] in ("path", "paths")
                            and (len(named) == 1 or named[-2] in FILE_WORDS)) \
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


def file_names(text: str) -> list[str]:
    """The paths ``text`` writes (:func:`written_paths`) whose last part is a file's name by
    its extension (:data:`EXTENSIONS`): "notes.txt", "data/users.csv"; not "km/h",
    "USD/EUR", "Node.js", "amazon.com"."""
    return [p for p in written_paths(text)
            if "." in (last := p.rstrip("/").rsplit("/", 1)[-1])
            and last.rsplit(".", 1)[1].lower() in EXTENSIONS]


def _bare(path: str) -> str:
    """``path`` without white space round it, a leading ``./`` or a trailing ``/``."""
    path = path.strip()
    path = path[2:] if path.startswith("./") else path
    return path.rstrip("/") if path.strip("/") else path


def writes_path(text: str, path: str, cased: bool = False) -> bool:
    """Whether ``text`` writes ``path`` whole (case aside, unless ``cased``), with or without
    a leading ``./`` or a trailing ``/`` ("src/" in "the files in src"): not as a part of a
    longer path ("users.csv" is not in "data/users.csv") or a word ("notes" is not in
    "notes.txt"); a path with folders is written where each of its parts is ("docs/notes.txt"
    in "notes.txt in the docs folder"). A path with no letter or digit ("." for the working
    folder) is always written."""
    path = _bare(path)
    if not re.search(r"[^\W_]", path):
        return True
    flags = 0 if cased else re.IGNORECASE

    def whole(part: str) -> bool:
        return re.search(rf"(?<![\w~./-])(?:\./)?{re.escape(part)}(?![\w-]|\.\w|/[\w.~-])",
                         text, flags) is not None

    parts = [p for p in path.split("/") if p not in ("", ".", "~")]
    return whole(path) or len(parts) > 1 and all(map(whole, parts))

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

import posixpath
import re

from .heard import NAME_WORD

# the last word of a parameter's name that makes it a path's ("path", "output_dir"); "path"
# after another word but one of NOT_FILE_WORDS ("repo_path"; not "career_path")
PATH_WORDS = frozenset("""path paths file files filename filenames filepath pathname dir
directory folder""".split())
NOT_FILE_WORDS = frozenset("""career learning growth migration upgrade promotion escalation
url uri api route routing json key flight travel critical shortest optimal network
xpath""".split())
_PATH_NAMED = re.compile(r"\b(?:file|folder|directory)\s*(?:path|name)\b|\bpath\s+(?:to|of)\s+"
                         r"(?:the\s+|a\s+|an\s+)?(?:\w+\s+)?(?:file|folder|directory|repository)\b",
                         re.IGNORECASE)
_PATH_CHARS = re.compile(r"[\w~./-]+")
_FILE_NAME = re.compile(r"\w[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7}")
# extensions that make a name a file's for a request about files ("notes.txt"; not
# "amazon.com", "Ph.D"); those of PRODUCT_EXTENSIONS only in lower case or after a folder
# ("app.js", "src/Main.js"; not "Node.js")
EXTENSIONS = frozenset("""txt md rst csv tsv json jsonl yaml yml toml ini cfg conf log py
ipynb sh c h cc cpp hpp rs go java kt swift rb php js mjs jsx ts tsx vue html htm css xml pdf
doc docx xls xlsx ppt pptx png jpg jpeg gif svg zip tar gz tgz sql db sqlite env
lock""".split())
PRODUCT_EXTENSIONS = frozenset("js ts".split())
MAX_PARTS = 16  # a path of more folders is written whole or not at all
# words of a path parameter's name or description that make it a file's, or a folder's
_FILE_WORDS = frozenset("file files filename filenames filepath".split())
_FOLDER_WORDS = frozenset("dir dirs directory directories folder folders".split())


def takes_path(name: str, schema: object) -> bool:
    """Whether the string parameter ``name`` (of JSON schema ``schema``) takes a file's or a
    folder's path: its name ends in a word of :data:`PATH_WORDS` ("path", "output_dir",
    "sourceFile", "repo_path"; not "file_type", nor "career_path": a word of
    :data:`NOT_FILE_WORDS` before "path") or in "file name", or its description says "file
    path", "directory name" or "path to the git repository"."""
    if not isinstance(schema, dict) or schema.get("type", "string") != "string" \
            or {"enum", "const", "format"} & schema.keys():
        return False
    named = [w.lower() for w in NAME_WORD.findall(name)]
    description = schema.get("description")
    return bool(named) and (named[-1] in PATH_WORDS and not (
        named[-1] in ("path", "paths") and len(named) > 1 and named[-2] in NOT_FILE_WORDS)
        or named[-2:] == ["file", "name"]) \
        or isinstance(description, str) and _PATH_NAMED.search(description) is not None


def takes_file(name: str, schema: object) -> bool:
    """Whether the path parameter ``name`` takes a file's path, not a folder's: a word of its
    name or description is "file" and none is "folder" or "directory" (read_file's "File
    path, relative to the root."; not grep's "File or directory.", nor "profile_path" or a
    "redirect" in a description)."""
    if not takes_path(name, schema):
        return False
    description = schema.get("description")
    said = {w.lower() for w in NAME_WORD.findall(name)} | set(re.findall(
        r"[a-z]+", description.lower() if isinstance(description, str) else ""))
    return bool(said & _FILE_WORDS) and not said & _FOLDER_WORDS


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
    its extension (:data:`EXTENSIONS`): "notes.txt", "data/users.csv", "app.js"; not "km/h",
    "USD/EUR", "Node.js", "amazon.com"."""
    out = []
    for p in written_paths(text):
        last = p.rstrip("/").rsplit("/", 1)[-1]
        extension = last.rsplit(".", 1)[1].lower() if "." in last else ""
        if extension in EXTENSIONS and (extension not in PRODUCT_EXTENSIONS or "/" in p
                                        or last == last.lower()):
            out.append(p)
    return out


def _bare(path: str) -> str:
    """``path`` without white space round it, normalised (no ``./``, ``//`` or final ``/``)."""
    path = path.strip()
    return posixpath.normpath(path) if path.strip("/") else path


def writes_path(text: str, path: str, cased: bool = False) -> bool:
    """Whether ``text`` writes ``path`` whole (case aside, unless ``cased``), with or without
    a leading ``./`` or a trailing ``/`` ("src/" in "the files in src"), or as a path's
    leading folders ("data" in "data/users.csv"): not as the end of a longer path
    ("users.csv" is not in "data/users.csv") or a part of a word ("notes" is not in
    "notes.txt"). A path with folders is also written where its name is, and each folder as
    one ("docs/notes.txt" in "notes.txt in the docs folder"; not "hello/world" in "hello
    world"), for up to :data:`MAX_PARTS` parts. A path with no letter or digit ("." for the
    working folder) is always written."""
    path = _bare(path)
    if not re.search(r"[^\W_]", path):
        return True
    flags = 0 if cased else re.IGNORECASE

    def whole(part: str, folder: bool = False) -> bool:
        name, lead = re.escape(part), r"(?<![\w~./-])(?:\./)?"
        pattern = rf"{lead}{name}(?![\w-]|\.\w)" if not folder else \
            rf"{lead}{name}(?:/|\s+(?:folder|directory|dir)\b)" \
            rf"|\b(?:folder|directory|dir)\s+{name}(?![\w-]|\.\w)"  # "docs/", "docs folder"
        return re.search(pattern, text, flags) is not None

    parts = list(dict.fromkeys(p for p in path.split("/") if p not in ("", ".", "~")))
    return whole(path) or 1 < len(parts) <= MAX_PARTS and whole(parts[-1]) \
        and all(whole(p, folder=True) for p in parts[:-1])

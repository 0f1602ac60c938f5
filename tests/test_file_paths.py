"""File paths in text (mlx_agent.file_paths) and the file tools a request names."""

from __future__ import annotations

import json

import pytest

from mlx_agent.described_tool import mentioned
from mlx_agent.file_paths import (file_names, takes_file, takes_path, writes_path,
                                   written_paths)
from mlx_agent.tools import builtin_tools, parse_tools


def test_the_paths_a_request_writes():
    assert written_paths("Read data/users.csv, notes.txt. Then ~/x and src/ (e.g. 3.5, v2.0, "
                         "ann@mail.example.net, https://a.com/b/c.txt), Makefile.am.") == \
        ["data/users.csv", "notes.txt", "~/x", "src/", "Makefile.am"]
    # a file's name by its extension: not a unit, a pair of codes, a product or a domain
    assert file_names("notes.txt, data/users.csv, km/h, USD/EUR, Node.js, amazon.com, src/") \
        == ["notes.txt", "data/users.csv"]


@pytest.mark.parametrize("text, path, written", [
    ("the logs directory", "logs", True), ("x", "./", True), ("x", ".", True),
    ("data/users.csv", "users.csv", False),  # a part of a longer path
    ("notes.txt", "notes", False),  # a part of a name
    ("List the files in src/", "src", True), ("List the files in src", "src/", True),
    ("in ./src.", "src", True), ("the logs directory", "logs/", True),
    ("Write hi to notes.txt in the docs folder", "docs/notes.txt", True),  # each part
    ("Write hi to notes.txt", "docs/notes.txt", False),
    ("README.md\nlogs/server.log\nlogs/worker.log", "logs/server.log", True),  # a listing
    ("Server.log", "server.log", True),
])
def test_whether_a_text_writes_a_path_whole(text, path, written):
    assert writes_path(text, path) is written
    assert writes_path("Server.log", "server.log", cased=True) is False


def test_which_parameters_take_a_path(tmp_path):
    schemas = {"path": {"type": "string"}, "output_dir": {"type": "string"},
               "sourceFile": {}, "file_name": {"type": "string"},
               "image_path": {"type": "string"},
               "where": {"type": "string", "description": "The file path to read."},
               "at": {"type": "string", "description": "Path to the folder."},
               # not: another kind, a career, a flight's, an enum, a number
               "file_type": {"type": "string"}, "career_path": {"type": "string"},
               "route": {"type": "string", "description": "The flight path of the plane."},
               "mode": {"type": "string", "enum": ["a.txt"]}, "dir": {"type": "integer"}}
    assert [n for n, s in schemas.items() if takes_path(n, s)] == \
        ["path", "output_dir", "sourceFile", "file_name", "image_path", "where", "at"]
    # a file's, not a folder's: read_file's path, not list_files' or grep's; by whole words
    # ("profile" is no file, "redirect" no folder)
    assert [n for n, s in schemas.items() if takes_file(n, s)] == \
        ["sourceFile", "file_name", "where"]
    assert not takes_file("profile_path", {"type": "string"})
    assert takes_file("target", {"type": "string", "description": "The redirect file path."})
    assert [t.name for t in builtin_tools(tmp_path)
            if takes_file("path", t.properties.get("path"))] == ["read_file", "write_file"]


def test_a_request_that_writes_a_files_name_names_the_file_tools(tmp_path):
    tools = builtin_tools(tmp_path)
    named = [t.name for t in mentioned(tools, "Write the text 'hello world' to greeting.txt.")]
    assert named == ["list_files", "write_file"]  # "list" says what it does: "file" is its name
    for request in ("What is Node.js?", "Convert 100 km/h to mph", "Is amazon.com down?",
                    "What is the USD/EUR rate?", "Write the text 'hello world'."):
        assert mentioned(tools, request) == [], request
    other = parse_tools(json.dumps([{"name": "get_weather", "parameters": {
        "type": "object", "properties": {}}}]), runnable=False)
    assert mentioned(other, "Read notes.txt") == []  # a file names no other tool

"""Which built-in file tool a request asks for (mlx_agent.file_intent), and the agent that
calls it where the model called another (real subprocesses with the bundled model)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlx_agent.file_intent import about_files, asked_instead, asked_name, asked_tool
from mlx_agent.stated_arguments import pressed_tools
from mlx_agent.tools import builtin_tools, parse_tools


@pytest.mark.parametrize("request_, name", [
    # a write verb first, with a file named (or one only files take)
    ("Store the note 'call Mateo' in reminders.md.", "write_file"),
    ("Put the line v2.0 in a file named VERSION.", "write_file"),
    ("Overwrite CHANGELOG with the single line 1.0.0 stable.", "write_file"),
    ("Replace the contents of VERSION with v1.5.0.", "write_file"),
    ("Update plan/notes.md so it says 'compost delivered'.", "write_file"),
    ("Create a file named todo.txt containing 'buy milk'.", "write_file"),  # not a search
    ("Can you save 'call Mateo' in reminders.md?", "write_file"),  # words before the verb
    ("Hi! Please write 'done' to status.txt.", "write_file"),  # a later sentence
    ("In todo.md, write 'buy milk'.", "write_file"),  # a later clause
    ("Now write 'hello' to notes.txt.", "write_file"),
    ("Open notes.txt, then write 'done' at the end.", "read_file"),  # the first action
    ("Make a list of fruits.", None),  # no file
    ("Write a poem about the sea.", None),
    ("Make a file-like object in Python.", None),  # nothing to write into it
    # a write verb, but nothing written: the file is read
    ("Store hours are in hours.txt. When do we open on Sunday?", "read_file"),
    ("Make sure notes.txt has no typos.", "read_file"),
    ("Put simply, what does config.yaml set?", "read_file"),
    ("Update me on what notes.txt says.", "read_file"),
    # a search, before a folder's contents
    ("Which files mention TODO?", "grep"),
    ("Where is flour mentioned?", "grep"),
    ("Is there a TODO anywhere in src?", "grep"),
    # a folder's contents
    ("What is in the orders folder?", "list_files"),
    ("Show me everything in this directory.", "list_files"),
    ("Which files are in src?", "list_files"),
    # a read: a read verb first (before a search: "find" is what to do with the file read),
    # or a file named
    ("Read notes.txt and find the line about Mateo.", "read_file"),
    ("Display CHANGELOG.", "read_file"),
    ("Show the file docs/supplies.md.", "read_file"),
    ("What port does config.yaml set?", "read_file"),
    ("Who owns the shop? The answer is in NOTES.md.", "read_file"),
    ("Who is the first user listed in data/users.csv?", "read_file"),  # "listed": no list
    ("What is the capital of France?", None),
])
def test_the_request_says_which_file_tool_it_asks_for(request_, name):
    assert asked_name(request_) == name


def test_only_an_offered_built_in_tool_is_asked_for(tmp_path):
    builtin = builtin_tools(tmp_path)
    assert asked_tool(builtin, "Display CHANGELOG.").name == "read_file"
    assert asked_tool([t for t in builtin if t.name != "read_file"], "Display CHANGELOG.") is None
    # a tool of the user's by the same name does what its own schema says
    mine = parse_tools(json.dumps([{"name": "read_file", "description": "Read a URL.",
                                    "parameters": {"type": "object", "properties": {}}}]),
                       runnable=False)
    assert asked_tool(mine, "Display CHANGELOG.") is None


def test_a_call_is_moved_only_between_the_file_tools_and_never_off_a_write(tmp_path):
    tools = {t.name: t for t in builtin_tools(tmp_path)}
    moved = asked_instead(list(tools.values()), "Display CHANGELOG.", tools["grep"])
    assert moved is tools["read_file"]
    for request, called in [
        ("Run test_calc.py.", "run_tests"),  # not a file tool
        ("Display CHANGELOG.", "read_file"),  # asked for already
        ("I need to call Mateo. Save that in reminders.md.", "write_file"),  # a write verb
        ("Add 'buy milk' to todo.md.", "write_file"),  # an addition: the model's write stays
    ]:
        assert asked_instead(list(tools.values()), request, tools[called]) is None, request


def test_a_request_about_a_folder_is_pressed_to_call_a_built_in_tool(tmp_path):
    builtin = builtin_tools(tmp_path)
    user = [{"role": "user", "content": "What is in the orders folder?"}]
    assert pressed_tools(builtin, user) == builtin
    for request in ("Where is flour mentioned?", "Find the word spade.", "Which note mentions "
                    "flour?", "Is Mateo mentioned anywhere?", "Search for the word spade in the "
                    "notes.", "Look for the words flour and sugar."):
        assert about_files(request), request
    # no file or folder named, no words looked for: the model may answer
    for question in ("Find the capital of France.", "Which folder should I keep my tax "
                     "papers in?", "How many occurrences of the letter r are in strawberry?",
                     "I mentioned my dog earlier, what was its name?",
                     "Find the word that rhymes with orange."):
        assert not about_files(question), question
    assert pressed_tools(builtin, [{"role": "user", "content": "Find the capital of France."}]) \
        == []
    ran = user + [{"role": "assistant", "content": "{}"},
                  {"role": "tool", "name": "list_files", "content": "orders/march.csv"}]
    assert pressed_tools(builtin, ran) == []  # it ran: the reply may answer


def agent(root, prompt: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "agent", "--builtin-tools",
                          "--root", str(root), "--json-out", "--single", prompt],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.real_model
def test_the_bundled_model_asked_to_store_a_note_writes_it(tmp_path):
    """It grepped for the note in the file it was to write ("no file or directory
    'reminders.md'"), twice, then answered that it had found it."""
    (tmp_path / "NOTES.md").write_text("# Spokes\n")
    events = agent(tmp_path, "Store the note 'call Mateo' in reminders.md.")
    calls = [e for e in events if e["type"] == "tool_call"]
    assert calls[0]["tool"] == "write_file", calls
    assert (tmp_path / "reminders.md").read_text().strip() == "call Mateo"


@pytest.mark.real_model
def test_the_bundled_model_asked_what_a_folder_holds_lists_it(tmp_path):
    """It grepped for "log" and answered that the folder's contents were not visible."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "april.log").write_text("2026-04-02 fixed puncture\n")
    (tmp_path / "NOTES.md").write_text("Spokes keeps the repair log of a workshop.\n")
    events = agent(tmp_path, "What's inside the logs directory?")
    calls = [e for e in events if e["type"] == "tool_call"]
    assert calls and calls[0]["tool"] == "list_files", calls
    assert "april.log" in next(e for e in events if e["type"] == "answer")["text"]

"""An answer after a short tool result states it (mlx_agent.stated_result)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mlx_agent.formats.messages import Call, Reply
from mlx_agent.stated_result import MAX_SAID, stated_answer


def turn(result: dict | str, request: str = "List the files in logs.") -> list[dict]:
    content = result if isinstance(result, str) else json.dumps(result)
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": request},
            {"role": "assistant", "content": "{}"},
            {"role": "tool", "name": "list_files", "content": content}]


def ran(stdout: str, code: int = 0) -> dict:
    return {"tool": "list_files", "stdout": stdout, "stderr": "", "exit_code": code}


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_an_answer_that_states_nothing_of_the_result_is_followed_by_it(tiny_lm, protocol):
    answer = "There are 4 files in the logs directory."
    text = json.dumps({"answer": answer}) if protocol == "json" else answer
    engine, prompt, tail = tiny_lm.engine(), tiny_lm.encode_text("a prompt"), [2]
    sampled = tiny_lm.encode_text(text)
    engine.sync(prompt + sampled + tail)
    reply, new_text, ids = stated_answer(engine, tiny_lm, protocol, prompt,
                                         Reply(content=answer), text, sampled, tail,
                                         turn(ran("logs/server.log")))
    assert reply.content == answer + "\n\nlist_files returned logs/server.log."
    assert new_text == (json.dumps({"answer": reply.content}, separators=(",", ":"))
                        if protocol == "json" else reply.content)
    assert tiny_lm.decode(ids) == new_text
    assert engine.tokens == prompt + ids + tail  # as if it had been sampled so
    small = tiny_lm.engine(context_length=len(prompt) + len(sampled) + 1)
    small.sync(prompt + sampled + tail)  # the answer with the result does not fit: as sampled
    assert stated_answer(small, tiny_lm, protocol, prompt, Reply(content=answer), text,
                         sampled, tail, turn(ran("logs/server.log")))[1] == text


@pytest.mark.parametrize("result, stated", [
    ("logs/a.log\nlogs/b.log\n", "logs/a.log, logs/b.log."),  # lines apart, a full stop
    ("Sent to Perth!", "Sent to Perth!"),  # a stop of its own
    ("id,name\n7,Ann", "id,name; 7,Ann."),  # a table's lines apart
    ("False", "False."),  # is_prime's False beside "Yes, it is prime"
])
def test_the_result_is_stated_in_one_sentence(tiny_lm, result, stated):
    reply = stated_answer(tiny_lm.engine(), tiny_lm, "hermes", [1], Reply(content="Done. "),
                          "Done. ", [1], [], turn(ran(result)))[0]
    assert reply.content == f"Done.\n\nlist_files returned {stated}"


@pytest.mark.parametrize("answer, messages", [
    ("The file is logs/server.log.", turn(ran("logs/server.log"))),  # stated
    ("Server: logs/server.log", turn(ran("logs/server.log"))),  # one word of it
    ("It has 2 lines.", turn(ran("a\nb"))),  # nothing the request does not write: one letter
    ("Done.", turn(ran("logs"), "List the logs")),  # the request writes all of it
    ("Done.", turn(ran("logs/server.log", code=1))),  # a failed call: no result to state
    ("Done.", turn(ran("x" * (MAX_SAID - 9) + " server.log"))),  # too long: the model's
    ("Done.", turn(ran("logs/server.log"))[:3]),  # no result this turn
    ("Done.", turn(["a", "list"])),  # JSON of no output: which part?
    ("Sent.", turn(ran("success: done"))),  # tells nothing
])
def test_an_answer_that_states_the_result_or_has_none_to_state_is_kept(tiny_lm, answer,
                                                                        messages):
    reply = Reply(content=answer)
    kept = stated_answer(tiny_lm.engine(), tiny_lm, "json", [1], reply, answer, [1], [],
                         messages)
    assert kept[0] is reply


TOML = '[shop]\nname = "Spokes"\nopening_hour = 8\nclosing_hour = 18\nlabour_rate = 32\n'
NOTES = ("# Spokes\n\nSpokes keeps the repair log of a bicycle workshop in Leeds.\n"
         "Owner: Priya Nair\n")
GREP = "logs/april.log:2: 2026-04-05 replaced chain for Mateo (ticket 312)"


@pytest.mark.parametrize("answer, result, request_, stated", [
    # the line the request asks about, by its name's words, of a result of any length
    ("It returned labour_rate=32.", TOML, "Tell me the closing hour in app.toml.",
     "From list_files: closing_hour = 18."),
    ("The shop does not own the shop.", NOTES, "Who owns the shop? See NOTES.md.",
     "From list_files: Owner: Priya Nair."),
    ("It is 18.", TOML, "Tell me the closing hour in app.toml.", None),  # stated
    ("Open at 9.", "a.txt:1: hour = 8\nb.txt:4: hour = 9", "Which hour?", None),  # which?
    # a short result quoted cut short
    ("It returned logs/april.log:2: 2026-04-05.", GREP, "Search the logs for ticket 312.",
     f"list_files returned {GREP}."),
    (f"It returned {GREP}", GREP, "Search the logs for ticket 312.", None),  # whole
    ("Mateo's chain: logs/april.log:2", GREP, "Search the logs for ticket 312.", None),
])
def test_an_answer_is_followed_by_what_it_leaves_unsaid(tiny_lm, answer, result, request_,
                                                         stated):
    reply = Reply(content=answer)
    out = stated_answer(tiny_lm.engine(), tiny_lm, "hermes", [1], reply, answer, [1], [],
                        turn(ran(result), request_))[0]
    assert out.content == (answer if stated is None else f"{answer}\n\n{stated}")


def test_a_call_or_a_cut_answer_is_kept(tiny_lm):
    for reply in (Reply(calls=[Call("list_files", {})]), Reply(content="The", complete=False)):
        assert stated_answer(tiny_lm.engine(), tiny_lm, "json", [1], reply, "x", [1], [],
                             turn(ran("server.log")))[0] is reply


@pytest.mark.real_model
def test_the_agent_states_the_result_it_got(tmp_path):
    """The bundled model, asked for a folder's files, answers with the listing it got."""
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "agenda.md").write_text("Meeting with Dana at 10am.\n")
    out = subprocess.run([sys.executable, "-m", "mlx_agent.cli.main", "agent",
                          "--builtin-tools", "--root", str(root), "--json-out", "--single",
                          "List the files in docs."], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    answer = next(e for e in events if e["type"] == "answer")["text"]
    assert "docs/agenda.md" in answer, answer

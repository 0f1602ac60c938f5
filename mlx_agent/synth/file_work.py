"""Everyday file work with the built-in tools, written as conversations: generated folders,
the requests people make of them, the tools' real results, and answers taken from those.

:func:`make_folder` fills an empty directory with a few small files (notes, code, tables,
some in sub-folders) holding facts ("The deadline is June 9."), names and marker lines;
:func:`file_tasks` phrases requests over it (report a fact, show a file, its first line or
word, count its lines, list a folder, find a word, ask whether a file mentions one, write
or create a file), each with the one call that serves it and how the answer is made from
that call's result; :func:`conversations` runs every call on a fresh copy of the folder with
the real built-in tool and writes request -> call -> result -> answer, for
:func:`mlx_agent.written_rows.conversation_row`. Some requests can open with a mistaken
call (a misspelt path, a folder read as a file, a search in a made-up folder) that really
fails, followed by the right one: the row trains the recovery, not the mistake
(``FileTask.untrained``); some name a file that is not there, and the answer says so
rather than inventing its contents. Synthesis (:mod:`.tasks`) phrases a
request from a tool's own name and description ("Call read_file with memo.txt as the
path"); this phrases it as a user asks for file work ("What's the budget in memo.txt?").

Deterministic under the random generator given. Values are drawn from the training side of
the pools (:mod:`.pools`), and neither the phrasings nor the names are those of the
hand-written held-out set in ``examples/files``. Not promised: that the requests cover
what users ask (they are templates), or a result's meaning beyond what the answer copies.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..tools import Tool
from . import pools as P
from .conversations import call_message, run_on_copy

STEMS = ("memo", "plan", "budget", "minutes", "ideas", "report", "summary", "roadmap",
         "tasks", "readme", "changelog", "schedule", "contacts", "recipe", "letter",
         "draft", "journal", "checklist", "goals", "status")
CODE_STEMS = ("utils", "main", "parser", "helpers", "models", "server", "convert", "stats")
TABLE_STEMS = ("sales", "prices", "stock", "scores", "expenses", "orders")
FOLDERS = ("docs", "reports", "src", "meetings", "drafts", "data", "plans", "archive")
MARKERS = ("FIXME", "NOTE", "XXX")
MONTHS = ("January", "February", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
THINGS = {  # what a fact line states, and how its value is drawn
    "deadline": lambda r: f"{r.choice(MONTHS)} {r.randint(1, 28)}",
    "budget": lambda r: f"${r.randint(2, 90) * 100}",
    "venue": lambda r: f"the {r.choice(P.CITIES)} office",
    "owner": lambda r: r.choice(_PEOPLE).split()[0],
    "kickoff time": lambda r: f"{r.randint(8, 11)}:{r.choice(('00', '15', '30', '45'))} am",
    "review date": lambda r: f"{r.choice(MONTHS)} {r.randint(1, 28)}",
    "version": lambda r: f"{r.randint(1, 9)}.{r.randint(0, 20)}",
    "room": lambda r: f"room {r.randint(100, 480)}",
    "contact": lambda r: r.choice(_PEOPLE),
    "target": lambda r: f"{r.randint(10, 990)} units",
    "code name": lambda r: r.choice(_WORDS).capitalize(),
    "password hint": lambda r: f"the {r.choice(P.COLORS)} {r.choice(_WORDS)}",
}
_PEOPLE = tuple(p for p in P.split(P.PEOPLE, P.TRAIN) if not p.startswith("Dana"))
_WORDS = tuple(w for w in P.split(P.WORDS, P.TRAIN) if w != "falcon")
_SENTENCES = P.split(P.SENTENCES, P.TRAIN)


# what a mistaken call names instead of a folder or a file the request gave
WRONG_NAMES = ("files", "all", "folder", "here", "directory", "everything")
MISSING_ANSWERS = ("There is no file named {p} here.", "I couldn't find {p}: it does not exist.",
                   "{p} does not exist, so I can't read it.")


@dataclass(frozen=True)
class FileTask:
    prompt: str
    kind: str
    call: tuple[str, dict]  # the built-in tool's name and arguments
    answer: Callable[[str], str]  # the answer, made from the call's stdout (its stderr: fails)
    # a mistaken call made first, which fails; ``call`` then recovers from its error
    slip: tuple[str, dict] | None = None
    fails: bool = False  # the call itself fails (the file does not exist): the answer says so

    @property
    def untrained(self) -> tuple[int, ...]:
        """The conversation's replies that are context, not training: the mistaken call."""
        return (1,) if self.slip else ()


def make_folder(root: Path, rng: random.Random) -> dict[str, str]:
    """Writes 3 to 7 small files under ``root`` (some in one or two sub-folders) and
    returns them as {relative path: text}. Each note holds a title and fact lines."""
    folders = [""] + [f + "/" for f in rng.sample(FOLDERS, rng.randint(0, 2))]
    files: dict[str, str] = {}
    wanted = rng.randint(3, 7)
    while len(files) < wanted:
        where, kind = rng.choice(folders), rng.random()
        if kind < 0.6:
            path = f"{where}{rng.choice(STEMS)}.{rng.choice(('txt', 'md'))}"
            body = [f"The {thing} is {THINGS[thing](rng)}."
                    for thing in rng.sample(sorted(THINGS), rng.randint(1, 3))]
            if rng.random() < 0.5:
                body.append(f"{rng.choice(MARKERS)}: {rng.choice(_SENTENCES).lower()}")
            if rng.random() < 0.5:
                body.append(f"Ask {rng.choice(_PEOPLE)} about the {rng.choice(_WORDS)} file.")
            rng.shuffle(body)
            lines = [rng.choice(P.TITLES)] + body
        elif kind < 0.8:
            path = f"{where}{rng.choice(CODE_STEMS)}.py"
            name, word = rng.choice(("total", "scale", "clean", "merge")), rng.choice(_WORDS)
            lines = [f"def {name}_{word}(items):",
                     f"    # {rng.choice(MARKERS)}: handle empty input" if rng.random() < 0.5
                     else f"    # written by {rng.choice(_PEOPLE).split()[0]}",
                     "    return [x for x in items if x]"]
        else:
            path = f"{where}{rng.choice(TABLE_STEMS)}.csv"
            lines = ["item,count"] + [f"{rng.choice(_WORDS)},{rng.randint(1, 99)}"
                                      for _ in range(rng.randint(2, 4))]
        if path in files:
            continue
        files[path] = "\n".join(lines) + "\n"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(files[path], encoding="utf-8")
    return files


def _names(paths: Sequence[str]) -> str:
    paths = list(paths)
    return paths[0] if len(paths) == 1 else ", ".join(paths[:-1]) + " and " + paths[-1]


def _matches(stdout: str) -> list[tuple[str, str]]:
    """(file, text) of grep's ``path:line: text`` lines (it says "no matches" when none)."""
    return [(parts[0], parts[2].strip()) for parts in
            (line.split(":", 2) for line in stdout.splitlines()) if len(parts) == 3]


def file_tasks(files: dict[str, str], rng: random.Random, n: int, *, slip_share: float = 0.0,
               missing_share: float = 0.0) -> list[FileTask]:
    """``n`` requests over the folder ``files`` describes (as :func:`make_folder` returns),
    of kinds drawn in turn. ``slip_share`` of them open with a mistaken call (a misspelt or
    made-up path, a folder read as a file) whose error the right call then recovers from
    (writes have none, and :func:`conversations` drops a slip that succeeds, so fewer do);
    ``missing_share`` ask about a file that is not there, and the answer says so."""
    makers = [_fact, _show, _first, _lines, _listing, _search, _mentions, _write]
    out = []
    while len(out) < n:
        if missing_share and rng.random() < missing_share:
            out.append(_missing(files, rng))
            continue
        task = rng.choice(makers)(files, rng)
        if task is None:
            continue
        if slip_share and rng.random() < slip_share:
            task = _slipped(task, files, rng)
        out.append(task)
    return out


def _misspelt_path(path: str, files: dict[str, str], rng: random.Random) -> str:
    """A path near ``path`` that names nothing in the folder: a letter dropped, the other
    extension, a plural, or the folder left out."""
    folder, _, name = path.rpartition("/")
    stem, _, ext = name.rpartition(".")
    taken = set(files) | {p.split("/")[0] for p in files}
    for _ in range(8):
        way = rng.randrange(4)
        if way == 0 and len(stem) > 3:
            i = rng.randrange(1, len(stem))
            near = f"{stem[:i]}{stem[i + 1:]}.{ext}"
        elif way == 1:
            near = f"{stem}.{dict(txt='md', md='txt').get(ext, 'txt')}"
        elif way == 2:
            near = f"{stem}s.{ext}"
        else:
            near = name
        near = f"{folder}/{near}" if folder and way != 3 else near
        if near not in taken:
            return near
    return f"{stem}-old.{ext}"


def _far(a: str, b: str) -> bool:
    """Whether two names are more than one edit (a letter dropped, added or changed, or
    an ending "s") apart."""
    if a == b or a.rstrip("s") == b.rstrip("s"):
        return False
    if abs(len(a) - len(b)) > 1:
        return True
    short, long = sorted((a, b), key=len)
    if len(short) == len(long):
        return sum(x != y for x, y in zip(a, b)) > 1
    return not any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _slipped(task: FileTask, files: dict[str, str], rng: random.Random) -> FileTask:
    """``task`` opened by a call that fails as a small model's do (the call still serves
    the request once its error is read); a write has no such slip and stays as it is."""
    name, args = task.call
    if name == "read_file":
        path = args["path"]
        folder = path.rpartition("/")[0]
        slip = ("read_file", {"path": folder if folder and rng.random() < 0.3
                              else _misspelt_path(path, files, rng)})
    elif name == "list_files":
        slip = ("read_file", {"path": args.get("path") or rng.choice(WRONG_NAMES)})
    elif name == "grep" and "path" in args:
        slip = ("grep", {"pattern": args["pattern"],
                         "path": _misspelt_path(args["path"], files, rng)})
    elif name == "grep":
        slip = ("grep", {"pattern": args["pattern"],
                         "path": rng.choice(WRONG_NAMES + (args["pattern"].lower(),))})
    else:
        return task
    return dataclasses.replace(task, kind=f"{task.kind}-recovered", slip=slip)


def _missing(files, rng):
    """A request for a file that is not there, named unlike every file that is (a name one
    edit from a real file is what a slip misspells, and its recovery reads the real one)."""
    taken = {p.rpartition("/")[2].rpartition(".")[0] for p in files}
    stems = [s for s in STEMS + CODE_STEMS if all(_far(s, t) for t in taken)]
    path = f"{rng.choice(stems or ['nonexistent'])}.{rng.choice(('txt', 'md'))}"
    prompt = rng.choice(("Print {p}.", "What does {p} say?", "Open {p} for me.",
                         "Read {p}.")).format(p=path)
    template = rng.choice(MISSING_ANSWERS)
    return FileTask(prompt, "missing", ("read_file", {"path": path}),
                    lambda _err: template.format(p=path), fails=True)


def _fact(files, rng):
    facts = [(p, line[4:].split(" is ", 1)[0]) for p, text in files.items()
             for line in text.splitlines() if line.startswith("The ") and " is " in line]
    if not facts:
        return None
    path, thing = rng.choice(facts)
    prompt = rng.choice((
        "What's the {t} in {p}?", "Look in {p} and tell me the {t}.",
        "Can you check {p} for the {t}?", "According to {p}, what is the {t}?",
        "I forgot the {t}. It's written in {p}.", "Open {p}: what does it give as the {t}?",
    )).format(t=thing, p=path)
    template = rng.choice(("The {t} is {v}.", "According to {p}, the {t} is {v}.",
                           "{p} says the {t} is {v}."))

    def answer(out: str) -> str:
        lead = f"The {thing} is "
        value = next(line[len(lead):] for line in out.splitlines() if line.startswith(lead))
        return template.format(t=thing, v=value.rstrip("."), p=path)
    return FileTask(prompt, "fact", ("read_file", {"path": path}), answer)


def _show(files, rng):
    path = rng.choice(sorted(files))
    prompt = rng.choice(("Print {p}.", "Display the contents of {p}.", "Can you open {p}?",
                         "What's inside {p}?", "Let me see {p}.", "Read {p} to me.")
                        ).format(p=path)
    lead = rng.choice(("{p} says:", "Here is {p}:", "The contents of {p}:")).format(p=path)
    return FileTask(prompt, "show", ("read_file", {"path": path}),
                    lambda out: f"{lead}\n{out.strip()}")


def _first(files, rng):
    path = rng.choice(sorted(files))
    if rng.random() < 0.5:
        prompt = rng.choice(("Which word does {p} start with?", "Tell me the opening word "
                             "of {p}.", "How does {p} begin? Just the first word.")
                            ).format(p=path)
        return FileTask(prompt, "first", ("read_file", {"path": path}),
                        lambda out: f"{path} starts with the word "
                                    f"\"{out.split()[0].strip(',:;(')}\".")
    prompt = rng.choice(("What's the first line of {p}?", "What is the heading of {p}?",
                         "Give me the top line in {p}.")).format(p=path)
    return FileTask(prompt, "first", ("read_file", {"path": path}),
                    lambda out: f"The first line of {path} is \"{out.splitlines()[0]}\".")


def _lines(files, rng):
    path = rng.choice(sorted(files))
    prompt = rng.choice(("Count the lines in {p}.", "How long is {p}, in lines?",
                         "What's the line count of {p}?")).format(p=path)

    def answer(out: str) -> str:
        n = len(out.splitlines())
        return f"{path} has {n} line{'s' if n != 1 else ''}."
    return FileTask(prompt, "lines", ("read_file", {"path": path}), answer)


def _listing(files, rng):
    folders = sorted({p.split("/")[0] for p in files if "/" in p})
    if folders and rng.random() < 0.6:
        folder = rng.choice(folders)
        prompt = rng.choice(("What's in the {d} folder?", "Show me what {d} contains.",
                             "Which files live under {d}?", "List everything in {d}/.")
                            ).format(d=folder)
        call = ("list_files", {"path": folder})
    else:
        prompt = rng.choice(("What files do I have here?", "Show me all the files.",
                             "List what's in this directory.", "Which files are there?"))
        call = ("list_files", {})
    return FileTask(prompt, "list", call,
                    lambda out: f"There {'is' if len(out.split()) == 1 else 'are'} "
                                f"{len(out.split())}: {_names(out.split())}.")


def _search_word(files, rng) -> str:
    """A word of the folder's files (now and then one of none of them)."""
    stripped = (w.strip(".,:;()\"'$") for text in files.values() for w in text.split())
    words = sorted({w for w in stripped if len(w) > 3 and w.isalpha()})
    return rng.choice(words) if words and rng.random() < 0.85 else rng.choice(_WORDS)


def _search(files, rng):
    word = _search_word(files, rng)
    prompt = rng.choice(("Where does {w} appear?", "Find {w} in my files.",
                         "Search the files for {w}.", "Which files talk about {w}?",
                         "Look for {w} across the folder.", "Grep for {w}.")).format(w=word)

    def answer(out: str) -> str:
        found = list(dict.fromkeys(path for path, _ in _matches(out)))
        if not found:
            return f"No file mentions {word}."
        return f"{word} appears in {_names(found)}."
    return FileTask(prompt, "search", ("grep", {"pattern": word}), answer)


def _mentions(files, rng):
    path, word = rng.choice(sorted(files)), _search_word(files, rng)
    prompt = rng.choice(("Does {p} mention {w}?", "Is {w} anywhere in {p}?",
                         "Check whether {p} says anything about {w}.")).format(p=path, w=word)

    def answer(out: str) -> str:
        found = _matches(out)
        if not found:
            return f"No, {path} does not mention {word}."
        return f"Yes, {path} mentions {word}: \"{found[0][1]}\""
    return FileTask(prompt, "mentions", ("grep", {"pattern": word, "path": path}), answer)


def _write(files, rng):
    text = rng.choice(_SENTENCES) + "."
    folder = rng.choice([""] + sorted({p.split("/")[0] + "/" for p in files if "/" in p}))
    path = f"{folder}{rng.choice(STEMS)}-{rng.choice(_WORDS)}.{rng.choice(('txt', 'md'))}"
    prompt = rng.choice(("Save \"{t}\" in a file called {p}.", "Put '{t}' into {p}.",
                         "Make a new file {p} that says: {t}", "Store the line \"{t}\" as {p}.",
                         "Could you create {p} with the text '{t}'?",
                         "Jot down \"{t}\" in {p}.")).format(t=text, p=path)
    return FileTask(prompt, "write", ("write_file", {"path": path, "content": text}),
                    lambda _out: f"Done: {path} now says \"{text}\"")


def conversations(tools: Sequence[Tool], folder: Path, tasks: Sequence[FileTask],
                  sandbox=None, timeout: float = 10.0) -> list[tuple[FileTask, list[dict]]]:
    """Each task with its conversation, each call run by the built-in tool of ``tools``
    over a fresh copy of ``folder``; a task whose call does not end as it should (a slip
    that succeeds, a call that fails unless the task expects it to) is left out. Train on
    a conversation's replies except those at ``task.untrained``."""
    by_name = {t.name: t for t in tools}
    out = []
    for n, task in enumerate(tasks):
        messages = [{"role": "user", "content": task.prompt}]
        if task.slip:
            name, arguments = task.slip
            result = run_on_copy(by_name[name], arguments, folder, sandbox=sandbox,
                                 timeout=timeout)
            if result.exit_code == 0 or result.timed_out:
                continue
            messages += [call_message(by_name[name], arguments, f"{n}-slip"),
                         {"role": "tool", "name": name, "content": result.for_model()}]
        name, arguments = task.call
        result = run_on_copy(by_name[name], arguments, folder, sandbox=sandbox, timeout=timeout)
        if (result.exit_code != 0) != task.fails or result.timed_out:
            continue
        said = result.stderr if task.fails else result.stdout
        out.append((task, messages + [
            call_message(by_name[name], arguments, n),
            {"role": "tool", "name": name, "content": result.for_model()},
            {"role": "assistant", "content": task.answer(said)}]))
    return out

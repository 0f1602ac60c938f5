"""The specialist trial: ``mlx_agent specialize`` on the trial's 7 tools, measured on the
trial's own held-out tasks against the committed adapter.

    .venv/bin/python scripts/specialist_trial.py [--work build/trial] [--minutes 15]

1. Writes the trial's task set (arithmetic with a calculator tool, lookups in a small JSON
   database, file reads over a fixture tree): held-out tasks with other numbers, users and
   files than its training tasks, half of them phrased in ways training never saw. Only the
   held-out tasks are used here.
2. Runs :func:`mlx_agent.specialize.specialize` on the same 7 tools (``tools.json`` and the
   built-in tools, in the order ``eval`` lists them) with the fixture as the tools' directory:
   synthesised tasks, written conversations, LoRA, its own held-out eval.
3. Evaluates the base model, ``models/smollm2-135m-tools`` (trained by an earlier version of
   this trial from guided rollouts), the adapter given as ``--start`` (specialize trains on
   from it: a general adapter) and the new specialist on the trial's held-out tasks,
   greedy, grammar on; prints the table (success = the expected call was made; answered = the
   answer also states the tool's result) and writes ``results.json`` in the work directory.
"""


from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import shutil
import time
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)

TOOLS = [
    {"type": "function", "function": {
        "name": "calculate", "description": "Compute a op b for two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"},
            "op": {"type": "string", "enum": ["add", "sub", "mul"]}},
            "required": ["a", "b", "op"]},
        "_exec": 'case "$op" in add) echo $((a + b));; sub) echo $((a - b));; mul) echo $((a * b));; esac'}},
    {"type": "function", "function": {
        "name": "lookup_user", "description": "Look up a user record by id in the database.",
        "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}},
                       "required": ["user_id"]},
        "_exec": 'grep -F "\\"$user_id\\"" db.jsonl || echo "no such user"'}},
]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
         "mallory", "niaj", "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter"]
FILES = {"notes/todo.txt": "ship v2\n", "notes/ideas.md": "# ideas\n", "src/app.py": "print(1)\n",
         "README.md": "# demo\n", "data/config.yaml": "debug: true\n", "docs/guide.txt": "read me\n",
         "src/util.py": "x = 1\n", "notes/meeting.txt": "monday\n"}


# Each family's phrasings: the first ones for training, the last held out for testing only.
CALC = {"add": (["What is {a} plus {b}?", "Add {a} and {b}."], "Sum {a} and {b}."),
        "sub": (["What is {a} minus {b}?", "Subtract {b} from {a}."], "Compute {a} minus {b}."),
        "mul": (["What is {a} times {b}?", "Multiply {a} by {b}."],
                "What's {a} multiplied by {b}?")}
LOOKUP = (["Look up user {u}.", "Find the record of user {u}."], "Who is user {u}?")
READ = (["Read the file {p}.", "Show me {p}."], "What does {p} say?")
APPLY = {"add": int.__add__, "sub": int.__sub__, "mul": int.__mul__}


def _task(tid, prompt, result, name, arguments, family, phrasing):
    """A task, with ``_result`` (what a right answer states) and ``_family`` /
    ``_phrasing`` for the report; the underscored keys stay out of the task files."""
    return {"id": tid, "prompt": prompt, "_result": result, "_family": family,
            "_phrasing": phrasing,
            "check": {"tool_calls": [{"name": name, "arguments": arguments}]},
            "tools": "tools.json", "builtin_tools": True, "fixture": "fixture"}


def make_tasks(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """Train and held-out tasks. Held out: other numbers, other users and other files
    than any training task, half of them in phrasings training never used."""
    train, test, seen = [], [], set()
    for i in range(60):
        op = list(CALC)[i % 3]
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        seen.add((a, b, op))
        text = CALC[op][0][(i // 3) % 2]
        train.append(_task(f"calc-{i}", text.format(a=a, b=b), str(APPLY[op](a, b)), "calculate",
                           {"a": a, "b": b, "op": op}, "calc", "seen"))
    for i in range(18):
        op = list(CALC)[i % 3]
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        while (a, b, op) in seen:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
        held = i % 2 == 1
        text = CALC[op][1] if held else rng.choice(CALC[op][0])
        test.append(_task(f"calc-t{i}", text.format(a=a, b=b), str(APPLY[op](a, b)),
                          "calculate", {"a": a, "b": b, "op": op}, "calc",
                          "held out" if held else "seen"))
    users = list(enumerate(NAMES))
    rng.shuffle(users)
    for n, (i, name) in enumerate(users):
        uid = f"u{100 + i}"
        if n < 13:
            for j, text in enumerate(LOOKUP[0]):
                train.append(_task(f"lookup-{i}-{j}", text.format(u=uid), name, "lookup_user",
                                   {"user_id": uid}, "lookup", "seen"))
        else:
            for j, (text, kind) in enumerate(((rng.choice(LOOKUP[0]), "seen"),
                                              (LOOKUP[1], "held out"))):
                test.append(_task(f"lookup-{i}-t{j}", text.format(u=uid), name, "lookup_user",
                                  {"user_id": uid}, "lookup", kind))
    files = list(FILES.items())
    rng.shuffle(files)
    for n, (path, content) in enumerate(files):
        if n < 5:
            for j, text in enumerate(READ[0]):
                train.append(_task(f"read-{n}-{j}", text.format(p=path), content.strip(),
                                   "read_file", {"path": path}, "read", "seen"))
        else:
            for j, (text, kind) in enumerate(((rng.choice(READ[0]), "seen"),
                                              (READ[1], "held out"))):
                test.append(_task(f"read-{n}-t{j}", text.format(p=path), content.strip(),
                                  "read_file", {"path": path}, "read", kind))
    rng.shuffle(train)
    return train, test


def write_task_set(work: Path, rng: random.Random) -> tuple[Path, Path, dict[str, dict]]:
    """The fixture, tools and task files; returns the files and each task's report keys."""
    if work.exists():
        shutil.rmtree(work)
    (work / "fixture").mkdir(parents=True)
    (work / "tools.json").write_text(json.dumps({"tools": TOOLS}, indent=1))
    for path, text in FILES.items():
        p = work / "fixture" / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (work / "fixture" / "db.jsonl").write_text("".join(
        json.dumps({"id": f"u{100 + i}", "name": n, "plan": rng.choice(["free", "pro"])}) + "\n"
        for i, n in enumerate(NAMES)))
    train_tasks, test_tasks = make_tasks(rng)
    info = {}
    for t in train_tasks + test_tasks:
        info[t["id"]] = {k[1:]: t.pop(k) for k in ("_result", "_family", "_phrasing")}
    for t in train_tasks:  # guided rollouts: the expected call, then an answer
        t["tool_choice"] = [t["check"]["tool_calls"][0], "none"]
    train, test = work / "train.jsonl", work / "test.jsonl"
    train.write_text("".join(json.dumps(t) + "\n" for t in train_tasks))
    test.write_text("".join(json.dumps(t) + "\n" for t in test_tasks))
    return train, test, info


def main():
    from mlx_agent.evaluate import run
    from mlx_agent.models import load
    from mlx_agent.specialize import RECIPE, Models, SpecializeConfig, specialize, table
    from mlx_agent.synth.config import SynthConfig
    from mlx_agent.tools import builtin_tools, load_tools

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="build/trial")
    ap.add_argument("--committed", default="models/smollm2-135m-tools")
    ap.add_argument("--start", default=None, metavar="ADAPTER",
                    help="specialize from this adapter (a general one), evaluated too")
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--n-heldout", type=int, default=20,
                    help="specialize's own synthesised held-out tasks")
    args = ap.parse_args()
    work = Path(args.work)
    start = time.perf_counter()
    _, test_tasks, info = write_task_set(work, random.Random(0))
    common = {"max_steps": 3, "max_tokens": 96, "grammar": True}

    def log(msg):
        print(f"[{time.perf_counter() - start:7.1f} s] {msg}", flush=True)

    def good_answer(answer: str | None, result: str) -> bool:
        """The answer states the tool's result (a number as a whole number), briefly."""
        if answer is None or len(answer.strip()) > len(result) + 40:
            return False
        return re.search(rf"(?<![\w.-]){re.escape(result)}(?![\w.])", answer) is not None

    def measure(lm) -> dict:
        summary = run(lm, test_tasks, config_overrides=common)
        runs = summary.runs
        by_kind = {}
        for key in ("family", "phrasing"):
            for value in sorted({i[key] for i in info.values()}):
                hits = [r.reward for r in runs if info[r.task][key] == value]
                by_kind[value] = f"{sum(hits):.0f}/{len(hits)}"
        answered = sum(r.reward == 1.0 and good_answer(r.answer, info[r.task]["result"])
                       for r in runs) / max(len(runs), 1)
        return {**summary.row(), "answered": answered, "by_kind": by_kind}

    # The tools as eval lists them for the trial's tasks: the file's, then the built-ins
    # (bound here to a scratch copy of the fixture: synthesis may call write_file).
    scratch = work / "scratch"
    shutil.copytree(work / "fixture", scratch)
    config = SpecializeConfig(
        synth=SynthConfig(n_heldout=args.n_heldout),
        sft=dataclasses.replace(RECIPE, iters=args.iters, minutes=args.minutes),
        max_steps=common["max_steps"], max_tokens=common["max_tokens"],
        fixture=str(work / "fixture"), extra_tools=tuple(builtin_tools(scratch)))
    tools_file = work / "tools.json"
    special = specialize(Models(load, args.start), load_tools(tools_file),
                         tools_file.read_bytes(),
                         work / "specialist", config, log=lambda m: print(m, flush=True))
    for line in table(special):
        log(line)
    rows = {}
    start_row = [("start", args.start)] if args.start else []
    for name, adapter in [("base", None), ("committed", args.committed), *start_row,
                          ("specialize", str(work / "specialist"))]:
        log(f"evaluating {name} on the trial's held-out tasks")
        rows[name] = measure(load(adapter=adapter))
        log(f"{name}: {rows[name]}")
    results = {"trial": rows, "specialize": special,
               "minutes": (time.perf_counter() - start) / 60}
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'':<12} {'success':>8} {'answered':>9} {'valid calls':>12} {'calls/run':>10}")
    for name, row in rows.items():
        print(f"{name:<12} {row['success']:>8.0%} {row['answered']:>9.0%} "
              f"{row['valid_calls']:>12.0%} {row['mean_calls']:>10.2f}  "
              + ", ".join(f"{k} {v}" for k, v in row["by_kind"].items()))
    print(f"held-out tasks: {rows['base']['runs']}; {results['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()

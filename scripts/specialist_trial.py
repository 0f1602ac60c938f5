"""The specialist trial: roll out, keep what worked, fine-tune, and measure on held-out tasks.

    .venv/bin/python scripts/specialist_trial.py [--work build/trial] [--out models/smollm2-135m-tools]

1. Writes a synthetic task set with checks (arithmetic with a calculator tool, lookups in a
   small JSON database, file reads over a fixture tree): training tasks, and held-out tasks
   with other numbers, users and files than any training task, half of them phrased in ways
   training never saw.
2. Evaluates the bundled model on the test set (greedy, grammar on).
3. Rolls it out on the train tasks, guided: each task's ``tool_choice`` is (its expected
   call, "none"), so the grammar leaves open only that call first and only an answer after
   the result. The model still samples every token; the answer is its own. Keeps the
   rollouts whose answer states the tool's result; a task with none keeps one rollout cut
   after its call. (Unguided, the 135M model succeeded in 2% of rollouts and then called
   tool after tool; guided to the tool alone, 12% made the right call and 4% also
   answered with the result.)
4. ``traces-to-data`` -> ``sft`` (LoRA) -> evaluates the specialist on the test set,
   unguided (tool_choice auto), like the base model.
Prints the table (success = the expected call was made; answered = the answer also states
the tool's result) and writes ``results.json`` in the work directory.
"""

from __future__ import annotations

import argparse
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
    from mlx_agent.engine import SamplingParams
    from mlx_agent.evaluate import run
    from mlx_agent.models import load
    from mlx_agent.sft import SFTConfig, read_rows, train
    from mlx_agent.trajectory import read, set_reward, write
    from mlx_agent.training_data import convert

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="build/trial")
    ap.add_argument("--out", default="models/smollm2-135m-tools")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=150)
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    start = time.perf_counter()
    train_tasks, test_tasks, info = write_task_set(work, random.Random(0))
    common = {"max_steps": 3, "max_tokens": 96, "grammar": True}

    def log(msg):
        print(f"[{time.perf_counter() - start:7.1f} s] {msg}", flush=True)

    def good_answer(answer: str | None, result: str) -> bool:
        """The answer states the tool's result (a number as a whole number), briefly."""
        if answer is None or len(answer.strip()) > len(result) + 40:
            return False
        return re.search(rf"(?<![\w.-]){re.escape(result)}(?![\w.])", answer) is not None

    def good(r) -> bool:
        return r.reward == 1.0 and good_answer(r.answer, info[r.task]["result"])

    def answered(summary) -> float:
        """The share of runs that made the expected call and whose answer states the result."""
        return sum(map(good, summary.runs)) / max(len(summary.runs), 1)

    def breakdown(summary) -> dict:
        """Right calls per task family and per phrasing (seen in training, or held out)."""
        out = {}
        for key in ("family", "phrasing"):
            for value in sorted({i[key] for i in info.values()}):
                runs = [r for r in summary.runs if info[r.task][key] == value]
                if runs:
                    out[value] = f"{sum(r.reward for r in runs):.0f}/{len(runs)}"
        return out

    base = load()
    log("evaluating the base model on the held-out tasks")
    base_run = run(base, test_tasks, config_overrides=common)
    base_eval = {**base_run.row(), "answered": answered(base_run),
                 "by_kind": breakdown(base_run)}
    log(f"base: {base_eval}")

    log(f"guided rollouts on the train tasks, {args.seeds} seeds at temperature 0.5")
    runs_dir = work / "runs"
    rollouts = run(base, train_tasks, seeds=args.seeds, trajectory_dir=runs_dir,
                   config_overrides={**common, "sampling": SamplingParams(temperature=0.5)})
    # Per task: keep the rollouts whose answer states the tool's result, briefly. A task
    # with none keeps one rollout cut after its (forced, right) call: the adapter learns
    # that call, and learns answering from the other tasks.
    by_task: dict[str, list] = {}
    for r in rollouts.runs:
        by_task.setdefault(r.task, []).append(r)
    full = cut = 0
    for task, runs in by_task.items():
        kept = [r for r in runs if good(r)]
        for r in runs:
            if r not in kept:
                set_reward(r.trajectory, 0.0)
        if kept:
            full += 1
            continue
        right = next((r for r in runs if r.reward == 1.0), None)
        traj = read(right.trajectory) if right else None
        call_at = next((i for i, st in enumerate(traj.steps) if st.tool_call is not None),
                       None) if traj else None
        if call_at is None:
            continue
        traj.steps = traj.steps[: call_at + 1]
        write(right.trajectory, traj)
        set_reward(right.trajectory, 1.0)
        cut += 1
    log(f"tasks with a good answer: {full}; kept only up to the call: {cut}")
    data = work / "sft.jsonl"
    counts = convert(runs_dir, data, min_reward=1.0)
    log(f"rollouts: {rollouts.row()}; answered {answered(rollouts):.0%}; "
        f"training rows: {counts.rows}")
    if counts.rows == 0:
        raise SystemExit("no successful rollouts to train on")

    trainee = load()
    stats = train(trainee, read_rows(data), out,
                  SFTConfig(iters=args.iters, batch_size=4, learning_rate=2e-4, rank=8,
                            num_layers=16))
    log(f"sft: {stats}")

    special = load(adapter=out)
    log("evaluating the specialist on the held-out tasks")
    special_run = run(special, test_tasks, config_overrides=common)
    special_eval = {**special_run.row(), "answered": answered(special_run),
                    "by_kind": breakdown(special_run)}
    log(f"specialist: {special_eval}")

    results = {"base": base_eval, "specialist": special_eval, "rollouts": rollouts.row(),
               "train_rows": counts.rows, "sft": stats,
               "minutes": (time.perf_counter() - start) / 60}
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'':<12} {'success':>8} {'answered':>9} {'valid calls':>12} {'calls/run':>10} "
          f"{'turns/run':>10}")
    for name, row in (("base", base_eval), ("specialist", special_eval)):
        print(f"{name:<12} {row['success']:>8.0%} {row['answered']:>9.0%} "
              f"{row['valid_calls']:>12.0%} {row['mean_calls']:>10.2f} {row['mean_turns']:>10.2f}")
    for name, row in (("base", base_eval), ("specialist", special_eval)):
        print(f"{name:<12} right calls by kind: " +
              ", ".join(f"{k} {v}" for k, v in row["by_kind"].items()))
    print(f"held-out tasks: {base_eval['runs']}; training rows: {counts.rows}; "
          f"{results['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()

"""The specialist trial: roll out, keep what worked, fine-tune, and measure on held-out tasks.

    .venv/bin/python scripts/specialist_trial.py [--work build/trial] [--out models/smollm2-135m-tools]

1. Writes a synthetic task set with checks (arithmetic with a calculator tool, lookups in a
   small JSON database, file reads over a fixture tree) and splits it into train and a
   held-out test set that training never sees.
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


def make_tasks(rng: random.Random) -> list[dict]:
    """Tasks with their check (the expected call) and ``_result``: what a right answer
    states (the trial's stricter filter; not part of the task file)."""
    tasks = []
    ops = [("add", "What is {a} plus {b}?", int.__add__), ("add", "Add {a} and {b}.", int.__add__),
           ("sub", "What is {a} minus {b}?", int.__sub__),
           ("sub", "Subtract {b} from {a}.", int.__sub__),
           ("mul", "What is {a} times {b}?", int.__mul__),
           ("mul", "Multiply {a} by {b}.", int.__mul__)]
    for i in range(60):
        op, text, f = ops[i % len(ops)]
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        tasks.append({"id": f"calc-{i}", "prompt": text.format(a=a, b=b), "_result": str(f(a, b)),
                      "check": {"tool_calls": [{"name": "calculate",
                                                "arguments": {"a": a, "b": b, "op": op}}]}})
    for i, name in enumerate(NAMES):
        uid = f"u{100 + i}"
        for j, text in enumerate(rng.sample(["Look up user {u}.", "Find the record of user {u}.",
                                             "Who is user {u}?"], 2)):
            tasks.append({"id": f"lookup-{i}-{j}", "prompt": text.format(u=uid), "_result": name,
                          "check": {"tool_calls": [{"name": "lookup_user",
                                                    "arguments": {"user_id": uid}}]}})
    for i, (path, content) in enumerate(FILES.items()):
        for j, text in enumerate(["Read the file {p}.", "Show me {p}.",
                                  "What does {p} say?"]):
            tasks.append({"id": f"read-{i}-{j}", "prompt": text.format(p=path),
                          "_result": content.strip(),
                          "check": {"tool_calls": [{"name": "read_file",
                                                    "arguments": {"path": path}}]}})
    for t in tasks:
        t.update(tools="tools.json", builtin_tools=True, fixture="fixture")
    rng.shuffle(tasks)
    return tasks


def write_task_set(work: Path, rng: random.Random) -> tuple[Path, Path, dict[str, str]]:
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
    tasks = make_tasks(rng)
    cut = len(tasks) * 2 // 3
    results = {t["id"]: t.pop("_result") for t in tasks}
    for t in tasks[:cut]:  # guided rollouts: the expected call, then an answer
        t["tool_choice"] = [t["check"]["tool_calls"][0], "none"]
    train, test = work / "train.jsonl", work / "test.jsonl"
    train.write_text("".join(json.dumps(t) + "\n" for t in tasks[:cut]))
    test.write_text("".join(json.dumps(t) + "\n" for t in tasks[cut:]))
    return train, test, results


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
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=150)
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    start = time.perf_counter()
    train_tasks, test_tasks, results_by_task = write_task_set(work, random.Random(0))
    common = {"max_steps": 3, "max_tokens": 96, "grammar": True}

    def log(msg):
        print(f"[{time.perf_counter() - start:7.1f} s] {msg}", flush=True)

    def good_answer(answer: str | None, result: str) -> bool:
        """The answer states the tool's result, and not much else."""
        return answer is not None and result in answer and len(answer.strip()) <= len(result) + 40

    def answered(summary) -> float:
        """The share of runs that made the expected call and whose answer states the result."""
        ok = [r.reward == 1.0 and good_answer(r.answer, results_by_task[r.task])
              for r in summary.runs]
        return sum(ok) / max(len(ok), 1)

    base = load()
    log("evaluating the base model on the held-out tasks")
    base_run = run(base, test_tasks, config_overrides=common)
    base_eval = {**base_run.row(), "answered": answered(base_run)}
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
        good = [r for r in runs if good_answer(r.answer, results_by_task[task])]
        for r in runs:
            if r not in good:
                set_reward(r.trajectory, 0.0)
        if good:
            full += 1
            continue
        traj = read(runs[0].trajectory)
        call_at = next(i for i, st in enumerate(traj.steps) if st.tool_call is not None)
        traj.steps = traj.steps[: call_at + 1]
        write(runs[0].trajectory, traj)
        set_reward(runs[0].trajectory, 1.0)
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
    special_eval = {**special_run.row(), "answered": answered(special_run)}
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
    print(f"held-out tasks: {base_eval['runs']}; training rows: {counts.rows}; "
          f"{results['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()

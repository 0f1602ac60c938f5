"""The specialist trial: roll out, keep what worked, fine-tune, and measure on held-out tasks.

    .venv/bin/python scripts/specialist_trial.py [--work build/trial] [--out models/smollm2-135m-tools]

1. Writes a synthetic task set with checks (arithmetic with a calculator tool, lookups in a
   small JSON database, file reads over a fixture tree) and splits it into train and a
   held-out test set that training never sees.
2. Evaluates the bundled model on the test set (greedy, grammar on).
3. Rolls it out on the train tasks (several seeds, temperature 0.8, grammar on) and keeps the
   trajectories that made the expected call, each cut after that call (the 135M model mostly
   calls again instead of answering; the adapter should learn the call, not the loop).
4. ``traces-to-data`` -> ``sft`` (LoRA) -> evaluates the specialist on the test set.
Prints the table and writes ``results.json`` in the work directory.
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
    tasks = []
    ops = [("add", "What is {a} plus {b}?"), ("add", "Add {a} and {b}."),
           ("sub", "What is {a} minus {b}?"), ("sub", "Subtract {b} from {a}."),
           ("mul", "What is {a} times {b}?"), ("mul", "Multiply {a} by {b}.")]
    for i in range(36):
        op, text = ops[i % len(ops)]
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        tasks.append({"id": f"calc-{i}", "prompt": text.format(a=a, b=b),
                      "check": {"tool_calls": [{"name": "calculate",
                                                "arguments": {"a": a, "b": b, "op": op}}]}})
    for i, name in enumerate(NAMES):
        uid = f"u{100 + i}"
        text = rng.choice(["Look up user {u}.", "Find the record of user {u}.",
                           "Who is user {u}?"])
        tasks.append({"id": f"lookup-{i}", "prompt": text.format(u=uid),
                      "check": {"tool_calls": [{"name": "lookup_user",
                                                "arguments": {"user_id": uid}}]}})
    for i, path in enumerate(FILES):
        for j, text in enumerate(["Read the file {p}.", "Show me {p}."]):
            tasks.append({"id": f"read-{i}-{j}", "prompt": text.format(p=path),
                          "check": {"tool_calls": [{"name": "read_file",
                                                    "arguments": {"path": path}}]}})
    for t in tasks:
        t.update(tools="tools.json", builtin_tools=True, fixture="fixture")
    rng.shuffle(tasks)
    return tasks


def write_task_set(work: Path, rng: random.Random) -> tuple[Path, Path]:
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
    train, test = work / "train.jsonl", work / "test.jsonl"
    train.write_text("".join(json.dumps(t) + "\n" for t in tasks[:cut]))
    test.write_text("".join(json.dumps(t) + "\n" for t in tasks[cut:]))
    return train, test


def main():
    from mlx_agent.engine import SamplingParams
    from mlx_agent.evaluate import run
    from mlx_agent.models import load
    from mlx_agent.sft import SFTConfig, read_rows, train
    from mlx_agent.trajectory import iter_dir, write
    from mlx_agent.training_data import convert

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="build/trial")
    ap.add_argument("--out", default="models/smollm2-135m-tools")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=150)
    args = ap.parse_args()
    work, out = Path(args.work), Path(args.out)
    start = time.perf_counter()
    train_tasks, test_tasks = write_task_set(work, random.Random(0))
    common = {"max_steps": 3, "max_tokens": 96, "grammar": True}

    def log(msg):
        print(f"[{time.perf_counter() - start:7.1f} s] {msg}", flush=True)

    base = load()
    log("evaluating the base model on the held-out tasks")
    base_eval = run(base, test_tasks, config_overrides=common).row()
    log(f"base: {base_eval}")

    log(f"rolling out on the train tasks, {args.seeds} seeds at temperature 0.8")
    runs_dir = work / "runs"
    rollouts = run(base, train_tasks, seeds=args.seeds, trajectory_dir=runs_dir,
                   config_overrides={**common, "sampling": SamplingParams(temperature=0.8)})
    # A successful rollout made the expected call; what the 135M model does after it is
    # mostly to call again. Keep each success up to its first call, so the adapter learns
    # the call and not the loop.
    expected = {json.loads(line)["id"]: json.loads(line)["check"]["tool_calls"][0]
                for line in train_tasks.read_text().splitlines()}

    def is_expected(step, want) -> bool:
        call = step.tool_call
        return (call is not None and call.name == want["name"]
                and all(json.loads(call.arguments_json).get(k) == v
                        for k, v in want["arguments"].items()))

    for path, traj in iter_dir(runs_dir):
        if traj.summary.get("reward") == "1.0":
            want = expected[traj.task]
            first = next(i for i, st in enumerate(traj.steps) if is_expected(st, want))
            traj.steps = traj.steps[: first + 1]
            write(path, traj)
    data = work / "sft.jsonl"
    counts = convert(runs_dir, data, min_reward=1.0)
    log(f"rollouts: {rollouts.row()}; training rows kept: {counts.rows}")
    if counts.rows == 0:
        raise SystemExit("no successful rollouts to train on")

    trainee = load()
    stats = train(trainee, read_rows(data), out,
                  SFTConfig(iters=args.iters, batch_size=4, learning_rate=2e-4, rank=8,
                            num_layers=16))
    log(f"sft: {stats}")

    special = load(adapter=out)
    log("evaluating the specialist on the held-out tasks")
    special_eval = run(special, test_tasks, config_overrides=common).row()
    log(f"specialist: {special_eval}")

    results = {"base": base_eval, "specialist": special_eval, "rollouts": rollouts.row(),
               "train_rows": counts.rows, "sft": stats,
               "minutes": (time.perf_counter() - start) / 60}
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'':<12} {'success':>8} {'valid calls':>12} {'calls/run':>10} {'turns/run':>10}")
    for name, row in (("base", base_eval), ("specialist", special_eval)):
        print(f"{name:<12} {row['success']:>8.0%} {row['valid_calls']:>12.0%} "
              f"{row['mean_calls']:>10.2f} {row['mean_turns']:>10.2f}")
    print(f"held-out tasks: {base_eval['runs']}; training rows: {counts.rows}; "
          f"{results['minutes']:.1f} minutes")


if __name__ == "__main__":
    main()

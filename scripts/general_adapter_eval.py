"""The general adapter against the base model: held-out synthetic catalogues and BFCL.

    .venv/bin/python scripts/general_adapter_eval.py --corpus build/general \
        --adapter build/general/adapter [--task-limit 10] [--outside-limit 5]
        [--bfcl-limit 100] [--batch 8]
        [--categories simple,multiple,irrelevance,live_simple,live_multiple] [--only base]
        [--table]

``--corpus`` is ``scripts/general_adapter.py``'s output: its held-out catalogues (domains no
training catalogue has) are the synthetic set, the first ``--task-limit`` held-out tasks of
each, run by ``mlx_agent eval`` (greedy, grammar on, ``--max-steps 4 --max-tokens 128``).
BFCL runs through ``mlx_agent eval-bfcl`` (greedy, grammar on). Each model's results go to
``--out`` (``synth-LABEL.jsonl``: a row per run; ``bfcl-LABEL.jsonl``: a row per category),
so a second invocation with ``--only`` reuses the other's files. Prints one table:

- synthetic ``right calls``: the call and chain tasks whose calls were all right;
  ``answered``: runs that ended in an answer; ``states result``: answer tasks whose answer
  states the result the right call returns (so the call must be right too);
  ``states what it got``: answer tasks whose answer states what its last tool call
  returned, whatever the call (read from the runs' trajectories, ``traj-LABEL/``);
  ``no tool``: no-tool tasks answered without a call; ``all``: every task above;
  ``refuses outside``: ``--outside-limit`` requests per held-out catalogue for a tool it
  lacks (one of a training catalogue's, the held-out half of synthesis's ``outside``
  kind), answered without a call;
- BFCL: the accuracy of each category.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zlib
from collections import defaultdict
from pathlib import Path

from mlx_agent.trajectory import iter_dir

HERE = Path(__file__).resolve().parent
CLI = [str(Path(sys.executable).parent / "mlx_agent")]


def heldout_tasks(corpus: Path, domains: set[str], limit: int, outside: int,
                  out: Path) -> Path:
    """One tasks file of the held-out catalogues' first ``limit`` held-out tasks each, and
    ``outside`` requests each for a tool it lacks (see :func:`outside_tasks`)."""
    lines = []
    for d in sorted((corpus / "tasks").iterdir()):
        if d.name.split("-")[0] not in domains:
            continue
        lines += [located(json.loads(line), d)
                  for line in (d / "heldout.jsonl").read_text().splitlines()[:limit]]
    lines += outside_tasks(corpus, domains, outside)
    path = out / "heldout.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def outside_tasks(corpus: Path, domains: set[str], limit: int) -> list[str]:
    """``limit`` requests for each held-out catalogue that ask for a tool it lacks (one of
    the training catalogues', whose name shares no noun with it: synthesis's ``outside``
    kind, the held-out half of those tools and phrasings), as JSON lines: no call is right."""
    if not limit:
        return []
    from mlx_agent.synth.synthesis import SynthConfig, synthesize
    from mlx_agent.tools import load_tools

    dirs = sorted((corpus / "tasks").iterdir())
    pool = list({t.name: t for d in dirs if d.name.split("-")[0] not in domains
                 for t in load_tools(d / "tools.json")}.values())
    lines = []
    for d in dirs:
        if d.name.split("-")[0] not in domains:
            continue
        config = SynthConfig(n_train=0, n_heldout=4 * limit, outside_share=0.5,
                             seed=zlib.crc32(f"outside:{d.name}".encode()), run_tools=False)
        asked = [t for t in synthesize(load_tools(d / "tools.json"), config,
                                       outside=pool).heldout if t.kind == "outside"]
        lines += [located(t.task, d) for t in asked[:limit]]
    return lines


def located(task: dict, catalogue: Path) -> str:
    """``task`` of the catalogue in ``catalogue`` as a JSON line of one file for all of
    them: its id prefixed with the catalogue's name, its tools file an absolute path."""
    return json.dumps(dict(task, id=f"{catalogue.name}/{task['id']}",
                           tools=str((catalogue / task["tools"]).resolve())))


def run(argv: list[str]) -> None:
    print("$ mlx_agent " + " ".join(argv), flush=True)
    subprocess.run(CLI + argv, check=True, cwd=HERE.parent)


def states_what_it_got(traj_dir: Path) -> str:
    """The share of answer tasks whose final answer contains the last tool result's output
    (as written, or as JSON escapes it inside the json protocol's answer)."""
    hits = []
    for _, traj in iter_dir(traj_dir):
        if not (traj.task or "").endswith("-answer"):
            continue
        results = [s.tool_result.stdout.strip() for s in traj.steps if s.tool_result]
        last = traj.steps[-1] if traj.steps else None
        answer = last.content if last and last.role == "assistant" and last.tool_call is None \
            else ""  # a run cut off after a call has no answer
        got = results[-1] if results else ""
        escaped = json.dumps(got, ensure_ascii=False)[1:-1]  # as inside the json answer
        hits.append(bool(got) and (got in answer or escaped in answer))
    return f"{sum(hits) / len(hits):.0%} ({len(hits)})" if hits else "-"


def synth_row(path: Path) -> dict:
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        by_kind[r["task"].rsplit("-", 1)[1]].append(r)
    # the runs of the held-out tasks proper (requests for a tool the catalogue lacks apart)
    runs = [r for kind, rs in by_kind.items() if kind != "outside" for r in rs]

    def share(rs, key="reward"):
        return f"{sum(bool(r[key]) for r in rs) / len(rs):.0%} ({len(rs)})" if rs else "-"

    row = {"right calls": share(by_kind["call"] + by_kind["chain"]),
           "answered": share(runs, "answered"), "states result": share(by_kind["answer"])}
    traj_dir = path.parent / f"traj-{path.stem.removeprefix('synth-')}"
    if traj_dir.is_dir():
        row["states what it got"] = states_what_it_got(traj_dir)
    row |= {"no tool": share(by_kind["none"]), "all": share(runs)}
    return row | ({"refuses outside": share(by_kind["outside"])} if by_kind["outside"] else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, type=Path)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--out", type=Path, help="default: CORPUS/eval")
    ap.add_argument("--task-limit", type=int, default=10)
    ap.add_argument("--outside-limit", type=int, default=5,
                    help="requests for a tool it lacks, per held-out catalogue")
    ap.add_argument("--heldout-domains", default="pets,vehicles",
                    help="as general_adapter.py was given")
    ap.add_argument("--bfcl-limit", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--categories",
                    default="simple,multiple,irrelevance,live_simple,live_multiple")
    ap.add_argument("--only", choices=["base", "general"], help="run one model")
    ap.add_argument("--skip", choices=["synth", "bfcl"], help="run one of the two sets")
    ap.add_argument("--table", action="store_true", help="only print the table of --out")
    args = ap.parse_args()
    out = args.out or args.corpus / "eval"
    out.mkdir(parents=True, exist_ok=True)
    tasks = heldout_tasks(args.corpus, set(args.heldout_domains.split(",")),
                          args.task_limit, args.outside_limit, out)
    models = {"base": ["--no-adapter"], "general": ["--adapter", args.adapter]}
    for label, extra in models.items():
        if args.table or (args.only and label != args.only):
            continue
        if args.skip != "synth":
            traj_dir = out / f"traj-{label}"
            shutil.rmtree(traj_dir, ignore_errors=True)  # a run's files, not an earlier run's
            run(["eval", *extra, "--tasks", str(tasks), "--max-steps", "4", "--max-tokens",
                 "128", "--batch", str(args.batch), "--out", str(out / f"synth-{label}.jsonl"),
                 "--trajectory-dir", str(traj_dir)])
        if args.skip != "bfcl":
            run(["eval-bfcl", *extra, "--categories", args.categories, "--limit",
                 str(args.bfcl_limit), "--batch", str(args.batch),
                 "--out", str(out / f"bfcl-{label}.jsonl")])
    table = {}
    for label in models:
        row = {}
        if (out / f"synth-{label}.jsonl").is_file():
            row.update(synth_row(out / f"synth-{label}.jsonl"))
        if (out / f"bfcl-{label}.jsonl").is_file():
            for line in (out / f"bfcl-{label}.jsonl").read_text().splitlines():
                c = json.loads(line)
                row[c["category"]] = f"{c['accuracy']:.0%} ({c['n']})"
        table[label] = row
    keys = list(dict.fromkeys(k for row in table.values() for k in row))
    print("| model | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for label, row in table.items():
        print(f"| {label} | " + " | ".join(row.get(k, "-") for k in keys) + " |")


if __name__ == "__main__":
    main()

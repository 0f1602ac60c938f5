"""The general tool-calling adapter's corpus: generated catalogues -> synthetic tasks.

    .venv/bin/python scripts/general_adapter.py --out build/general [--seed 0]
        [--per-catalogue 16] [--heldout-domains pets,vehicles] [--seconds-per-iteration 9]
        [--catalogue-size 4,8] [--mixed 2] [--outside-share 0] [--optional-share 0.5]
        [--two-call-share 0.15] [--slip-share 0]
        [--contrast] [--raw-chat]
        [--tasks-per-row 1] [--file-folders 0 [--file-tasks 6] [--file-chat 0]
         [--file-slip-share 0] [--file-missing-share 0]]
        [--train ADAPTER_DIR --minutes 55 [--iters N] [--learning-rate 2e-4] [--processes 2]
         [--lora-keys self_attn.q_proj,self_attn.v_proj] [--start ADAPTER_DIR]]

1. Generates the procedural catalogues (:mod:`mlx_agent.synth.catalogues`: 500+ tools, 28
   domains) and writes each as ``catalogues/NAME/tools.json``. The catalogues of the
   ``--heldout-domains`` are kept apart, and their tools are removed from every other
   catalogue, so the adapter is measured on tools and domains it never saw. Training
   catalogues have ``--catalogue-size`` tools of their domain and up to ``--mixed`` of others
   (held-out ones keep the defaults, so their figures compare across recipes).
2. Runs task synthesis (``mlx_agent synth``'s :func:`synthesize`) on each: ``tasks/NAME/``
   gets ``train.jsonl`` and ``heldout.jsonl`` for a training catalogue, ``heldout.jsonl``
   only for a held-out one. ``--outside-share`` of the training tasks ask for a tool of
   another training catalogue (never a held-out one's) that shares no noun with this one
   (no call is right); ``--optional-share`` of a training task's optional parameters are
   given (held-out tasks keep 0.5). With ``--contrast`` each such request is also a call
   task, word for word, in the first training catalogue that has the tool it asks for (a
   row of its own; the tasks files keep what synthesis wrote).
3. Prints the corpus's size: tasks by kind, and the tokens a written row of each would have
   (the catalogue's system prompt as the json format renders it, the request, the calls as
   the grammar writes them, a short result and answer: an estimate until the rows are
   written), and the training budget that implies at ``--seconds-per-iteration`` and
   ``--batch``: iterations for one epoch and the rows that fit in ``--minutes``.

4. With ``--train DIR``: writes every training task as a conversation and its row (the
   conversation writer of ``mlx_agent specialize``: request -> call -> the tool's real
   result, run in the sandbox -> an answer), ``rows.jsonl`` in ``--out``, and trains a LoRA
   adapter on them into ``DIR`` within ``--minutes`` (mlx_agent.sft; the adapter is written
   when the time runs out). ``--tasks-per-row K`` asks K tasks of a catalogue in turn in
   one conversation, so a row pays for the catalogue's system prompt once for K replies
   (the estimate in 3 is per task, as if K were 1; ``written_rows`` and ``written_tokens``
   are the rows'). With ``--raw-chat`` a no-tool request's answer is the raw model's own
   reply to it (greedy, without tools), and each such request is also a row with
   no tools shown: the adapter learns to keep the raw model's plain chat. Without
   ``--train`` the script stops at the tasks and says what the rows will cost.
   ``--file-folders N`` adds everyday file work with the built-in tools
   (:mod:`mlx_agent.synth.file_work`): N generated folders, ``--file-tasks`` requests over
   each, written with the tools' real results, the catalogue the built-ins after up to two
   training catalogues' tools (as ``agent --tools FILE --builtin-tools`` lists them), and
   ``--file-chat`` requests of each that need no tool, answered without a call.
   ``--slip-share`` of the training tasks (``--file-slip-share`` of the file requests) open
   with a mistaken call (a value miscopied from the request, a made-up path, a folder read
   as a file) and the error it gets, then the right call: the row trains the recovery, not
   the mistake. ``--file-missing-share`` of the file requests name a file that is not
   there; the answer says so instead of making one up.
   ``--start DIR`` trains on from an adapter (its rank, layers and keys) instead of a new one.

Deterministic under ``--seed`` (training too, on one machine). Each catalogue's synthesis
draws from its own seed (``--seed`` and the catalogue's name), so catalogues do not repeat
each other's values and requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

import mlx_agent  # noqa: F401  (fast BLAS before mlx)
from mlx_agent.engine import SamplingParams
from mlx_agent.formats import make_format
from mlx_agent.grammar import call_text
from mlx_agent.models import load
from mlx_agent.fileio import write_jsonl
from mlx_agent.sft import SFTConfig, train as train_adapter
from mlx_agent.serve import ChatService
from mlx_agent.serve.service import ChatCall
from mlx_agent.synth.catalogues import Catalogue, catalogues, write
from mlx_agent.synth.conversations import Outcomes, rows as written_rows
from mlx_agent.synth.file_work import conversations as file_conversations
from mlx_agent.synth.file_work import file_tasks, make_folder
from mlx_agent.synth.synthesis import SynthConfig, synthesize
from mlx_agent.synth.synthesis import write as write_tasks
from mlx_agent.synth.tasks import SynthTask
from mlx_agent.synth.values import canonical
from mlx_agent.tools import builtin_tools, declared_tools, load_tools, resolve_sandbox
from mlx_agent.written_rows import conversation_row

REPLY_OVERHEAD = 12  # tokens of a result turn and a one-sentence answer around the result


def contrast(made: list[tuple[list, list[SynthTask]]]) -> int:
    """Pair every outside request with the same words as a call, in the first training
    catalogue that has the tool it asks for (appended to that catalogue's tasks, kind
    ``contrast``): whether to call then depends on the catalogue shown, not on the
    request's topic. Returns how many were paired."""
    home = {}
    for i, (tools, _) in enumerate(made):
        for tool in tools:
            home.setdefault(tool.name, i)
    paired = []
    for tools, tasks in made:
        for t in tasks:
            if t.kind == "outside" and t.asked and t.asked["name"] in home:
                task = {**t.task, "id": f"{t.task['id']}-contrast",
                        "check": {"tool_calls": [t.asked]}}
                paired.append((home[t.asked["name"]], dataclasses.replace(
                    t, task=task, kind="contrast", calls=(canonical(t.asked),), asked=None)))
    for i, t in paired:
        made[i][1].append(t)
    return len(paired)


def split(cats: list[Catalogue], heldout: set[str]) -> tuple[list[Catalogue], list[Catalogue]]:
    """(training, held-out) catalogues; no training catalogue keeps a held-out domain's tool."""
    held = [c for c in cats if c.name.split("-")[0] in heldout]
    banned = {t["function"]["name"] for c in held for t in c.tools
              if c.name.split("-")[0] in heldout}
    train = []
    for c in cats:
        if c in held:
            continue
        tools = tuple(t for t in c.tools if t["function"]["name"] not in banned)
        train.append(Catalogue(c.name, c.domains, tools))
    return train, held


def row_tokens(lm, fmt, tools, task: dict) -> int:
    """An estimate of the tokens of the row a task becomes (see the module's docstring)."""
    by_name = {t.name: t for t in tools}
    n = len(fmt.prompt_ids([{"role": "user", "content": task["prompt"]}], tools))
    for call in task["check"].get("tool_calls") or []:
        n += len(lm.encode(call_text("json", by_name[call["name"]], call["arguments"])))
        n += REPLY_OVERHEAD
    return n + REPLY_OVERHEAD


def raw_replies(lm, prompts: list[str], max_tokens: int = 48) -> dict[str, str]:
    """The raw model's own greedy reply to each prompt, without tools, one at a time (a
    batch's rounding could break a near-tie differently from run to run); a reply cut by
    ``max_tokens`` keeps its whole sentences, and one with none, or empty, is left out."""
    service = ChatService(lm, tools=[], kv_slots=0)
    out = {}
    for prompt in prompts:
        r = service.chat(service.prepare(ChatCall(
            [{"role": "user", "content": prompt}], tools=[], max_tokens=max_tokens,
            sampling=SamplingParams())))
        text = (r.content or "").strip()
        if r.finish_reason == "length":
            whole = re.match(r"(?s).*[.!?](?=\s|$)", text)
            text = whole.group(0) if whole else ""
        if text:
            out[prompt] = text
    return out


def file_rows(lm, fmt, train: list[Catalogue], folders: int, per_folder: int, seed: int,
              sandbox, chat: int = 0, slip_share: float = 0.0, missing_share: float = 0.0
              ) -> list[dict]:
    """Rows of everyday file work (module docstring, ``--file-folders``), and ``chat``
    requests a folder that need no tool, answered directly with the same tools shown."""
    out = []
    outcomes = Outcomes(run=False, seed=seed)
    with tempfile.TemporaryDirectory(prefix="mlx-agent-general-files-") as tmp:
        builtins = builtin_tools(tmp)
        for i in range(folders):
            rng = random.Random(f"{seed}:files:{i}")
            folder = Path(tmp) / f"folder{i}"
            folder.mkdir()
            files = make_folder(folder, rng)
            others = declared_tools(list(rng.choice(train).tools[:rng.randint(0, 2)]))
            tasks = file_tasks(files, rng, per_folder, slip_share=slip_share,
                               missing_share=missing_share)
            for task, messages in file_conversations(builtins, folder, tasks, sandbox=sandbox):
                out.append({**conversation_row(lm, fmt, others + builtins, messages,
                                               task.untrained),
                            "task": f"files-{i}", "kind": f"files-{task.kind}"})
            if chat:
                asked = synthesize(others + builtins, SynthConfig(
                    n_train=chat, n_heldout=1, seed=zlib.crc32(f"{seed}:files:{i}".encode()),
                    no_tool_share=1.0, chain_share=0.0, answer_share=0.0, run_tools=False))
                out += written_rows(lm, fmt, others + builtins,
                                    [t for t in asked.train if t.kind == "none"], outcomes,
                                    seed=seed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-catalogue", type=int, default=16, help="training tasks each")
    ap.add_argument("--heldout-per-catalogue", type=int, default=10)
    ap.add_argument("--tasks-per-row", type=int, default=1,
                    help="tasks of one catalogue asked in turn in one conversation (row)")
    ap.add_argument("--heldout-domains", default="pets,vehicles")
    ap.add_argument("--catalogue-size", default="4,8", help="MIN,MAX own-domain tools")
    ap.add_argument("--mixed", type=int, default=2, help="other domains' tools a catalogue has")
    ap.add_argument("--outside-share", type=float, default=0.0)
    ap.add_argument("--optional-share", type=float, default=0.5,
                    help="how often a training task gives an optional parameter")
    ap.add_argument("--two-call-share", type=float, default=SynthConfig.chain_share,
                    help="share of training tasks that need two calls (held-out: the default)")
    ap.add_argument("--raw-chat", action="store_true")
    ap.add_argument("--contrast", action="store_true",
                    help="each outside request also as a call in a catalogue that has its tool")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--seconds-per-iteration", type=float, default=9.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--train", metavar="ADAPTER_DIR", help="write rows and train into this")
    ap.add_argument("--iters", type=int, help="default: one epoch")
    ap.add_argument("--learning-rate", type=float, default=2e-4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--num-layers", type=int, default=16)
    ap.add_argument("--lora-keys", default=",".join(SFTConfig.keys),
                    help="the linear layers LoRA trains, comma-separated (last names match)")
    ap.add_argument("--file-folders", type=int, default=0,
                    help="generated folders of everyday file work (built-in tools)")
    ap.add_argument("--file-tasks", type=int, default=6, help="requests over each folder")
    ap.add_argument("--file-chat", type=int, default=0,
                    help="requests of each folder's catalogue that need no tool")
    ap.add_argument("--slip-share", type=float, default=0.0,
                    help="share of training tasks opened by a miscopied call and its error")
    ap.add_argument("--file-slip-share", type=float, default=0.0,
                    help="share of file requests opened by a mistaken call and its error")
    ap.add_argument("--file-missing-share", type=float, default=0.0,
                    help="share of file requests about a file that is not there")
    ap.add_argument("--start", metavar="ADAPTER_DIR", help="train on from this adapter")
    ap.add_argument("--processes", type=int, default=1,
                    help="training processes, each a share of every batch")
    args = ap.parse_args()
    out = Path(args.out)
    heldout = set(args.heldout_domains.split(","))
    try:
        low, high = (int(n) for n in args.catalogue_size.split(","))
        if not 1 <= low <= high:
            raise ValueError
    except ValueError:
        ap.error(f"--catalogue-size takes MIN,MAX with 1 <= MIN <= MAX, not "
                 f"{args.catalogue_size!r}")
    if min(args.file_folders, args.file_tasks, args.file_chat) < 0:
        ap.error("--file-folders, --file-tasks and --file-chat take counts of at least 0")
    if args.tasks_per_row < 1:
        ap.error("--tasks-per-row takes a count of at least 1")
    if not 0 <= args.optional_share <= 1:
        ap.error("--optional-share takes a share from 0 to 1")
    if not 0 <= args.two_call_share <= 0.5:
        ap.error("--two-call-share takes a share from 0 to 0.5")
    for name in ("slip_share", "file_slip_share", "file_missing_share"):
        if not 0 <= getattr(args, name) <= 0.5:
            ap.error(f"--{name.replace('_', '-')} takes a share from 0 to 0.5")
    if not 0 <= args.outside_share <= 0.5:
        ap.error("--outside-share takes a share from 0 to 0.5")
    if args.processes < 1 or args.batch % args.processes:
        ap.error(f"--processes must divide --batch ({args.batch})")
    _, held = split(catalogues(args.seed), heldout)
    train, _ = split(catalogues(args.seed, size=(low, high), mixed=args.mixed), heldout)
    # what outside requests ask for: training catalogues' tools only, never a held-out one's
    pool = declared_tools(list({t["function"]["name"]: t for c in train for t in c.tools}
                               .values()))
    lm = load(args.model)
    fmt = make_format("json", lm)
    sandbox = resolve_sandbox("auto", warn=print)
    outcomes = Outcomes(run=True, sandbox=sandbox, seed=args.seed)
    # each catalogue's rows draw their answers (and slips) from its own seed
    kinds, tokens, made, seeds = Counter(), 0, [], []
    for cat, is_held in [(c, False) for c in train] + [(c, True) for c in held]:
        path = write([cat], out / "catalogues")[0]
        tools = load_tools(path)
        config = SynthConfig(n_train=0 if is_held else args.per_catalogue,
                             n_heldout=args.heldout_per_catalogue,
                             seed=zlib.crc32(f"{args.seed}:{cat.name}".encode()),
                             outside_share=0.0 if is_held else args.outside_share,
                             optional_share=0.5 if is_held else args.optional_share,
                             chain_share=SynthConfig.chain_share if is_held
                             else args.two_call_share)
        result = synthesize(tools, config, sandbox=sandbox, outside=pool)
        write_tasks(result, path.read_bytes(), out / "tasks" / cat.name)
        for t in result.train:
            kinds[t.kind] += 1
            tokens += row_tokens(lm, fmt, tools, t.task)
        made.append((tools, result.train))
        seeds.append(config.seed)
    if args.contrast:
        kinds["contrast"] = contrast(made)
        tokens += sum(row_tokens(lm, fmt, tools, t.task) for tools, ts in made for t in ts
                      if t.kind == "contrast")
    rows = sum(kinds.values())
    iterations = -(-rows // args.batch)
    fits = int(args.minutes * 60 / args.seconds_per_iteration) * args.batch
    summary = {
        "training_catalogues": len(train), "heldout_catalogues": len(held),
        "heldout_domains": args.heldout_domains, "catalogue_size": args.catalogue_size,
        "mixed": args.mixed, "outside_share": args.outside_share, "raw_chat": args.raw_chat,
        "contrast": args.contrast, "tasks_per_row": args.tasks_per_row,
        "two_call_share": args.two_call_share, "slip_share": args.slip_share,
        "file_slip_share": args.file_slip_share, "file_missing_share": args.file_missing_share,
        "rows": rows, "by_kind": dict(kinds),
        "tokens": tokens, "mean_tokens_per_row": round(tokens / max(rows, 1)),
        "iterations_per_epoch": iterations,
        "minutes_per_epoch": round(iterations * args.seconds_per_iteration / 60, 1),
        f"rows_in_{args.minutes:g}_minutes": fits,
    }
    if args.train:
        chat = sorted({t.task["prompt"] for _, ts in made for t in ts if t.kind == "none"})
        replies = raw_replies(lm, chat) if args.raw_chat else {}
        training_rows = []
        for (tools, tasks), cat_seed in zip(made, seeds):
            training_rows += written_rows(lm, fmt, tools, tasks, outcomes, seed=cat_seed,
                                          replies=replies, per_row=args.tasks_per_row,
                                          slip_share=args.slip_share)
        plain = make_format("plain", lm)  # the same chat with no tools, as chat shows it
        for prompt, reply in replies.items():
            row = conversation_row(lm, plain, [], [{"role": "user", "content": prompt},
                                                   {"role": "assistant", "content": reply}])
            training_rows.append({**row, "task": "chat", "kind": "chat"})
        files = file_rows(lm, fmt, train, args.file_folders, args.file_tasks, args.seed,
                          sandbox, chat=args.file_chat, slip_share=args.file_slip_share,
                          missing_share=args.file_missing_share)
        training_rows += files
        summary["file_rows"] = len(files)
        write_jsonl(out / "rows.jsonl", training_rows)
        summary["chat_rows"] = len(replies)
        summary["written_rows"] = len(training_rows)
        summary["written_tokens"] = sum(len(r["input_ids"]) for r in training_rows)
        summary["tool_results"] = dict(outcomes.counts)
        print(json.dumps(summary, indent=1), flush=True)
        config = SFTConfig(iters=args.iters or -(-len(training_rows) // args.batch),
                           batch_size=args.batch,
                           learning_rate=args.learning_rate, rank=args.rank,
                           num_layers=args.num_layers, keys=tuple(args.lora_keys.split(",")),
                           val_fraction=0.0, seed=args.seed,
                           minutes=args.minutes, processes=args.processes,
                           init_adapter=args.start)
        started = time.perf_counter()
        stats = train_adapter(load(args.model), training_rows, args.train, config)
        summary["training"] = {**stats, "minutes": round((time.perf_counter() - started) / 60, 1),
                               "learning_rate": args.learning_rate, "rank": args.rank,
                               "num_layers": args.num_layers, "lora_keys": args.lora_keys,
                               "batch": args.batch, "start": args.start}
    (out / "corpus.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

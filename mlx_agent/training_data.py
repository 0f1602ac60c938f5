"""``traces-to-data``: trajectories into training rows, with no re-tokenization.

- **sft**: one row per trajectory: the whole conversation as ``messages`` (tool calls and
  tool results included), ``input_ids`` (the token sequence the model saw, replayed from the
  trajectory) and ``loss_mask`` (1 where the model sampled the token), plus ``source_atraj``,
  ``task`` and ``reward``. ``mlx_agent sft`` reads these rows as they are.
- **dpo**: for trajectories of the same task and prompt, every pair with different rewards:
  ``prompt_ids`` (up to the first sampled token), ``chosen_ids`` / ``rejected_ids``
  (the rest of the higher- and lower-reward rollout), and their rewards.

Filters, each counted: trajectories whose ids are not what the model was fed (the original
``posttrainllm``'s: :attr:`~mlx_agent.trajectory.Trajectory.token_exact`), those below
``min_reward`` (or without a reward when one is required), exact duplicates (the same token
sequence), and, for sft, near-duplicates of the prompt (MinHash over word 3-grams of the user
messages, via ``datasketch``); dpo keeps every rollout of a prompt, since its pairs come from
them.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .fileio import write_jsonl
from .trajectory import Trajectory, TrajectoryError, read

NEAR_DUP_THRESHOLD = 0.9
_WORD = re.compile(r"\w+")


@dataclass
class Counts:
    read: int = 0
    unreadable: int = 0
    not_token_exact: int = 0
    low_reward: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    kept: int = 0
    rows: int = 0
    extra: dict = field(default_factory=dict)
    unreadable_why: list[str] = field(default_factory=list)  # "path: why", one per file

    def lines(self) -> list[str]:
        return [f"{k.replace('_', ' ')}: {v}" for k, v in vars(self).items()
                if k not in ("extra", "unreadable_why")]


def reward_of(traj: Trajectory) -> float | None:
    """The trajectory's reward; None without one, or for one that is not a finite number
    (a "nan" passed every --min-reward and was written as JSON's invalid NaN)."""
    reward = None
    if "reward" in traj.summary:
        with contextlib.suppress(ValueError):
            reward = float(traj.summary["reward"])
    else:
        rewards = [s.reward for s in traj.steps if s.reward is not None]
        reward = rewards[-1] if rewards else None
    return reward if reward is not None and math.isfinite(reward) else None


def messages(traj: Trajectory) -> list[dict]:
    out = []
    for step in traj.steps:
        msg = {"role": step.role, "content": step.content}
        if step.tool_call is not None:
            msg["tool_calls"] = [{"type": "function", "function": {
                "name": step.tool_call.name, "arguments": step.tool_call.arguments_json}}]
        if step.tool_result is not None:
            msg["name"] = step.tool_result.name
        out.append(msg)
    return out


def prompt_text(traj: Trajectory) -> str:
    return "\n".join(s.content for s in traj.steps if s.role == "user")


def _shingles(text: str) -> set[bytes]:
    words = _WORD.findall(text.lower())
    if len(words) < 3:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + 3]).encode() for i in range(len(words) - 2)}


def load(directory: str | os.PathLike, counts: Counts, min_reward: float | None,
         on_file: Callable[[Path], None] = lambda p: None) -> Iterator[tuple[Path, Trajectory]]:
    """Readable trajectories that pass the reward filter, read one at a time as they are
    asked for; ``on_file`` after each file."""
    for path in sorted(Path(directory).glob("*.atraj")):
        traj = _kept(path, counts, min_reward)
        if traj is not None:
            yield path, traj
        on_file(path)


def _kept(path: Path, counts: Counts, min_reward: float | None) -> Trajectory | None:
    counts.read += 1
    try:
        traj = read(path)
    except TrajectoryError as e:
        counts.unreadable += 1
        counts.unreadable_why.append(f"{path}: {e}")
        return None
    if not traj.token_exact:  # rows from it would teach ids the model never reads
        counts.not_token_exact += 1
        return None
    r = reward_of(traj)
    if min_reward is not None and (r is None or r < min_reward):
        counts.low_reward += 1
        return None
    return traj


# a kept trajectory: its file, itself, and replay()'s ids and mask
Kept = tuple[Path, Trajectory, list[int], list[int]]


def dedupe(items: Iterable[tuple[Path, Trajectory]], counts: Counts,
           near: bool = True) -> Iterator[Kept]:
    """Drop exact duplicates, and (``near``) trajectories whose prompt is a near-duplicate,
    as ``items`` come (what is kept of those seen is a digest of their ids and a MinHash);
    each kept one comes with its replay, computed once."""
    from datasketch import MinHash, MinHashLSH

    seen: set[bytes] = set()
    lsh = MinHashLSH(threshold=NEAR_DUP_THRESHOLD, num_perm=128)
    for i, (path, traj) in enumerate(items):
        ids, mask = traj.replay()
        digest = hashlib.sha256(array.array("q", ids).tobytes()).digest()
        if digest in seen:
            counts.exact_duplicates += 1
            continue
        seen.add(digest)
        if near:
            mh = MinHash(num_perm=128)
            mh.update_batch(list(_shingles(prompt_text(traj))))
            if lsh.query(mh):
                counts.near_duplicates += 1
                continue
            lsh.insert(str(i), mh)
        counts.kept += 1
        yield path, traj, ids, mask


def sft_rows(items: Iterable[Kept]) -> Iterator[dict]:
    for path, traj, ids, mask in items:
        if not any(mask[1:]):  # the first token is never a target: nothing to train on
            continue
        yield {"messages": messages(traj), "input_ids": ids, "loss_mask": mask,
               "source_atraj": path.name, "task": traj.task, "reward": reward_of(traj)}


def dpo_rows(items: Iterable[Kept]) -> list[dict]:
    groups: dict[tuple, list] = {}
    for path, traj, ids, mask in items:
        r = reward_of(traj)
        if r is None:
            continue
        if 1 not in mask:
            continue
        cut = mask.index(1)
        groups.setdefault((traj.task, prompt_text(traj)), []).append((r, path, ids, cut))
    rows = []
    for (task, _), runs in groups.items():
        runs.sort(key=lambda x: -x[0])
        for i, (r_hi, p_hi, ids_hi, cut_hi) in enumerate(runs):
            for r_lo, p_lo, ids_lo, cut_lo in runs[i + 1 :]:
                if r_hi <= r_lo or ids_hi[:cut_hi] != ids_lo[:cut_lo]:
                    continue  # equal rewards, or prompts that differ in their ids
                rows.append({"task": task, "prompt_ids": ids_hi[:cut_hi],
                             "chosen_ids": ids_hi[cut_hi:], "rejected_ids": ids_lo[cut_lo:],
                             "chosen_reward": r_hi, "rejected_reward": r_lo,
                             "chosen_atraj": p_hi.name, "rejected_atraj": p_lo.name})
    return rows


def convert(directory, out: str | os.PathLike | None, *, mode: str = "sft",
            min_reward: float | None = None, dry_run: bool = False,
            on_file: Callable[[Path], None] = lambda p: None) -> Counts:
    """Write ``mode`` rows from the ``.atraj`` files in ``directory`` to ``out`` (atomically;
    an earlier file there is kept when no row comes) and count what each filter dropped.
    sft reads, converts and writes one trajectory at a time; dpo holds the token ids of the
    rollouts it pairs."""
    if mode not in ("sft", "dpo"):
        raise ValueError(f"unknown mode {mode!r}; choose sft or dpo")
    if not Path(directory).is_dir():
        raise ValueError(f"{directory} is not a directory of .atraj files")
    if not any(Path(directory).glob("*.atraj")):
        raise ValueError(f"{directory} holds no .atraj files; give the --trajectory-dir of "
                         "agent or eval runs")
    counts = Counts()
    # DPO pairs rollouts of one prompt, so only SFT drops near-duplicate prompts
    items = dedupe(load(directory, counts, min_reward, on_file), counts, near=mode == "sft")
    rows = sft_rows(items) if mode == "sft" else iter(dpo_rows(items))

    def counted() -> Iterator[dict]:
        for row in rows:
            counts.rows += 1
            yield row
        if not counts.rows and not dry_run and out is not None:  # ``out`` is left as it was
            first = f"; {counts.unreadable_why[0]}" if counts.unreadable_why else ""
            raise ValueError(f"no {mode} rows from the {counts.read} trajectories ("
                             + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in
                                         vars(counts).items() if isinstance(v, int) and v)
                             + f"){first}; nothing written")

    if dry_run or out is None:
        for _ in counted():
            pass
    else:
        write_jsonl(out, counted())
    return counts

"""``eval`` and ``eval-bfcl`` over a Ray cluster (``--ray``), through :mod:`mlx_agent.fanout`.

Each worker loads the model once, with one engine (so the shared system prompt is prefilled
once per worker) and takes runs: an ``eval`` run is one (task, seed), an ``eval-bfcl`` run is
one question. With ``batch`` > 1 a worker takes that many runs at once and decodes them
together (:mod:`mlx_agent.batch_runner`: an engine a run, one model thread, shared
prefixes), as ``--batch`` does in one process. A worker records a run's trajectory in a
directory of its own and sends the file's bytes back; the driver writes it, atomically, into
``--trajectory-dir`` under the same name, so the directory looks as a local run leaves it.
Results come back in task order, and the checks are the local ones, so greedy runs give the
same rewards, calls and trajectories as a local run (timings and trajectory ids apart).

Files: by default every node needs the model (a name installed, or a path) and the tasks
file with its tools and fixtures at the same paths as the driver. A run whose files live
only on the driver (``specialize``'s temporary tasks and adapters) ships them instead:
:func:`pack` makes a directory's files one gzipped tar, which a worker unpacks (refusing
links and paths that leave it) into a directory of its own, kept while the worker lives.
Not promised: shipping the model itself, or large fixtures cheaply (they travel in every
worker's arguments).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import queue
import shutil
import socket
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .bfcl import CategoryScore, answer_question, bfcl, category_questions, score
from .evaluate import RunResult, Summary, Task, TaskFile, run_one
from .batch_runner import batch_engines
from .fanout import Failed, FanoutError, Pool, run_tasks
from .fileio import write_bytes
from .models import load
from .serve import ChatService
from .tools import SandboxUnavailable, resolve_sandbox


def pack(directory: str | Path, names: Sequence[str] | None = None) -> bytes:
    """``directory``'s files (or only ``names`` in it), as one gzipped tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names if names is not None else sorted(p.name for p in
                                                           Path(directory).iterdir()):
            tar.add(Path(directory) / name, arcname=name)
    return buf.getvalue()


def unpack(data: bytes) -> Path:
    """:func:`pack`'s bytes, unpacked into a new directory removed when the process ends;
    members that are links or would land outside it are refused."""
    out = Path(tempfile.mkdtemp(prefix="mlx-agent-shipped-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(out, filter="data")
    return out


def _engines(lm, batch: int) -> list:
    """A worker's engines for runs at once: one plain engine, or ``batch`` batched ones."""
    return batch_engines(lm, batch) if batch > 1 else [lm.engine()]


class _Engines:
    """:func:`_engines`, each taken by one run at a time."""

    def __init__(self, lm, batch: int):
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for engine in _engines(lm, batch):
            self._free.put(engine)

    @contextlib.contextmanager
    def take(self):
        item = self._free.get()
        try:
            yield item
        finally:
            self._free.put(item)


@dataclass(frozen=True)
class ModelSpec:
    """What a worker loads: ``load``'s arguments; ``adapter_files`` (:func:`pack`'s bytes of
    an adapter directory) replace ``adapter`` for an adapter only the driver has."""

    spec: str | None = None
    adapter: str | None = None
    weights: str | None = None
    context_length: int | None = None
    adapter_files: bytes | None = None

    def load(self):
        adapter = str(unpack(self.adapter_files)) if self.adapter_files else self.adapter
        return load(self.spec, adapter=adapter, weights=self.weights,
                    context_length=self.context_length)


@dataclass(frozen=True)
class EvalWorker:
    """The runner factory for ``eval`` runs (pickled to every worker)."""

    model: ModelSpec
    base: str  # the tasks file's directory: tools and fixtures are relative to it
    protocol: str
    overrides: dict  # AgentConfig fields, without the sandbox
    sandbox: str = "auto"
    allow_network: bool = False
    trajectories: bool = False
    files: bytes | None = None  # base's files, packed: shipped to workers instead of a path
    batch: int = 1  # runs at once on a worker, decoded together

    def __call__(self) -> Callable[[tuple[Task, int]], tuple]:
        try:
            box = resolve_sandbox(self.sandbox, network=self.allow_network)
        except SandboxUnavailable as e:
            raise FanoutError(f"on {socket.gethostname()}: {e}") from None
        lm = self.model.load()
        base = unpack(self.files) if self.files is not None else Path(self.base)
        return _EvalRunner(self, base, lm, _Engines(lm, self.batch),
                           {**self.overrides, "sandbox": box})


class _EvalRunner:
    def __init__(self, spec: EvalWorker, base: Path, lm, engines: _Engines, overrides: dict):
        self.spec, self.base, self.lm, self.engines = spec, base, lm, engines
        self.overrides = overrides

    def __call__(self, job: tuple[Task, int]) -> tuple[RunResult, str | None, bytes | None]:
        """One run; its result, and its trajectory's file name and bytes."""
        task, seed = job
        with tempfile.TemporaryDirectory(prefix="mlx-agent-ray-") as tmp, \
                self.engines.take() as engine:
            result = run_one(self.lm, engine, task, seed, self.base,
                             self.spec.protocol, dict(self.overrides),
                             tmp if self.spec.trajectories else None, None)
            if result.trajectory is None:
                return result, None, None
            path = Path(result.trajectory)
            return dataclasses.replace(result, trajectory=None), path.name, path.read_bytes()


def run_eval(worker: EvalWorker, tasks_file: str | Path | TaskFile, *, seeds: int = 1,
             trajectory_dir: str | Path | None = None, address: str = "auto",
             workers: int | None = None,
             on_run: Callable[[RunResult, str], None] = lambda r, w: None) -> Summary:
    """``evaluate.run`` over the cluster: every task ``seeds`` times, in the same order.
    ``on_run(result, worker)`` sees each result in order, once its trajectory is written."""
    jobs = [(task, seed) for task in TaskFile.of(tasks_file).tasks for seed in range(seeds)]
    if trajectory_dir is not None:
        Path(trajectory_dir).mkdir(parents=True, exist_ok=True)
    summary = Summary()

    def take(i: int, value, where: str) -> None:
        if isinstance(value, Failed):
            task, seed = jobs[i]
            result = RunResult(task=task.id, seed=seed, reward=0.0, calls=0, valid_calls=0,
                               turns=0, rendered=0, reused=0, seconds=0.0, answer=None,
                               error=value.reason)
        else:
            result, name, data = value
            if data is not None and trajectory_dir is not None:
                path = Path(trajectory_dir) / name
                write_bytes(path, data)
                result = dataclasses.replace(result, trajectory=str(path))
        summary.runs.append(result)
        on_run(result, where)

    run_tasks(worker, jobs, address=address, workers=workers, slots=worker.batch,
              on_result=take)
    return summary


@dataclass(frozen=True)
class BfclWorker:
    """The runner factory for ``eval-bfcl`` questions (pickled to every worker)."""

    model: ModelSpec
    tool_mode: str
    protocol: str
    max_tokens: int
    batch: int = 1  # questions at once on a worker, decoded together
    stated_arguments: bool = True  # see mlx_agent.stated_arguments

    def __call__(self) -> Callable[[dict], tuple]:
        lm = self.model.load()  # one service; its lanes take the questions at once
        service = ChatService(lm, tool_mode=self.tool_mode, protocol=self.protocol,
                              kv_slots=0, engines=_engines(lm, self.batch),
                              stated_arguments=self.stated_arguments)
        types = bfcl().types
        return lambda q: answer_question(service, q, types, self.max_tokens)


def bfcl_category(pool: Pool, tool_mode: str, category: str, *, limit: int | None = None,
                  on_item: Callable[[dict], None] = lambda item: None,
                  on_answer: Callable[[str, str], None] = lambda qid, w: None) -> CategoryScore:
    """:func:`mlx_agent.bfcl.run_category` on a pool of :class:`BfclWorker`: each question
    is put by a worker (``on_answer(question id, worker)`` as they come back), then all
    are scored here, in order. A question whose workers all died counts as one that could
    not be put to the model."""
    questions = category_questions(category, limit)
    start = time.perf_counter()
    answers = pool.run(questions, on_result=lambda i, a, w: on_answer(questions[i]["id"], w))
    answers = [([], 0, a.reason, 0.0) if isinstance(a, Failed) else a for a in answers]
    return score(category, tool_mode, questions, answers, start, on_item)

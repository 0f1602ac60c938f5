"""Fan tasks out over a Ray cluster: one actor per worker, results back in task order.

A :class:`Pool` starts ``workers`` actors. Each calls ``make_runner()`` once (to load a
model, its prompt cache, ...) and then ``runner(task)`` for each task the driver hands it,
one at a time, so a fast worker takes more tasks than a slow one. :meth:`Pool.run` hands
every result to ``on_result`` in task order, however the results arrive, and returns them
all; a pool serves many runs. :func:`run_tasks` is one run on a pool of its own.

Faults: a worker that dies (its process killed, its node lost) has its task re-run on another
worker, at most ``retries`` times; then the task's result is :class:`Failed`, with the
reason. A worker that dies is replaced by a new one (workers that die while starting, as
many times as there are workers). An exception raised by ``make_runner`` or the runner is
not retried: it stops the run and is raised in the driver, as in a run without Ray. Ctrl-C (or any exception) in the driver kills
the actors; the results already in are handed to ``on_result`` first (in task order, with
gaps where tasks were unfinished), each once: a Ctrl-C that arrives while a result is being
handed over waits until it is, so whatever the caller writes from them is complete.

With ``slots`` > 1 a worker takes that many tasks at once, each on a thread of its own
(a threaded actor): its runner must take concurrent calls (eval's batched runner decodes
them together). A worker that dies takes all its tasks in flight with it; each is re-run
as above.

``make_runner``, the tasks and the results are pickled: the functions and classes they use
must be importable on every node (defined at module level in an installed package). Not
promised: that workers see the driver's files (every node needs the model and the task
files at the same paths), or placement (Ray puts actors where CPUs are free).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import ray
from ray.exceptions import RayError, RayTaskError

from .errors import UserFacingError
from .signals import held_back

RETRIES = 2  # re-runs of a task whose worker died, before it is recorded as failed
_PENDING = object()


class FanoutError(UserFacingError, RuntimeError):
    """The cluster cannot be reached, or a worker failed in a way that is not the task's."""


@dataclass(frozen=True)
class Failed:
    """The result of a task that could not be finished: every worker it ran on died."""

    reason: str


def connect(address: str = "auto") -> None:
    """Join the Ray cluster at ``address`` (``host:port``, ``ray://host:port``), or with
    ``auto`` the cluster this machine is part of ($RAY_ADDRESS, ``ray start``), else a new
    local one. Does nothing when already connected."""
    if ray.is_initialized():
        return
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if target and target != "auto":
        _check_reachable(target)
    # Ray's init sets a SIGTERM handler of its own (sys.exit(15)): the caller's (the CLI's,
    # which cleans up as Ctrl-C does and exits 143) is put back
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=None if address == "auto" else address, log_to_driver=False,
                 logging_level=logging.WARNING, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        # Ray sends its token to an address given explicitly only when told to
        auth = "" if os.environ.get("RAY_AUTH_MODE") else (
            "; if the cluster uses token authentication, set RAY_AUTH_MODE=token "
            "(the token in ~/.ray/auth_token or $RAY_AUTH_TOKEN)")
        raise FanoutError(f"cannot join the Ray cluster at {target or address}: {why}{auth}") \
            from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on an address nothing listens at (Ray itself retries for minutes)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or port is None:
        raise FanoutError(f"--ray {address!r} is not an address; give HOST:PORT "
                          "(as `ray start --head` prints it) or auto")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise FanoutError(f"cannot reach a Ray cluster at {address} "
                          f"({e.strerror or e}); start one with `ray start --head`, "
                          "or give --ray auto") from None


def cluster_cpus() -> int:
    """The CPUs of the cluster joined by :func:`connect`."""
    return int(ray.cluster_resources().get("CPU", 1))


def run_tasks(make_runner: Callable[[], Callable[[Any], Any]], tasks: Sequence, *,
              address: str = "auto", workers: int | None = None, cpus_per_worker: int = 1,
              retries: int = RETRIES, slots: int = 1,
              on_result: Callable[[int, Any, str], None] = lambda i, r, w: None) -> list:
    """Run ``make_runner()(task)`` for every task over the cluster, on a :class:`Pool`
    made for these tasks alone; the results in task order (see :meth:`Pool.run`)."""
    with Pool(make_runner, address=address, workers=workers, cpus_per_worker=cpus_per_worker,
              retries=retries, slots=slots) as pool:
        return pool.run(tasks, on_result)


class Pool:
    """Workers that keep their runner across runs: ``with Pool(make_runner) as pool:``,
    then :meth:`run` as often as needed. ``workers`` defaults to one per
    ``cpus_per_worker`` CPUs of the cluster; each worker reserves that many CPUs and runs
    its thread pools with as many threads. The workers start at once (loading in parallel
    while the driver goes on); closing the pool, or an exception in :meth:`run`, ends them.
    Each worker takes ``slots`` tasks at a time.
    """

    def __init__(self, make_runner: Callable[[], Callable[[Any], Any]], *,
                 address: str = "auto", workers: int | None = None,
                 cpus_per_worker: int = 1, retries: int = RETRIES, slots: int = 1):
        connect(address)
        self.make_runner, self.cpus, self.retries = make_runner, cpus_per_worker, retries
        self.slots = slots
        self.actor_class = ray.remote(_Worker).options(num_cpus=cpus_per_worker,
                                                       max_restarts=0, max_task_retries=0,
                                                       max_concurrency=slots)
        self.size = workers or max(1, cluster_cpus() // cpus_per_worker)
        self.spares = self.size  # replacements for workers that die while starting
        self.actors: list = []
        self.starting: dict = {}  # the ref of a starting worker's where() -> the worker
        self.idle: deque = deque()
        self.names: dict = {}  # worker -> "host:pid", once started
        for _ in range(self.size):
            self.start_worker()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.starting, self.idle = [], {}, deque()

    def run(self, tasks: Sequence,
            on_result: Callable[[int, Any, str], None] = lambda i, r, w: None) -> list:
        """Every task's result, in task order (a :class:`Failed` where the task could not
        be finished). ``on_result(index, result, worker)`` is called in task order;
        ``worker`` names the worker (``host:pid``) that ran it."""
        if not self.actors:
            raise FanoutError("this pool of workers is closed")
        try:
            return _Run(self, list(tasks), on_result).run()
        except BaseException:
            self.close()
            raise

    def start_worker(self) -> None:
        actor = self.actor_class.remote(self.make_runner, self.cpus)
        self.actors.append(actor)
        self.starting[actor.where.remote()] = actor

    def remove(self, actor) -> bool:
        """Ends ``actor``; false when it was already gone (another of its tasks said so)."""
        if actor not in self.actors:
            return False
        self.actors.remove(actor)
        self.idle = deque(a for a in self.idle if a is not actor)  # its free slots
        ray.kill(actor)  # it may only be unreachable; a task must not run twice at once
        return True


class _Worker:
    """The actor: the runner built once, then one task at a time."""

    def __init__(self, make_runner, threads: int):
        os.environ.update(_thread_env(threads))  # before anything starts a thread pool
        self.error = None
        try:
            self.runner = make_runner()
        except Exception as e:  # noqa: BLE001 (raised to the driver from where())
            self.error = e

    def where(self) -> str:
        if self.error is not None:
            raise self.error
        return f"{socket.gethostname()}:{os.getpid()}"

    def run(self, task):
        return self.runner(task)


def _thread_env(threads: int) -> dict[str, str]:
    """Thread pool sizes for a worker that reserves ``threads`` CPUs (BLAS, our kernels)."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
            "MLX_AGENT_KERNEL_THREADS": n}


class _Run:
    """One run's loop: hand out tasks, collect results, replace dead workers."""

    def __init__(self, pool: Pool, tasks: list, on_result):
        self.pool, self.tasks, self.on_result = pool, tasks, on_result
        self.results: list = [_PENDING] * len(tasks)
        self.ran_on = [""] * len(tasks)
        self.attempts = Counter()
        self.queue = deque(range(len(tasks)))
        self.waiting: dict = {}  # ref -> (worker, task index)
        self.delivered = 0

    def run(self) -> list:
        try:
            while self.pool.idle and self.queue:
                self._give(self.pool.idle.popleft())
            while self._busy():
                refs = [*self.waiting, *self.pool.starting]
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.5)
                for ref in ready:
                    self._collect(ref)
                self._deliver()
        except BaseException:
            self._deliver(gaps=True)
            raise
        return self.results

    def _busy(self) -> bool:
        """Tasks in flight, or queued with a worker to take them (one starting, at least).
        A worker that cannot start (no free CPUs) is not waited for once the work is done."""
        return bool(self.waiting) or bool(self.queue and self.pool.starting)

    def _give(self, actor) -> None:
        if self.queue:
            i = self.queue.popleft()
            self.waiting[actor.run.remote(self.tasks[i])] = (actor, i)
        else:
            self.pool.idle.append(actor)

    def _collect(self, ref) -> None:
        actor, i = (self.pool.starting.pop(ref), None) if ref in self.pool.starting \
            else self.waiting.pop(ref)
        try:
            value = ray.get(ref)
        except RayTaskError as e:  # the runner raised: what a local run would raise
            raise (e.cause if isinstance(e.cause, Exception) else FanoutError(str(e))) from None
        except RayError as e:  # the worker died, or its node
            self._lost(actor, i, e)
            return
        if i is None:  # started: each of its slots takes a task
            self.pool.names[actor] = value
            for _ in range(self.pool.slots - 1):
                self._give(actor)
        else:
            self.results[i], self.ran_on[i] = value, self.pool.names[actor]
        self._give(actor)

    def _lost(self, actor, i: int | None, error: RayError) -> None:
        pool = self.pool
        first = pool.remove(actor)  # its other tasks in flight come back lost too
        why = f"worker {pool.names.get(actor, '(starting)')} died: " \
              f"{(str(error).strip().splitlines() or [type(error).__name__])[0]}"
        if i is not None:
            self.attempts[i] += 1
            if self.attempts[i] > pool.retries:
                self.results[i] = Failed(f"{why} (ran {self.attempts[i]} times)")
            else:
                self.queue.appendleft(i)
        # a death with a task in flight is bounded by that task's retries; deaths while
        # starting (a node that cannot load the model) by the spares
        if not first:
            return
        if i is not None or pool.spares:
            pool.spares -= 1 if i is None else 0
            pool.start_worker()
        elif not pool.actors:  # nobody left to take the queue
            for j in self.queue:
                self.results[j] = Failed(f"no worker left; last: {why}")
            self.queue.clear()

    def _deliver(self, gaps: bool = False) -> None:
        while self.delivered < len(self.tasks):
            i = self.delivered
            if self.results[i] is _PENDING and not gaps:
                return
            with held_back():  # a Ctrl-C or SIGTERM inside would hand this result over again
                if self.results[i] is not _PENDING:
                    self.on_result(i, self.results[i], self.ran_on[i])
                self.delivered += 1



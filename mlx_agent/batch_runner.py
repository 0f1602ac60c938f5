"""Run many single-sequence callers (agents, chat services) over one batched decoder.

Code written against :class:`~mlx_agent.engine.Engine` (the agent loop, the chat service)
runs unchanged in worker threads, each with a :class:`BatchedEngine` of its own. One model
thread, the :class:`BatchRunner`'s, does all MLX work:

- an engine's ``sync``, ``prefill``, ``restore``, ``snapshot`` and ``reset`` run there
  between decode steps (one prefill at a time; the batch waits);
- its ``generate`` joins the runner's :class:`~mlx_agent.batch.BatchDecoder` and yields the
  tokens of the batched steps. Steps go in lockstep: the next one is sampled only once every
  row's caller has asked for another token or stopped, so each caller gets exactly one draw
  per token it reads (a caller that stops early leaves its sampler and grammar untouched,
  and its cache holds exactly the tokens it read), as with the engine alone;
- a prompt prefix that another engine already prefilled (a system prompt, a tools block) is
  copied from a shared :class:`Prefixes` store instead of being prefilled again.

:func:`run_pool` hands items to the worker threads and the results back in order.

Ctrl-C reaches the pool's caller only: :meth:`BatchRunner.cancel` (``run_pool``'s
``cancel``) then ends the workers' runs at their next token or engine call.

Not promised: fairness between a long prefill and the rows waiting on it; a worker busy
outside the runner stops only when it next asks the runner for work (a caller that runs
tools also stops them: eval's workers run theirs under
:func:`mlx_agent.tools.executor.stopped_by`).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator, Sequence, TypeVar

import mlx.core as mx

from .batch import BatchDecoder, Row
from .engine import (Constraint, Engine, PrefillStats, Sampler, common_prefix, greedy_sampler,
                     keep_snapshot)
from .signals import held_back
from .thread_state import release_on_exit

T, C, R = TypeVar("T"), TypeVar("C"), TypeVar("R")


class Prefixes:
    """Snapshots of prompts that engines prefilled, for other engines to start from."""

    def __init__(self, size: int = 4, min_gain: int = 16):
        self.size, self.min_gain = size, min_gain
        self.entries: list[tuple[list[int], list[tuple[mx.array, mx.array]]]] = []

    def seed(self, engine: Engine, ids: Sequence[int]) -> None:
        """Before ``engine`` syncs to ``ids``: start it from the stored prompt that shares
        the most with ``ids`` when that beats what the engine holds by ``min_gain``."""
        own = common_prefix(engine.tokens, ids)
        best, n = None, own + self.min_gain
        for tokens, kvs in self.entries:
            c = min(common_prefix(tokens, ids), len(ids) - 1)
            if c >= n:
                best, n = kvs, c
        if best is not None:
            engine.restore(list(ids[:n]), [(k[..., :n, :], v[..., :n, :]) for k, v in best])

    def keep(self, engine: Engine, prefilled: int) -> None:
        """After a sync that prefilled ``prefilled`` tokens: keep the engine's state when
        most of it was new."""
        if prefilled < self.min_gain or prefilled < len(engine.tokens) - prefilled:
            return  # a prompt that mostly continues a stored one adds little
        keep_snapshot(engine, self.entries, self.size)


class _ModelThread:
    """The process's one model thread, started on first use and kept until the process
    ends: MLX binds arrays to the thread that made them (its streams are thread-local), and
    an array still unevaluated when its thread ends (a seeded sampler's next key, say) aborts
    the process when it is freed. One runner's loop runs on it at a time."""

    _lock = threading.Lock()
    _thread: threading.Thread | None = None
    _jobs: queue.SimpleQueue = queue.SimpleQueue()
    busy = False

    @classmethod
    def start(cls, loop: Callable[[], None]) -> threading.Thread:
        with cls._lock:
            if cls.busy:
                raise RuntimeError("another batch runner is open in this process; close it "
                                   "first")
            cls.busy = True
            if cls._thread is None:
                cls._thread = threading.Thread(target=cls._serve, name="mlx-agent-model",
                                               daemon=True)
                cls._thread.start()
        cls._jobs.put(loop)
        return cls._thread

    @classmethod
    def _serve(cls) -> None:
        while True:
            cls._jobs.get()()

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls.busy = False


class _Ticket:
    """One generate() call's place in the batch, shared by its caller and the model thread."""

    def __init__(self, row: Row):
        self.row = row
        self.wants = False  # the caller waits for a token
        self.closing = False  # the caller stopped reading
        self.tokens: list[int] = []  # handed over, not yet read
        self.left = False  # the row is back in its engine
        self.error: BaseException | None = None


class BatchRunner:
    """The model thread: engine calls and batched decode steps, see the module docstring."""

    def __init__(self, model, max_batch: int = 8, prefixes: Prefixes | None = None):
        if max_batch < 1:
            raise ValueError(f"a batch holds at least one sequence, not {max_batch}")
        self.decoder = BatchDecoder(model)
        self.max_batch = max_batch
        self.prefixes = prefixes if prefixes is not None else Prefixes()
        self.steps = 0  # batched steps run
        self.rows_stepped = 0  # tokens they produced
        self._cv = threading.Condition()
        self._calls: list[tuple[Callable, list]] = []
        self._joining: list[_Ticket] = []
        self._tickets: list[_Ticket] = []
        self._stop = False
        self._cancelled: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = _ModelThread.start(self._loop)

    def __enter__(self) -> "BatchRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._cv:
            if self._stop:
                return
            self._stop = True
            self._cv.notify_all()
        self._stopped.wait()

    def cancel(self, error: BaseException | None = None) -> None:
        """Every caller's work ends: a generate() in the batch, and every engine call from
        now on, raises ``error`` (a KeyboardInterrupt by default) in its caller's thread."""
        with self._cv:
            self._cancelled = error if error is not None else KeyboardInterrupt()
            for t in self._tickets + self._joining:
                t.error = self._cancelled
            self._cv.notify_all()

    # -- what callers use --------------------------------------------------------------------

    def on_model_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the model thread (at once when already there) and return its value."""
        if self.on_model_thread():
            return fn()
        box: list = []
        with self._cv:
            if self._cancelled is not None:
                raise self._cancelled
            if self._stop:
                raise RuntimeError("the batch runner is closed")
            self._calls.append((fn, box))
            self._cv.notify_all()
            self._cv.wait_for(lambda: box)
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def engine(self, lm, **options) -> "BatchedEngine":
        """A :class:`BatchedEngine` for ``lm`` (a LoadedModel), built on the model thread."""
        ident = lm.identity
        options.setdefault("context_length", lm.context_length)
        options.setdefault("kv_spec", (ident.kv_heads, ident.head_dim, getattr(mx, ident.kv_dtype)))
        return self.call(lambda: BatchedEngine(self, lm.model, **options))

    def tokens(self, row: Row) -> Iterator[int]:
        """Join ``row`` to the batch and yield its tokens as the steps produce them."""
        ticket = _Ticket(row)
        with self._cv:
            ticket.error = self._cancelled
            self._joining.append(ticket)
        try:
            while True:
                with self._cv:
                    if not ticket.tokens and not ticket.left and ticket.error is None:
                        ticket.wants = True
                        self._cv.notify_all()
                        self._cv.wait_for(lambda: ticket.tokens or ticket.left
                                          or ticket.error is not None)
                    if ticket.error is not None:
                        raise ticket.error
                    if not ticket.tokens:
                        return
                    token = ticket.tokens.pop(0)
                yield token
        finally:
            with self._cv:
                ticket.closing = True
                self._cv.notify_all()
                self._cv.wait_for(lambda: ticket.left)

    # -- the model thread --------------------------------------------------------------------

    def _ready(self) -> bool:
        if self._stop or self._calls:
            return True
        if any(t.closing and not t.left for t in self._tickets):
            return True
        live = [t for t in self._tickets if not t.left]
        room = self.max_batch - len(live)
        if self._joining and room > 0 and all(t.wants or t.closing for t in self._joining[:room]):
            return True
        return bool(live) and all(t.wants or t.closing for t in live)

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            _ModelThread.release()
            self._stopped.set()

    def _serve(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(self._ready)
                if self._stop:
                    mx.synchronize()  # close() returns with no work still queued
                    return
                calls, self._calls = self._calls, []
            for fn, box in calls:
                try:
                    box.append((True, fn()))
                except BaseException as e:  # handed to the caller's thread
                    box.append((False, e))
            with self._cv:
                self._cv.notify_all()
            try:
                self._step()
            except Exception as e:  # every row in the batch fails with it
                self._fail(e)

    def _step(self) -> None:
        with self._cv:
            closing = [t for t in self._tickets if t.closing and not t.left]
            room = self.max_batch - (len(self._tickets) - len(closing))
            joining = [t for t in self._joining[:max(room, 0)] if t.wants or t.closing]
            self._joining = [t for t in self._joining if t not in joining]
        self.decoder.leave([t.row for t in closing])
        for t in joining:
            if not t.closing:
                try:
                    self.decoder.join([t.row])
                except Exception as e:  # this row's own problem (a full context, say)
                    t.error = e
        with self._cv:
            for t in closing + [t for t in joining if t.closing or t.error]:
                t.left = True
            self._tickets = [t for t in self._tickets if not t.left] + \
                [t for t in joining if not t.left]
            live = [t for t in self._tickets if not t.left]
            if not live or not all(t.wants for t in live):
                self._cv.notify_all()
                return
        by_row = {id(t.row): t for t in live}
        rows = list(self.decoder.rows)
        tokens = self.decoder.step()
        self.steps += 1
        self.rows_stepped += len(tokens)
        with self._cv:
            for row, token in zip(rows, tokens):
                t = by_row[id(row)]
                t.tokens.append(token)
                t.wants = False
                if row.error is not None:  # its grammar gave up: the token is not handed on
                    t.error = row.error
                if row.finished:
                    t.left = True
            self._tickets = [t for t in self._tickets if not t.left]
            self._cv.notify_all()

    def _fail(self, error: Exception) -> None:
        with self._cv:
            for t in self._tickets + self._joining:
                t.error, t.left = error, True
            self._tickets, self._joining = [], []
            self.decoder = BatchDecoder(self.decoder.model)
            self._cv.notify_all()


class BatchedEngine(Engine):
    """An :class:`Engine` whose work runs on a :class:`BatchRunner`'s model thread and
    whose :meth:`generate` decodes in the runner's batch. Not for two threads at once."""

    def __init__(self, runner: BatchRunner, model, **options):
        self.runner = runner
        self._decoding = False  # a generate() is in the batch: the cache is there, not here
        super().__init__(model, **options)

    def call(self, fn: Callable[[], R]) -> R:
        """``fn()`` on the runner's model thread."""
        if self._decoding and not self.runner.on_model_thread():
            raise RuntimeError("this engine's generate() is still running; close it first")
        return self.runner.call(fn)

    def reset(self, keep: int = 0) -> None:
        self.call(lambda: Engine.reset(self, keep))

    def restore(self, tokens, kvs, logits=None) -> None:
        self.call(lambda: Engine.restore(self, tokens, kvs, logits))

    def snapshot(self):
        return self.call(lambda: Engine.snapshot(self))

    def prefill(self, ids: Sequence[int], stop=None) -> PrefillStats:
        return self.call(lambda: Engine.prefill(self, ids, stop))

    def logprob(self, ids: Sequence[int]) -> float:
        return self.call(lambda: Engine.logprob(self, ids))

    def sync(self, ids: Sequence[int], stop=None) -> PrefillStats:
        """As :meth:`Engine.sync`, starting from a shared prefix where one is stored."""
        def work() -> PrefillStats:
            ids_ = list(ids)
            if ids_:
                self.runner.prefixes.seed(self, ids_)
            stats = Engine.sync(self, ids_, stop)
            self.runner.prefixes.keep(self, stats.prefilled)
            return stats

        return self.call(work)

    def generate(self, sampler: Sampler | None = None, *, max_tokens: int = 256,
                 stop_ids: frozenset[int] | set[int] = frozenset(),
                 constraint: Constraint | None = None) -> Iterator[int]:
        if self.logits is None:
            raise RuntimeError("nothing to continue from: prefill or sync a prompt first")
        if self.room is not None and self.room <= 0:
            self._check_room(1)
        if max_tokens <= 0:
            return
        self._decoding = True
        try:
            yield from self.runner.tokens(Row(self, sampler or greedy_sampler, max_tokens,
                                              stop_ids, constraint))
        finally:
            self._decoding = False


def batch_engines(lm, n: int) -> list[BatchedEngine]:
    """``n`` engines for ``lm`` (a LoadedModel) on a new runner batching up to ``n``, kept
    for as long as its engines are (a server's, a worker's)."""
    runner = BatchRunner(lm.model, max_batch=n)
    return [runner.engine(lm) for _ in range(n)]


_POLL = 0.1  # s: the longest a wait for a result holds a Ctrl-C back


def run_pool(contexts: Sequence[C], items: Sequence[T], fn: Callable[[C, T], R],
             on_done: Callable[[int, R], None] = lambda i, r: None,
             cancel: Callable[[], None] | None = None) -> list[R]:
    """``fn(context, item)`` for every item, one thread per context (a context listed n times
    is used by n threads at once: it must take concurrent calls, as a chat service with n
    lanes does); ``on_done(index, result)`` runs in the calling thread as results come.
    Returns the results in the order of ``items``; the first exception is raised (after the
    threads have stopped taking items). When the calling thread is interrupted (Ctrl-C),
    ``cancel()`` (a runner's :meth:`BatchRunner.cancel`) ends the items in progress before
    the threads are joined; without it they run to their end."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for i, item in enumerate(items):
        todo.put((i, item))
    done: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def work(context) -> None:
        release_on_exit()
        while not stop.is_set():
            try:
                i, item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((i, True, fn(context, item)))
            except BaseException as e:
                stop.set()
                done.put((i, False, e))
                return

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in contexts]
    for t in threads:
        t.start()
    results: dict[int, R] = {}
    error, interrupted, current = None, False, None
    try:
        while len(results) < len(items) and error is None:
            # a Ctrl-C acts once a result taken is handed on whole (a row and its
            # trajectory, or neither): one that came just as get() returned lost the result
            with held_back():
                try:
                    current = done.get(timeout=_POLL)
                except queue.Empty:
                    continue
                i, ok, value = current
                if not ok:
                    error = value
                    break
                results[i] = value
                on_done(i, value)
    except KeyboardInterrupt:
        interrupted = True
        if cancel is not None:
            cancel()
        raise
    finally:
        stop.set()
        for t in threads:
            t.join()
        if interrupted and current is not None and current[1] and current[0] not in results:
            on_done(current[0], current[2])  # taken from the queue, not yet handed on
        while interrupted:  # items that finished all the same are done: handed on, not lost
            try:
                i, ok, value = done.get_nowait()
            except queue.Empty:
                break
            if ok:
                on_done(i, value)
    if error is not None:
        raise error
    return [results[i] for i in range(len(items))]

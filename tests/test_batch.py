"""Batched decoding gives each sequence exactly what the engine alone gives it (tiny random
models: exact ids), with its own sampler, seed, grammar and stop rule; rows join and leave
without disturbing the others; engine calls from worker threads run on the model thread."""

from __future__ import annotations

import random

import pytest

from mlx_agent.batch import BatchDecoder, Row
from mlx_agent.batch_runner import BatchedEngine, BatchRunner, run_pool
from mlx_agent.engine import Engine, SamplingParams

from .ctrl_c import CTRL_C_AT

CTX = 64


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 90) for _ in range(rng.randrange(2, 24))] for _ in range(n)]


def _params(i: int) -> SamplingParams:
    return SamplingParams() if i % 2 == 0 else SamplingParams(temperature=0.9, top_k=20, seed=i)


def test_batch_rows_equal_the_engine_alone_and_join_late(tiny_model):
    prompts = _prompts(6)
    alone = []
    for i, p in enumerate(prompts):
        e = Engine(tiny_model, context_length=CTX)
        e.sync(p)
        alone.append(list(e.generate(_params(i).sampler(), max_tokens=12 + i, stop_ids={5})))
    engines = [Engine(tiny_model, context_length=CTX) for _ in prompts]
    for e, p in zip(engines, prompts):
        e.sync(p)
    rows = [Row(e, _params(i).sampler(), 12 + i, {5}) for i, e in enumerate(engines)]
    dec = BatchDecoder(tiny_model)
    dec.join(rows[:3])
    steps = 0
    while len(dec):
        dec.step()
        steps += 1
        if steps == 4:  # three more join a running batch
            dec.join(rows[3:])
    assert [r.generated for r in rows] == alone
    for e, p, r in zip(engines, prompts, rows):
        assert e.tokens == p + r.generated  # every token handed out is in the engine's cache
    # each engine goes on alone from what the batch handed back, as if it had never left
    ref = Engine(tiny_model, context_length=CTX)
    ref.sync(engines[0].tokens)
    assert list(engines[0].generate(max_tokens=5)) == list(ref.generate(max_tokens=5))


def test_a_full_context_caps_a_row_and_a_bad_row_is_refused(tiny_model):
    e = Engine(tiny_model, context_length=CTX)
    e.sync(list(range(1, CTX - 2)))
    dec = BatchDecoder(tiny_model)
    row = Row(e, max_tokens=50)
    dec.join([row])
    while len(dec):
        dec.step()
    assert len(row.generated) == 3 and len(e.tokens) == CTX
    with pytest.raises(RuntimeError, match="nothing to continue from"):
        dec.join([Row(Engine(tiny_model, context_length=CTX))])
    fresh = Engine(tiny_model, context_length=CTX)
    fresh.sync([1, 2])
    with pytest.raises(ValueError, match="at least one token"):
        dec.join([Row(fresh, max_tokens=0)])


def test_grammar_masks_apply_per_row_in_one_batch(tiny_lm):
    from mlx_agent.grammar import schema_constraint

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    prompts = [tiny_lm.prompt_ids(t) for t in ("Give a number:", "Write JSON", "Hi")]
    alone = []
    for i, p in enumerate(prompts):
        e = tiny_lm.engine()
        e.sync(p)
        c = schema_constraint(tiny_lm, schema) if i != 1 else None
        alone.append(list(e.generate(max_tokens=16, constraint=c)))
    rows = []
    for i, p in enumerate(prompts):
        e = tiny_lm.engine()
        e.sync(p)
        rows.append(Row(e, max_tokens=16,
                        constraint=schema_constraint(tiny_lm, schema) if i != 1 else None))
    dec = BatchDecoder(tiny_lm.model)
    dec.join(rows)
    while len(dec):
        dec.step()
    assert [r.generated for r in rows] == alone
    assert tiny_lm.tokenizer.decode(rows[0].generated).startswith('{')


def test_a_rule_set_between_steps_applies_to_the_next_token(tiny_lm):
    """A greedy, unconstrained batch queues its next argmax with the forward pass; a grammar
    given to a row between steps still decides that row's next token."""
    from mlx_agent.grammar import schema_constraint

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    prompt = tiny_lm.prompt_ids("Hi")
    e = tiny_lm.engine()
    e.sync(prompt)
    alone = list(e.generate(max_tokens=1))
    alone += list(e.generate(max_tokens=8, constraint=schema_constraint(tiny_lm, schema)))
    e = tiny_lm.engine()
    e.sync(prompt)
    row = Row(e, max_tokens=9)
    dec = BatchDecoder(tiny_lm.model)
    dec.join([row])
    dec.step()
    row.constraint = schema_constraint(tiny_lm, schema)
    while len(dec):
        dec.step()
    assert row.generated == alone
    assert tiny_lm.tokenizer.decode(row.generated[1:]).startswith("{")


def _conversation(engine, prompt, params):
    """Two generations with a turn between, the second stopped early by its reader."""
    sampler = params.sampler()
    engine.sync(prompt)
    first = list(engine.generate(sampler, max_tokens=10, stop_ids={5}))
    engine.sync(engine.tokens + [7, 8, 9])
    second = []
    for token in engine.generate(sampler, max_tokens=20):
        second.append(token)
        if len(second) == 3:
            break
    return first, second, list(engine.tokens)


def test_worker_threads_over_one_runner_equal_the_engine_alone(tiny_model):
    prompts = _prompts(10, seed=1)
    alone = [_conversation(Engine(tiny_model, context_length=CTX), p, _params(i))
             for i, p in enumerate(prompts)]
    with BatchRunner(tiny_model, max_batch=4) as runner:
        engines = [runner.call(lambda: BatchedEngine(runner, tiny_model, context_length=CTX))
                   for _ in range(4)]
        done = []
        got = run_pool(engines, list(enumerate(prompts)),
                       lambda e, item: _conversation(e, item[1], _params(item[0])),
                       on_done=lambda i, r: done.append(i))
        assert runner.rows_stepped > runner.steps  # steps carried several rows at once
    assert got == alone and sorted(done) == list(range(10))


def test_a_shared_prefix_is_prefilled_once(tiny_model):
    system = list(range(10, 40))
    with BatchRunner(tiny_model, max_batch=2) as runner:
        a, b = (runner.call(lambda: BatchedEngine(runner, tiny_model, context_length=CTX))
                for _ in range(2))
        assert a.sync(system + [1, 2]).prefilled == 32
        stats = b.sync(system + [3])
        assert (stats.reused, stats.prefilled) == (30, 1)
        ref = Engine(tiny_model, context_length=CTX)
        ref.sync(system + [3])
        assert list(b.generate(max_tokens=6)) == list(ref.generate(max_tokens=6))


def test_errors_reach_the_calling_thread(tiny_model):
    with BatchRunner(tiny_model) as runner:
        e = runner.call(lambda: BatchedEngine(runner, tiny_model, context_length=8))
        with pytest.raises(Exception, match="exceed the 8-token context"):
            e.sync(list(range(1, 20)))
        with pytest.raises(RuntimeError, match="nothing to continue from"):
            next(e.generate())
        with pytest.raises(ZeroDivisionError):
            run_pool([e], [1, 2], lambda ctx, x: 1 / 0)


def test_ctrl_c_ends_the_runs_in_the_batch_and_keeps_those_done(tiny_model):
    """Ctrl-C reaches the pool's caller; its ``cancel`` (the runner's) ends the generations
    in the worker threads at their next token, where without it they ran to the end."""
    tokens: dict[int, int] = {}

    def work(engine, i):
        engine.sync([1 + i, 2, 3])
        tokens[i] = 0
        for _ in engine.generate(max_tokens=2 if i == 0 else 400):
            tokens[i] += 1
        return i

    seen = []

    def on_done(i, result):
        seen.append(i)
        if len(seen) == 1:
            raise KeyboardInterrupt  # the user's Ctrl-C, as the first run finishes

    with BatchRunner(tiny_model, max_batch=4) as runner:
        engines = [runner.call(lambda: BatchedEngine(runner, tiny_model, context_length=512))
                   for _ in range(4)]
        with pytest.raises(KeyboardInterrupt):
            run_pool(engines, list(range(6)), work, on_done=on_done, cancel=runner.cancel)
        with pytest.raises(KeyboardInterrupt):  # the runner takes no more work
            engines[0].sync([1, 2])
    assert seen == [0] and 5 not in tokens  # the last item never started
    assert all(n < 400 for i, n in tokens.items() if i), tokens  # the others were cut


def test_the_engine_draws_once_per_token_it_hands_out(tiny_model):
    """A generation that ends at its token limit drew one token too many (a seeded
    sampler's next generation then differed from the batch's, which draws none)."""
    calls = []

    def sampler(logprobs):
        calls.append(1)
        return logprobs.argmax(axis=-1)

    e = Engine(tiny_model, context_length=CTX)
    e.sync([1, 2, 3])
    assert len(list(e.generate(sampler, max_tokens=5))) == 5 and len(calls) == 5


def test_batched_steps_on_the_cpu_kernels_equal_the_engine_alone():
    """A quantized model on the CPU kernels: a batched step attends each row from its first
    key (the kernel's per-row start, not the padding mask's composed attention) and gives
    the ids the engine gives alone, greedy and seeded."""
    import mlx.nn as nn

    from mlx_agent.kernels import kernel_status
    from mlx_agent.models.cpu_layers import use_cpu_kernels

    from .conftest import make_tiny_llama

    if not kernel_status().available:
        pytest.skip(f"no CPU kernels here: {kernel_status().reason}")
    model = make_tiny_llama(seed=3)
    nn.quantize(model, group_size=32, bits=4)
    assert use_cpu_kernels(model) > 0
    prompts = _prompts(5, seed=2)  # different lengths: left padding in the batch
    alone = []
    for i, p in enumerate(prompts):
        e = Engine(model, context_length=CTX)
        e.sync(p)
        alone.append(list(e.generate(_params(i).sampler(), max_tokens=10)))
    engines = [Engine(model, context_length=CTX) for _ in prompts]
    for e, p in zip(engines, prompts):
        e.sync(p)
    rows = [Row(e, _params(i).sampler(), 10) for i, e in enumerate(engines)]
    dec = BatchDecoder(model)
    dec.join(rows)
    while len(dec):
        dec.step()
    assert [r.generated for r in rows] == alone


INTERRUPTED_POOL = CTRL_C_AT + """
import time
from mlx_agent.batch_runner import run_pool
handed = []
def work(ctx, x):
    time.sleep(0.01 * x)
    return x
ctrl_c_at(int(sys.argv[1]), ("get",))  # just after the at-th result was taken
try:
    run_pool([None] * 2, list(range(1, 9)), work, on_done=lambda i, r: handed.append(r))
except KeyboardInterrupt:
    pass
sys.setprofile(None)
print(" ".join(map(str, sorted(handed))))
"""


@pytest.mark.parametrize("at", range(1, 7))
def test_a_ctrl_c_as_a_result_is_taken_loses_no_result(at):
    """A Ctrl-C just as the pool took a finished run from its queue lost the run: its
    trajectory stayed with no row (eval --batch, once in CI). Each run that finished is
    handed on, in order of finishing: 1..k, with no gap."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", INTERRUPTED_POOL, str(at)], capture_output=True,
                       text=True, timeout=60)
    handed = [int(x) for x in r.stdout.split()]
    assert r.returncode == 0 and handed and handed == list(range(1, len(handed) + 1)), \
        (r.stdout, r.stderr)

"""Exactness of the engine and its three cache modes, on tiny random models."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_agent.cache import ContextFull, PinnedRotatingKVCache
from mlx_agent.engine import Engine, SamplingParams

ATOL = 2e-4


def full_logits(model, ids):
    return np.array(model(mx.array([ids]))[0])


def ids_for(model, n, seed=1):
    vocab = model.model.embed_tokens.weight.shape[0] if hasattr(model.model, "embed_tokens") \
        else model.model.token_embedding.weight.shape[0]
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
def test_chunked_prefill_and_decode_match_full_forward(tiny_model, mode):
    ids = ids_for(tiny_model, 40)
    ref = full_logits(tiny_model, ids)
    engine = Engine(tiny_model, context_length=64, cache_mode=mode, kv_window=64, prefill_step=7)
    engine.prefill(ids[:23])
    np.testing.assert_allclose(np.array(engine.logits), ref[22], atol=ATOL)
    for i in range(23, 40):
        engine.prefill([ids[i]])
        np.testing.assert_allclose(np.array(engine.logits), ref[i], atol=ATOL)
    assert engine.tokens == ids


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
def test_greedy_generation_matches_argmax_of_full_forward(tiny_model, mode):
    prompt = ids_for(tiny_model, 9, seed=3)
    engine = Engine(tiny_model, context_length=64, cache_mode=mode, kv_window=64)
    engine.prefill(prompt)
    out = list(engine.generate(max_tokens=12))
    seq = prompt + out
    ref = full_logits(tiny_model, seq)
    assert out == ref[len(prompt) - 1 : -1].argmax(-1).tolist()
    # every yielded token is in the cache, and the logits after it are kept
    assert engine.tokens == seq
    np.testing.assert_allclose(np.array(engine.logits), ref[-1], atol=ATOL)


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
def test_prefix_reuse_trims_and_refills_exactly(tiny_model, mode):
    a, b, c = ids_for(tiny_model, 20, 4), ids_for(tiny_model, 9, 5), ids_for(tiny_model, 6, 6)
    engine = Engine(tiny_model, context_length=64, cache_mode=mode, kv_window=64, prefill_step=8)
    first = engine.sync(a + b)
    assert (first.reused, first.prefilled) == (0, 29)
    second = engine.sync(a + c)
    assert (second.reused, second.prefilled) == (20, 6)
    fresh = Engine(tiny_model, context_length=64, cache_mode=mode, kv_window=64)
    fresh.prefill(a + c)
    np.testing.assert_allclose(np.array(engine.logits), np.array(fresh.logits), atol=ATOL)
    # a prompt that is a strict prefix of the cache re-feeds its last token
    third = engine.sync(a)
    assert (third.reused, third.prefilled) == (19, 1)
    np.testing.assert_allclose(np.array(engine.logits), full_logits(tiny_model, a)[-1], atol=ATOL)
    # the same prompt again costs nothing
    assert engine.sync(a).prefilled == 0


def test_preallocated_and_growing_agree_and_prealloc_never_reallocates(tiny_model):
    ids = ids_for(tiny_model, 30, 7)
    pre = Engine(tiny_model, context_length=48, cache_mode="preallocated")
    grow = Engine(tiny_model, context_length=48, cache_mode="growing")
    for e in (pre, grow):
        e.prefill(ids[:10])
    shapes = [c.keys.shape for c in pre.cache]
    assert all(s[2] == 48 for s in shapes)
    out_pre = list(pre.generate(max_tokens=10))
    out_grow = list(grow.generate(max_tokens=10))
    assert out_pre == out_grow
    np.testing.assert_allclose(np.array(pre.logits), np.array(grow.logits), atol=ATOL)
    assert [c.keys.shape for c in pre.cache] == shapes  # written in place, never regrown


def test_preallocated_cache_grows_in_steps_and_agrees_with_growing(tiny_model, monkeypatch):
    from mlx_agent import cache

    monkeypatch.setattr(cache, "PREALLOCATE_STEP", 16)
    ids = ids_for(tiny_model, 12, 3)
    pre = Engine(tiny_model, context_length=40, cache_mode="preallocated")
    grow = Engine(tiny_model, context_length=40, cache_mode="growing")
    for e in (pre, grow):
        e.prefill(ids)
    assert {c.keys.shape[2] for c in pre.cache} == {16}
    assert list(pre.generate(max_tokens=26)) == list(grow.generate(max_tokens=26))
    assert {c.keys.shape[2] for c in pre.cache} == {40}  # 16, 32, then capped at the context
    np.testing.assert_allclose(np.array(pre.logits), np.array(grow.logits), atol=ATOL)
    with pytest.raises(ContextFull):
        pre.prefill(ids_for(tiny_model, 3))


def test_preallocated_cache_refuses_overflow(tiny_model):
    engine = Engine(tiny_model, context_length=16, cache_mode="preallocated")
    engine.prefill(ids_for(tiny_model, 10))
    with pytest.raises(ContextFull, match="16-token context"):
        engine.prefill(ids_for(tiny_model, 7))
    assert len(engine.tokens) == 10  # nothing half-fed
    out = list(engine.generate(max_tokens=100))
    assert len(out) == 6 and len(engine.tokens) == 16  # stops at the end of the context


def test_rotating_window_pins_and_stays_bounded(tiny_model):
    window, keep = 16, 5
    ids = ids_for(tiny_model, 60, 8)
    steps = Engine(tiny_model, context_length=64, cache_mode="rotating", kv_window=window)
    steps.reset(keep=keep)
    chunks = Engine(tiny_model, context_length=64, cache_mode="rotating", kv_window=window,
                    prefill_step=6)
    chunks.reset(keep=keep)
    grow = Engine(tiny_model, context_length=64, cache_mode="growing")
    grow.prefill(ids[:keep])
    steps.prefill(ids[:keep])
    for t in ids[keep:]:
        steps.prefill([t])
        assert all(c.keys.shape[2] <= window for c in steps.cache)
    for i in range(0, 60, 11):
        chunks.prefill(ids[i : i + 11])
    assert all(isinstance(c, PinnedRotatingKVCache) for c in steps.cache)
    for c, g in zip(steps.cache, grow.cache):
        k, _ = c.keys, c.values
        np.testing.assert_allclose(np.array(k[..., :keep, :]), np.array(g.keys[..., :keep, :]),
                                   atol=ATOL)
    # one-token steps and multi-token chunks see the same tokens after rotation
    np.testing.assert_allclose(np.array(steps.logits), np.array(chunks.logits), atol=1e-3)
    # bounded memory: the conversation is 60 tokens, the cache holds the window
    assert max(c.keys.shape[2] for c in steps.cache) == window
    # and it can go on past the context length
    steps.prefill(ids_for(tiny_model, 20, 9))
    assert len(steps.tokens) == 80


def test_rotating_matches_growing_before_the_window_fills(tiny_model):
    ids = ids_for(tiny_model, 20, 10)
    rot = Engine(tiny_model, context_length=64, cache_mode="rotating", kv_window=32)
    grow = Engine(tiny_model, context_length=64, cache_mode="growing")
    for e in (rot, grow):
        e.prefill(ids)
    assert list(rot.generate(max_tokens=8)) == list(grow.generate(max_tokens=8))


def test_same_seed_same_tokens(tiny_model):
    prompt = ids_for(tiny_model, 5, 11)

    def run(seed):
        e = Engine(tiny_model, context_length=64)
        e.prefill(prompt)
        return list(e.generate(SamplingParams(temperature=1.0, seed=seed).sampler(),
                               max_tokens=20))

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_sampling_params_reject_nonsense():
    with pytest.raises(ValueError, match="top-p"):
        SamplingParams(top_p=0)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            SamplingParams(temperature=bad)
    with pytest.raises(ValueError, match="context length"):
        Engine(None, context_length=0)


@pytest.mark.parametrize("mode", ["preallocated", "growing", "rotating"])
@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_an_interrupted_step_leaves_the_cache_consistent(tiny_model, mode, where):
    """Ctrl-C may land after some layers were fed: the engine repairs itself."""
    ids = ids_for(tiny_model, 20, 12)
    engine = Engine(tiny_model, context_length=64, cache_mode=mode, kv_window=64, prefill_step=6)
    engine.prefill(ids[:10])
    original = engine._forward

    def interrupted(x, want_logits):  # one Ctrl-C, then the engine runs normally
        original(x, want_logits)
        engine.cache[0].trim(1)  # as if the interrupt came before the last layers ran
        engine._forward = original
        raise KeyboardInterrupt

    engine._forward = interrupted
    with pytest.raises(KeyboardInterrupt):
        if where == "prefill":
            engine.prefill(ids[10:])
        else:
            next(engine.generate(max_tokens=5))
    assert all(c.offset == len(engine.tokens) for c in engine.cache)
    assert engine.tokens == ids[:10]
    np.testing.assert_allclose(np.array(engine.logits), full_logits(tiny_model, ids[:10])[-1],
                               atol=ATOL)
    engine.prefill(ids[10:])
    np.testing.assert_allclose(np.array(engine.logits), full_logits(tiny_model, ids)[-1], atol=ATOL)


def test_a_top_k_past_the_vocabulary_keeps_every_token_and_breaks_nothing():
    # mlx-lm's top-k raised here, inside a compiled function, and left MLX's global random
    # state unusable: every later unseeded draw failed (a server's, until restarted)
    logprobs = mx.log(mx.softmax(mx.array([[0.0, 1.0, 2.0, 3.0]]), axis=-1))
    for k in (4, 5, 10**6):
        draws = {SamplingParams(temperature=1.0, top_k=k, seed=s).sampler()(logprobs).item()
                 for s in range(40)}
        assert draws == {0, 1, 2, 3}
        assert SamplingParams(temperature=1.0, top_k=k).sampler()(logprobs).item() in range(4)
    assert SamplingParams(temperature=1.0).sampler()(logprobs).item() in range(4)


def test_any_integer_seed_is_a_seed():
    logprobs = mx.log(mx.softmax(mx.arange(8, dtype=mx.float32)[None], axis=-1))

    def draws(seed):
        sample = SamplingParams(temperature=1.0, seed=seed).sampler()
        return [sample(logprobs).item() for _ in range(6)]

    assert draws(-1) == draws(2**64 - 1) and draws(2**70) == draws(0)


@pytest.mark.parametrize("mode", ["preallocated", "growing"])
def test_a_stopped_prefill_leaves_the_engine_as_it_was(tiny_model, mode):
    from mlx_agent.engine import PrefillStopped

    ids = ids_for(tiny_model, 40, 21)
    engine = Engine(tiny_model, context_length=64, cache_mode=mode, prefill_step=8)
    engine.prefill(ids[:10])
    before = np.array(engine.logits)
    asked = []

    def stop():  # the client leaves after the second chunk
        asked.append(1)
        return len(asked) >= 2

    with pytest.raises(PrefillStopped):
        engine.sync(ids, stop=stop)
    assert engine.tokens == ids[:10] and all(c.offset == 10 for c in engine.cache)
    assert np.array_equal(np.array(engine.logits), before)
    engine.sync(ids)  # and it goes on as if nothing happened
    fresh = Engine(tiny_model, context_length=64, cache_mode=mode, prefill_step=8)
    fresh.prefill(ids)
    assert np.allclose(np.array(engine.logits), np.array(fresh.logits), atol=1e-5)


def test_a_stopped_sync_that_trimmed_keeps_no_stale_logits(tiny_model):
    from mlx_agent.engine import PrefillStopped

    a, b = ids_for(tiny_model, 12, 3), ids_for(tiny_model, 30, 4)
    b[:6] = a[:6]  # six tokens in common
    engine = Engine(tiny_model, context_length=64, prefill_step=8)
    engine.prefill(a)
    with pytest.raises(PrefillStopped):
        engine.sync(b, stop=lambda: True)  # trims to the common six, then stops
    assert engine.tokens == a[:6] and engine.logits is None
    engine.sync(a[:6])  # the logits after a[:6], not the ones left after a[:12]
    fresh = Engine(tiny_model, context_length=64, prefill_step=8)
    fresh.prefill(a[:6])
    assert np.allclose(np.array(engine.logits), np.array(fresh.logits), atol=1e-5)


def test_penalties_count_the_samplers_own_draws():
    # probabilities .5 and .3 for tokens 3 and 4: a penalty of 1 on a drawn token makes the
    # other one likelier (log .5 - 1 < log .3), and both drawn leaves 3 ahead again
    logprobs = mx.log(mx.array([[0.05, 0.05, 0.1, 0.5, 0.3]]))
    draws = SamplingParams(presence_penalty=1.0).sampler()
    assert [draws(logprobs).item() for _ in range(4)] == [3, 4, 3, 3]
    draws = SamplingParams(frequency_penalty=0.3).sampler()  # 3 leads by 0.51 a draw
    assert [draws(logprobs).item() for _ in range(6)] == [3, 3, 4, 3, 4, 3]
    draws = SamplingParams(logit_bias=((0, 5.0),)).sampler()
    assert [draws(logprobs).item() for _ in range(2)] == [0, 0]
    draws = SamplingParams(temperature=1, seed=1, logit_bias=((1, 100.0), (99, 5.0))).sampler()
    assert [draws(logprobs).item() for _ in range(3)] == [1, 1, 1]  # an id past the row: none
    masked = mx.array([[-mx.inf, -mx.inf, 0.0, -mx.inf, -mx.inf]])  # a grammar's mask wins
    assert SamplingParams(logit_bias=((3, 100.0),)).sampler()(masked).item() == 2
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": float("nan")},
                {"logit_bias": ((-1, 1.0),)}, {"logit_bias": ((1, 101.0),)}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)

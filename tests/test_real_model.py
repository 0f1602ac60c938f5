"""Behaviour of the real bundled model (SmolLM2-135M GGUF): few tests, short prompts."""

from __future__ import annotations

from mlx_agent.engine import SamplingParams
from mlx_agent.text import TextStream


def chat_ids(lm, text):
    return lm.encode(lm.chat.render([{"role": "user", "content": text}]))


def read(stream: TextStream) -> str:
    return "".join(segment for _, segment in stream) + stream.flush()


def test_greedy_chat_answer_names_paris(real_model):
    lm = real_model
    engine = lm.engine()
    engine.sync(chat_ids(lm, "What is the capital of France?"))
    stream = TextStream(engine, lm.tokenizer, max_tokens=40, stop_ids=lm.stop_ids)
    text = read(stream)
    assert "Paris" in text
    assert text == stream.text
    assert stream.finish_reason == "stop"
    assert stream.ids[-1] in lm.stop_ids  # the turn is closed in the cache
    assert engine.tokens[-len(stream.ids):] == stream.ids


def test_same_seed_same_tokens(real_model):
    lm = real_model
    ids = chat_ids(lm, "Tell me a story.")

    def run(seed):
        engine = lm.engine(context_length=256)
        engine.sync(ids)
        s = TextStream(engine, lm.tokenizer, SamplingParams(temperature=1.0, seed=seed).sampler(),
                       max_tokens=16)
        read(s)
        return s.ids

    first = run(42)
    assert run(42) == first
    assert run(43) != first


def test_second_turn_reuses_the_first(real_model):
    lm = real_model
    engine = lm.engine(context_length=512)
    msgs = [{"role": "user", "content": "Say hi."}]
    first = lm.encode(lm.chat.render(msgs))
    engine.sync(first)
    s = TextStream(engine, lm.tokenizer, max_tokens=12, stop_ids=lm.stop_ids)
    reply = read(s)
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again."}]
    second = lm.encode(lm.chat.render(msgs))
    stats = engine.sync(second)
    assert stats.reused >= len(first) and stats.prefilled < len(second) - stats.reused + 8


def test_tokenizer_round_trips_and_streams(real_model):
    lm = real_model
    for text in ["Hello, world!", "x = 12345 + 67", "naïve café — 東京 🚀", "<|im_start|>user\nhi"]:
        ids = lm.encode(text)
        assert lm.decode(ids) == text
        detok = lm.tokenizer.detokenizer
        detok.reset()
        for i in ids:
            detok.add_token(i)
        detok.finalize()
        assert detok.text == text
    assert lm.encode("<|im_end|>") == [2]
    assert lm.encode("2024") == lm.encode("2") + lm.encode("0") + lm.encode("2") + lm.encode("4")

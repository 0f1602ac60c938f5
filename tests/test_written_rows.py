"""Rows written directly are token-exact with the agent's rollout of the same conversation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlx_agent import trajectory as tj
from mlx_agent.chat import ChatFormat
from mlx_agent.written_rows import RowError, conversation_row

from .test_agent_loop import ECHO, QWEN_LIKE, Script, agent


def with_reply_ends(lm, ids: list[int], mask: list[int]) -> tuple[list[int], list[int]]:
    """A json rollout's ids and mask as a written row has them: the grammar ended each
    reply, the row also trains the end-of-turn token after it (and after the last one,
    where the rollout stops)."""
    stop = min(lm.stop_ids)
    ends = [i for i in range(1, len(ids)) if mask[i - 1] and not mask[i]]
    assert all(ids[i] == stop for i in ends)
    return ids + [stop], [1 if i in ends else m for i, m in enumerate(mask)] + [1]


@pytest.mark.parametrize("protocol", ["json", "hermes"])
def test_a_written_row_equals_the_replayed_rollout(tiny_lm, tmp_path, protocol):
    lm = tiny_lm if protocol == "json" else replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    if protocol == "json":
        replies = ['{"tool":"echo","arguments":{"text":"hi"}}', '{"answer":"It said hi."}']
    else:
        replies = ['<tool_call>\n{"name":"echo","arguments":{"text":"hi"}}\n</tool_call><|im_end|>',
                   "It said hi.<|im_end|>"]
    rec = tj.Recorder(tmp_path, task="t")
    a, _, _ = agent(lm, Script(lm, *replies), protocol=protocol, recorder=rec)
    assert a.ask("Echo hi and tell me what it said.").answer == "It said hi."
    ids, mask = tj.read(rec.path).replay()
    row = conversation_row(lm, a.fmt, ECHO, a.conversation.messages)
    if protocol == "json":
        ids, mask = with_reply_ends(lm, ids, mask)
    assert row["input_ids"] == ids and row["loss_mask"] == mask
    assert lm.decode([t for t, m in zip(ids, mask) if m]).count("hi") == 2  # call and answer


def test_a_conversation_must_end_with_a_reply(tiny_lm):
    from mlx_agent.formats import make_format

    with pytest.raises(RowError, match="end with an assistant reply"):
        conversation_row(tiny_lm, make_format("json", tiny_lm), ECHO,
                         [{"role": "user", "content": "hi"}])


def test_hermes_calls_written_as_tool_calls_render_as_the_model_writes_them(tiny_lm):
    from mlx_agent.formats import make_format

    lm = replace(tiny_lm, chat=ChatFormat(QWEN_LIKE))
    fmt = make_format("hermes", lm)
    call = {"id": "c1", "type": "function",
            "function": {"name": "echo", "arguments": '{"text": "hi"}'}}
    structured = [{"role": "user", "content": "Echo hi."},
                  {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "name": "echo", "content": "hi"},
                  {"role": "assistant", "content": "It said hi."}]
    as_text = [*structured[:1], {"role": "assistant", "content":
               '<tool_call>\n{"name":"echo","arguments":{"text":"hi"}}\n</tool_call>'},
               *structured[2:]]
    a, b = (conversation_row(lm, fmt, ECHO, m) for m in (structured, as_text))
    assert a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"]


def test_untrained_replies_are_context_only(tiny_lm):
    """A reply named in ``untrained`` (a mistaken call) is in the ids, not in the mask; the
    last reply cannot be one."""
    from mlx_agent.formats import make_format

    fmt = make_format("json", tiny_lm)
    call = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c0", "type": "function", "function": {"name": "echo", "arguments": '{"text": "hj"}'}}]}
    messages = [{"role": "user", "content": "Echo hi."}, call,
                {"role": "tool", "name": "echo", "content": "no such text"},
                {"role": "assistant", "content": "It failed."}]
    full = conversation_row(tiny_lm, fmt, ECHO, messages)
    row = conversation_row(tiny_lm, fmt, ECHO, messages, untrained=(1,))
    assert row["input_ids"] == full["input_ids"]
    learned = tiny_lm.decode([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m])
    assert "It failed." in learned and "hj" not in learned
    assert "hj" in tiny_lm.decode([t for t, m in zip(full["input_ids"], full["loss_mask"]) if m])
    for wrong in (3, 2, 0, 9):  # the last reply, a tool message, the request, none
        with pytest.raises(RowError, match="assistant messages before the last"):
            conversation_row(tiny_lm, fmt, ECHO, messages, untrained=(wrong,))

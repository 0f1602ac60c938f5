"""Training rows from conversations written directly, not sampled: no rollout needed.

A conversation (OpenAI-shaped messages ending in an assistant reply: a request, a call, the
tool's result, an answer, ...) is rendered by the same wire format the agent uses, so the
row's ``input_ids`` are exactly what the agent would have in its KV cache had the model
written those replies itself, and ``loss_mask`` is 1 on each assistant reply and the
end-of-turn token after it. That token is sampled in hermes and plain; in json the agent's
one-call grammar ends a reply at its closing brace, but where parallel calls are allowed (the
server's default, as OpenAI's) the model must end the reply itself, so it is trained there too
(the one place a written json row's mask differs from a replayed rollout's). The row's shape
is ``traces-to-data``'s, so ``mlx_agent sft`` trains on it as it is.

Not promised: that a reply is one the model would write. Nothing here checks a call against
its tool or an answer against a result; what to write is the caller's choice.
"""

from __future__ import annotations

from typing import Collection, Sequence

from .formats import Format
from .tools import Tool


class RowError(ValueError):
    """A conversation that cannot become a row (the message says why)."""


def conversation_row(lm, fmt: Format, tools: Sequence[Tool], messages: list[dict],
                     untrained: Collection[int] = ()) -> dict:
    """``{"messages", "input_ids", "loss_mask"}`` for ``messages``, token-exact with the
    agent's view of the same conversation. The replies at the indices in ``untrained`` (a
    mistaken call the conversation then recovers from) are context only: masked out."""
    replies = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    if not replies or replies[-1] != len(messages) - 1:
        raise RowError("a written conversation must end with an assistant reply")
    if not set(untrained) <= set(replies[:-1]):
        raise RowError("untrained replies must be assistant messages before the last")
    if fmt.name != "json":  # templates: replies are kept as the text the model writes
        messages = [{"role": "assistant", "content": fmt.reply_text(m)}
                    if m["role"] == "assistant" else m for m in messages]
    # the end of the last reply (json: see the module docstring); a model without an
    # end-of-turn token (a byte-level toy) has none to learn
    end = [min(lm.stop_ids)] if lm.stop_ids else []
    last = replies[-1]
    ids = fmt.prompt_ids(messages[:last], tools) + _reply_ids(lm, fmt, messages[last]) + end
    mask = [0] * len(ids)
    for k in replies:
        start = len(fmt.prompt_ids(messages[:k], tools))
        written = _reply_ids(lm, fmt, messages[k])
        stop = start + len(written)
        if ids[start:stop] != written:
            raise RowError(f"message {k} does not render as the agent would see it")
        if stop < len(ids) and ids[stop] in lm.stop_ids:
            stop += 1
        if k not in untrained:
            mask[start:stop] = [1] * (stop - start)
    return {"messages": messages, "input_ids": ids, "loss_mask": mask}


def _reply_ids(lm, fmt: Format, message: dict) -> list[int]:
    """The ids the model writes for an assistant message: the text the format renders it
    as, tokenized as the agent renders replies it did not sample itself."""
    return lm.encode_text(fmt.reply_text(message))

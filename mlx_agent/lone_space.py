"""After a lone space, no word: the rule that keeps grammar-constrained text in words.

A tokenizer that joins a space to the word after it (`` hello``, ``▁hello``) writes a lone
space token before a word only for rare words; a model that samples one (because a grammar
shut the way it wanted, say the quotation mark after ``got:``) is off its usual path, and
what it writes next is rarely a word: after ``"Here is what I got: "`` the bundled model's
first choice is ``urns``. :func:`lone_space_rule` finds, once per tokenizer, the tokens that
end in a space (white space only) and the mask of tokens allowed after them: all but those
that start with a letter. Digits stay allowed (``" 42"`` is a space, then ``4``, ``2``, for
tokenizers that split digits off), as do punctuation and tokens that start with a space.
:class:`~mlx_agent.grammar.Constraint` applies the mask after such a token whenever the
grammar leaves some token open under it.

What it does not promise: that constrained text is tokenized the way the tokenizer would
write it (only this one pair is ruled out), or that a rare word can follow a lone space
(it is written with other tokens instead).
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=8)
def lone_space_rule(tokenizer) -> tuple[frozenset[int], np.ndarray | None]:
    """For an llguidance tokenizer: the ids of white-space tokens that end in a space, and
    the int32 bitmask of the tokens allowed after one (``None`` where the tokenizer does not
    join a space to a word, so a lone space before one is ordinary)."""
    if len(tokenizer.tokenize_bytes(b" the")) != 1:
        return frozenset(), None
    n = tokenizer.vocab_size
    texts = [tokenizer.decode_bytes([i]) for i in range(n)]
    special = {i for i in range(n) if tokenizer.is_special_token(i)}
    ends = frozenset(i for i, b in enumerate(texts)
                     if b.endswith(b" ") and not b.strip() and i not in special)
    allowed = np.full((n + 31) // 32, -1, dtype=np.int32)
    bits = allowed.view(np.uint32)
    for i, b in enumerate(texts):
        if b[:1].isalpha() and i not in special:
            bits[i >> 5] &= ~np.uint32(1 << (i & 31))
    return ends, allowed

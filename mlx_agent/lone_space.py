"""After a lone space, no word: the rule that keeps grammar-constrained text in words.

A tokenizer that joins a space to the word after it (`` hello``, ``▁hello``) writes a lone
space token before a word only for rare words; a model that samples one (because a grammar
shut the way it wanted, say the quotation mark after ``got:``) is off its usual path, and
what it writes next is rarely a word: after ``"Here is what I got: "`` the bundled model's
first choice is ``urns``. :func:`lone_space_rule` finds, once per tokenizer, the tokens that
end in a space (white space only), the mask of tokens allowed after them (all but those that
start with a letter: digits stay, as ``" 42"`` is a space, then ``4``, ``2`` for tokenizers
that split digits off, and so do punctuation and tokens that start with a space), and the
mask of tokens that start with a space. :class:`~mlx_agent.grammar.Constraint` applies the
rule after such a token where the grammar would let a space-led token come next (free text,
a JSON string): the model can still write the word with its own space (`` hello``, after
which the text holds two spaces). Where the grammar allows no space there (``"a " /[a-z]+/``
after its literal space), nothing is masked.

What it does not promise: that constrained text is tokenized the way the tokenizer would
write it (only this one pair is ruled out), or that a rare word can follow a lone space
(it is written with other tokens instead).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np


class Rule(NamedTuple):
    ends: frozenset[int]  # white-space tokens that end in a space
    allowed: np.ndarray  # int32 bitmask: the tokens that may follow one (no letter first)
    space_led: np.ndarray  # int32 bitmask: the tokens that start with a space


@functools.lru_cache(maxsize=8)
def lone_space_rule(tokenizer) -> Rule | None:
    """The :class:`Rule` for an llguidance tokenizer; ``None`` where the tokenizer does not
    join a space to a word, so a lone space before one is ordinary."""
    if len(tokenizer.tokenize_bytes(b" the")) != 1:
        return None
    n = tokenizer.vocab_size
    texts = [tokenizer.decode_bytes([i]) for i in range(n)]
    special = {i for i in range(n) if tokenizer.is_special_token(i)}
    ends = frozenset(i for i, b in enumerate(texts)
                     if b.endswith(b" ") and not b.strip() and i not in special)
    ordinary = np.array([i not in special for i in range(n)])
    letter = ordinary & np.array([b[:1].isalpha() for b in texts])
    space = ordinary & np.array([b[:1] == b" " for b in texts])
    return Rule(ends, _bitmask(~letter), _bitmask(space))


def _bitmask(flags: np.ndarray) -> np.ndarray:
    """Per-token flags as llguidance's int32 bitmask (token i: bit i % 32 of word i // 32)."""
    padded = np.zeros(-(-len(flags) // 32) * 32, dtype=bool)
    padded[:len(flags)] = flags
    return np.packbits(padded, bitorder="little").view(np.int32)

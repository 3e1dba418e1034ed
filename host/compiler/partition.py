"""How a GPT-2 model is split over the cards of the ring (intra-layer model parallelism).

Attention is split by heads, the fully-connected layers (QKV excepted: it follows the heads) and the
LM head by output columns. Counts need not divide: 25 heads on 4 cards are 7, 6, 6, 6; 3 heads on
4 cards leave one card without attention work. Column splits are made in whole groups of
`align` columns (the matrix unit's lanes) where possible. Every output element is produced by one
card with the full reduction, so the logits do not depend on the card count.
"""
from __future__ import annotations

from dataclasses import dataclass

Span = tuple[int, int]


def split(total: int, parts: int, align: int = 1) -> tuple[Span, ...]:
    """[start, stop) spans covering range(total) in `parts` nearly equal pieces of whole `align` groups,
    the larger pieces first; pieces may be empty when there are fewer groups than parts."""
    if total < 0 or parts < 1 or align < 1:
        raise ValueError(f"cannot split {total} into {parts} parts of alignment {align}")
    groups = -(-total // align)
    base, extra = divmod(groups, parts)
    spans, start = [], 0
    for index in range(parts):
        stop = min(total, start + (base + (index < extra)) * align)
        spans.append((start, stop))
        start = stop
    return tuple(spans)


@dataclass(frozen=True)
class Partition:
    """Which slice of every split dimension each card owns."""
    cards: int
    heads: tuple[Span, ...]
    """Attention heads (and with them the Q, K and V columns and the KV cache)."""
    embd: tuple[Span, ...]
    """Output columns of the attention projection and of the second MLP layer (n_embd wide)."""
    ffn: tuple[Span, ...]
    """Output columns of the first MLP layer (4 x n_embd wide)."""
    vocab: tuple[Span, ...]
    """LM-head columns (vocabulary entries) whose logits the card computes."""

    def to_dict(self) -> dict:
        return {"cards": self.cards, "heads": self.heads, "embd": self.embd, "ffn": self.ffn, "vocab": self.vocab}


def partition(n_head: int, n_embd: int, n_inner: int, vocab_size: int, cards: int, align: int) -> Partition:
    """The partition of a GPT-2 model over `cards` cards whose matrix unit has `align` lanes."""
    return Partition(cards=cards, heads=split(n_head, cards), embd=split(n_embd, cards, align),
                     ffn=split(n_inner, cards, align), vocab=split(vocab_size, cards, align))

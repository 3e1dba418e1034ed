"""How a GPT-2 model is split over the cards of the ring (intra-layer model parallelism).

Attention is split by heads, the fully-connected layers (QKV excepted: it follows the heads) and the
LM head by output columns. Counts need not divide: 25 heads on 4 cards are 7, 6, 6, 6; 3 heads on
4 cards leave one card without attention work. Column splits are made in whole groups of
`align` columns (the matrix unit's lanes) where possible; the first MLP layer's split evens out
the weight bytes per card that an uneven head split leaves (decode streams every card's weights).
Every output element is produced by one card with the full reduction, so the logits do not depend
on the card count.
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
        """JSON-ready: spans as [start, stop] lists."""
        return {"cards": self.cards, **{name: [list(span) for span in getattr(self, name)]
                                        for name in ("heads", "embd", "ffn", "vocab")}}


def balance(total: int, base: list, align: int) -> tuple[Span, ...]:
    """Spans of range(total), in whole `align` groups where possible, sized so that base[c] + size_c is as
    even as possible over the cards (sizes never negative)."""
    groups = -(-total // align)
    target = (sum(base) / align + groups) / len(base)
    sizes = [max(0, round(target - b / align)) for b in base]
    while sum(sizes) > groups:  # take a group from the most loaded card that still has one
        sizes[max((c for c in range(len(sizes)) if sizes[c]),
                  key=lambda c: (base[c] / align + sizes[c], sizes[c]))] -= 1
    while sum(sizes) < groups:
        sizes[min(range(len(sizes)), key=lambda c: base[c] / align + sizes[c])] += 1
    spans, start = [], 0
    for size in sizes:
        stop = min(total, start + size * align)
        spans.append((start, stop))
        start = stop
    return tuple(spans)


def partition(n_head: int, n_embd: int, n_inner: int, vocab_size: int, cards: int, align: int) -> Partition:
    """The partition of a GPT-2 model over `cards` cards whose matrix unit has `align` lanes. Heads are split
    as evenly as they go; the first MLP layer's columns then even out the weights each card streams per layer
    (a card with an extra head gets fewer of them)."""
    head_dim = n_embd // n_head
    heads = split(n_head, cards)
    embd = split(n_embd, cards, align)
    # Weight words per layer besides the first MLP layer: Q, K, V columns, then attention and MLP projections.
    base = [(3 * head_dim * (h1 - h0) * n_embd + (n_embd + n_inner) * (e1 - e0)) / n_embd
            for (h0, h1), (e0, e1) in zip(heads, embd)]
    return Partition(cards=cards, heads=heads, embd=embd, ffn=balance(n_inner, base, align),
                     vocab=split(vocab_size, cards, align))


def model_partition(dims, config) -> Partition:
    """The compiler's partition of a model (ModelDims `dims`) over ArchConfig `config`'s cards: column splits in
    whole mpu_lanes groups (in whole 64-word buffer rows, 1.5B's 1,600 columns would be 448/384/384/384 on 4
    cards)."""
    return partition(dims.n_head, dims.n_embd, dims.n_inner, dims.vocab_size, config.cards, config.mpu_lanes)

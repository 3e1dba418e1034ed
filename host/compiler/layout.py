"""Where everything lives on a card: the HBM memory map (with its capacity check), the activation-buffer
plan (which also fixes the most tokens one run can process, `max_rows`) and the weight-buffer slots."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ringgpt.host.compiler.errors import CapacityError
from ringgpt.host.compiler.partition import split

STAT_WORDS = 8
"""Per-row statistics slots in the activation buffer (see Stat)."""

LOGIT_CHUNK = 64
"""Logits per chunk maximum: after the LM head every card reduces its vocabulary slice to the maxima of
consecutive chunks of this many logits (VMAX, one row a chunk) and stores them beside the logits, so the host's
sampler finds the argmax and the top-k candidates in the few chunks that can hold them."""


def chunk_count(words: int) -> int:
    """Chunk maxima of a slice of `words` logits (the last chunk may be short)."""
    return -(-words // LOGIT_CHUNK)


class Stat:
    """Offsets of the per-row statistics (each row has STAT_WORDS words)."""
    MEAN, VAR, RSTD = 0, 1, 2
    ROWMAX = (3, 5)
    """Row maximum of the scores of score area 0 and 1."""
    ROWSUM = (4, 6)


def align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def region_align(config) -> int:
    """Words on whose multiples every HBM and activation-buffer region starts: a buffer row (buffer_chunk_words) and
    an HBM beat, so that a transfer between region starts writes whole buffer rows, its words unshifted."""
    return math.lcm(config.buffer_chunk_words, config.beat_words)


def embedding_row(d: int, beat: int) -> int:
    """Words from one position-embedding row to the next in HBM (wpe), and from one staged token or position row to
    the next in BIG: n_embd rounded up to the HBM beat (misaligned_transfer). Where that is not n_embd, the
    embedding's GATHER and LOAD write BIG at this stride and its VADD adds them into X at stride n_embd."""
    return align_up(d, beat)


def ln_block(d: int, align: int) -> int:
    """Words from one layer's LayerNorm parameters (ln_1 gamma, beta, ln_2 gamma, beta: 4 n_embd) to the next, in
    HBM and in the activation buffer: rounded up to `align` (region_align), so every layer's block starts on one."""
    return align_up(4 * d, align)


def weight_stride(k: int, align: int) -> int:
    """Words from one weight column (k words) to the next, in HBM and in the weight buffer: k rounded up to `align`
    (ArchConfig.weight_align: the matrix unit reads each lane's weight tile from one buffer row, hw/resolved.py's
    misaligned_weights); the words between are zero."""
    return align_up(k, align)


@dataclass(frozen=True)
class KVArea:
    """Where a head group's keys and values lie in one of the activation buffer's KV areas, as the weights of
    attention's MASKED_QK (the keys) and MATMUL (V^T), so on `align`-word boundaries (ArchConfig.weight_align,
    hw/resolved.py's misaligned_weights): the keys position-major, a head's key in a slot of `key_words` (head_dim
    rounded up to align), a position's row the group's slots; then V^T, one row of `value_row` words (max_context
    rounded up to align) per dimension of the group's heads. GPT-2's head_dim (64) and a max_context of a
    multiple of 64 need no rounding at u280."""
    head_dim: int
    max_context: int
    kv_group: int
    align: int

    @property
    def key_words(self) -> int:
        return align_up(self.head_dim, self.align)

    @property
    def value_row(self) -> int:
        return align_up(self.max_context, self.align)

    def key_row(self, heads: int) -> int:
        """Words from one position's keys of `heads` heads to the next."""
        return heads * self.key_words

    @property
    def values(self) -> int:
        """V^T's offset in the area (after max_context rows of kv_group heads' keys)."""
        return self.max_context * self.key_row(self.kv_group)

    @property
    def words(self) -> int:
        return self.values + self.kv_group * self.head_dim * self.value_row


def weight_slot_words(wbuf_words: int, slots: int, align: int) -> int:
    """Words of one of the weight buffer's `slots` slots: an equal share, rounded down to `align` so that every
    slot starts on a weight tile boundary."""
    return wbuf_words // slots // align * align


@dataclass(frozen=True)
class Region:
    name: str
    kind: str
    """'weights' (written at load, read only) or 'kv' (the KV cache, written by the programs)."""
    start: int
    words: int

    @property
    def stop(self) -> int:
        return self.start + self.words


@dataclass
class HbmMap:
    """A card's HBM, allocated bottom-up in regions that start on multiples of `align` words."""
    card: int
    capacity_words: int
    align: int
    regions: list = field(default_factory=list)
    top: int = 0

    def alloc(self, name: str, words: int, kind: str) -> int:
        start = align_up(self.top, self.align)
        self.regions.append(Region(name, kind, start, words))
        self.top = start + words
        return start

    def words_of(self, kind: str) -> int:
        return sum(r.words for r in self.regions if r.kind == kind)

    def check_capacity(self, max_context: int) -> None:
        """Raises CapacityError naming the card, what does not fit and by how many bytes."""
        capacity = self.capacity_words * 2
        weights = max((r.stop for r in self.regions if r.kind == "weights"), default=0) * 2
        if weights > capacity:
            raise CapacityError(
                f"the weights do not fit card {self.card}'s HBM: {weights:,} bytes for {capacity:,} "
                f"({weights - capacity:,} bytes over); use more cards or a smaller model")
        if self.top * 2 > capacity:
            kv = self.words_of("kv") * 2
            raise CapacityError(
                f"the KV cache for max_context={max_context} ({kv:,} bytes) does not fit card {self.card}'s HBM "
                f"beside the weights ({weights:,} bytes): {self.top * 2 - capacity:,} bytes over "
                f"{capacity:,}; lower max_context or use more cards")

    def to_list(self) -> list:
        return [{"name": r.name, "kind": r.kind, "start": r.start, "words": r.words} for r in self.regions]


@dataclass(frozen=True)
class AbufPlan:
    """Activation-buffer regions of one card (word addresses) for runs of up to max_rows tokens.

    Per-row regions (row stride in brackets): X residual stream [D], H LayerNorm output [D], T scratch and
    projection outputs [D] (sized for max(D, CardShape.staged_fc)), S statistics [STAT_WORDS], and BIG, reused
    over a layer: first the gathered attention output [D] at BIG, the local Q|K|V [3 Hl hd] at QKV and the
    score areas [max_context] at SCORES; later the gathered MLP hidden layer [n_inner] over all of it (and, where
    n_embd is not a multiple of the HBM beat, the embedding's staged token and position rows: embedding_row).
    Fixed regions: LayerNorm parameters (two layers' blocks of ln_block words, alternating), KV areas (each a head
    group's K [max_context x G hd] then V^T [G hd x max_context], their columns on weight_align boundaries:
    KVArea), the final LayerNorm output and the logits. Every region but QKV and SCORES (which no transfer from
    HBM writes) starts on region_align.
    """
    max_rows: int
    kv_group: int
    """Heads whose keys and values are read from HBM together (the last group may be smaller)."""
    kv_areas: int
    score_areas: int
    regions: dict

    def __getitem__(self, name: str) -> int:
        return self.regions[name][0]

    @property
    def words(self) -> int:
        return max(start + size for start, size in self.regions.values())

    def to_dict(self) -> dict:
        return {"max_rows": self.max_rows, "kv_group": self.kv_group, "kv_areas": self.kv_areas,
                "score_areas": self.score_areas, "regions": {k: list(v) for k, v in self.regions.items()}}


@dataclass(frozen=True)
class CardShape:
    """What one card's activation-buffer plan depends on."""
    local_heads: int
    vocab_slice: int
    staged_fc: int = 0
    """The card's first-MLP-layer columns staged in T for their all-gathers: all but its first weight piece's on
    several cards, none on one."""


def piece_spans(ncols: int, column_words: int, slot_words: int, align: int, count: int = 1) -> tuple:
    """Column spans of the fewest pieces (at least `count`) that cut `ncols` columns of `column_words` words
    into weight-buffer slots of `slot_words`: nearly equal, in whole `align` column groups where possible;
    spans past the last column are empty."""
    if column_words > slot_words:
        raise CapacityError(f"one weight column of {column_words} words (with its bias) does not fit a weight-buffer "
                            f"slot of {slot_words} words: use fewer weight-buffer slots")
    count = max(count, -(-ncols * column_words // slot_words))
    spans = split(ncols, count, align)
    while any((b - a) * column_words > slot_words for a, b in spans):
        count += 1
        spans = split(ncols, count, align if count * align <= ncols else 1)
    return spans


def gathered_spans(spans: tuple, column_words: int, slot_words: int, align: int) -> list:
    """For each card's share [start, stop) of an all-gathered slice, the column spans (from its start) of the weight
    pieces it is cut into (piece_spans): as many on every card, the most that any card needs, so that the cards'
    per-piece all-gathers meet (a card short of columns gets empty spans)."""
    count = 1
    while True:
        pieces = [piece_spans(stop - start, column_words, slot_words, align, count) for start, stop in spans]
        count = max(len(p) for p in pieces)
        if all(len(p) == count for p in pieces):
            return pieces


def card_shapes(part, n_embd: int, config, wbuf_slots: int) -> list:
    """Each card's CardShape under a partition (partition.Partition) whose weight pieces fill the weight buffer's
    `wbuf_slots` slots (weight_slot_words) in whole mpu_lanes column groups (an fc column: weight_stride(n_embd)
    words and its bias)."""
    staged = [0] * part.cards
    if part.cards > 1:
        pieces = gathered_spans(part.ffn, weight_stride(n_embd, config.weight_align) + 1,
                                weight_slot_words(config.wbuf_words, wbuf_slots, region_align(config)), config.mpu_lanes)
        staged = [(f1 - f0) - (first[1] - first[0]) for (f0, f1), (first, *_) in zip(part.ffn, pieces)]
    return [CardShape(h1 - h0, v1 - v0, fc) for (h0, h1), (v0, v1), fc in zip(part.heads, part.vocab, staged)]


def _per_row(d: int, n_inner: int, qkv_width: int, max_context: int, score_areas: int, staged_fc: int,
             beat: int) -> dict:
    row = embedding_row(d, beat)
    staged_embd = 2 * row if row != d else 0  # the embedding's token and position rows, staged
    return {"X": d, "H": d, "T": max(d, staged_fc), "S": STAT_WORDS,
            "BIG": max(n_inner, d + qkv_width + score_areas * max_context, staged_embd)}


def _fixed(d: int, card: CardShape, kv: KVArea, kv_areas: int, align: int) -> dict:
    return {"LNP": 2 * ln_block(d, align), "LNFP": 2 * d, "KV": kv_areas * kv.words,
            "LNF": d, "SF": STAT_WORDS, "LOGITS": card.vocab_slice,
            "CHUNK_MAX": chunk_count(card.vocab_slice)}


def _place(sizes: dict, top: int, align: int) -> tuple[dict, int]:
    """The regions of `sizes` ({name: words}) one after the other from word `top`, each start rounded up to
    `align`; and the first word after them."""
    regions = {}
    for name, size in sizes.items():
        top = align_up(top, align)
        regions[name] = (top, size)
        top += size
    return regions, top


def _plan_parts(config, d: int, n_inner: int, head_dim: int, card: CardShape, max_context: int, kv_group: int,
                kv_areas: int, score_areas: int) -> tuple[dict, int, dict]:
    """The fixed regions, the first word after them and the per-row regions' words a row."""
    qkv_width = 3 * card.local_heads * head_dim
    per_row = _per_row(d, n_inner, qkv_width, max_context, score_areas, card.staged_fc, config.beat_words)
    align = region_align(config)
    kv = KVArea(head_dim, max_context, kv_group, align)
    return (*_place(_fixed(d, card, kv, kv_areas, align), 0, align), per_row)


def plan_abuf(config, d: int, n_inner: int, head_dim: int, card: CardShape, max_context: int, kv_group: int,
              kv_areas: int, score_areas: int, max_rows: int | None = None) -> AbufPlan | None:
    """The plan for one card on ArchConfig `config` (every region starting on region_align, the KV areas' columns
    on weight_align: KVArea): with max_rows None, the most rows that fit (capped at max_context); None when not
    even one row fits."""
    kv_group = min(kv_group, card.local_heads)
    regions, top, per_row = _plan_parts(config, d, n_inner, head_dim, card, max_context, kv_group, kv_areas,
                                        score_areas)
    align, limit = region_align(config), config.abuf_words

    def place(rows: int) -> tuple[dict, int]:
        return _place({name: size * rows for name, size in per_row.items()}, top, align)

    if max_rows is None:
        max_rows = min(max_context, (limit - top) // sum(per_row.values()))
        while max_rows >= 1 and place(max_rows)[1] > limit:  # the padding between the regions
            max_rows -= 1
        if max_rows < 1:
            return None
    placed, top = place(max_rows)
    if top > limit:
        return None
    regions.update(placed)
    qkv_width = 3 * card.local_heads * head_dim
    regions["QKV"] = (regions["BIG"][0] + d * max_rows, qkv_width * max_rows)
    regions["SCORES"] = (regions["QKV"][0] + qkv_width * max_rows, score_areas * max_context * max_rows)
    return AbufPlan(max_rows, kv_group, kv_areas, score_areas, regions)


ROW_TARGET = 96
"""Prompt tokens per run below which the planner gives up KV-group size and double buffering for rows."""


def _candidates(max_heads: int):
    """(kv_group, kv_areas, score_areas) from the most overlap and fewest KV transfers to the least."""
    for group in range(max_heads, 0, -1):
        for kv_areas in (2, 1):
            yield group, kv_areas, 2
    yield 1, 1, 1


def choose_abuf_plans(config, d: int, n_inner: int, head_dim: int, cards: list, max_context: int,
                      kv_group: int | None = None, row_cap: int | None = None) -> list:
    """One plan per card (CardShape each) on ArchConfig `config`, all with the same max_rows: the first candidate
    (largest KV group, double-buffered KV and score areas first) that allows min(ROW_TARGET, max_context, row_cap)
    rows per run, else the one with the most rows; max_rows is at most row_cap. `kv_group` forces the group size.
    Raises CapacityError if no row fits."""
    max_heads = max(max(c.local_heads for c in cards), 1)
    row_cap = min(max_context, row_cap or max_context)
    target = min(ROW_TARGET, row_cap)
    best = None
    for group, kv_areas, score_areas in _candidates(max_heads):
        if kv_group is not None and group != min(kv_group, max_heads):
            continue
        plans = [plan_abuf(config, d, n_inner, head_dim, c, max_context, group, kv_areas, score_areas)
                 for c in cards]
        if any(p is None for p in plans):
            continue
        rows = min(p.max_rows for p in plans)
        if best is None or rows > best[0]:
            best = (rows, group, kv_areas, score_areas)
        if rows >= target:
            break
    if best is None:
        worst = max(cards, key=lambda c: (c.local_heads, c.vocab_slice))
        _, top, per_row = _plan_parts(config, d, n_inner, head_dim, worst, max_context,
                                      min(kv_group or 1, worst.local_heads), 1, 1)
        need = _place(per_row, top, region_align(config))[1]
        raise CapacityError(f"the activation buffer ({config.abuf_words:,} words) cannot hold even one token's "
                            f"activations and one head group's KV cache for max_context={max_context} ({need:,} "
                            "words): lower max_context, use more cards or a smaller KV group")
    rows, group, kv_areas, score_areas = best
    rows = min(rows, row_cap)
    return [plan_abuf(config, d, n_inner, head_dim, c, max_context, group, kv_areas, score_areas, rows)
            for c in cards]

"""Where everything lives on a card: the HBM memory map (with its capacity check), the activation-buffer
plan (which also fixes the most tokens one run can process, `max_rows`) and the weight buffer's slots and KV
areas."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ringgpt.host.compiler.errors import CapacityError
from ringgpt.host.compiler.partition import split
from ringgpt.hw.isa import weight_words
from ringgpt.hw.numerics import pack_int8

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


def stream_align(config) -> int:
    """Words on whose multiples every weight piece starts in HBM: a whole stripe of the HBM map (hbm_channels x
    hbm_interleave_words: a granule in every pseudo-channel, hw/hbm.py) and region_align. A piece's LOAD then starts
    every DMA engine at once, and the rows they complete together fall in distinct weight-buffer memories; started
    mid-stripe, the engines' rows meet in a memory and wait for each other (sim/cycle_model/grants.py: a u280
    weight stream at a beat a cycle took up to 57 % longer, 44 % at 200 MHz's 0.9). Costs at most a stripe less
    one word of HBM per piece (8 KB at u280)."""
    return math.lcm(region_align(config), config.hbm_channels * config.hbm_interleave_words)


def lm_head_align(config) -> int:
    """Columns on whose multiples the LM head's pieces start (piece_spans): whole buffer rows (buffer_chunk_words) of
    the matrix unit's lane groups (mpu_lanes), so that each piece writes its logits from a buffer row's first word.
    The layers' pieces stay in mpu_lanes groups: in whole buffer rows they are more pieces, 1-3 % more decode time on
    1 and 2 cards (docs/rtl-core.md)."""
    return math.lcm(config.buffer_chunk_words, config.mpu_lanes)


def activation_row(width: int, config) -> int:
    """Words from one row of `width` activations to the next where a unit reads them (n_embd: the residual stream X,
    the LayerNorm output H, the scratch T, the gathered attention output; n_inner: the gathered MLP hidden layer)
    and from one LayerNorm parameter vector to the next; also from one position-embedding row to the next in HBM
    (wpe): `width` rounded up to vector_align, weight_align and the HBM beat, so that every such row starts on the
    vector unit's boundaries (hw/resolved.misaligned_vector), a MATMUL with INT8 weights reads it as whole memory
    rows (misaligned_weights), and the embedding's GATHER and LOAD write X and T directly (misaligned_transfer).
    The width itself at GPT-2's sizes."""
    return align_up(width, math.lcm(config.vector_align, config.weight_align, config.beat_words))


def score_row(max_context: int, config) -> int:
    """Words from one row of a head's attention scores to the next: max_context rounded up to vector_align (the
    softmax's rows, hw/resolved.misaligned_vector)."""
    return align_up(max_context, config.vector_align)


def ln_block(d: int, config) -> int:
    """Words from one layer's LayerNorm parameters (ln_1 gamma, beta, ln_2 gamma, beta: 4 vectors of n_embd, each
    activation_row from the last) to the next, in HBM and in the activation buffer: rounded up to region_align, so
    every layer's block starts on one."""
    return align_up(4 * activation_row(d, config), region_align(config))


def weight_stride(k: int, align: int) -> int:
    """Words from one weight column (k words) to the next, in HBM and in the weight buffer: k rounded up to `align`
    (ArchConfig.weight_align: the matrix unit reads each lane's weight tile from one buffer row, hw/resolved.py's
    misaligned_weights); the words between are zero."""
    return align_up(k, align)


def column_layout(k: int, config, int8: bool, bias: bool = True) -> tuple[int, int]:
    """(stride, aux) of a MATMUL's weight columns of k weights in a piece: words from one column to the next
    (weight_stride of the column's weight_words, on weight_align: misaligned_weights), and the words each
    column adds after the columns: its bias (when `bias`), and with INT8 weights its bias (zero without one) and
    its scale, the scales' row after the biases'."""
    return weight_stride(weight_words(k, int8), config.weight_align), 2 if int8 else int(bias)


@dataclass(frozen=True)
class KVArea:
    """Where a head group's keys and values lie in one of the weight buffer's KV areas, as the weights of
    attention's MASKED_QK (the keys) and MATMUL (V^T), so in WBUF (the ISA's rule) and on `align`-word boundaries
    (ArchConfig.weight_align, hw/resolved.py's misaligned_weights): the keys position-major, a head's key in a
    slot of `key_words` (head_dim rounded up to align), a position's row the group's slots; then V^T, one row of
    `value_row` words (max_context rounded up to align) per dimension of the group's heads. GPT-2's head_dim (64)
    and a max_context of a multiple of 64 need no rounding at u280."""
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
    """Words of one of `slots` slots in `wbuf_words` words of the weight buffer: an equal share, rounded down to
    `align` so that every slot starts on a weight tile boundary."""
    return wbuf_words // slots // align * align


def kv_share(config, slots: int) -> int:
    """Weight-buffer words the KV areas may take beside `slots` weight slots: a (slots + 1)-th of WBUF, what one
    more slot would hold (u280, 2 slots: 1,485,482 words, room for 11 heads' keys and V^T at max_context 1,024)."""
    return config.wbuf_words // (slots + 1)


def group_heads(heads: int, group: int) -> int:
    """The largest head group when `heads` heads are cut into groups of at most `group` (as evenly as they go:
    build.CardBuilder.groups): what a card's KV area must hold."""
    return -(-heads // -(-heads // group)) if heads else 0


@dataclass(frozen=True)
class KVPlan:
    """The weight buffer of every card: `slots` weight slots of `slot_words` from word 0, then `areas` KV areas
    (KVArea, each a head group's keys and V^T, groups of at most `group` heads) from `start`."""
    group: int
    areas: int
    slots: int
    slot_words: int

    @property
    def start(self) -> int:
        return self.slots * self.slot_words


def choose_kv(config, head_dim: int, heads: list, max_context: int, slots: int, kv_group: int | None = None) -> KVPlan:
    """The KV areas of cards with `heads` local heads each: the first candidate, from the largest head group and two
    areas (the next group's keys and values load while this one's are read) to one head and one area, whose areas
    fit the weight buffer's KV share (kv_share) on every card; the weight slots share the rest. `kv_group` forces the
    group size. Raises CapacityError if not even one head's area fits."""
    align, share = region_align(config), kv_share(config, slots)
    max_heads = max(max(heads), 1)

    def words(group: int, areas: int) -> int:
        return max(areas * KVArea(head_dim, max_context, group_heads(h, group), align).words for h in heads)
    for group in range(max_heads, 0, -1):
        if kv_group is not None and group != min(kv_group, max_heads):
            continue
        for areas in (2, 1):
            if words(group, areas) <= share:
                return KVPlan(group, areas, slots,
                              weight_slot_words(config.wbuf_words - words(group, areas), slots, align))
    forced = kv_group is not None and kv_group > 1
    what = f"a group of {min(kv_group, max_heads)} heads'" if forced else "one head's"
    need = words(min(kv_group, max_heads) if forced else 1, 1)
    raise CapacityError(f"the weight buffer ({config.wbuf_words:,} words) cannot hold {what} keys and V^T for "
                        f"max_context={max_context} ({need:,} words) in its KV share ({share:,} words beside "
                        f"{slots} weight slots): lower max_context{', a smaller kv_group' if forced else ''}, use "
                        "more cards or fewer weight-buffer slots")


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

    def alloc(self, name: str, words: int, kind: str, align: int | None = None) -> int:
        """Allocates `words` at the next multiple of `align` (default: the map's) and returns its first word."""
        start = align_up(self.top, align or self.align)
        self.regions.append(Region(name, kind, start, words))
        self.top = start + words
        return start

    def start(self, name: str) -> int:
        """The first word of region `name`."""
        return next(r.start for r in self.regions if r.name == name)

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

    Per-row regions (row stride in brackets; R = activation_row, n_embd at GPT-2's sizes): X residual stream [R],
    H LayerNorm output [R], T scratch and projection outputs [R] (sized for max(R, CardShape.staged_fc)),
    S statistics [STAT_WORDS], and BIG, reused over a layer: first the gathered attention output [R] at BIG, the
    local Q|K|V [3 Hl hd] at QKV (R words a row after BIG) and the score areas [score_row] at SCORES (QKV's width
    on vector_align after QKV); later the gathered MLP hidden layer [activation_row of n_inner] over all of it.
    Fixed regions: LayerNorm parameters (two layers' blocks of ln_block words, alternating), the final LayerNorm's
    (gamma, beta R words apart) and output, and the logits. Every region but QKV and SCORES (which no transfer from HBM writes)
    starts on region_align, SCORES on vector_align. The card's KV areas are in WBUF (KVPlan): `kv_areas` areas of
    `kv_group` heads from `kv_start`.
    """
    max_rows: int
    kv_group: int
    """Heads whose keys and values are read from HBM together (the last group may be smaller)."""
    kv_areas: int
    kv_start: int
    """The weight-buffer word of the first KV area."""
    score_areas: int
    regions: dict

    def __getitem__(self, name: str) -> int:
        return self.regions[name][0]

    @property
    def words(self) -> int:
        return max(start + size for start, size in self.regions.values())

    def to_dict(self) -> dict:
        return {"max_rows": self.max_rows, "kv_group": self.kv_group, "kv_areas": self.kv_areas,
                "kv_start": self.kv_start, "score_areas": self.score_areas,
                "regions": {k: list(v) for k, v in self.regions.items()}}


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


def card_shapes(part, n_embd: int, config, slot_words: int, int8: bool = False) -> list:
    """Each card's CardShape under a partition (partition.Partition) whose weight pieces fill weight-buffer slots of
    `slot_words` (KVPlan) in whole mpu_lanes column groups (an fc column: column_layout(n_embd))."""
    staged = [0] * part.cards
    if part.cards > 1:
        pieces = gathered_spans(part.ffn, sum(column_layout(n_embd, config, int8)), slot_words, config.mpu_lanes)
        staged = [(f1 - f0) - (first[1] - first[0]) for (f0, f1), (first, *_) in zip(part.ffn, pieces)]
    return [CardShape(h1 - h0, v1 - v0, fc) for (h0, h1), (v0, v1), fc in zip(part.heads, part.vocab, staged)]


def _per_row(config, d: int, n_inner: int, qkv_width: int, max_context: int, score_areas: int,
             staged_fc: int) -> dict:
    row = activation_row(d, config)
    return {"X": row, "H": row, "T": max(row, staged_fc), "S": STAT_WORDS,
            "BIG": max(activation_row(n_inner, config),
                       row + _qkv_row(qkv_width, config) + score_areas * score_row(max_context, config))}


def _qkv_row(qkv_width: int, config) -> int:
    """BIG's words a row for the QKV block: its width rounded up to vector_align, so the score areas after it start
    on the vector unit's boundaries."""
    return align_up(qkv_width, config.vector_align)


def _fixed(config, d: int, card: CardShape) -> dict:
    return {"LNP": 2 * ln_block(d, config), "LNFP": 2 * activation_row(d, config), "LNF": d, "SF": STAT_WORDS,
            "LOGITS": card.vocab_slice, "CHUNK_MAX": chunk_count(card.vocab_slice)}


def _place(sizes: dict, top: int, align: int) -> tuple[dict, int]:
    """The regions of `sizes` ({name: words}) one after the other from word `top`, each start rounded up to
    `align`; and the first word after them."""
    regions = {}
    for name, size in sizes.items():
        top = align_up(top, align)
        regions[name] = (top, size)
        top += size
    return regions, top


def _plan_parts(config, d: int, n_inner: int, head_dim: int, card: CardShape, max_context: int,
                score_areas: int) -> tuple[dict, int, dict]:
    """The fixed regions, the first word after them and the per-row regions' words a row."""
    qkv_width = 3 * card.local_heads * head_dim
    per_row = _per_row(config, d, n_inner, qkv_width, max_context, score_areas, card.staged_fc)
    align = region_align(config)
    return (*_place(_fixed(config, d, card), 0, align), per_row)


def plan_abuf(config, d: int, n_inner: int, head_dim: int, card: CardShape, max_context: int, kv: KVPlan,
              score_areas: int, max_rows: int | None = None) -> AbufPlan | None:
    """The plan for one card on ArchConfig `config` (every region starting on region_align), its KV areas as `kv`
    places them: with max_rows None, the most rows that fit (capped at max_context); None when not even one row
    fits."""
    regions, top, per_row = _plan_parts(config, d, n_inner, head_dim, card, max_context, score_areas)
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
    regions["QKV"] = (regions["BIG"][0] + activation_row(d, config) * max_rows, qkv_width * max_rows)
    regions["SCORES"] = (regions["QKV"][0] + _qkv_row(qkv_width, config) * max_rows,
                         score_areas * score_row(max_context, config) * max_rows)
    return AbufPlan(max_rows, group_heads(card.local_heads, kv.group), kv.areas, kv.start, score_areas, regions)


ROW_TARGET = 96
"""Prompt tokens per run below which the planner gives up the second score area for rows."""


def choose_abuf_plans(config, d: int, n_inner: int, head_dim: int, cards: list, max_context: int, kv: KVPlan,
                      row_cap: int | None = None) -> list:
    """One plan per card (CardShape each) on ArchConfig `config`, all with the same max_rows: two score areas (the
    next head's scores are computed while this one's softmax runs) if they allow min(ROW_TARGET, max_context,
    row_cap) rows per run, else the choice with the most rows; max_rows is at most row_cap. Raises CapacityError
    if no row fits."""
    row_cap = min(max_context, row_cap or max_context)
    target = min(ROW_TARGET, row_cap)
    best = None
    for score_areas in (2, 1):
        plans = [plan_abuf(config, d, n_inner, head_dim, c, max_context, kv, score_areas) for c in cards]
        if any(p is None for p in plans):
            continue
        rows = min(p.max_rows for p in plans)
        if best is None or rows > best[0]:
            best = (rows, score_areas)
        if rows >= target:
            break
    if best is None:
        worst = max(cards, key=lambda c: (c.local_heads, c.vocab_slice))
        _, top, per_row = _plan_parts(config, d, n_inner, head_dim, worst, max_context, 1)
        need = _place(per_row, top, region_align(config))[1]
        raise CapacityError(f"the activation buffer ({config.abuf_words:,} words) cannot hold even one token's "
                            f"activations and scores for max_context={max_context} ({need:,} words): lower "
                            "max_context, use more cards or a smaller model")
    rows, score_areas = best
    rows = min(rows, row_cap)
    return [plan_abuf(config, d, n_inner, head_dim, c, max_context, kv, score_areas, rows) for c in cards]


def plan_buffers(config, dims, part, max_context: int, slots: int, kv_group: int | None = None,
                 max_rows: int | None = None, int8: bool = False) -> tuple[KVPlan, list]:
    """The weight buffer's plan (choose_kv) and each card's activation-buffer plan (choose_abuf_plans) of a model
    (ModelDims `dims`) cut over the cards by partition `part`, its weights INT8 or FP16 (`int8`)."""
    kv = choose_kv(config, dims.head_dim, [h1 - h0 for h0, h1 in part.heads], max_context, slots, kv_group)
    shapes = card_shapes(part, dims.n_embd, config, kv.slot_words, int8)
    return kv, choose_abuf_plans(config, dims.n_embd, dims.n_inner, dims.head_dim, shapes, max_context, kv, max_rows)


# --- a card's weight stream and HBM map ---------------------------------------------------------------------

LAYER_SLICES = ("qkv", "proj", "fc", "fc2")
GATHERED_SLICES = {"proj": ("embd", "n_embd"), "fc": ("ffn", "n_embd"), "fc2": ("embd", "n_inner")}
"""The layer slices whose output columns are all-gathered on several cards, piece by piece: the partition field
that splits their columns and the model dimension of their input."""


@dataclass(frozen=True)
class Piece:
    """One weight-buffer load and the MATMUL that reads it: `cols` weight columns of `k` weights (column-major,
    `stride` words apart: column_layout) at HBM word `hbm`, then `cols` bias words when `bias`, then with INT8
    weights (`int8`) `cols` scale words (after `cols` zero words where there is no bias). `origin` = (layer, slice
    index, first local column); the LM head is slice 0 of layer n_layer."""
    hbm: int
    cols: int
    k: int
    stride: int
    bias: bool
    origin: tuple

    hbm_region: str = "layer weights"
    int8: bool = False

    @property
    def aux_words(self) -> int:
        """Words a column adds after the columns (column_layout)."""
        return 2 if self.int8 else int(self.bias)

    @property
    def words(self) -> int:
        return self.cols * (self.stride + self.aux_words)

    def image(self, columns: np.ndarray, bias: np.ndarray | None, scale: np.ndarray | None = None) -> np.ndarray:
        """The piece's words in HBM: `columns` (cols x k: FP16 weights, or INT8 ones and their FP16 `scale`s) `stride`
        words apart, zeros between, then the bias (zeros for none with INT8), then the scales."""
        out = np.zeros(self.words, np.float16)
        body, aux = out[:self.cols * self.stride].reshape(self.cols, self.stride), out[self.cols * self.stride:]
        if self.int8:
            body[:, :weight_words(self.k, True)] = pack_int8(columns)
            aux[self.cols:] = scale
        else:
            body[:, :self.k] = columns
        if bias is not None:
            aux[:self.cols] = bias
        return out

    @property
    def name(self) -> str:
        """The piece's name in the plan check (verify.py)."""
        layer, index, col = self.origin
        what = "lm_head" if self.hbm_region != "layer weights" else f"L{layer}.{LAYER_SLICES[index]}"
        return f"{what} weights @{col}"


def pack_slice(pieces: list, hbm_at: int, ncols: int, k: int, config, int8: bool, bias: bool, origin: tuple,
               slot_words: int, align: int, hbm_region: str = "layer weights", spans: tuple | None = None,
               piece_align: int = 1) -> int:
    """Cuts one weight slice (`ncols` columns of k weights, INT8 or FP16, column_layout's stride apart, + bias, +
    scales, from HBM word hbm_at) into pieces that fit a weight-buffer slot: the column `spans` given, else the
    fewest (piece_spans); appends them to `pieces` and returns the HBM word after the slice. Each piece starts at a
    multiple of `piece_align` words (the pieces of a slice are consecutive, with at most piece_align - 1 words
    between them). A load never holds two slices, so its slot frees as soon as the slice's matrix work is done,
    whatever the next slice waits for."""
    stride, aux = column_layout(k, config, int8, bias)
    layer, index, col = origin
    at = hbm_at
    for a, b in spans or piece_spans(ncols, stride + aux, slot_words, align):
        if b > a:
            at = align_up(at, piece_align)
            pieces.append(Piece(at, b - a, k, stride, bias, (layer, index, col + a), hbm_region, int8))
            at += (b - a) * (stride + aux)
    return at


def gathered_pieces(config, dims, part, slot_words: int, int8: bool = False) -> dict:
    """On several cards, for each all-gathered layer slice (its index in LAYER_SLICES), every card's piece spans
    (gathered_spans: as many on every card); empty on one card."""
    if config.cards == 1:
        return {}
    pieces = {}
    for name, (spans, inputs) in GATHERED_SLICES.items():
        column_words = sum(column_layout(getattr(dims, inputs), config, int8))
        pieces[LAYER_SLICES.index(name)] = gathered_spans(getattr(part, spans), column_words, slot_words,
                                                          config.mpu_lanes)
    return pieces


def layer_widths(dims, part, card: int) -> list:
    """(input words, output columns) of each of LAYER_SLICES on `card`: QKV's columns are its heads' Q, K and V,
    the others' its partition spans."""
    (h0, h1), (e0, e1), (f0, f1) = part.heads[card], part.embd[card], part.ffn[card]
    d = dims.n_embd
    return [(d, 3 * (h1 - h0) * dims.head_dim), (d, e1 - e0), (d, f1 - f0), (dims.n_inner, e1 - e0)]


@dataclass(frozen=True)
class LayerStream:
    """A card's weight pieces of one decoder layer (pack_slice; HBM words from the layer's start, origin layer 0).
    Every layer's pieces are these, `stride` words after the previous layer's: the pieces start on stream_align,
    so a layer's span rounded up to it."""
    pieces: tuple
    end: int
    """Words from the layer's start to the end of its last piece."""
    stride: int

    def words(self, n_layer: int) -> int:
        """Words of `n_layer` layers' pieces, one layer after the other."""
        return (n_layer - 1) * self.stride + self.end

    def of_layer(self, layer: int, start: int) -> list:
        """Layer `layer`'s pieces in a stream that starts at HBM word `start`."""
        return [replace(p, hbm=start + layer * self.stride + p.hbm, origin=(layer, *p.origin[1:]))
                for p in self.pieces]


def layer_stream(config, widths: list, slot_words: int, gathered: dict, int8: bool = False) -> LayerStream:
    """One layer's pieces on a card whose LAYER_SLICES have `widths` (layer_widths) and whose all-gathered slices
    are cut into the column spans `gathered` (its entries of gathered_pieces), in weight-buffer slots of
    `slot_words`, INT8 or FP16 (`int8`)."""
    align, pieces, end = stream_align(config), [], 0
    for index, (k, ncols) in enumerate(widths):
        end = pack_slice(pieces, end, ncols, k, config, int8, True, (0, index, 0), slot_words, config.mpu_lanes,
                         spans=gathered.get(index), piece_align=align)
    return LayerStream(tuple(pieces), end, align_up(end, align))


def kv_cache_words(config, dims, max_context: int, local_heads: int, kv_group: int) -> int:
    """HBM words of one layer's KV cache on a card with `local_heads` heads: max_context rows of their keys in the
    KV areas' slots (KVArea.key_row), then V^T, one row of KVArea.value_row words per dimension of their heads."""
    area = KVArea(dims.head_dim, max_context, kv_group, region_align(config))
    return max_context * area.key_row(local_heads) + local_heads * dims.head_dim * area.value_row


def card_hbm(config, dims, card: int, max_context: int, stream_words: int, lm_head_words: int | None,
             kv_words: int) -> HbmMap:
    """Card `card`'s HBM map, every region starting on region_align (a LOAD whose HBM and buffer words agree modulo
    the buffer chunk writes whole buffer rows, hw/core/dma.py, and its words must agree modulo the beat,
    misaligned_transfer): the token embedding (wte, its rows the tied LM head's columns), max_context position
    rows, every layer's LayerNorm parameters and the final one's, the layers' weight stream (stream_words, from a
    multiple of stream_align), the
    LM head's `lm_head_words` (its columns, and with INT8 weights their biases and scales) unless it is tied to wte
    (None), then one KV cache of kv_words per layer
    (none on a card without heads, kv_words 0)."""
    align, d = region_align(config), dims.n_embd
    m = HbmMap(card, config.hbm_words, align)
    column = weight_stride(d, config.weight_align)
    m.alloc("wte", dims.vocab_size * column, "weights")
    m.alloc("wpe", max_context * activation_row(d, config), "weights")
    m.alloc("layernorm", dims.n_layer * ln_block(d, config) + 2 * activation_row(d, config), "weights")
    m.alloc("layer weights", stream_words, "weights", stream_align(config))
    if lm_head_words is not None:
        m.alloc("lm_head", lm_head_words, "weights", stream_align(config))
    for layer in range(dims.n_layer if kv_words else 0):
        m.alloc(f"KV cache L{layer}", kv_words, "kv")
    return m


def lm_head_words(config, d: int, cols: int, int8: bool, slot_words: int) -> int:
    """HBM words of an LM head of its own (not wte): `cols` columns of d weights (column_layout without a bias) in
    pack_slice's pieces for weight-buffer slots of `slot_words`, each starting on stream_align."""
    return pack_slice([], 0, cols, d, config, int8, False, (0, 0, 0), slot_words, lm_head_align(config), "lm_head",
                      piece_align=stream_align(config))


def check_hbm(config, dims, part, slot_words: int, plans: list, max_context: int, int8: bool = False) -> list:
    """Each card's HBM map as the compiler lays it out, from the dimensions alone (plan_buffers' weight-buffer slots
    of slot_words and activation-buffer `plans`) and the LM head taken as tied to wte, as GPT-2's is (with INT8
    weights an INT8 copy of it besides); raises CapacityError (HbmMap.check_capacity) where a card's weights, or its
    KV caches beside them, do not fit its HBM (the compiler checks its own map again, an untied LM head included)."""
    gathered, maps = gathered_pieces(config, dims, part, slot_words, int8), []
    for card, plan in enumerate(plans):
        stream = layer_stream(config, layer_widths(dims, part, card), slot_words,
                              {index: spans[card] for index, spans in gathered.items()}, int8)
        heads = part.heads[card][1] - part.heads[card][0]
        v0, v1 = part.vocab[card]
        head = lm_head_words(config, dims.n_embd, v1 - v0, True, slot_words) if int8 else None
        maps.append(card_hbm(config, dims, card, max_context, stream.words(dims.n_layer), head,
                             kv_cache_words(config, dims, max_context, heads, plan.kv_group)))
        maps[-1].check_capacity(max_context)
    return maps

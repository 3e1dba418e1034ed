"""MAC tree: one matrix-unit lane, and the vector unit's VSUM/VDOT. `width` exact FP16 products summed by block
alignment (`numerics.tile_sums`): integer products, aligned to the tile's largest exponent sum, one integer adder
tree, one rounding to FP32. No floating-point adder inside the tree."""
from amaranth.hdl import C, Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import FP16, FP16_EXP_MAX, FP32, check_power_of_two, delay, register, round_sum_to_fp32, stage
from .stream import Streamed

LEVELS_PER_STAGE = 2
"""Levels of the max tree and of the adder tree between two pipeline registers."""
_PRODUCT = 2 * (nx.FP16_MAN_BITS + 1)
_ALIGNED = _PRODUCT + nx.TREE_GUARD_BITS
"""Bits of an aligned product's magnitude: the 22-bit product and the guard bits below it."""
_EXP_OFFSET = nx.FP32_BIAS - nx.TREE_GUARD_BITS - nx.PRODUCT_SCALE
"""FP32 biased exponent of an aligned sum = qmax + _EXP_OFFSET + index of its leading one."""


def mac_operands(width: int) -> data.StructLayout:
    """Payload of a MAC tree: the input vector x and the weight vector w, `width` FP16 each."""
    return data.StructLayout({"x": data.ArrayLayout(FP16, width), "w": data.ArrayLayout(FP16, width)})


def mac_tree_latency(width: int) -> int:
    """Cycles of MacTreeCore(width): two tree passes (the exponents' maximum, the aligned sum) and 5 more."""
    return 2 * tree_stages(width) + 5


def tree_stages(leaves: int) -> int:
    """Pipeline stages of a reduction tree over `leaves` values (LEVELS_PER_STAGE levels a stage)."""
    levels = (leaves - 1).bit_length()
    return max(1, -(-levels // LEVELS_PER_STAGE))


def _level(values: list, combine) -> list:
    """One level of a pairwise reduction: combine(values[2j], values[2j + 1]), an odd last value carried on."""
    return [combine(values[2 * j], values[2 * j + 1]) for j in range(len(values) // 2)] + values[len(values) // 2 * 2:]


def reduce_tree(m: Module, values: list, combine, *, name: str):
    """Pairwise reduction of `values` with `combine(a, b)`, a register after every LEVELS_PER_STAGE levels and at
    the root: latency tree_stages(len(values)) cycles."""
    level = 0
    while True:
        if len(values) > 1:
            values = _level(values, combine)
            level += 1
        if len(values) == 1 or level % LEVELS_PER_STAGE == 0:
            values = [register(m, v, name=f"{name}{level}_{j}") for j, v in enumerate(values)]
            if len(values) == 1:
                return values[0]


class MacTreeCore(wiring.Component):
    """Free-running MAC tree: `o` = tile_sums(i.x, i.w), FP32.

    Stage 1 splits each pair into its integer product (the 11 x 11-bit significands, subnormals without hidden
    bit) and exponent sum q (exponent fields, subnormals 1), and reduces the lanes' NaN, Inf and -0 flags. Then
    the largest q of the nonzero products (a max tree); each product aligned to it, magnitude << TREE_GUARD_BITS >>
    (qmax - q), negative ones as their ones' complement; the integer adder tree, whose root also adds the count of
    negative products (registered once more); the sum's magnitude, leading and trailing zeros; FP32 rounding (RNE,
    the sticky bit from the trailing zeros) and packing.
    `latency` = 2 * tree_stages(width) + 5 cycles (11 at width 64); one dot product of `width` terms per cycle.
    """

    def __init__(self, width: int):
        check_power_of_two("MAC tree", width)
        self.width = width
        self.latency = mac_tree_latency(width)
        super().__init__({"i": In(mac_operands(width)), "o": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        W = self.width
        products, exponents, negatives, live = [], [], [], []
        nan, inf_pos, inf_neg, neg_zero = [], [], [], []
        for j in range(W):
            x, w = self.i.x[j], self.i.w[j]
            fields = []
            for v in (x, w):
                special = v.exp == FP16_EXP_MAX
                fields.append((Cat(v.mant, v.exp != 0), Mux(v.exp == 0, 1, v.exp), special & (v.mant != 0),
                               special & (v.mant == 0), (v.exp == 0) & (v.mant == 0)))
            (sig_x, exp_x, nan_x, inf_x, zero_x), (sig_w, exp_w, nan_w, inf_w, zero_w) = fields
            neg = x.sign ^ w.sign
            s1 = stage(m, f"s1_{j}", sig_x=sig_x, sig_w=sig_w, q=exp_x + exp_w, neg=neg, live=~(zero_x | zero_w))
            products.append(Signal(_PRODUCT, name=f"product{j}"))
            m.d.comb += products[-1].eq(s1["sig_x"] * s1["sig_w"])
            exponents.append(s1["q"])
            negatives.append(s1["neg"])
            live.append(s1["live"])
            nan.append(nan_x | nan_w | (inf_x & zero_w) | (inf_w & zero_x))
            inf_pos.append((inf_x | inf_w) & ~neg)
            inf_neg.append((inf_x | inf_w) & neg)
            neg_zero.append((zero_x | zero_w) & neg)
        inf_pos, inf_neg = Cat(*inf_pos).any(), Cat(*inf_neg).any()
        flags = stage(m, "s1_flags", nan=Cat(*nan).any() | (inf_pos & inf_neg), inf=inf_pos | inf_neg,
                      inf_sign=inf_neg, all_neg_zero=Cat(*neg_zero).all())

        # the largest exponent sum of the nonzero products; the products wait for it
        qmax = reduce_tree(m, [Mux(ok, q, 0) for ok, q in zip(live, exponents)], lambda a, b: Mux(a > b, a, b),
                           name="qmax")
        wait = tree_stages(W)
        terms, signs = [], []
        for j in range(W):
            product = delay(m, products[j], wait, name=f"product{j}")
            q = delay(m, exponents[j], wait, name=f"q{j}")
            neg = delay(m, negatives[j], wait, name=f"neg{j}")
            aligned = Cat((product << nx.TREE_GUARD_BITS) >> (qmax - q).as_unsigned(), C(0, 1)).as_signed()
            terms.append(register(m, Mux(neg, ~aligned, aligned), signed(_ALIGNED + 1), name=f"term{j}"))
            signs.append(neg)
        negative_count = register(m, _count(signs), name="negative_count")
        qmax_a = register(m, qmax, name="qmax_a")

        # exact integer sum: the ones' complements plus the count of negative terms
        total = register(m, reduce_tree(m, terms, lambda a, b: a + b, name="sum")
                         + delay(m, negative_count, wait, name="negative_count"),
                         signed(_ALIGNED + W.bit_length() + 1), name="total")
        q_top = delay(m, qmax_a, wait + 1, name="qmax_s")

        round_sum_to_fp32(m, self.o, total, q_top, _EXP_OFFSET, flags, self.latency - 2)
        return m


def _count(bits: list):
    """The number of set bits among `bits` (a balanced tree of adders)."""
    while len(bits) > 1:
        bits = _level(bits, lambda a, b: a + b)
    return bits[0]


class MacTree(Streamed):
    """Stream MAC tree: payload {x, w} (`width` FP16 each) -> tile_sums(x, w) (FP32); latency MacTreeCore's + 1
    (the FIFO), one dot product per cycle."""

    def __init__(self, width: int):
        super().__init__(MacTreeCore(width))
        self.width = width

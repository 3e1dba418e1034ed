"""INT8 tile: one matrix-unit lane's sum of a tile of INT8 weights times FP16 activations (`numerics.int8_tile_sums`,
W8A16): the activations aligned to the tile's largest, exact integer products and an integer adder tree, one
rounding to FP32. No exponent per product: an INT8 weight has none, so the alignment (stage 1 and the exponents'
maximum, `_align`) depends on the activations alone and is the same for every lane; in the matrix unit one copy
serves all mpu_lanes lanes, each of which keeps only its products and its tree (`_dot`)."""
from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import FP16, FP16_EXP_MAX, FP32, check_power_of_two, delay, register, round_sum_to_fp32, stage
from .mac_tree import reduce_tree, tree_stages
from .stream import Streamed

INT8 = signed(8)
_ALIGNED = nx.FP16_MAN_BITS + 1 + nx.INT8_GUARD_BITS
"""Bits of an aligned activation's magnitude: the 11-bit significand and the guard bits below it (24)."""
_PRODUCT = _ALIGNED + 8
"""Bits of a product of an aligned activation (sign and magnitude) and a weight, signed (32 + sign)."""
_EXP_OFFSET = nx.FP32_BIAS - nx.FP16_BIAS - nx.FP16_MAN_BITS - nx.INT8_GUARD_BITS
"""FP32 biased exponent of a tile's sum = emax + _EXP_OFFSET + index of its leading one."""


def int8_operands(width: int) -> data.StructLayout:
    """Payload of an INT8 tile: the activations x (`width` FP16) and the weights q (`width` INT8)."""
    return data.StructLayout({"x": data.ArrayLayout(FP16, width), "q": data.ArrayLayout(INT8, width)})


def int8_tile_latency(width: int) -> int:
    """Cycles of Int8TileCore(width): two tree passes (the activations' exponent maximum, the products' sum) and 6
    more (split, align, multiply, sum register, normalise, round)."""
    return 2 * tree_stages(width) + 6


class Int8TileCore(wiring.Component):
    """Free-running INT8 tile: `o` = int8_tile_sums(i.x, i.q), FP32.

    Stage 1 splits each activation into its significand (11 bits, subnormals without hidden bit, zero for Inf and
    NaN) and exponent field (subnormals 1) and reduces the lane's NaN, Inf x 0, +-Inf and -0 flags with the
    weights. Then emax, the largest exponent of the nonzero activations (a max tree); each activation aligned to it,
    significand << INT8_GUARD_BITS >> (emax - e), signed; its exact product with the weight (25 x 8 bits: a DSP48E2);
    the integer adder tree; the sum's magnitude, leading and trailing zeros; FP32 rounding (RNE) and packing.
    `latency` = 2 * tree_stages(width) + 6 cycles (20 at width 128); one tile per cycle.
    """

    def __init__(self, width: int):
        check_power_of_two("INT8 tile", width)
        self.width = width
        self.latency = int8_tile_latency(width)
        super().__init__({"i": In(int8_operands(width)), "o": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        aligned, weights, emax, flags = self._align(m)
        self._dot(m, aligned, weights, emax, flags)
        return m

    def _align(self, m: Module) -> tuple:
        """The activations aligned to the tile's largest (signed, `tree_stages + 2` cycles after the input), the
        weights and emax beside them, and the lane's flags (registered at stage 1)."""
        W = self.width
        sigs, exps, signs, live, weights = [], [], [], [], []
        nan, inf_zero, inf_pos, inf_neg, neg_zero = [], [], [], [], []
        for j in range(W):
            x, q = self.i.x[j], self.i.q[j]
            special = x.exp == FP16_EXP_MAX
            zero_x, zero_q = (x.exp == 0) & (x.mant == 0), q == 0
            neg = x.sign ^ (q < 0)
            s1 = stage(m, f"s1_{j}", sig=Mux(special, 0, Cat(x.mant, x.exp != 0)), exp=Mux(x.exp == 0, 1, x.exp),
                       sign=x.sign, live=~special & ~zero_x, q=q)
            sigs.append(s1["sig"])
            exps.append(s1["exp"])
            signs.append(s1["sign"])
            live.append(s1["live"])
            weights.append(s1["q"])
            nan.append(special & (x.mant != 0))
            inf = special & (x.mant == 0)
            inf_zero.append(inf & zero_q)
            inf_pos.append(inf & ~zero_q & ~neg)
            inf_neg.append(inf & ~zero_q & neg)
            neg_zero.append((zero_x | zero_q) & neg)
        inf_pos, inf_neg = Cat(*inf_pos).any(), Cat(*inf_neg).any()
        flags = stage(m, "s1_flags", nan=Cat(*nan).any() | Cat(*inf_zero).any() | (inf_pos & inf_neg),
                      inf=inf_pos | inf_neg, inf_sign=inf_neg, all_neg_zero=Cat(*neg_zero).all())
        top = reduce_tree(m, [Mux(ok, e, 1) for ok, e in zip(live, exps)], lambda a, b: Mux(a > b, a, b),
                          name="emax")
        wait = tree_stages(W)
        out = []
        for j in range(W):
            sig = delay(m, sigs[j], wait, name=f"sig{j}")
            e = delay(m, exps[j], wait, name=f"exp{j}")
            sign = delay(m, signs[j], wait, name=f"sign{j}")
            magnitude = Signal(_ALIGNED, name=f"magnitude{j}")
            m.d.comb += magnitude.eq((sig << nx.INT8_GUARD_BITS) >> (top - e).as_unsigned())
            out.append(register(m, Mux(sign, -magnitude, magnitude), signed(_ALIGNED + 1), name=f"aligned{j}"))
        weights = [delay(m, q, wait + 1, name=f"q{j}") for j, q in enumerate(weights)]
        return out, weights, register(m, top, name="emax_a"), flags

    def _dot(self, m: Module, aligned: list, weights: list, emax, flags: dict) -> None:
        """The products, their exact sum, and its rounding to FP32 into `o`."""
        W = self.width
        products = [register(m, a * q, signed(_PRODUCT + 1), name=f"product{j}")
                    for j, (a, q) in enumerate(zip(aligned, weights))]
        wait = tree_stages(W)
        total = register(m, reduce_tree(m, products, lambda a, b: a + b, name="sum"),
                         signed(_PRODUCT + W.bit_length() + 1), name="total")
        round_sum_to_fp32(m, self.o, total, delay(m, emax, wait + 2, name="emax_s"), _EXP_OFFSET, flags,
                          self.latency - 2)


class Int8Tile(Streamed):
    """Stream INT8 tile: payload {x (`width` FP16), q (`width` INT8)} -> int8_tile_sums(x, q) (FP32); latency
    Int8TileCore's + 1 (the FIFO), one tile per cycle."""

    def __init__(self, width: int):
        super().__init__(Int8TileCore(width))
        self.width = width

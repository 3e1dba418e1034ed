"""INT8 tile: one matrix-unit lane's sum of a tile of INT8 weights times FP16 activations (`numerics.int8_tile_sums`,
W8A16): the activations aligned to the tile's largest, exact integer products and an integer adder tree, one
rounding to FP32. No exponent per product: an INT8 weight has none, so the alignment (stage 1 and the exponents'
maximum, in `Int8TileCore`) depends on the activations alone and is the same for every lane; in the matrix unit one
copy serves all mpu_lanes lanes, each of which keeps only its products, flags and tree (`lane_sum`,
`Int8LaneCore`)."""
from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
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
_EXP_OFFSET = nx.FP32_BIAS - nx.INT8_GRID_SHIFT
"""FP32 biased exponent of a tile's sum = emax + _EXP_OFFSET + index of its leading one."""


def int8_operands(width: int) -> data.StructLayout:
    """Payload of an INT8 tile: the activations x (`width` FP16) and the weights q (`width` INT8)."""
    return data.StructLayout({"x": data.ArrayLayout(FP16, width), "q": data.ArrayLayout(INT8, width)})


def int8_tile_latency(width: int) -> int:
    """Cycles of Int8TileCore(width): two tree passes (the activations' exponent maximum, the products' sum) and 6
    more (split, align, multiply, sum register, normalise, round)."""
    return 2 * tree_stages(width) + 6


ACTIVATION_CLASS = data.StructLayout({"nan": 1, "inf": 1, "zero": 1, "sign": 1})
"""What a lane needs of each activation besides its aligned value: the specials and the sign of a zero product."""


def int8_lane_operands(width: int) -> data.StructLayout:
    """Payload of one lane of an INT8 tile: the aligned activations (signed), their classes, the tile's emax (all
    three shared by the lanes) and the lane's weights."""
    return data.StructLayout({"a": data.ArrayLayout(signed(_ALIGNED + 1), width),
                              "cls": data.ArrayLayout(ACTIVATION_CLASS, width),
                              "emax": unsigned(nx.FP16_EXP_BITS), "q": data.ArrayLayout(INT8, width)})


def int8_lane_latency(width: int) -> int:
    """Cycles of Int8LaneCore(width): the products, the adder tree, the sum register, normalise, round."""
    return tree_stages(width) + 4


def lane_sum(m: Module, out, aligned: list, classes: list, emax, weights: list) -> None:
    """One lane of an INT8 tile into `out` (FP32), int8_lane_latency(len(aligned)) cycles after its operands: the
    products of the aligned activations and the weights (25 x 8 bits, registered: a DSP48E2) beside the lane's flags
    (a NaN activation, Inf x 0, +Inf and -Inf products, every product -0), the integer adder tree, the rounding."""
    products, nan, inf_pos, inf_neg, neg_zero = [], [], [], [], []
    for j, (a, c, q) in enumerate(zip(aligned, classes, weights)):
        zero_q, neg = q == 0, c.sign ^ (q < 0)
        products.append(register(m, a * q, signed(_PRODUCT + 1), name=f"product{j}"))
        nan.append(c.nan | (c.inf & zero_q))
        inf_pos.append(c.inf & ~zero_q & ~neg)
        inf_neg.append(c.inf & ~zero_q & neg)
        neg_zero.append((c.zero | zero_q) & neg)
    inf_pos, inf_neg = Cat(*inf_pos).any(), Cat(*inf_neg).any()
    flags = stage(m, "lane_flags", nan=Cat(*nan).any() | (inf_pos & inf_neg), inf=inf_pos | inf_neg,
                  inf_sign=inf_neg, all_neg_zero=Cat(*neg_zero).all())
    wait = tree_stages(len(aligned))
    total = register(m, reduce_tree(m, products, lambda a, b: a + b, name="sum"),
                     signed(_PRODUCT + len(aligned).bit_length() + 1), name="total")
    round_sum_to_fp32(m, out, total, delay(m, emax, wait + 2, name="emax_s"), _EXP_OFFSET, flags, wait + 2)


class Int8LaneCore(wiring.Component):
    """Free-running lane of an INT8 tile, the part each matrix-unit lane keeps (`lane_sum`), its activations aligned
    by a shared aligner: `o` = int8_tile_sums of the activations the inputs stand for and i.q, FP32.
    `latency` = tree_stages(width) + 4 cycles."""

    def __init__(self, width: int):
        check_power_of_two("INT8 tile", width)
        self.width = width
        self.latency = int8_lane_latency(width)
        super().__init__({"i": In(int8_lane_operands(width)), "o": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        W = self.width
        lane_sum(m, self.o, [self.i.a[j] for j in range(W)], [self.i.cls[j] for j in range(W)], self.i.emax,
                 [self.i.q[j] for j in range(W)])
        return m


def int8_aligned(width: int) -> data.StructLayout:
    """What the shared aligner gives every lane: the aligned activations (signed), their classes and the tile's
    emax (`int8_lane_operands` less the lane's weights)."""
    return data.StructLayout({"a": data.ArrayLayout(signed(_ALIGNED + 1), width),
                              "cls": data.ArrayLayout(ACTIVATION_CLASS, width), "emax": unsigned(nx.FP16_EXP_BITS)})


def int8_align_latency(width: int) -> int:
    """Cycles of Int8AlignerCore(width): the split, the exponents' maximum (a tree), the alignment."""
    return tree_stages(width) + 2


class Int8AlignerCore(wiring.Component):
    """Free-running aligner of an INT8 tile's `width` FP16 activations, shared by the lanes of the matrix unit:
    `o` = each activation aligned to the tile's largest (`int8_tile_sums`), its class and the tile's emax.

    Stage 1 splits each activation into its significand (11 bits, subnormals without hidden bit, zero for Inf and
    NaN), exponent field (subnormals 1) and class (NaN, Inf, zero, sign). Then emax, the largest exponent of the
    nonzero activations (a max tree); each activation aligned to it, significand << INT8_GUARD_BITS >> (emax - e),
    signed. `latency` = tree_stages(width) + 2 cycles."""

    def __init__(self, width: int):
        check_power_of_two("INT8 tile", width)
        self.width = width
        self.latency = int8_align_latency(width)
        super().__init__({"i": In(data.ArrayLayout(FP16, width)), "o": Out(int8_aligned(width))})

    def elaborate(self, platform):
        m = Module()
        W = self.width
        sigs, exps, classes, live = [], [], [], []
        for j in range(W):
            x = self.i[j]
            special, zero = x.exp == FP16_EXP_MAX, (x.exp == 0) & (x.mant == 0)
            s1 = stage(m, f"s1_{j}", sig=Mux(special, 0, Cat(x.mant, x.exp != 0)), exp=Mux(x.exp == 0, 1, x.exp),
                       cls=Cat(special & (x.mant != 0), special & (x.mant == 0), zero, x.sign),
                       live=~special & ~zero)
            sigs.append(s1["sig"])
            exps.append(s1["exp"])
            classes.append(s1["cls"])
            live.append(s1["live"])
        top = reduce_tree(m, [Mux(ok, e, 1) for ok, e in zip(live, exps)], lambda a, b: Mux(a > b, a, b),
                          name="emax")
        wait = tree_stages(W)
        for j in range(W):
            sig = delay(m, sigs[j], wait, name=f"sig{j}")
            e = delay(m, exps[j], wait, name=f"exp{j}")
            sign = delay(m, classes[j][3], wait, name=f"sign{j}")
            magnitude = Signal(_ALIGNED, name=f"magnitude{j}")
            m.d.comb += magnitude.eq((sig << nx.INT8_GUARD_BITS) >> (top - e).as_unsigned())
            m.d.sync += self.o.a[j].eq(Mux(sign, -magnitude, magnitude))
            m.d.comb += self.o.cls[j].eq(delay(m, classes[j], wait + 1, name=f"cls{j}"))
        m.d.sync += self.o.emax.eq(top)
        return m


class Int8TileCore(wiring.Component):
    """Free-running INT8 tile: `o` = int8_tile_sums(i.x, i.q), FP32: the shared aligner (`Int8AlignerCore`) and one
    lane (`Int8LaneCore`), the weights waiting for the aligned activations.
    `latency` = 2 * tree_stages(width) + 6 cycles (14 at width 128); one tile per cycle.
    """

    def __init__(self, width: int):
        check_power_of_two("INT8 tile", width)
        self.width = width
        self.latency = int8_tile_latency(width)
        super().__init__({"i": In(int8_operands(width)), "o": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        W = self.width
        aligner = m.submodules.aligner = Int8AlignerCore(W)
        lane = m.submodules.lane = Int8LaneCore(W)
        m.d.comb += [aligner.i.eq(self.i.x), lane.i.a.eq(aligner.o.a), lane.i.cls.eq(aligner.o.cls),
                     lane.i.emax.eq(aligner.o.emax), self.o.eq(lane.o)]
        m.d.comb += [lane.i.q[j].eq(delay(m, self.i.q[j], aligner.latency, name=f"q{j}")) for j in range(W)]
        return m


class Int8Tile(Streamed):
    """Stream INT8 tile: payload {x (`width` FP16), q (`width` INT8)} -> int8_tile_sums(x, q) (FP32); latency
    Int8TileCore's + 1 (the FIFO), one tile per cycle."""

    def __init__(self, width: int):
        super().__init__(Int8TileCore(width))
        self.width = width

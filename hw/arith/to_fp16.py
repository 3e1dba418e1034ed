"""FP32 -> FP16 conversion (`numerics.to_fp16`): round to nearest even, overflow to +-Inf, FP16
subnormals kept, FP32 subnormals to a signed zero, canonical NaN 0x7E00."""
from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import FP16, FP16_EXP_MAX, FP16_INF, FP32, FP32_EXP_MAX, stage, trailing_zeros
from .stream import Streamed

_REBIAS = nx.FP32_BIAS - nx.FP16_BIAS                   # 112: FP16 exponent = FP32 exponent - 112
_DROP = nx.FP32_MAN_BITS - nx.FP16_MAN_BITS             # 13 significand bits dropped when normal
_MAX_SHIFT = nx.FP32_MAN_BITS + 2                       # 25: everything, the hidden bit included,
                                                         # falls below the rounding position


class ToFP16Core(wiring.Component):
    """Free-running FP32 -> FP16 converter: `o` = to_fp16(i), `latency` = 2 cycles.

    Stage 1 classifies the input and picks the right shift of the 24-bit significand (13 for
    normal results, more for subnormal ones) and counts its trailing zeros (for the sticky bit); stage 2
    shifts, rounds to nearest even and adds the rounding carry into the packed exponent/mantissa, so a
    carry out of the largest finite value gives Inf.
    """

    latency = 2

    i: In(FP32)
    o: Out(FP16)

    def elaborate(self, platform):
        m = Module()
        x = self.i
        normal = x.exp > _REBIAS
        shift = Signal(range(_MAX_SHIFT + 1))
        with m.If(normal):
            m.d.comb += shift.eq(_DROP)
        with m.Elif(x.exp >= _REBIAS + _DROP + 1 - _MAX_SHIFT):
            m.d.comb += shift.eq(_REBIAS + _DROP + 1 - x.exp)
        with m.Else():
            m.d.comb += shift.eq(_MAX_SHIFT)
        special = x.exp == FP32_EXP_MAX
        sig = Cat(x.mant, 1)
        s1 = stage(m, "s1", sig=sig, shift=shift, trailing=trailing_zeros(m, sig, name="s1_trailing"),
                   exp=Mux(normal, (x.exp - _REBIAS)[:nx.FP16_EXP_BITS], 0), sign=x.sign,
                   nan=special & (x.mant != 0), inf=special & (x.mant == 0),
                   overflow=x.exp >= _REBIAS + FP16_EXP_MAX, zero=x.exp == 0)

        sig, shift = s1["sig"], s1["shift"]
        kept = Signal(nx.FP16_MAN_BITS + 1)
        m.d.comb += kept.eq(sig >> shift)
        below = Cat(C(0, 1), sig)                       # bit j: significand bit j - 1
        guard = (below >> shift)[0]
        sticky = shift > s1["trailing"] + 1             # a set significand bit below the guard bit
        up = guard & (sticky | kept[0])
        magnitude = Signal(15)
        m.d.comb += magnitude.eq(Cat(kept[:nx.FP16_MAN_BITS], s1["exp"]) + up)
        with m.If(s1["nan"]):
            m.d.sync += self.o.eq(nx.FP16_CANONICAL_NAN)
        with m.Elif(s1["inf"] | s1["overflow"]):
            m.d.sync += self.o.eq(Cat(C(FP16_INF, 15), s1["sign"]))
        with m.Elif(s1["zero"]):
            m.d.sync += self.o.eq(Cat(C(0, 15), s1["sign"]))
        with m.Else():
            m.d.sync += self.o.eq(Cat(magnitude, s1["sign"]))
        return m


class ToFP16(Streamed):
    """Stream FP32 -> FP16 converter: payload FP32 -> to_fp16; latency 3 cycles (core 2 + FIFO 1),
    one result per cycle, ready/valid back-pressure."""

    def __init__(self):
        super().__init__(ToFP16Core())

"""Special-function unit (exp, recip, rsqrt, gelu) by table lookup and linear interpolation,
`numerics.special`: the top LUT_INDEX_BITS of the FP16 input select a segment (base, slope) from
memories initialised with `numerics.lut_tables(name)`; the low LUT_FRAC_BITS are the integer frac;
y = to_fp16(add_fp32(mul_fp32(slope, frac), base)). NaN inputs give the canonical NaN."""
from amaranth.hdl import Module, Mux
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import FP16, FP16_EXP_MAX, delay, register
from .fp32_add import FP32AddCore
from .fp32_mul import FP32IntMulCore
from .stream import Streamed
from .to_fp16 import ToFP16Core


class SpecialFunctionCore(wiring.Component):
    """Free-running special-function unit for `name` in numerics.SPECIAL_FUNCTIONS:
    `o` = special(name, i), FP16 -> FP16.

    `latency` = 1 (table read) + FP32IntMulCore.latency (3) + FP32AddCore.latency (5)
    + ToFP16Core.latency (2) = 11 cycles. The base and slope tables are two LUT_SEGMENTS x 32-bit
    memories with a registered read; a NaN input replaces the base by the canonical NaN, which the
    add and the conversion carry to FP16 0x7E00.
    """

    latency = 1 + FP32IntMulCore.latency + FP32AddCore.latency + ToFP16Core.latency

    def __init__(self, name: str):
        base, slope = nx.lut_tables(name)
        self.name = name
        self.base_init = [int(v) for v in nx.fp32_bits(base)]
        self.slope_init = [int(v) for v in nx.fp32_bits(slope)]
        super().__init__({"i": In(FP16), "o": Out(FP16)})

    def elaborate(self, platform):
        m = Module()
        x = self.i
        m.submodules.base = base = memory.Memory(shape=32, depth=nx.LUT_SEGMENTS, init=self.base_init)
        m.submodules.slope = slope = memory.Memory(shape=32, depth=nx.LUT_SEGMENTS, init=self.slope_init)
        segment = x.as_value()[nx.LUT_FRAC_BITS:]
        base_rd, slope_rd = base.read_port(), slope.read_port()
        m.d.comb += [base_rd.addr.eq(segment), slope_rd.addr.eq(segment)]
        frac = register(m, x.as_value()[:nx.LUT_FRAC_BITS], name="frac")
        nan = register(m, (x.exp == FP16_EXP_MAX) & (x.mant != 0), name="nan")

        m.submodules.mul = mul = FP32IntMulCore(nx.LUT_FRAC_BITS)
        m.d.comb += [mul.i.a.eq(slope_rd.data), mul.i.k.eq(frac)]
        base_value = Mux(nan, nx.FP32_CANONICAL_NAN, base_rd.data)
        m.submodules.add = add = FP32AddCore()
        m.d.comb += [add.i.a.eq(mul.o), add.i.b.eq(delay(m, base_value, mul.latency, name="base"))]
        m.submodules.to_fp16 = conv = ToFP16Core()
        m.d.comb += [conv.i.eq(add.o), self.o.eq(conv.o)]
        return m


class SpecialFunction(Streamed):
    """Stream special-function unit for `name` (exp, recip, rsqrt or gelu): payload FP16 ->
    special(name, x) (FP16); latency 12 cycles (core 11 + FIFO 1), one result per cycle."""

    def __init__(self, name: str):
        super().__init__(SpecialFunctionCore(name))
        self.name = name

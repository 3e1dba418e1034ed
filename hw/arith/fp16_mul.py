"""FP16 x FP16 -> FP32 multiplier, exact (`numerics.mul_fp16_exact`): the 11 x 11-bit significand
product fits FP32's 24 bits and every FP16 product lies in FP32's normal range, so it never rounds."""
from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import FP16, FP16_EXP_MAX, FP32, FP32_INF, leading_zeros, stage
from .stream import Streamed

MUL16_OPERANDS = data.StructLayout({"a": FP16, "b": FP16})

_PRODUCT = 2 * (nx.FP16_MAN_BITS + 1)   # significand product width
_EXP_OFFSET = nx.FP32_BIAS - 2 * nx.FP16_BIAS - 2 * nx.FP16_MAN_BITS + _PRODUCT - 1
"""FP32 exponent of a product = exp(a) + exp(b) + _EXP_OFFSET - leading zeros of the product."""


class FP16MulCore(wiring.Component):
    """Free-running exact FP16 multiplier: `o` = mul_fp16_exact(i.a, i.b), `latency` = 2 cycles.

    Stage 1 multiplies the 11-bit significands (subnormals without hidden bit, exponent 1) and adds
    the exponents; stage 2 normalises by the product's leading-zero count and packs. NaN operands
    and Inf x 0 give the canonical NaN; Inf x nonzero gives Inf; zero operands give a signed zero.
    """

    latency = 2

    i: In(MUL16_OPERANDS)
    o: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        a, b = self.i.a, self.i.b

        def unpack(x):
            special = x.exp == FP16_EXP_MAX
            return Cat(x.mant, x.exp != 0), Mux(x.exp == 0, 1, x.exp), special & (x.mant != 0), \
                special & (x.mant == 0), (x.exp == 0) & (x.mant == 0)

        sig_a, exp_a, nan_a, inf_a, zero_a = unpack(a)
        sig_b, exp_b, nan_b, inf_b, zero_b = unpack(b)
        product = Signal(_PRODUCT)
        m.d.comb += product.eq(sig_a * sig_b)
        nan = nan_a | nan_b | (inf_a & zero_b) | (inf_b & zero_a)
        s1 = stage(m, "s1", product=product, exp=exp_a + exp_b, sign=a.sign ^ b.sign, nan=nan,
                   inf=inf_a | inf_b, zero=zero_a | zero_b)

        lz = leading_zeros(m, s1["product"], name="s2_lz")
        normalised = Signal(_PRODUCT)
        m.d.comb += normalised.eq(s1["product"] << lz)
        exp = s1["exp"] + _EXP_OFFSET - lz
        with m.If(s1["nan"]):
            m.d.sync += self.o.eq(nx.FP32_CANONICAL_NAN)
        with m.Elif(s1["inf"]):
            m.d.sync += self.o.eq(Cat(C(FP32_INF, 31), s1["sign"]))
        with m.Elif(s1["zero"]):
            m.d.sync += self.o.eq(Cat(C(0, 31), s1["sign"]))
        with m.Else():
            mant = Cat(C(0, nx.FP32_MAN_BITS - (_PRODUCT - 1)), normalised[:_PRODUCT - 1])
            m.d.sync += self.o.eq(Cat(mant, exp[:nx.FP32_EXP_BITS], s1["sign"]))
        return m


class FP16Multiplier(Streamed):
    """Stream exact FP16 multiplier: payload {a, b} -> mul_fp16_exact(a, b) (FP32); latency 3
    cycles (core 2 + FIFO 1), one result per cycle, ready/valid back-pressure."""

    def __init__(self):
        super().__init__(FP16MulCore())

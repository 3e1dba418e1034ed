"""FP32 multipliers: `numerics.mul_fp32(a, k)` of an FP32 a by an integer 0 <= k < 2**int_bits (the interpolation
multiply of the exp and GELU special-function units: slope x r, slope x frac), and of an FP32 a by an FP16 s (the
matrix unit's INT8 column scale), the exact product rounded to nearest even once."""
from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .. import numerics as nx
from .common import (FP16, FP16_EXP_MAX, FP32, is_inf32, is_nan32, leading_zeros, register_fp32_result,
                     round_pack_fp32, stage, trailing_zeros)
from .stream import Streamed


class FP32IntMulCore(wiring.Component):
    """Free-running FP32 x uint(int_bits) multiplier: `o` = mul_fp32(i.a, i.k), `latency` = 3.

    Stage 1 multiplies the 24-bit significand by k; stage 2 normalises (leading-zero count, the
    shift limited so that results below 2**-126 stay subnormal); stage 3 rounds to nearest even and
    packs. NaN, or Inf x 0, gives the canonical NaN; overflow gives Inf; a zero factor a signed zero.
    """

    latency = 3

    def __init__(self, int_bits: int):
        if isinstance(int_bits, bool) or not isinstance(int_bits, int) or not 1 <= int_bits <= 24:
            raise ValueError(f"integer factor width must be an int from 1 to 24, got {int_bits!r}")
        self.int_bits = int_bits
        super().__init__({
            "i": In(data.StructLayout({"a": FP32, "k": int_bits})),
            "o": Out(FP32),
        })

    def elaborate(self, platform):
        m = Module()
        a, k = self.i.a, self.i.k
        bits = self.int_bits
        width = 24 + bits
        product = Signal(width)
        m.d.comb += product.eq(Cat(a.mant, a.exp != 0) * k)
        s1 = stage(m, "s1", product=product, top_exp=Mux(a.exp == 0, 1, a.exp) + bits,
                   sign=a.sign, nan=is_nan32(a) | (is_inf32(a) & (k == 0)), inf=is_inf32(a))

        lz = leading_zeros(m, s1["product"], name="s2_lz")
        limit = s1["top_exp"] - 1
        left = Signal(range(width + 1))
        m.d.comb += left.eq(Mux(lz > limit, limit, lz))
        s2 = stage(m, "s2", norm=(s1["product"] << left)[:width], exp=s1["top_exp"] - left,
                   zero=s1["product"] == 0, **{key: s1[key] for key in ("sign", "nan", "inf")})

        packed = round_pack_fp32(m, s2["sign"], s2["exp"], s2["norm"], name="s3_packed")
        register_fp32_result(m, self.o, nan=s2["nan"], inf=s2["inf"], zero=s2["zero"], sign=s2["sign"],
                             zero_sign=s2["sign"], packed=packed)
        return m


_SCALED_SIG = 24 + 11
"""Bits of an FP32 significand times an FP16 one (24 x 11)."""
_SCALED_TOP = (_SCALED_SIG - 1) - (nx.FP32_BIAS + nx.FP32_MAN_BITS) - (nx.FP16_BIAS + nx.FP16_MAN_BITS) + nx.FP32_BIAS
"""FP32 biased exponent of a * s when the product's top bit is set, less both exponent fields (-14; a subnormal's
field counted as 1): a = sig_a * 2**(ea - 150), s = sig_s * 2**(es - 25)."""


class FP32Fp16MulCore(wiring.Component):
    """Free-running FP32 x FP16 multiplier: `o` = mul_fp32(i.a, i.s) (s widened to FP32 exactly), `latency` = 3.

    Stage 1 multiplies the 24-bit and 11-bit significands (exactly) and adds the exponents; stage 2 normalises: a
    left shift by the leading zeros, limited so that results below 2**-126 stay subnormal, or a right shift (with a
    sticky bit) where the product is below the subnormal range's top; stage 3 rounds to nearest even and packs. NaN,
    or Inf x 0, gives the canonical NaN; overflow gives Inf; a zero factor a signed zero (sign a xor s)."""

    latency = 3

    def __init__(self):
        super().__init__({"i": In(data.StructLayout({"a": FP32, "s": FP16})), "o": Out(FP32)})

    def elaborate(self, platform):
        m = Module()
        a, s = self.i.a, self.i.s
        s_inf, s_nan = (s.exp == FP16_EXP_MAX) & (s.mant == 0), (s.exp == FP16_EXP_MAX) & (s.mant != 0)
        a_zero, s_zero = (a.exp == 0) & (a.mant == 0), (s.exp == 0) & (s.mant == 0)
        product = Signal(_SCALED_SIG)
        m.d.comb += product.eq(Cat(a.mant, a.exp != 0) * Cat(s.mant, s.exp != 0))
        top = Signal(signed(11))
        m.d.comb += top.eq(Mux(a.exp == 0, 1, a.exp) + Mux(s.exp == 0, 1, s.exp) + _SCALED_TOP)
        s1 = stage(m, "s1", product=product, top=top, sign=a.sign ^ s.sign,
                   nan=is_nan32(a) | s_nan | (is_inf32(a) & s_zero) | (a_zero & s_inf), inf=is_inf32(a) | s_inf)

        p, top = s1["product"], s1["top"]
        lz = leading_zeros(m, p, name="s2_lz")
        left, right = Signal(range(_SCALED_SIG + 1)), Signal(range(_SCALED_SIG + 1))
        m.d.comb += [left.eq(Mux(top < 1, 0, Mux(lz > top - 1, top - 1, lz))),
                     right.eq(Mux(top < 1, Mux(1 - top > _SCALED_SIG, _SCALED_SIG, 1 - top), 0))]
        lost = Signal()     # a right shift drops a set bit
        m.d.comb += lost.eq(right > trailing_zeros(m, p, name="s2_tz"))
        s2 = stage(m, "s2", norm=Mux(top < 1, p >> right, (p << left)[:_SCALED_SIG]),
                   exp=Mux(top < 1, 1, (top - left).as_unsigned()[:10]), lost=lost, zero=p == 0,
                   **{key: s1[key] for key in ("sign", "nan", "inf")})

        norm = s2["norm"]
        packed = round_pack_fp32(m, s2["sign"], s2["exp"], norm, name="s3_packed",
                                 sticky=norm[:_SCALED_SIG - 25].any() | s2["lost"])
        register_fp32_result(m, self.o, nan=s2["nan"], inf=s2["inf"], zero=s2["zero"], sign=s2["sign"],
                             zero_sign=s2["sign"], packed=packed)
        return m


class FP32IntMultiplier(Streamed):
    """Stream FP32 x uint(int_bits) multiplier: payload {a, k} -> mul_fp32(a, k); latency 4 cycles
    (core 3 + FIFO 1), one result per cycle, ready/valid back-pressure."""

    def __init__(self, int_bits: int):
        super().__init__(FP32IntMulCore(int_bits))
        self.int_bits = int_bits

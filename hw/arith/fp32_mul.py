"""FP32 x unsigned-integer multiplier: IEEE binary32 `numerics.mul_fp32(a, k)` for an integer
0 <= k < 2**int_bits (exactly an FP32 value), the product rounded to nearest even. It is the
interpolation multiply of the exp and GELU special-function units (slope x r, slope x frac)."""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .common import FP32, is_inf32, is_nan32, leading_zeros, register_fp32_result, round_pack_fp32, stage
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


class FP32IntMultiplier(Streamed):
    """Stream FP32 x uint(int_bits) multiplier: payload {a, k} -> mul_fp32(a, k); latency 4 cycles
    (core 3 + FIFO 1), one result per cycle, ready/valid back-pressure."""

    def __init__(self, int_bits: int):
        super().__init__(FP32IntMulCore(int_bits))
        self.int_bits = int_bits

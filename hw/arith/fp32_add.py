"""FP32 adder: IEEE binary32 addition as `numerics.add_fp32` defines it (round to nearest even,
gradual underflow, +-Inf, canonical NaN, x + (-x) = +0, (-0) + (-0) = -0)."""

from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .common import (FP32, is_inf32, is_nan32, leading_zeros, register_fp32_result, round_pack_fp32, stage,
                     trailing_zeros)
from .stream import Streamed

ADD_OPERANDS = data.StructLayout({"a": FP32, "b": FP32})

_GUARD = 3            # guard, round and sticky bits below the 24-bit significand
_WIDE = 24 + _GUARD   # aligned significand width
_FLAGS = ("sign", "nan", "inf", "zero_sign")


class FP32AddCore(wiring.Component):
    """Free-running FP32 adder: `o` = add_fp32(i.a, i.b), `latency` = 5 cycles.

    Stages: unpack, order by magnitude and take the exponent difference (and the smaller significand's trailing
    zeros); align the smaller operand (a sticky bit when the shift passes its lowest set bit); add or subtract;
    normalise (leading-zero count, the left shift limited so results below 2**-126 stay subnormal); round to nearest
    even and pack.
    """

    latency = 5

    i: In(ADD_OPERANDS)
    o: Out(FP32)

    def elaborate(self, platform):
        m = Module()
        a, b = self.i.a, self.i.b

        # 1: unpack, order by magnitude, specials
        swap = b.as_value()[:31] > a.as_value()[:31]
        big = Signal(FP32)
        small = Signal(FP32)
        m.d.comb += [big.eq(Mux(swap, b, a)), small.eq(Mux(swap, a, b))]
        diff = Signal(8)
        m.d.comb += diff.eq(Mux(big.exp == 0, 1, big.exp) - Mux(small.exp == 0, 1, small.exp))
        shift = Signal(range(_WIDE + 1))
        m.d.comb += shift.eq(Mux(diff > _WIDE, _WIDE, diff))
        exp = Signal(8)
        m.d.comb += exp.eq(Mux(big.exp == 0, 1, big.exp))
        sig_small = Cat(small.mant, small.exp != 0)
        # the smaller significand's trailing zeros (24 when it is 0), for stage 2's sticky bit
        trailing = trailing_zeros(m, sig_small, name="s1_trailing")
        s1 = stage(m, "s1", sign=big.sign, sub=a.sign ^ b.sign, exp=exp,
                   sig_big=Cat(big.mant, big.exp != 0), sig_small=sig_small, trailing=trailing,
                   shift=shift, inf=is_inf32(a) | is_inf32(b), zero_sign=a.sign & b.sign,
                   nan=is_nan32(a) | is_nan32(b) | (is_inf32(a) & is_inf32(b) & (a.sign != b.sign)))

        # 2: align the smaller significand, keeping a sticky bit
        wide_small = Cat(C(0, _GUARD), s1["sig_small"])
        aligned = Signal(_WIDE)
        m.d.comb += aligned.eq(wide_small >> s1["shift"])
        lost = s1["shift"] > s1["trailing"] + _GUARD     # the lowest set bit is shifted out
        s2 = stage(m, "s2", big=Cat(C(0, _GUARD), s1["sig_big"]), small=aligned | lost,
                   **{k: s1[k] for k in _FLAGS + ("sub", "exp")})

        # 3: add or subtract magnitudes (|big| >= |small|, so the difference is not negative)
        total = Signal(_WIDE + 1)
        m.d.comb += total.eq(Mux(s2["sub"], s2["big"] - s2["small"], s2["big"] + s2["small"]))
        s3 = stage(m, "s3", sum=total, exp=s2["exp"], **{k: s2[k] for k in _FLAGS})

        # 4: normalise so that the hidden bit is the top bit (or the exponent reaches 1)
        total = s3["sum"]
        lz = leading_zeros(m, total[:_WIDE], name="s4_lz")
        limit = s3["exp"] - 1
        clamped = lz > limit                           # below 2**-126: shift only to exponent 1
        left = Signal(range(_WIDE + 1))
        m.d.comb += left.eq(Mux(clamped, limit, lz))
        norm = Signal(_WIDE)
        exp = Signal(9)
        with m.If(total[_WIDE]):
            m.d.comb += [norm.eq(Cat(total[0] | total[1], total[2:])), exp.eq(s3["exp"] + 1)]
        with m.Else():
            # s3 exp - left, with the subtraction beside the comparison (exp - limit is 1)
            m.d.comb += [norm.eq(total[:_WIDE] << left), exp.eq(Mux(clamped, 1, s3["exp"] - lz))]
        s4 = stage(m, "s4", norm=norm, exp=exp, zero=total == 0, **{k: s3[k] for k in _FLAGS})

        # 5: round to nearest even, pack, specials
        packed = round_pack_fp32(m, s4["sign"], s4["exp"], s4["norm"], name="s5_packed")
        register_fp32_result(m, self.o, nan=s4["nan"], inf=s4["inf"], zero=s4["zero"], sign=s4["sign"],
                             zero_sign=s4["zero_sign"], packed=packed)
        return m


class FP32Adder(Streamed):
    """Stream FP32 adder: payload {a, b} -> add_fp32(a, b); latency 6 cycles (core 5 + FIFO 1),
    one result per cycle, ready/valid back-pressure."""

    def __init__(self):
        super().__init__(FP32AddCore())

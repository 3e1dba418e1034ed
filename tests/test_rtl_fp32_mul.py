"""The FP32 multipliers against numerics.mul_fp32: FP32IntMultiplier on Verilator and Icarus, FP32Fp16MulCore in
Amaranth's simulator."""
import numpy as np
import pytest

from ringgpt.hw import numerics as nx
from ringgpt.hw.arith.fp32_mul import FP32Fp16MulCore, FP32IntMultiplier
from ringgpt.sim.tb import vectors

from free_running import outputs
from ringgpt.sim.cocotb_support.runner import Design

VECTORS = {"verilator": 40_000, "icarus": 8_000}


@pytest.mark.parametrize("int_bits", [0, 25, 2.0, True])
def test_rejects_bad_factor_width(int_bits):
    with pytest.raises(ValueError, match=rf"^integer factor width must be an int from 1 to 24, got {int_bits!r}$"):
        FP32IntMultiplier(int_bits)


@pytest.mark.rtl
def test_fp32_int_multiplier_bit_exact(run_tb, sim):
    run_tb(Design.of("ringgpt.hw.arith.fp32_mul:FP32IntMultiplier", int_bits=5), "ringgpt.sim.tb.tb_fp32_mul",
           seed=3, vectors=VECTORS[sim])


def scale_case(seed: int, n: int):
    """FP32 x FP16 operands: every FP32 corner times every FP16 corner, then random FP32 (every exponent range)
    times random FP16 patterns, times column scales (|w| / 127: 1e-8 to 1), and tiny times tiny (subnormal and
    zero products)."""
    rng = np.random.default_rng(seed)
    a32, s16 = np.meshgrid(vectors.FP32_CORNERS, vectors.FP16_CORNERS, indexing="ij")
    a = [a32.ravel(), vectors.random_fp32(rng, n), vectors.random_fp32(rng, n),
         nx.fp32_bits(np.ldexp(rng.uniform(-2, 2, n), rng.integers(-149, -100, n)).astype(np.float32))]
    s = [s16.ravel(), vectors.random_fp16(rng, n),
         nx.fp16_bits(np.ldexp(rng.uniform(0.5, 1, n), rng.integers(-27, 1, n))),
         nx.fp16_bits(np.ldexp(rng.uniform(-1, 1, n), rng.integers(-24, 4, n)))]
    a, s = np.concatenate(a).astype(np.uint32), np.concatenate(s).astype(np.uint16)
    expected = nx.fp32_bits(nx.mul_fp32(nx.fp32_from_bits(a), nx.fp16_from_bits(s).astype(np.float32)))
    return a, s, expected


def test_fp32_fp16_multiplier_bit_exact_in_amaranth_simulation():
    """FP32Fp16MulCore (the matrix unit's INT8 column scale) against numerics.mul_fp32, one product a cycle."""
    a, s, expected = scale_case(5, 3000)
    dut = FP32Fp16MulCore()

    def feed(ctx, n):
        ctx.set(dut.i.a.as_value(), int(a[n]))
        ctx.set(dut.i.s.as_value(), int(s[n]))
    got = outputs(dut, feed, len(a))
    bad = np.nonzero(got != expected)[0]
    assert not len(bad), (f"{len(bad)} products differ, first a={a[bad[0]]:#010x} s={s[bad[0]]:#06x}: "
                          f"got {got[bad[0]]:#010x}, expected {expected[bad[0]]:#010x}")

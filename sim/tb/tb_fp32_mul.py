"""cocotb testbench of FP32IntMultiplier: every FP32 corner case times every integer factor, and
random FP32 operands (all exponent ranges, subnormals, near overflow) times random factors,
bit-exact against numerics.mul_fp32 under random valid gaps and ready back-pressure, and at full
rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def case(seed: int, n: int, int_bits: int):
    rng = np.random.default_rng(seed)
    factors = np.arange(1 << int_bits, dtype=np.uint32)
    a = np.concatenate([np.repeat(vectors.FP32_CORNERS, len(factors)), vectors.random_fp32(rng, n)])
    k = np.concatenate([np.tile(factors, len(vectors.FP32_CORNERS)),
                        rng.integers(0, 1 << int_bits, n).astype(np.uint32)])
    expected = nx.fp32_bits(nx.mul_fp32(nx.fp32_from_bits(a), k.astype(np.float32)))
    items = [int(x) | (int(y) << 32) for x, y in zip(a, k)]
    return [(hex(x), int(y)) for x, y in zip(a, k)], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args, unit = bench.args(), bench.design()
    await bench.check_stream(dut, "mul_fp32", *case(args["seed"], args["vectors"], unit.int_bits),
                             seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "mul_fp32 at full rate", *case(7, 512, bench.design().int_bits))

"""cocotb testbench of FP16Multiplier: every pair of FP16 corner cases, uniform random pattern
pairs and random normal-valued pairs, bit-exact against numerics.mul_fp16_exact under random valid
gaps and ready back-pressure, and at full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def case(seed: int, n: int):
    rng = np.random.default_rng(seed)
    ca, cb = vectors.cross(vectors.FP16_CORNERS)
    half = n // 2
    a = np.concatenate([ca, vectors.random_fp16(rng, half), vectors.random_fp16(rng, n - half, scale=8.0)])
    b = np.concatenate([cb, vectors.random_fp16(rng, half), vectors.random_fp16(rng, n - half, scale=8.0)])
    expected = nx.fp32_bits(nx.mul_fp16_exact(nx.fp16_from_bits(a), nx.fp16_from_bits(b)))
    items = [int(x) | (int(y) << 16) for x, y in zip(a, b)]
    return [(hex(x), hex(y)) for x, y in zip(a, b)], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args = bench.args()
    await bench.check_stream(dut, "mul_fp16_exact", *case(args["seed"], args["vectors"]), seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "mul_fp16_exact at full rate", *case(7, 512))

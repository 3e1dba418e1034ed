"""cocotb testbench of FP32Adder: every pair of FP32 corner cases and random operands (close
exponents, rounding ties, subnormal sums), bit-exact against numerics.add_fp32 under random valid
gaps and ready back-pressure, and at full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def case(seed: int, n: int):
    a, b = vectors.fp32_add_operands(np.random.default_rng(seed), n)
    expected = nx.fp32_bits(nx.add_fp32(nx.fp32_from_bits(a), nx.fp32_from_bits(b)))
    items = [int(x) | (int(y) << 32) for x, y in zip(a, b)]
    return [(hex(x), hex(y)) for x, y in zip(a, b)], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args = bench.args()
    await bench.check_stream(dut, "add_fp32", *case(args["seed"], args["vectors"]), seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "add_fp32 at full rate", *case(7, 512))

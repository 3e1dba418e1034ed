"""cocotb testbench of SpecialFunction(name): all 65,536 FP16 inputs, bit-exact against
numerics.special(name, x) under random valid gaps and ready back-pressure, and at full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench


def case(x: np.ndarray):
    name = bench.design().name
    expected = nx.fp16_bits(nx.special(name, nx.fp16_from_bits(x)))
    return [hex(v) for v in x], [int(v) for v in x], expected


@cocotb.test()
async def exhaustive_under_backpressure(dut):
    args = bench.args()
    x = np.random.default_rng(args["seed"]).permutation(1 << 16).astype(np.uint16)
    await bench.check_stream(dut, f"special {bench.design().name}", *case(x), seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, f"special {bench.design().name} at full rate",
                                *case(np.arange(0x3000, 0x3400, dtype=np.uint16)))

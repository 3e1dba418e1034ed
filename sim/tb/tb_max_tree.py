"""cocotb testbench of MaxTree(width): rows of uniform random FP16 patterns (NaNs and Infs of both
signs included), rows drawn from the FP16 corner cases, rows of signed zeros, rows of one repeated
value and rows of normal values; bit-exact against numerics.reduce_max under random valid gaps and
ready back-pressure, and at full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def case(seed: int, rows: int, width: int):
    rng = np.random.default_rng(seed)
    k = rows // 5
    x = np.concatenate([
        vectors.random_fp16(rng, (rows - 4 * k, width)),
        rng.choice(vectors.FP16_CORNERS, (k, width)),
        rng.choice(np.array([0x0000, 0x8000], np.uint16), (k, width)),
        np.repeat(rng.choice(vectors.FP16_CORNERS, (k, 1)), width, axis=1),
        vectors.random_fp16(rng, (k, width), scale=1.0),
    ]).astype(np.uint16)
    expected = nx.fp16_bits(nx.reduce_max(nx.fp16_from_bits(x), axis=1))
    items = [bench.pack_lanes(row, 16) for row in x]
    return [[hex(v) for v in row] for row in x], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args, width = bench.args(), bench.design().width
    await bench.check_stream(dut, "reduce_max", *case(args["seed"], args["vectors"], width), seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "reduce_max at full rate", *case(7, 500, bench.design().width))

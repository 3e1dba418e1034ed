"""cocotb testbench of MacTree(width): rows of random normal values (with cancellation), uniform
random FP16 patterns (NaN, Inf, subnormal products), rows drawn from the FP16 corner cases, rows of
signed zeros (sign of an all-zero sum) and rows of largest-finite values; bit-exact against
numerics.fold_tree(numerics.mul_fp16_exact(x, w)) under random valid gaps and ready back-pressure,
and at full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def case(seed: int, rows: int, width: int):
    rng = np.random.default_rng(seed)
    k = rows // 6

    def operands():
        return np.concatenate([
            vectors.random_fp16(rng, (rows - 5 * k, width), scale=2.0),
            vectors.random_fp16(rng, (k, width)),
            rng.choice(vectors.FP16_CORNERS, (k, width)),
            rng.choice(np.array([0x0000, 0x8000], np.uint16), (k, width)),
            rng.choice(np.array([0x7BFF, 0xFBFF, 0x0001, 0x8001], np.uint16), (k, width)),
            vectors.random_fp16(rng, (k, width), scale=1e-4),
        ]).astype(np.uint16)

    x, w = operands(), operands()
    products = nx.mul_fp16_exact(nx.fp16_from_bits(x), nx.fp16_from_bits(w))
    expected = nx.fp32_bits(nx.fold_tree(products, axis=1))
    items = [bench.pack_lanes(xr, 16) | (bench.pack_lanes(wr, 16) << (16 * width)) for xr, wr in zip(x, w)]
    return [(xr.tolist(), wr.tolist()) for xr, wr in zip(x, w)], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args, width = bench.args(), bench.design().width
    await bench.check_stream(dut, "fold_tree(mul_fp16_exact)", *case(args["seed"], args["vectors"], width),
                             seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "MAC tree at full rate", *case(7, 300, bench.design().width))

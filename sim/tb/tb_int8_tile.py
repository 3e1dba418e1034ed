"""cocotb testbench of Int8Tile(width): rows of activations with exponents spread past the guard bits (truncated
terms), uniform random FP16 patterns (NaN, Inf, subnormals), FP16 corner cases, signed zeros with zero weights (the
sign of an all-zero sum, rows whose products are all -0), Inf against zero weights, and rows whose products cancel
exactly; bit-exact against
numerics.int8_tile_sums(x, q) under random valid gaps and ready back-pressure, and at full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def case(seed: int, rows: int, width: int):
    rng = np.random.default_rng(seed)
    k = rows // 6
    x = np.concatenate([
        nx.fp16_bits(np.ldexp(rng.uniform(-2, 2, (rows - 5 * k, width)), rng.integers(-24, 10, (rows - 5 * k, width)))),
        vectors.random_fp16(rng, (k, width)),
        rng.choice(vectors.FP16_CORNERS, (k, width)),
        rng.choice(np.array([0x0000, 0x8000], np.uint16), (k, width)),
        vectors.random_fp16(rng, (k, width), scale=2.0),
        vectors.random_fp16(rng, (k, width), scale=1e-4),
    ]).astype(np.uint16)
    q = rng.integers(-127, 128, (rows, width)).astype(np.int8)
    q[rows - 5 * k + 2 * k:rows - 5 * k + 3 * k] *= rng.integers(0, 2, (k, width)).astype(np.int8)  # zero weights
    q[rows - 5 * k + k:rows - 5 * k + 2 * k:2] = 0           # corner rows with every weight zero (Inf x 0, -0)
    zeros = rows - 3 * k                                     # -0 sums: every product -0, three ways
    x[zeros:zeros + 3] = np.array([[0x8000], [0xBC00], [0x0000]], np.uint16)   # -0 x q >= 0, -1 x 0, +0 x q < 0
    q[zeros] = np.abs(q[zeros])
    q[zeros + 1] = 0
    q[zeros + 2] = -np.maximum(np.abs(q[zeros + 2]), 1)
    half = width // 2                                        # exact cancellation in the last rows
    x[-k:, half:] = x[-k:, :half]
    q[-k:, half:] = -q[-k:, :half]
    expected = nx.fp32_bits(nx.int8_tile_sums(nx.fp16_from_bits(x), q))
    items = [bench.pack_lanes(xr, 16) | (bench.pack_lanes(qr.view(np.uint8), 8) << (16 * width)) for xr, qr in zip(x, q)]
    return [(xr.tolist(), qr.tolist()) for xr, qr in zip(x, q)], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args, width = bench.args(), bench.design().width
    await bench.check_stream(dut, "int8_tile_sums", *case(args["seed"], args["vectors"], width), seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "INT8 tile at full rate", *case(7, 300, bench.design().width))

"""cocotb testbench of MacTree(width): rows of random normal values (with cancellation), uniform
random FP16 patterns (NaN, Inf, subnormal products), rows drawn from the FP16 corner cases, rows of
signed zeros (sign of an all-zero sum), rows of largest-finite values, rows whose exponents spread
past the guard bits (truncated terms) and rows whose products cancel exactly; bit-exact against
numerics.tile_sums(x, w) under random valid gaps and ready back-pressure, and at full rate."""
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
    # exponents spread over 2**-14 ... 2**14 against ones (terms shifted past the guard bits)
    spread = nx.fp16_bits(np.ldexp(rng.uniform(-2, 2, (k, width)), rng.integers(-14, 15, (k, width))))
    ones = np.full((k, width), 0x3C00, np.uint16)
    # exact cancellation: each row's second half is its first half with the weights negated
    half = width // 2
    cancel_x = np.concatenate([x[:k, :half]] * 2, axis=1)
    cancel_w = np.concatenate([w[:k, :half], w[:k, :half] ^ np.uint16(0x8000)], axis=1)
    x, w = np.concatenate([x, spread, cancel_x]), np.concatenate([w, ones, cancel_w])
    expected = nx.fp32_bits(nx.tile_sums(nx.fp16_from_bits(x), nx.fp16_from_bits(w)))
    items = [bench.pack_lanes(xr, 16) | (bench.pack_lanes(wr, 16) << (16 * width)) for xr, wr in zip(x, w)]
    return [(xr.tolist(), wr.tolist()) for xr, wr in zip(x, w)], items, expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args, width = bench.args(), bench.design().width
    await bench.check_stream(dut, "tile_sums", *case(args["seed"], args["vectors"], width),
                             seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    await bench.check_full_rate(dut, "MAC tree at full rate", *case(7, 300, bench.design().width))

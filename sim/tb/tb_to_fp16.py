"""cocotb testbench of ToFP16: all 65,536 FP16 values widened to FP32 (each must come back
unchanged, NaNs canonical), FP32 corner cases, dense random FP32 over FP16's range and beyond,
rounding ties at every output exponent (normal and subnormal), and the overflow boundary around
65,520; bit-exact against numerics.to_fp16 under random valid gaps and ready back-pressure, and at
full rate."""
import cocotb
import numpy as np

from ringgpt.hw import numerics as nx
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.tb import vectors


def fp16_values() -> np.ndarray:
    """Every FP16 pattern as the FP32 pattern of the same value (NaNs keep their payloads)."""
    with np.errstate(invalid="ignore"):
        return nx.fp32_bits(nx.fp16_from_bits(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)).astype(np.float32))


def ties(rng: np.random.Generator, n: int) -> np.ndarray:
    """FP32 values exactly halfway between neighbouring FP16 values (and one FP32 ulp either side),
    for every FP16 exponent, subnormal outputs included."""
    exp = rng.integers(103, 143, n).astype(np.uint32)                 # FP16 exponent -9 ... 30
    drop = np.where(exp > 112, 13, 126 - exp).astype(np.uint32)       # significand bits below the lsb
    mant = rng.integers(0, 1 << 23, n).astype(np.uint32)
    half = (np.uint32(1) << (drop - 1)).astype(np.uint32)
    mant = (mant & ~((half << 1) - 1)) | half                          # exactly half an FP16 ulp
    mant = (mant.astype(np.int64) + rng.integers(-1, 2, n)).clip(0, (1 << 23) - 1).astype(np.uint32)
    return (rng.integers(0, 2, n).astype(np.uint32) << 31) | (exp << 23) | mant


def overflow_boundary() -> np.ndarray:
    """65504 (largest FP16) up to 65536 in steps of FP32 ulps around the 65520 rounding boundary."""
    around = np.arange(0x477FEFF0, 0x477FF010, dtype=np.uint32)
    edges = np.array([0x477FE000, 0x477FE001, 0x477FFFFF, 0x47800000, 0x47800001], dtype=np.uint32)
    both = np.concatenate([around, edges])
    return np.concatenate([both, both | 0x80000000])


def case(seed: int, n: int):
    rng = np.random.default_rng(seed)
    dense = (rng.integers(0, 2, n).astype(np.uint32) << 31) | (rng.integers(96, 148, n).astype(np.uint32) << 23) \
        | rng.integers(0, 1 << 23, n).astype(np.uint32)
    x = np.concatenate([fp16_values(), vectors.FP32_CORNERS, overflow_boundary(), ties(rng, n),
                        dense, vectors.random_fp32(rng, n)])
    expected = nx.fp16_bits(nx.to_fp16(nx.fp32_from_bits(x)))
    return [hex(v) for v in x], [int(v) for v in x], expected


@cocotb.test()
async def bit_exact_under_backpressure(dut):
    args = bench.args()
    await bench.check_stream(dut, "to_fp16", *case(args["seed"], args["vectors"]), seed=args["seed"])


@cocotb.test()
async def one_result_per_cycle(dut):
    inputs, items, expected = case(7, 256)
    await bench.check_full_rate(dut, "to_fp16 at full rate", inputs[-1024:], items[-1024:], expected[-1024:])

"""Test-vector generators for the arithmetic testbenches: corner-case bit patterns and random
operands biased towards the hard cases (cancellation, alignment, rounding ties, subnormals,
overflow). All functions return uint16 / uint32 bit-pattern arrays."""
from __future__ import annotations

import numpy as np

from ringgpt.hw import numerics as nx

FP32_CORNERS = np.array([
    0x00000000, 0x80000000,                  # signed zeros
    0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000,  # subnormals
    0x00800000, 0x80800000, 0x00800001,      # smallest normals
    0x3F800000, 0xBF800000, 0x3F800001, 0x3F7FFFFF, 0x33800000, 0x33800001, 0xB3800000,
    0x34000000, 0x4B800000, 0x4B7FFFFF,      # 1, ulp and half-ulp neighbours, 2**24
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F7FFFFE, 0x73800000, 0x73000000,  # largest finite, its half ulp
    0x7F800000, 0xFF800000,                  # infinities
    0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFF800001,  # NaNs, quiet and signalling
], dtype=np.uint32)

FP16_CORNERS = np.array([
    0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0200,   # zeros, subnormals
    0x0400, 0x8400, 0x0401, 0x3C00, 0xBC00, 0x3C01, 0x3BFF,   # normals around 1
    0x7BFF, 0xFBFF, 0x7BFE, 0x7C00, 0xFC00,                   # largest finite, Inf
    0x7E00, 0xFE00, 0x7C01, 0x7FFF, 0xFC01,                   # NaNs
], dtype=np.uint16)


def cross(corners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ordered pairs of `corners`."""
    return np.repeat(corners, len(corners)), np.tile(corners, len(corners))


def random_fp32(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random FP32 patterns: a quarter uniform over all patterns, the rest with exponents drawn
    from the whole range including 0 (subnormal) and 255 (Inf/NaN) more often than uniform."""
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    exp = rng.choice(np.array([0, 1, 2, 254, 255, 127, 126, 128], dtype=np.uint32), n)
    exp = np.where(rng.random(n) < 0.5, exp, rng.integers(0, 256, n).astype(np.uint32))
    mant = bits & 0x7FFFFF
    mant = np.where(rng.random(n) < 0.1, mant & 0x7FFF00, mant)      # trailing zeros: exact cases
    shaped = (bits & 0x80000000) | (exp << 23) | mant
    return np.where(rng.random(n) < 0.25, bits, shaped).astype(np.uint32)


def near(rng: np.random.Generator, a: np.ndarray, max_shift: int) -> np.ndarray:
    """Patterns whose exponent is within `max_shift` of `a`'s, random sign and mantissa (alignment,
    cancellation and sticky-bit cases for an adder)."""
    n = len(a)
    exp = (a >> 23) & 0xFF
    exp = np.clip(exp.astype(np.int64) - rng.integers(-2, max_shift + 1, n), 0, 254).astype(np.uint32)
    mant = rng.integers(0, 1 << 23, n).astype(np.uint32)
    mant = np.where(rng.random(n) < 0.3, a & 0x7FFFFF, mant)           # equal mantissas: x - x
    sign = rng.integers(0, 2, n).astype(np.uint32) << 31
    return sign | (exp << 23) | mant


def rounding_ties(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (a, b) where b is an odd multiple, (2**j + 1) or 1, of half an ulp of a: a + b and
    a - b land halfway between two FP32 values whenever they stay in a's binade."""
    exp = rng.integers(30, 224, n).astype(np.uint32)
    a = (rng.integers(0, 2, n).astype(np.uint32) << 31) | (exp << 23) | rng.integers(0, 1 << 23, n).astype(np.uint32)
    j = rng.integers(0, 8, n).astype(np.uint32)
    mant = np.where(j == 0, 0, np.uint32(1) << (np.uint32(23) - j)).astype(np.uint32)
    b = (rng.integers(0, 2, n).astype(np.uint32) << 31) | ((exp - 24 + j) << 23) | mant
    return a, b


def fp32_add_operands(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Adder operands: every pair of FP32 corners, then `n` random pairs mixing uniform patterns,
    close exponents (cancellation), rounding ties and subnormal-range sums."""
    ca, cb = cross(FP32_CORNERS)
    k = n // 4
    a1 = random_fp32(rng, n - 3 * k)
    b1 = random_fp32(rng, n - 3 * k)
    a2 = random_fp32(rng, k)
    b2 = near(rng, a2, 30)
    a3, b3 = rounding_ties(rng, k)
    a4 = rng.integers(0, 1 << 25, k).astype(np.uint32) | (rng.integers(0, 2, k).astype(np.uint32) << 31)
    b4 = rng.integers(0, 1 << 25, k).astype(np.uint32) | (rng.integers(0, 2, k).astype(np.uint32) << 31)
    return np.concatenate([ca, a1, a2, a3, a4]), np.concatenate([cb, b1, b2, b3, b4])


def random_fp16(rng: np.random.Generator, shape, *, scale: float | None = None) -> np.ndarray:
    """FP16 patterns: uniform over all patterns, or (with `scale`) normal values of that scale."""
    if scale is None:
        return rng.integers(0, 1 << 16, shape).astype(np.uint16)
    return nx.fp16_bits(rng.normal(0.0, scale, shape).astype(np.float16))

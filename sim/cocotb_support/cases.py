"""Helpers the unit testbenches share to draw random instruction cases and pause their buses."""
from __future__ import annotations

import random

from ringgpt.hw.isa import InstructionLayout


def pick(rng, options):
    """One of `options`, drawn by the NumPy generator `rng`, as an int."""
    return int(options[int(rng.integers(len(options)))])


def extent(rows: int, cols: int, stride: int) -> int:
    """Words a block of `rows` rows of `cols` words, `stride` apart, spans."""
    return (rows - 1) * stride + cols


def stride_for(rng, cols: int, *, overlap: bool) -> int:
    """A row stride for rows of `cols` words: a few words of gap, or (with `overlap`, now and then) overlapping rows."""
    if overlap and rng.random() < 0.15:
        return int(rng.integers(0, cols + 1))
    return cols + int(rng.integers(0, 6))


def aligned_up(value: int, align: int) -> int:
    """`value` rounded up to a multiple of `align`."""
    return -(-value // align) * align


def place(rng, sizes: dict, capacity: int, aligned=(), align: int = 1) -> dict | None:
    """Random non-overlapping bases for blocks of `sizes` words in a buffer of `capacity` words, those named in
    `aligned` on multiples of `align` words."""
    names = list(sizes)
    rng.shuffle(names)
    free = capacity - sum(sizes.values()) - (align - 1) * len(aligned)
    if free < 0:
        return None
    cuts = sorted(int(v) for v in rng.integers(0, free + 1, len(names)))
    bases, at, prev = {}, 0, 0
    for name, cut in zip(names, cuts):
        at += cut - prev
        prev = cut
        if name in aligned:
            at = aligned_up(at, align)
        bases[name] = at
        at += sizes[name]
    return bases


def set_field(word: int, path: str, value: int) -> int:
    """`word` with field `path` (e.g. "flags.reserved", "src1.space") set to `value`."""
    layout, offset = InstructionLayout, 0
    for part in path.split("."):
        field = layout.as_shape()[part] if hasattr(layout, "as_shape") else layout[part]
        offset += field.offset
        layout = field.shape
    width = field.width
    return (word & ~(((1 << width) - 1) << offset)) | ((value & ((1 << width) - 1)) << offset)


def pauses(rng: random.Random, probability: float):
    """A pause generator for cocotbext-axi and the stream drivers: paused with `probability` each cycle."""
    while True:
        yield rng.random() < probability

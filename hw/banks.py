"""The buffers' bank rule, defined once. ABUF and WBUF are cut into chunks of `chunk` words
(ArchConfig.buffer_chunk_words, a power of two), and chunk c is row c div banks of memory c mod banks
(ArchConfig.buffer_banks), so the map repeats every chunk x banks words. hw/core/buffers.py builds the
memories that way; the DMA's crossbar, the matrix unit's bias read, the cycle model, the bank-conflict replay
and the testbenches place words with these functions. Each takes ints, NumPy arrays and Amaranth values alike."""
from __future__ import annotations

import numpy as np
from amaranth.hdl import Array, Const, Value

from ringgpt.hw.intmath import log2


def chunk_of(word, chunk: int):
    """The chunk holding buffer word `word`."""
    return word >> log2(chunk)


def place(chunk_index, banks: int) -> tuple:
    """(memory, row) of chunk `chunk_index`. On an Amaranth value with `banks` = 2^k + 1 (5 at sim-small, 17 at
    u280) the same numbers come from adders instead of Yosys's dividers (`_fermat_place`)."""
    if isinstance(chunk_index, Value) and _fermat_digits(banks):
        return _fermat_place(chunk_index, banks)
    return chunk_index % banks, chunk_index // banks


def _fermat_digits(banks: int) -> int:
    """k where banks = 2^k + 1, else 0."""
    k = (banks - 1).bit_length() - 1
    return k if banks > 2 and banks == (1 << k) + 1 else 0


def _fermat_place(c: Value, banks: int) -> tuple:
    """(c mod banks, c div banks) for banks = 2^k + 1 in logic a few adders deep: 2^k = -1 modulo banks, so the
    remainder is that of the alternating sum of c's k-bit digits, read from a table; the quotient is (c - remainder)
    times the inverse of banks modulo 2^n, (1 - 2^k)(1 + 2^2k)(1 + 2^4k)... (exact, since banks divides
    c - remainder), computed as c times the inverse (three adders at u280) less the remainder's product, read from
    a second table. At u280 (26 bits, 17 banks) Yosys maps it to 266 LUTs and 11 logic levels, where `%` and `//`
    took 4,694 LUTs and 88 levels."""
    k, n = _fermat_digits(banks), len(c)
    digits = [c[i:i + k] for i in range(0, n, k)]
    even, odd = digits[0::2], digits[1::2]
    offset = -(-len(odd) * ((1 << k) - 1) // banks) * banks     # a multiple of banks that keeps the sum >= 0
    top = len(even) * ((1 << k) - 1) + offset
    total = (sum(even) + offset - sum(odd))[:top.bit_length()]
    sums = range(1 << top.bit_length())
    remainder = Array(Const(v % banks, range(banks)) for v in sums)[total]
    inverse = pow(banks, -1, 1 << n)
    scaled, step = (c - (c << k))[:n], k                       # c times the inverse, beside the remainder
    while 2 * step < n:
        step *= 2
        scaled = (scaled + (scaled << step))[:n]
    return remainder, (scaled - Array(Const(v % banks * inverse % (1 << n), n) for v in sums)[total])[:n]


def memory_of(word, chunk: int, banks: int):
    """The memory holding buffer word `word`."""
    return place(chunk_of(word, chunk), banks)[0]


def period(chunk: int, banks: int) -> int:
    """Words after which the map repeats: moving a set of accesses by a multiple of it keeps each one's memory."""
    return chunk * banks


def tile_read_cycles(starts: np.ndarray, enabled: np.ndarray, words, chunk: int, banks: int,
                     bank_of=None) -> np.ndarray:
    """Cycles of TileReadPort requests (hw/core/buffers.py; the last axis: the lanes' first words `starts`,
    `enabled`; each lane reads `words`, a number or one per lane: 1 for a `single` lane): the largest number of
    distinct chunks one memory holds, at least 1 (`bank_of(c)`: a chunk's memory, by default `place`'s)."""
    first, last = chunk_of(starts, chunk), chunk_of(starts + words - 1, chunk)
    chunks = np.concatenate([np.where(enabled, first, -1), np.where(enabled & (last != first), last, -1)], axis=-1)
    chunks = np.sort(chunks, axis=-1)
    distinct = (chunks >= 0) & np.concatenate([np.ones_like(chunks[..., :1], bool), chunks[..., 1:] != chunks[..., :-1]],
                                              axis=-1)
    bank = np.where(distinct, (bank_of or (lambda c: place(c, banks)[0]))(np.maximum(chunks, 0)), banks)
    return np.maximum(np.stack([(bank == b).sum(axis=-1) for b in range(banks)], axis=-1).max(axis=-1), 1)

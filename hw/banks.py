"""The buffers' bank rule, defined once. ABUF and WBUF are cut into chunks of `chunk` words
(ArchConfig.buffer_chunk_words, a power of two), and chunk c is row c div banks of memory c mod banks
(ArchConfig.buffer_banks), so the map repeats every chunk x banks words. hw/core/buffers.py builds the
memories that way; the DMA's crossbar, the matrix unit's bias read, the cycle model, the bank-conflict replay
and the testbenches place words with these functions. Each takes ints, NumPy arrays and Amaranth values alike."""
from __future__ import annotations

import numpy as np

from ringgpt.hw.intmath import log2


def chunk_of(word, chunk: int):
    """The chunk holding buffer word `word`."""
    return word >> log2(chunk)


def place(chunk_index, banks: int) -> tuple:
    """(memory, row) of chunk `chunk_index`."""
    return chunk_index % banks, chunk_index // banks


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

"""ABUF's shared reads against the tile ports (hw/core/buffers.py, BankedBuffer._reads): each cycle a memory serves
the shared read granted to it first, and a tile port's chunk only when no shared read takes the memory. The DMA
unit's one ABUF read (hw/core/dma.py) takes a memory in every cycle of a STORE from ABUF (a beat a cycle, or a word
a cycle transposed: `_store_reads`) and of an on-chip copy's reads (a chunk a cycle); meanwhile a vector or matrix
instruction whose next operand chunk lies in the memory being read waits, frozen (`blocked_cycles`). The units'
own costs (costs.instruction_cost, their bank stalls alone) leave these waits out; the schedule adds them.
"""
from __future__ import annotations

import functools

import numpy as np

from ringgpt.hw.banks import memory_of
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.timing import PortTiming
from ringgpt.hw.intmath import ceil_div
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit, weight_words
from ringgpt.hw.resolved import Resolved

from .stalls import _beat_times, vector_operands
from .timing import unit_timing

READ_START = 2
"""Cycles from a unit's take of an instruction to its first buffer read (IDLE takes it, CHECK, RUN reads)."""
STORE_READ_START = READ_START + PortTiming.request_cycles
"""Cycles from the DMA unit's take of a STORE to its first ABUF read: RUN offers the first job, which reaches the
engine's burst request `request_cycles` later, and the engine reads the beat's words as it queues the burst."""


def _reads(times, masks) -> tuple:
    """(times, masks) as flat int64 arrays in the order of `times`."""
    times, masks = np.asarray(times, np.int64).ravel(), np.asarray(masks, np.int64).ravel()
    order = np.argsort(times, kind="stable")
    return times[order], masks[order]


def _masks(first, last, cfg: ArchConfig) -> np.ndarray:
    """The memories (a bit mask) of reads whose words run from `first` to `last` (word addresses)."""
    C, banks = cfg.buffer_chunk_words, cfg.buffer_banks
    first, last = np.asarray(first, np.int64), np.asarray(last, np.int64)
    return (np.left_shift(1, memory_of(first, C, banks))
            | np.left_shift(1, memory_of(last, C, banks))).astype(np.int64)


def reads_abuf(r: Resolved) -> bool:
    """Whether a DMA instruction reads ABUF through the unit's one ABUF read (a STORE from ABUF, an on-chip copy)."""
    return r.op in (Opcode.LOAD, Opcode.STORE) and r.src1[0] is Space.ABUF and r.rows > 0 and r.n > 0


def reads_tiles(r: Resolved) -> bool:
    """Whether a vector instruction, or a MATMUL or MASKED_QK with its x in ABUF, reads ABUF through a tile port."""
    return r.rows > 0 and r.n > 0 and (OPCODES[r.op].unit is Unit.VECTOR or (
        r.op in (Opcode.MATMUL, Opcode.MASKED_QK) and r.src1[0] is Space.ABUF))


@functools.lru_cache(maxsize=1024)
def abuf_reads(r: Resolved, cfg: ArchConfig):
    """(cycles from the DMA unit's take, memories as a bit mask) of each read of an instruction that reads_abuf
    through the unit's one ABUF read (`DMAUnit.read_words` wide: it claims the memories of both chunks its words
    could span unless it starts a chunk), in order: a STORE, one beat a cycle, each read at the ABUF word of the
    beat's lane 0 (transposed: a job, so a read, a word); an on-chip copy, one chunk of vector_width words a cycle
    (transposed: the tile's fill reads, one source row each, the drains between tiles reading nothing;
    DMATiming.steps)."""
    rows, n, base, stride = r.rows, r.n, r.src1[1], r.src1_stride
    transpose, wide = bool(r.flags.transpose), max(cfg.vector_width, cfg.beat_words) - 1
    if r.op is Opcode.STORE:
        B, x0, x_stride = cfg.beat_words, r.dst[1], r.dst_stride
        if transpose:       # a job a word: word u of row v (u outer) to off-chip word x0 + u * x_stride + v
            u, v = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(rows), indexing="ij"))
            first = base + u + v * stride - (x0 + u * x_stride + v) % B
        else:               # each row's beats, at the off-chip beats' lane 0
            x = x0 + np.arange(rows, dtype=np.int64) * x_stride
            delta = base + np.arange(rows, dtype=np.int64) * stride - x
            first = np.concatenate([np.arange(a // B * B, a + n, B) + d for a, d in zip(x.tolist(), delta.tolist())])
        return _reads(STORE_READ_START + np.arange(first.size), _masks(first, first + wide, cfg))
    P = cfg.vector_width
    if not transpose:       # rows x chunks steps, a chunk of P words each
        k, t = np.meshgrid(np.arange(rows), np.arange(ceil_div(n, P)), indexing="ij")
        first = (base + k * stride + t * P).ravel()
        return _reads(READ_START + np.arange(first.size), _masks(first, first + wide, cfg))
    times, firsts, now = [], [], READ_START
    for r0 in range(0, rows, P):
        for c0 in range(0, n, P):
            R, C = min(P, rows - r0), min(P, n - c0)
            times.extend(range(now, now + R))
            firsts.extend(base + (r0 + i) * stride + c0 for i in range(R))
            now += R + 1 + C
    first = np.asarray(firsts, np.int64)
    return _reads(times, _masks(first, first + wide, cfg))


@functools.lru_cache(maxsize=1024)
def tile_steps(r: Resolved, cfg: ArchConfig):
    """(cycles from the unit's take, memories as a bit mask) of the ABUF reads of a vector instruction's issue steps
    (its ABUF operands, VectorTiming.step_words a step) or of a MATMUL's or MASKED_QK's beats (its x tile, as
    stalls._beat_times issues them, read only where it differs from the previous beat's: hw/core/matrix.py keeps
    it), in order, of an instruction that reads_tiles."""
    if OPCODES[r.op].unit is Unit.VECTOR:
        t = unit_timing(cfg)["vector"]
        step = t["step"][r.op]
        chunks, loop = ceil_div(r.n, step), t["loop"]
        rows, chunk = np.meshgrid(np.arange(r.rows), np.arange(chunks), indexing="ij")
        if OPCODES[r.op].reduction == "sum" and r.rows < loop:      # each round of the rows waits for the loop
            times = chunk * loop + rows
        elif OPCODES[r.op].reduction == "sum":
            times = chunk * r.rows + rows
        else:
            times = rows * chunks + chunk
        masks = 0
        for address, stride, scalar in vector_operands(r, cfg):
            first = address + rows * stride + (0 if scalar else chunk * step)
            masks = masks | _masks(first, first, cfg)
        return _reads(READ_START + times, np.broadcast_to(masks, times.shape))
    W = cfg.mac_width
    int8 = bool(r.flags.int8)
    words = 2 * W if int8 else W                                    # the x words a beat multiplies
    groups, tiles = ceil_div(r.n, cfg.mpu_lanes), ceil_div(weight_words(r.k, int8), W)
    issued = _beat_times(r.rows * groups, tiles, cfg)                # [pair, tile]
    pair, tile = np.meshgrid(np.arange(r.rows * groups), np.arange(tiles), indexing="ij")
    first = r.src1[1] + (pair // groups) * r.src1_stride + tile * words
    order = np.argsort(issued.ravel(), kind="stable")
    issued, first = issued.ravel()[order], first.ravel()[order]
    read = np.ones(first.size, bool)
    read[1:] = first[1:] != first[:-1]
    return _reads(READ_START + issued[read], _masks(first[read], first[read] + words - 1, cfg))


def blocked_cycles(start: int, r: Resolved, readers: list, cfg: ArchConfig) -> int:
    """Cycles the tile reads of `r` (tile_steps, from its unit's take at `start`) wait for `readers` (each (the DMA
    unit's take of it, a DMA instruction that reads_abuf)): each cycle a step is served the memories it still
    needs that no reader takes (the tile port keeps what it was given), and it waits until it has them all, every
    later step with it (the unit is frozen). The instructions' card does not enter; remembered by the
    instructions and their offsets (a model's layers meet alike)."""
    victim = r._replace(card=0)
    key = (victim, cfg, tuple((origin - start, reader._replace(card=0)) for origin, reader in readers))
    if key not in _BLOCKED:
        if len(_BLOCKED) >= _BLOCKED_LIMIT:
            _BLOCKED.clear()
        _BLOCKED[key] = _blocked(victim, [(offset, reader) for offset, reader in key[2]], cfg)
    return _BLOCKED[key]


_BLOCKED: dict = {}
_BLOCKED_LIMIT = 1 << 14


def _blocked(r: Resolved, readers: list, cfg: ArchConfig) -> int:
    """blocked_cycles of `r` taken at cycle 0, its readers' takes relative to it: the steps replayed against the
    memories the readers take in each cycle of a window from the first step the readers can meet on (the DMA unit
    runs one instruction at a time, so no two readers read in one cycle)."""
    times, masks = tile_steps(r, cfg)
    reads = [(origin, *abuf_reads(reader, cfg)) for origin, reader in readers]
    first = max(int(times[0]), min(origin + int(t[0]) for origin, t, _ in reads))
    last = max(origin + int(t[-1]) + 1 for origin, t, _ in reads)       # nothing is read from here on
    k = np.searchsorted(times, first)      # the steps before the window wait for nothing
    margin = 1024
    while first < last:
        end = min(last, int(times[-1]) + 1 + margin)
        taken = np.zeros(end - first, np.int64)
        for origin, read_times, read_masks in reads:
            a, b = np.searchsorted(read_times, [first - origin, end - origin])
            taken[read_times[a:b] + (origin - first)] |= read_masks[a:b]
        shift = _replay(times[k:] - first, masks[k:], taken, open_ended=end < last)
        if shift is not None:
            return shift
        margin *= 8
    return 0


def _replay(steps: np.ndarray, masks: np.ndarray, taken: np.ndarray, open_ended: bool):
    """The shift of the last of `steps` (cycles from the window's start, each needing the memories `masks`) when
    each waits, and every later one with it, until it has been served its memories: each cycle it is given those
    that `taken` (the memories read in each cycle of the window; none after it) leaves free. None when a wait runs
    past an `open_ended` window (reads follow it)."""
    end = taken.size
    inside = np.flatnonzero(steps < end)
    if not (taken[steps[inside]] & masks[inside]).any():        # nothing in the way at the steps' own cycles
        return None if open_ended and inside.size < steps.size else 0
    taken, shift = taken.tolist(), 0
    for when, pending in zip(steps.tolist(), masks.tolist()):
        cycle = when + shift
        if cycle >= end:
            return None if open_ended else shift
        pending &= taken[cycle]
        while pending:
            cycle += 1
            if cycle >= end:
                if open_ended:
                    return None
                break
            pending &= taken[cycle]
        shift = cycle - when
    return shift

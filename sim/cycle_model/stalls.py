"""Bank stalls: the cycles the matrix and vector units stall while their tiles share a buffer memory's read port
(hw/banks.py's rule, hw/core/buffers.py's TileReadPort), and a MASKED_QK's two writes a cycle into ABUF."""
from __future__ import annotations

import functools

import numpy as np

from ringgpt.hw.intmath import ceil_div
from ringgpt.hw.banks import memory_of, period, tile_read_cycles
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Opcode, Space, weight_words
from ringgpt.hw.resolved import Resolved

from .timing import unit_timing


def weight_beat_cycles(base: int, stride: int, n: int, k: int, cfg: ArchConfig, banks: int | None = None,
                       bank_of=None) -> np.ndarray:
    """Cycles of each beat (column group g, tile t) of a MATMUL's or MASKED_QK's weight reads (hw/core/matrix.py):
    lane l reads mac_width words at base + (g * lanes + l) * stride + t * mac_width for the columns below n,
    `banks.tile_read_cycles` over the config's memories (or `banks` and `bank_of`, for comparisons)."""
    L, W = cfg.mpu_lanes, cfg.mac_width
    g, t, lane = np.meshgrid(np.arange(ceil_div(n, L)), np.arange(ceil_div(k, W)), np.arange(L), indexing="ij")
    column = g * L + lane
    return tile_read_cycles(base + column * stride + t * W, column < n, W, cfg.buffer_chunk_words,
                            banks or cfg.buffer_banks, bank_of)


def matrix_stall_cycles(r: Resolved, cfg: ArchConfig) -> int:
    """Cycles the matrix unit stalls while a MATMUL's or MASKED_QK's tiles are read and its results written
    (hw/core/matrix.py), alone on the buffers: beat (row, column group g, tile t) reads, as lanes of WBUF's
    TileReadPort, its weight tiles (weight_beat_cycles' lanes) and, at the pair's tile `_bias_tiles` chooses,
    the MATMUL's bias (mpu_lanes words at aux + g * mpu_lanes), and takes their tile_read_cycles; its x tile,
    alone in ABUF's TileReadPort, never stalls (its two chunks lie in two memories). A MASKED_QK also writes each row's maximum
    (aux) beside its results (dst), through ABUF's one unit write a cycle (hw/core/buffers.py): where the two fall
    in one cycle, the second waits a cycle (`_write_cycles`). The unit is frozen for every cycle either needs
    beyond one. INT8 weights (the int8 flag): a lane's tile is the same buffer row, of 2 x mac_width weights (half
    the beats: weight_words of k), its activations two whole memory rows, and the pair's column scales (mpu_lanes
    words at aux + aux_stride + g * mpu_lanes) are read as the bias is, a lane of their own, at the tile
    `_bias_tiles` chooses for them."""
    has_bias = r.op is Opcode.MATMUL and r.aux[0] is not Space.NONE
    aux = ([r.aux[1]] if has_bias else []) + ([r.aux[1] + r.aux_stride] if r.flags.int8 else [])
    down = _periods_below([r.src2[1]] + aux, cfg)   # moved down together
    writes = r.op is Opcode.MASKED_QK          # the results and the row maxima
    rows = r.rows if writes else 1             # without them every row stalls alike
    stalls = _matrix_stalls((r.src2[1] - down, r.src2_stride), tuple(a - down for a in aux), writes, rows,
                            r.n, weight_words(r.k, bool(r.flags.int8)), cfg)
    return stalls if writes else r.rows * stalls


@functools.lru_cache(maxsize=4096)
def _matrix_stalls(weights: tuple, aux: tuple, writes: bool, rows: int, n: int, k: int,
                   cfg: ArchConfig) -> int:
    """matrix_stall_cycles of `rows` rows: the weights at (address, column stride), columns of k words, the bias's
    and the scales' addresses (`aux`: none, the bias, or the bias and the scales); `writes`: a MASKED_QK's results
    and row maxima."""
    L, W = cfg.mpu_lanes, cfg.mac_width
    groups, tiles = ceil_div(n, L), ceil_div(k, W)
    _, g, t, lane = np.meshgrid(np.arange(rows), np.arange(groups), np.arange(tiles), np.arange(L), indexing="ij")
    one = (rows, groups, tiles, 1)
    column = g * L + lane
    starts, enabled, words = [weights[0] + column * weights[1] + t * W], [column < n], [W] * L
    for address in aux:
        starts.append(np.broadcast_to(address + g[..., :1] * L, one))
        enabled.append(t[..., :1] == _bias_tiles(weights, address, groups, tiles, cfg)[g[..., :1]])
        words.append(L)
    cycles = tile_read_cycles(np.concatenate(starts, axis=-1), np.concatenate(enabled, axis=-1), np.array(words),
                              cfg.buffer_chunk_words, cfg.buffer_banks)
    if not writes:
        return int((cycles - 1).sum())
    issued = _beat_times(rows * groups, tiles, cfg)           # each beat's cycle, the unit never frozen
    need = np.ones(int(issued.max()) + 1, np.int64)
    need[issued.ravel()] = cycles.reshape(rows * groups, tiles).ravel()
    write_need = _write_cycles(issued[:, -1], rows, groups, cfg)
    size = max(len(need), len(write_need))
    need, write_need = (np.pad(a, (0, size - len(a)), constant_values=1) for a in (need, write_need))
    return int((np.maximum(need, write_need) - 1).sum())


def _bias_tiles(weights: tuple, bias: int, groups: int, tiles: int, cfg: ArchConfig) -> np.ndarray:
    """The tile at which each column group's pairs read their bias (hw/core/matrix.py): the first whose weight
    lanes leave the bias's (first) memory free, that is whose lane mpu_lanes, one past the last, would fall in
    it, else the last tile."""
    L, C, P = cfg.mpu_lanes, cfg.buffer_chunk_words, cfg.buffer_banks
    g, t = np.meshgrid(np.arange(groups), np.arange(tiles), indexing="ij")
    free = memory_of(weights[0] + (g * L + L) * weights[1] + t * cfg.mac_width, C, P)
    match = free == memory_of(bias + g * L, C, P)
    return np.where(match.any(axis=1), match.argmax(axis=1), tiles - 1)


def _beat_times(pairs: int, tiles: int, cfg: ArchConfig) -> np.ndarray:
    """The cycle (from the first beat) at which the matrix unit issues beat (pair, tile), never frozen: sets of
    loop_latency pairs (all remaining ones when fewer than twice that remain), each tile a round of max(set,
    loop_latency) cycles with one beat per pair of the set."""
    loop = unit_timing(cfg)["matrix"]["loop"]
    issued = np.zeros((pairs, tiles), np.int64)
    time = begin = 0
    while begin < pairs:
        stop = pairs if pairs - begin < 2 * loop else begin + loop
        rounds = max(stop - begin, loop)
        issued[begin:stop] = time + np.arange(tiles)[None, :] * rounds + np.arange(stop - begin)[:, None]
        time, begin = time + tiles * rounds, stop
    return issued


def _write_cycles(last_beats: np.ndarray, rows: int, groups: int, cfg: ArchConfig) -> np.ndarray:
    """Cycles a MASKED_QK's writes need at each cycle (from its first beat): pair p's results `latency` after its
    last beat, row r's maximum `row_max` after its last pair's results; 2 where the two fall in one cycle (ABUF
    takes one unit write a cycle), else 1."""
    timing = unit_timing(cfg)["matrix"]
    results = last_beats + timing["latency"]
    maxima = results[np.arange(rows) * groups + groups - 1] + timing["row_max"]
    need = np.ones(int(max(results.max(), maxima.max())) + 1, np.int64)
    need[maxima[np.isin(maxima, results)]] = 2
    return need


@functools.lru_cache(maxsize=4096)
def vector_stall_cycles(rows: int, n: int, operands: tuple, cfg: ArchConfig, step: int) -> int:
    """Cycles the vector unit stalls while its operands are read (hw/core/vector.py): for each step t of each row
    r (`step` elements: VectorTiming.step_words), its ABUF operands (`operands`: (address,
    stride, row scalar) of src1 and of src2 and aux when in ABUF) share one TileReadPort, vector_width words at
    address + r * stride + t * step, of which the step's `step` words, within one memory row (the ISA's rule,
    hw/resolved.misaligned_vector), are read (a row scalar, or every operand with n = 1: its one word at
    address + r * stride); the sum of tile_read_cycles - 1."""
    if len(operands) < 2:
        return 0
    r, t = np.meshgrid(np.arange(rows), np.arange(ceil_div(n, step)), indexing="ij")
    starts = np.stack([base + r * stride + (0 if scalar else t * step) for base, stride, scalar in operands], axis=-1)
    words = np.array([1 if scalar or n == 1 else step for _, _, scalar in operands])
    cycles = tile_read_cycles(starts, np.ones(starts.shape, bool), words, cfg.buffer_chunk_words, cfg.buffer_banks)
    return int((cycles - 1).sum())


def vector_operands(r: Resolved, cfg: ArchConfig) -> tuple:
    """The ABUF operands a vector instruction reads, as vector_stall_cycles takes them: (address, stride, row
    scalar), the addresses moved down together (_periods_below)."""
    out = [(r.src1[1], r.src1_stride, False)]
    for name, flag in (("src2", "src2_row_scalar"), ("aux", "aux_row_scalar")):
        space, address = getattr(r, name)
        if space is Space.ABUF:
            out.append((address, getattr(r, f"{name}_stride"), bool(getattr(r.flags, flag, 0))))
    down = _periods_below([address for address, _, _ in out], cfg)
    return tuple((address - down, stride, scalar) for address, stride, scalar in out)


def _periods_below(addresses: list, cfg: ArchConfig) -> int:
    """The whole periods of the buffer memories (chunk x banks words) below the lowest of `addresses`: moving
    reads of one buffer down by them together keeps each chunk's memory and which chunks are the same."""
    step = period(cfg.buffer_chunk_words, cfg.buffer_banks)
    return min(addresses) // step * step

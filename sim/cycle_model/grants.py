"""The DMA engines' waits for the buffers' write ports (hw/core/port_engine.py, PortEngine; hw/core/dma.py,
DMAUnit._row_writes): the hbm_channels engines of an off-chip LOAD into ABUF or WBUF merge their beats into whole
rows and share one write port per buffer memory, each memory taking one row a cycle, the engines behind the leader
first. When two engines' rows fall in one memory in the same cycle, one waits with its beat in its register, and
its port stops. `grant_stall_cycles` is what that adds to a transfer's busy cycles in the cycle model
(sim/cycle_model/hbm.py): the replay of every engine's rows (`engine_beats`) granted as the RTL grants them
(`grant_cycles`), against each engine's replay alone (`transfer_grants`), with every engine fed at the rate its
memory serves it (one beat a cycle from the testbench's AxiRams; the HBM's sustained share on a board).
sim/bank_conflicts.py counts the same over whole programs. `grant_cycles` is the replay's definition; a compiled
kernel of it (hw/native.py's build; tests/test_cycle_model_grants.py checks them equal) runs it where a C compiler
is there.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from ringgpt.hw import hbm, native
from ringgpt.hw.banks import memory_of, period
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Opcode, Space
from ringgpt.hw.resolved import Resolved

def engine_beats(cfg, rows: int, n: int, x0: int, x_stride: int, b0: int, b_stride: int, write: bool) -> list:
    """For each HBM engine, (asks, jobs): the memories (a bit mask) each of its beats asks for, in order, and the job
    of each, for a transfer of `rows` jobs of `n` words, job i at HBM word x0 + i * x_stride and buffer word
    b0 + i * b_stride. A STORE beat asks for the engines' one store read (bit `buffer_banks`: whatever chunks it
    reads); a LOAD beat (in one chunk: the ISA's beat rule, hw/resolved.misaligned_transfer) writes its chunk when it
    fills it to its last word, or where the job's words end in the beat or the beat ends an interleave granule
    (PortEngine._rows), nothing otherwise (its words wait for the next beat)."""
    B, K, banks, G = cfg.beat_words, cfg.buffer_chunk_words, cfg.buffer_banks, cfg.hbm_interleave_words
    lo = x0 + x_stride * np.arange(rows, dtype=np.int64)
    delta = b0 + b_stride * np.arange(rows, dtype=np.int64) - lo
    out = []
    for channel in range(cfg.hbm_channels):
        llo, lhi = hbm.local_range(channel, lo, lo + n, cfg)
        asks, jobs = [], []
        for job in np.flatnonzero(llo < lhi):
            beat = np.arange(llo[job] // B * B, lhi[job], B)
            first, last = np.maximum(beat, llo[job]), np.minimum(beat + B, lhi[job]) - 1
            start = hbm.hbm_word(channel, first, cfg) + delta[job]
            end = start + (last - first)
            if write:
                ends = (lhi[job] - beat <= B) | ((beat + B) % G == 0)
                full = (end % K == K - 1) | ends
                asks.extend(np.where(full, 1 << memory_of(start, K, banks), 0).tolist())
            else:
                asks.extend([1 << banks] * len(beat))
            jobs.extend([int(job)] * len(beat))
        out.append((asks, jobs))
    return out


def grant_cycles(requests: list, rate: float, *, jobs: list | None = None, backlog: float = 4.0) -> int:
    """Cycles until every engine's beats are granted: each cycle an engine gains `rate` beats from its memory (up
    to `backlog` waiting) and holds its next beat in its stage until granted (a beat asking for no memory is
    taken at once), a beat of job j (`jobs`, parallel to `requests`; default 0) no earlier than cycle j + 1 (the
    unit issues a job a cycle); grants go first to the engines that moved fewer beats than the leader (`urgent`),
    then to the rest, each class in engine order, unless a grant before took one of the beat's memories."""
    engines = len(requests)
    jobs = jobs or [[0] * len(asks) for asks in requests]
    index, credit, stage = [0] * engines, [0.0] * engines, [0] * engines
    left, cycles = sum(len(asks) for asks in requests), 0
    while left or any(stage):
        cycles += 1
        moved = [index[e] - (stage[e] != 0) for e in range(engines)]
        leader, taken = max(moved), 0
        for e in sorted(range(engines), key=lambda e: moved[e] == leader):    # stable: engine order in a class
            if stage[e] and not stage[e] & taken:
                taken |= stage[e]
                stage[e] = 0
        for e, asks in enumerate(requests):
            credit[e] = min(credit[e] + rate, backlog)
            if index[e] < len(asks) and credit[e] >= 1.0 and not stage[e] and jobs[e][index[e]] < cycles:
                stage[e] = asks[index[e]]
                index[e] += 1
                credit[e] -= 1.0
                left -= 1
    return cycles


def feed_rate(cfg: ArchConfig) -> float:
    """Beats per cycle each engine's memory gives it on a long stream: the HBM's sustained bytes per cycle shared
    by the channels, at most one beat a cycle."""
    return min(1.0, cfg.hbm_bytes_per_cycle / (cfg.hbm_channels * 2 * cfg.beat_words))


def grant_stall_cycles(r: Resolved, cfg: ArchConfig) -> int:
    """Cycles the shared write ports add to an off-chip LOAD into ABUF or WBUF (0 for anything else: a STORE's
    beats are read one per cycle in all already, DMATiming._serve; a transposed LOAD's go through the tile)."""
    if r.op is not Opcode.LOAD or r.flags.transpose or not (r.rows and r.n) or r.src1[0] is not Space.HBM:
        return 0
    return transfer_grants(cfg, r.rows, r.n, r.src1[1], r.src1_stride, r.dst[1], r.dst_stride, True, feed_rate(cfg))[1]


def transfer_grants(cfg: ArchConfig, rows: int, n: int, x0: int, x_stride: int, b0: int, b_stride: int, write: bool,
                    rate: float) -> tuple:
    """(cycles, waits) of a transfer between HBM and a buffer (engine_beats' arguments) with every engine fed
    `rate` beats a cycle: the cycles of its slowest engine alone, and what the grants add to them. Remembered by
    the addresses modulo the HBM map's period (hbm_channels squared granules) and the buffers' (hw/banks.period)."""
    period_x = cfg.hbm_channels ** 2 * cfg.hbm_interleave_words
    return _grants(cfg, rows, n, x0 % period_x, x_stride, b0 % period(cfg.buffer_chunk_words, cfg.buffer_banks),
                   b_stride, write, rate)


@functools.lru_cache(maxsize=1 << 12)
def _grants(cfg: ArchConfig, rows: int, n: int, x0: int, x_stride: int, b0: int, b_stride: int, write: bool,
            rate: float) -> tuple:
    beats = [(asks, jobs) for asks, jobs in engine_beats(cfg, rows, n, x0, x_stride, b0, b_stride, write) if asks]
    if not beats:
        return 0, 0
    alone = max(fast_grant_cycles([asks], [jobs], rate) for asks, jobs in beats)
    if len(beats) == 1:     # (an idle engine never asks, and the leader is never behind it)
        return alone, 0
    return alone, fast_grant_cycles([a for a, _ in beats], [j for _, j in beats], rate) - alone


_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>

/* grants.grant_cycles (conflicts on, its default backlog passed in): engine e's asks are asks[offsets[e]] ..
   asks[offsets[e + 1] - 1], their jobs at the same places of jobs. Returns the cycles, or -1 when out of memory. */
int64_t grant_cycles(const int64_t *asks, const int64_t *jobs, const int64_t *offsets, int64_t engines, double rate,
                     double backlog) {
    int64_t *index = calloc(engines, sizeof(int64_t)), *stage = calloc(engines, sizeof(int64_t));
    int64_t *moved = calloc(engines, sizeof(int64_t));
    double *credit = calloc(engines, sizeof(double));
    int64_t cycles = -1;
    if (index && stage && moved && credit) {
        int64_t left = offsets[engines] - offsets[0], staged = 0;
        cycles = 0;
        while (left || staged) {
            int64_t leader = INT64_MIN, taken = 0;
            cycles++;
            for (int64_t e = 0; e < engines; e++) {
                moved[e] = index[e] - (stage[e] != 0);
                if (moved[e] > leader) leader = moved[e];
            }
            for (int lead = 0; lead < 2; lead++)      /* the engines behind the leader first, each class in order */
                for (int64_t e = 0; e < engines; e++)
                    if ((moved[e] == leader) == lead && stage[e] && !(stage[e] & taken)) {
                        taken |= stage[e];
                        stage[e] = 0;
                        staged--;
                    }
            for (int64_t e = 0; e < engines; e++) {
                credit[e] = credit[e] + rate < backlog ? credit[e] + rate : backlog;
                if (index[e] < offsets[e + 1] - offsets[e] && credit[e] >= 1.0 && !stage[e]
                    && jobs[offsets[e] + index[e]] < cycles) {
                    stage[e] = asks[offsets[e] + index[e]];
                    staged += stage[e] != 0;
                    index[e]++;
                    credit[e] -= 1.0;
                    left--;
                }
            }
        }
    }
    free(index); free(stage); free(moved); free(credit);
    return cycles;
}
"""


@functools.cache
def _kernel():
    lib = native.build("grants", _SOURCE)
    if lib is not None:
        lib.grant_cycles.restype = ctypes.c_int64
        lib.grant_cycles.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double,
                                     ctypes.c_double]
    return lib


def fast_grant_cycles(requests: list, jobs: list, rate: float) -> int:
    """grant_cycles(requests, rate, jobs=jobs), by the compiled kernel where there is one."""
    lib = _kernel()
    if lib is None:
        return grant_cycles(requests, rate, jobs=jobs)
    asks = np.array([a for r in requests for a in r], dtype=np.int64)
    issued = np.array([j for r in jobs for j in r], dtype=np.int64)
    offsets = np.cumsum([0] + [len(r) for r in requests], dtype=np.int64)
    cycles = lib.grant_cycles(native.address(asks), native.address(issued), native.address(offsets), len(requests),
                              rate, 4.0)
    if cycles < 0:
        raise MemoryError("the grant replay's kernel ran out of memory")
    return int(cycles)

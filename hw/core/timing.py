"""The units' timing in plain Python: their latencies, overheads and busy-cycle formulas, defined once. Each RTL
unit inherits its class here (MatrixUnit from MatrixTiming, ...), and the cycle model builds these classes alone,
so the two read one definition and the model elaborates no hardware."""
from __future__ import annotations

import functools

import numpy as np

from ringgpt.hw import hbm
from ringgpt.hw import numerics as nx
from ringgpt.hw.arith.accumulator import TileAccumulator
from ringgpt.hw.arith.fp16_mul import FP16MulCore
from ringgpt.hw.arith.fp32_add import FP32AddCore
from ringgpt.hw.arith.int8_tile import int8_tile_latency
from ringgpt.hw.arith.mac_tree import mac_tree_latency
from ringgpt.hw.arith.max_tree import max_tree_latency
from ringgpt.hw.arith.special import LATENCY as SPECIAL_LATENCY
from ringgpt.hw.arith.to_fp16 import ToFP16Core
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.intmath import ceil_div
from ringgpt.hw.isa import INSTRUCTION_BITS, INSTRUCTION_BYTES, OPCODES, Opcode, Space

from .axi import AXI_MAX_BURST, AXI_PAGE_BYTES

READ_LATENCY = 1
"""Cycles from a buffer read's address to its data."""
UNIT_OVERHEAD = 4
"""Cycles of a unit's accept, check, drain-detect and done steps."""
TX_QUEUE_LATENCY = 1
"""Cycles from a beat written into the transmit queue to its tvalid (lib.fifo.SyncFIFO)."""
RX_QUEUE_LATENCY = 2
"""Cycles from a beat taken on rx to the receive queue's output (lib.fifo.SyncFIFOBuffered, block RAM)."""
FETCH_BURSTS = 4
"""Bursts fetch keeps in flight when the FIFO is empty: each one is a quarter of the FIFO."""


class MatrixTiming:
    """The matrix unit's pipeline (hw/core/matrix.py): `latency` cycles from a beat's issue to its result's write
    (read, MAC tree, accumulator, bias register, FP16 widen, FP32 add, FP16, GELU), `int8_latency` with INT8 weights
    (the INT8 tile's aligner and lane instead of the MAC tree; the column scale's multiply beside the bias's widening),
    `row_max_latency` more for MASKED_QK's row maximum, `loop_latency` between tiles of one sum."""

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.lanes, self.width = cfg.mpu_lanes, cfg.mac_width
        self.tree_latency = mac_tree_latency(self.width)
        self.loop_latency = FP32AddCore.latency
        self.contexts = 2 * self.loop_latency - 1
        self.post_latency = READ_LATENCY + FP16MulCore.latency + FP32AddCore.latency + ToFP16Core.latency \
            + SPECIAL_LATENCY["gelu"]
        self.latency = READ_LATENCY + self.tree_latency + TileAccumulator.latency + self.post_latency
        self.int8_tree_latency = int8_tile_latency(nx.INT8_TILE_ROWS * self.width)
        self.int8_latency = self.latency - self.tree_latency + self.int8_tree_latency
        self.row_max_latency = max_tree_latency(self.lanes) if self.lanes >= 2 else 0
        self.overhead = UNIT_OVERHEAD


class VectorTiming:
    """The vector unit's pipelines (hw/core/vector.py): `latency` by kind, "elementwise" (read, multiply, add, FP16,
    or a special function padded to the same depth), "sum" (read, MAC tree, accumulator, FP16) for VSUM and VDOT,
    "max" (read, max tree) for VMAX (the keys are OpSpec.reduction's); `loop_latency` between chunks of one sum."""

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.width = V = cfg.vector_width
        self.loop_latency = FP32AddCore.latency
        self.contexts = 2 * self.loop_latency - 1
        self.special_latency = {spec.special: SPECIAL_LATENCY[spec.special] for spec in OPCODES.values() if spec.special}
        arith = FP16MulCore.latency + FP32AddCore.latency + ToFP16Core.latency
        self.elementwise_depth = max([arith] + list(self.special_latency.values()))
        self.tree_latency = mac_tree_latency(V)
        self.max_latency = max_tree_latency(V)
        self.latency = {
            "elementwise": READ_LATENCY + self.elementwise_depth,
            "sum": READ_LATENCY + self.tree_latency + TileAccumulator.latency + ToFP16Core.latency,
            "max": READ_LATENCY + self.max_latency,
        }
        self.overhead = UNIT_OVERHEAD

    def latency_of(self, opcode: Opcode) -> int:
        return self.latency[OPCODES[opcode].reduction or "elementwise"]

    def step_words(self, opcode: Opcode) -> int:
        """Elements of a row an instruction of `opcode` takes per issue step: `special_lanes` for a special
        function (only those lanes have its cores), `vector_width` for every other opcode."""
        return self.cfg.special_lanes if OPCODES[opcode].special else self.width


class PortTiming:
    """One AXI port engine's latencies (hw/core/port_engine.py, PortEngine)."""

    request_cycles = 3
    """Cycles from a job's (the cycle it is offered) to its first burst's handshake: the job queue, the current
    job, the request register."""
    data_latency = 1
    """Cycles from an R handshake to its buffer write (the write register)."""
    fetch_cycles = 2
    """Cycles from a write burst's request register to its first W beat on the bus (ABUF read, W queue)."""

    @classmethod
    def read_cycles(cls, latency: int) -> int:
        """Cycles from a job's to its first word in a buffer, on a memory of first-beat `latency`."""
        return cls.request_cycles + latency + cls.data_latency

    @classmethod
    def write_cycles(cls, latency: int) -> int:
        """Cycles from a job's to the B response of its one-beat write, on a memory answering `latency` cycles
        after the last W beat."""
        return cls.request_cycles + cls.fetch_cycles + latency


class DMATiming:
    """The DMA unit's busy cycles (hw/core/dma.py, DMAUnit): on-chip copies exactly, off-chip transfers as the
    engines serve them alone on the ports."""

    job_start = 1
    """Cycles from CHECK to the first job in the engines' queues (RUN's first cycle emits it)."""

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.width = cfg.vector_width
        self.beat_words = cfg.beat_words
        self.latency = READ_LATENCY + 1
        self.drain_latency = 1
        self.overhead = UNIT_OVERHEAD

    def steps(self, rows: int, n: int, transpose: bool) -> int:
        """Issue steps of an on-chip copy of `rows` x `n` words (see `cycles`)."""
        P = self.width
        chunks = ceil_div(n, P)
        if not transpose:
            return rows * chunks
        groups = ceil_div(rows, P)
        return chunks * (rows + groups) + groups * n

    def cycles(self, rows: int, n: int, transpose: bool) -> int:
        """Busy cycles of a legal on-chip LOAD (`overhead` alone when rows or n is 0: ZERO_DIM).

        Straight copies: one chunk of vector_width (P) words per cycle, rows * ceil(n / P) steps, then
        `latency` (read, write register). Transposed copies go through the P x P tile (`TransposeTile`): for each group
        of R <= P source rows and each chunk of C <= P columns, R fill steps (one source row each), one step
        for the last row to land, and C drain steps (one destination row of R words each), then
        `drain_latency`: about P / 2 words per cycle on full tiles, one destination row per cycle when rows = 1.
        """
        if rows <= 0 or n <= 0:
            return self.overhead
        return self.overhead + self.steps(rows, n, transpose) + (self.drain_latency if transpose else self.latency)

    job_start = 1
    """Cycles from CHECK to the first job in the engines' queues (RUN's first cycle emits it)."""

    def transfer_cycles(self, r, *, latency: int, indices=None) -> int:
        """Estimated busy cycles of a legal off-chip LOAD, STORE or GATHER `r` (hw/resolved.Resolved) with
        nothing else on the ports, on memories whose first beat (R, or B after the last W) comes `latency`
        cycles after the handshake before it and then one beat per cycle. GATHER's table rows are `indices`
        (default 0 .. rows - 1).

        Model: jobs go out one per cycle (transposed STORE: one per word; GATHER: one per two cycles with ABUF
        indices, after the index read with HOST ones); each port serves its beats (hw/hbm.py's map, 4 KiB
        pages, AXI_MAX_BURST-beat bursts) one per cycle, and at most hbm_outstanding bursts per `latency` + 1
        cycles, a STORE's ports one beat per cycle in all (their one ABUF read, `_store_reads`); a read's last beat lands `PortTiming.data_latency` after it arrives, a write is done with the
        B response after its last W beat. A transposed LOAD pays this per tile of up to P x P words, then
        drains the tile's columns one per cycle. Bases are taken as page aligned."""
        P = self.width
        rows, n, transpose = r.rows, r.n, bool(r.flags.transpose)
        if rows <= 0 or n <= 0:
            return self.overhead
        (x_space, x_base), x_stride = (r.dst, r.dst_stride) if r.op is Opcode.STORE else (r.src1, r.src1_stride)
        host = x_space is Space.HOST
        start = self.overhead + self.job_start
        if r.op is Opcode.LOAD and transpose:   # per tile: its jobs, their words in the tile, the drain
            total = self.overhead + self.drain_latency
            for r0 in range(0, rows, P):
                for c0 in range(0, n, P):
                    R, C = min(P, rows - r0), min(P, n - c0)
                    starts = [x_base + (r0 + i) * x_stride + c0 for i in range(R)]
                    total += (self.job_start + self._serve(starts, C, latency, host, jobs=R)
                              + PortTiming.read_cycles(latency) + C)
            return total
        if r.op is Opcode.GATHER:
            table = range(rows) if indices is None else indices
            starts, length = [x_base + int(i) * x_stride for i in table], n
            if r.src2[0] is Space.HOST:     # the index read, then one job a cycle
                start += PortTiming.read_cycles(latency) + 1
                jobs = rows
            else:                           # each index read one cycle before its job
                start += 1
                jobs = 2 * rows - 1
        elif r.op is Opcode.STORE and transpose:
            starts, length, jobs = [x_base + j * x_stride + k for j in range(n) for k in range(rows)], 1, rows * n
        else:
            starts, length, jobs = [x_base + k * x_stride for k in range(rows)], n, rows
        serve = self._serve(starts, length, latency, host, jobs=jobs, serial=r.op is Opcode.STORE)
        if r.op is Opcode.STORE:
            return start + serve + PortTiming.write_cycles(latency)
        return start + serve + PortTiming.read_cycles(latency)

    def _serve(self, starts, length: int, latency: int, host: bool, *, jobs: int, serial: bool = False) -> int:
        """Cycles from the first job's to the last one's, or from the first beat to the last, of the rows
        [start, start + length) (see transfer_cycles); `serial`: the ports' beats one per cycle in all."""
        cfg, B = self.cfg, self.beat_words
        starts = np.asarray(starts, dtype=np.int64)[None, :]
        page_beats = AXI_PAGE_BYTES // (2 * B)
        if host:
            lo, hi = starts, starts + length
        else:   # every port at once: row p of (lo, hi) is port p's channel-local range of each row
            lo, hi = hbm.local_range(np.arange(cfg.hbm_channels)[:, None], starts, starts + length, cfg)
        used = lo < hi
        first, last = lo // B, (hi - 1) // B
        beats = np.where(used, last - first + 1, 0)
        pages = last // page_beats - first // page_beats + 1
        bursts = np.where(used, np.maximum(pages, -(-beats // AXI_MAX_BURST)), 0).sum(axis=1)
        busiest = max(int(beats.sum() if serial else beats.sum(axis=1).max()),
                      max(ceil_div(int(b) * (latency + 1), cfg.hbm_outstanding) for b in bursts.tolist()))
        return max(busiest, jobs) - 1


class RouterTiming:
    """The router's busy cycles (hw/core/router.py) with nothing in its way."""

    def __init__(self, cfg: ArchConfig):
        self.cfg, self.width = cfg, cfg.vector_width
        self.latency = READ_LATENCY + TX_QUEUE_LATENCY
        self.rx_latency = RX_QUEUE_LATENCY + 1
        self.overhead = UNIT_OVERHEAD

    def beats(self, rows: int, n: int) -> int:
        """Payload beats of a rows x n block."""
        return rows * ceil_div(n, self.width)

    def cycles(self, op: Opcode, rows: int, n: int, *, slices: tuple = (), card: int = 0,
               in_place: bool = True) -> int:
        """Busy cycles of a legal instruction with nothing in its way: SEND with `tx` always ready; RECV with its
        block already queued; ALLGATHER on a ring of these routers with direct links, every card accepting it in
        the same cycle (`slices`: (n_c, k_c) of every card, `card`: this one's index). `overhead` alone for
        zero dimensions."""
        if rows <= 0 or (n <= 0 and op is not Opcode.ALLGATHER):
            return self.overhead
        beats = self.beats(rows, n)
        if op is Opcode.SEND:       # post, header, one read per beat, the last beat onto the link
            return self.overhead + 2 + beats + self.latency
        if op is Opcode.RECV:       # header, one beat per cycle
            return self.overhead + 1 + beats
        if len(slices) == 1:        # post, the copy's reads and the last one's data
            return self.overhead + 1 + (beats + READ_LATENCY if beats and not in_place else 0)
        return self._gather_cycles(rows, slices, card, in_place)

    def _gather_cycles(self, rows: int, slices: tuple, card: int, in_place: bool) -> int:
        """ALLGATHER on a ring of len(slices) cards, store and forward, in the cycles of Completion.cycles
        (accept = 1): in step s every card posts the slice of card - s once it holds it and its link is free."""
        cards = len(slices)
        beats = [self.beats(rows, n) for n, _ in slices]
        first_post = 3              # accept, CHECK, then RUN posts the own block
        tx_free, rx_free, drained = [first_post] * cards, [first_post] * cards, [0] * cards
        # an own slice copied (not in place) lands in the write register in these cycles; received beats wait
        copy = [(first_post + 2 + READ_LATENCY, first_post + 1 + READ_LATENCY + b) if b and not in_place else None
                for b in beats]
        received = {}
        for step in range(cards - 1):
            for c in range(cards):
                origin, to = (c - step) % cards, (c + 1) % cards
                b = beats[origin]
                post = tx_free[c] if step == 0 else max(tx_free[c], received[c, origin] + 1)
                header_on_link = post + 1 + TX_QUEUE_LATENCY            # pushed in post + 1
                tx_free[c] = post + 2 + b                               # the header, then b reads
                drained[c] = 1 + (post + 1 + b + self.latency if b else header_on_link)
                header = header_on_link + RX_QUEUE_LATENCY              # at the next card's receive queue output
                body = post + 2 + self.latency + RX_QUEUE_LATENCY       # its first payload beat there
                accept = max(header, rx_free[to])
                end = accept
                if b:
                    start = max(body, accept + 1)
                    window = copy[to]
                    if window and window[0] <= start <= window[1]:
                        start = window[1] + 1
                    end = start + b - 1
                    if window and start < window[0] <= end:
                        end += window[1] - window[0] + 1
                rx_free[to], received[to, origin] = end + 1, end
        last = max(received[card, origin] for origin in range(cards) if origin != card)
        return max(drained[card] + 1, last + 2)


class FetchTiming:
    """Fetch's FIFO and bursts (hw/core/fetch.py): `depth` words (default: hbm_latency_cycles rounded up to a power
    of two), bursts of up to `burst_words` words of `beats_per_word` beats each."""

    def __init__(self, cfg: ArchConfig, depth: int | None = None):
        if INSTRUCTION_BITS % cfg.hbm_port_bits:
            raise ValueError(f"fetch needs hbm_port_bits dividing {INSTRUCTION_BITS}, got {cfg.hbm_port_bits}")
        self.cfg = cfg
        self.beats_per_word = INSTRUCTION_BITS // cfg.hbm_port_bits
        self.depth = depth or 1 << max(FETCH_BURSTS, cfg.hbm_latency_cycles - 1).bit_length()
        self.burst_words = min(self.depth // FETCH_BURSTS, AXI_PAGE_BYTES // INSTRUCTION_BYTES,
                               AXI_MAX_BURST // self.beats_per_word)
        if self.burst_words < 1:
            raise ValueError(f"fetch depth {self.depth} is below {FETCH_BURSTS} words")


@functools.cache
def dma_timing(cfg: ArchConfig) -> DMATiming:
    return DMATiming(cfg)


def onchip_cycles(cfg: ArchConfig, rows: int, n: int, transpose: bool) -> int:
    """Busy cycles of an on-chip LOAD on the DMA unit of `cfg` (what the cycle model charges)."""
    return dma_timing(cfg).cycles(rows, n, bool(transpose))


def transfer_cycles(cfg: ArchConfig, r, *, latency: int | None = None, indices=None) -> int:
    """Estimated busy cycles of an off-chip LOAD, STORE or GATHER on the DMA unit of `cfg` with the ports to
    itself (DMATiming.transfer_cycles; `latency` defaults to cfg.hbm_latency_cycles)."""
    return dma_timing(cfg).transfer_cycles(r, latency=cfg.hbm_latency_cycles if latency is None else latency,
                                           indices=indices)


@functools.cache
def router_timing(cfg: ArchConfig) -> RouterTiming:
    return RouterTiming(cfg)


def router_cycles(cfg: ArchConfig, op: Opcode, rows: int, n: int, **kwargs) -> int:
    """Busy cycles of an uncontended router instruction on the router of `cfg` (RouterTiming.cycles)."""
    return router_timing(cfg).cycles(op, rows, n, **kwargs)

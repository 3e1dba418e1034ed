"""The cycle model: what every instruction costs on the micro-architecture (`instruction_cost`, the
one place every cost formula lives, calibrated against the RTL's cycle counts: docs/rtl-calibration.md), and how
much of that the controller and scoreboard let overlap (`schedule`, the RTL controller's in-order issue with
fetch, unit queues and hazards, all cards jointly). Its input is the functional simulator's trace: each executed
instruction with every register-relative field resolved (`Resolved`). Definitions: docs/cycle-model.md."""
from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ringgpt.hw.intmath import ceil_div
from ringgpt.hw.banks import memory_of, period, tile_read_cycles
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.axi import AXI_PAGE_BYTES
from ringgpt.hw.core.timing import DMATiming, FetchTiming, MatrixTiming, VectorTiming, router_cycles
from ringgpt.hw.hbm import hbm_channel_of
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit
from ringgpt.hw.resolved import Resolved, hazard, scoreboard_ranges


class Cost(NamedTuple):
    unit: Unit
    cycles: int
    """Cycles the unit is busy with the instruction (the RTL's Completion.cycles: from taking it to `done`)."""
    hbm_bytes: int = 0
    ring_bytes: int = 0
    """Bytes this card puts on its outgoing ring link."""
    host_bytes: int = 0



@functools.cache
def unit_timing(cfg: ArchConfig) -> dict:
    """The pipeline depths and fixed overheads of the matrix and vector units of `cfg`, read from the
    units' timing classes (hw/core/timing.py, which the RTL units inherit), not typed into the config."""
    matrix, vector = MatrixTiming(cfg), VectorTiming(cfg)
    return {"matrix": {"latency": matrix.latency, "row_max": matrix.row_max_latency, "overhead": matrix.overhead,
                       "loop": matrix.loop_latency},
            "vector": {"latency": dict(vector.latency), "overhead": vector.overhead, "loop": vector.loop_latency}}


def _issue_cycles(pairs: int, tiles: int, loop: int) -> int:
    """Cycles to issue `tiles` rounds over `pairs` independent sums through an accumulator whose adder
    loop is `loop` cycles: one beat per cycle when pairs >= loop, else each round waits for the loop."""
    if pairs <= 0 or tiles <= 0:
        return 0
    return pairs * tiles if pairs >= loop else (tiles - 1) * loop + pairs


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
    beyond one."""
    has_bias = r.op is Opcode.MATMUL and r.aux[0] is not Space.NONE
    down = _periods_below([r.src2[1]] + ([r.aux[1]] if has_bias else []), cfg)   # moved down together
    writes = r.op is Opcode.MASKED_QK          # the results and the row maxima
    rows = r.rows if writes else 1             # without them every row stalls alike
    stalls = _matrix_stalls((r.src2[1] - down, r.src2_stride), r.aux[1] - down if has_bias else None, writes, rows,
                            r.n, r.k, cfg)
    return stalls if writes else r.rows * stalls


@functools.lru_cache(maxsize=4096)
def _matrix_stalls(weights: tuple, bias: int | None, writes: bool, rows: int, n: int, k: int,
                   cfg: ArchConfig) -> int:
    """matrix_stall_cycles of `rows` rows: the weights at (address, column stride), the bias at its address or
    None; `writes`: a MASKED_QK's results and row maxima."""
    L, W = cfg.mpu_lanes, cfg.mac_width
    groups, tiles = ceil_div(n, L), ceil_div(k, W)
    _, g, t, lane = np.meshgrid(np.arange(rows), np.arange(groups), np.arange(tiles), np.arange(L), indexing="ij")
    one = (rows, groups, tiles, 1)
    column = g * L + lane
    starts, enabled, words = [weights[0] + column * weights[1] + t * W], [column < n], [W] * L
    if bias is not None:
        starts.append(np.broadcast_to(bias + g[..., :1] * L, one))
        enabled.append(t[..., :1] == _bias_tiles(weights, bias, groups, tiles, cfg)[g[..., :1]])
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
def vector_stall_cycles(rows: int, n: int, operands: tuple, cfg: ArchConfig) -> int:
    """Cycles the vector unit stalls while its operands are read (hw/core/vector.py): for each chunk t of
    each row r, its ABUF operands (`operands`: (address, stride, row scalar) of src1 and of src2 and aux
    when in ABUF) share one TileReadPort, vector_width words at address + r * stride + t * vector_width
    (a row scalar: its one word at address + r * stride); the sum of tile_read_cycles - 1."""
    if len(operands) < 2:
        return 0
    V = cfg.vector_width
    r, t = np.meshgrid(np.arange(rows), np.arange(ceil_div(n, V)), indexing="ij")
    starts = np.stack([base + r * stride + (0 if scalar else t * V) for base, stride, scalar in operands], axis=-1)
    words = np.array([1 if scalar else V for _, _, scalar in operands])
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


def instruction_cost(r: Resolved, cfg: ArchConfig) -> Cost:
    """Cycles and bytes of one instruction on its unit, with nothing else running."""
    unit = OPCODES[r.op].unit
    words = r.rows * r.n
    if unit is Unit.CONTROL:
        return Cost(unit, 1)
    if unit is Unit.MATRIX:
        # One beat per cycle: an x tile broadcast to mpu_lanes lanes, each reading a mac_width weight tile;
        # (row, column group) pairs interleaved through the tile accumulator (hw/core/matrix.py); a beat whose
        # weight, x and bias tiles share a buffer memory stalls (matrix_stall_cycles).
        t = unit_timing(cfg)["matrix"]
        issue = _issue_cycles(r.rows * ceil_div(r.n, cfg.mpu_lanes), ceil_div(r.k, cfg.mac_width), t["loop"])
        tail = t["latency"] + (t["row_max"] if r.op is Opcode.MASKED_QK else 0)
        if issue:
            issue += matrix_stall_cycles(r, cfg)
        return Cost(unit, t["overhead"] + (issue + tail if issue else 0))
    if unit is Unit.VECTOR:
        # One chunk of vector_width elements per cycle; a row sum's chunks go through the accumulator loop.
        t = unit_timing(cfg)["vector"]
        chunks = ceil_div(r.n, cfg.vector_width)
        reduction = OPCODES[r.op].reduction
        issue = _issue_cycles(r.rows, chunks, t["loop"]) if reduction == "sum" else r.rows * chunks
        tail = t["latency"][reduction or "elementwise"]
        if issue:   # chunks whose operands share a buffer memory stall (vector_stall_cycles)
            issue += vector_stall_cycles(r.rows, r.n, vector_operands(r, cfg), cfg)
        return Cost(unit, t["overhead"] + (issue + tail if issue else 0))
    if unit is Unit.DMA:
        spaces = (r.dst[0], r.src1[0])
        nbytes = 2 * words
        if Space.HBM in spaces:
            return Cost(unit, dma_cycles(r, cfg), hbm_bytes=nbytes)
        if Space.HOST in spaces:
            return Cost(unit, dma_cycles(r, cfg), host_bytes=nbytes)
        # On chip (ABUF -> ABUF/WBUF): the RTL unit's own count (hw/core/dma.py: straight chunks of vector_width
        # words per cycle; transposed copies through a vector_width x vector_width tile).
        return Cost(unit, _modeled_dma(cfg).cycles(r.rows, r.n, bool(r.flags.transpose)))
    # Router: the RTL unit's own cycles on direct links (hw/core/router.py), and what a board's link adds per hop.
    if r.op is Opcode.ALLGATHER:
        in_place = r.src1 == (r.dst[0], r.dst[1] + r.k) and r.src1_stride == r.dst_stride
        cycles = router_cycles(cfg, r.op, r.rows, r.n, slices=r.slices, card=r.card, in_place=in_place)
        # In step s a card forwards the slice of card (id - s): every slice but its successor's; each step pays
        # the hop and the largest slice's time on the link beyond one beat per cycle.
        largest = r.rows * ceil_div(max(n for n, _ in r.slices), cfg.vector_width)
        sent = 2 * r.rows * (sum(n for n, _ in r.slices) - r.slices[(r.card + 1) % cfg.cards][0])
        return Cost(unit, cycles + (cfg.cards - 1) * (cfg.ring_latency_cycles + link_excess(largest, cfg)),
                    ring_bytes=sent)
    cycles = router_cycles(cfg, r.op, r.rows, r.n)
    if r.op is Opcode.SEND:     # the hop itself is the receiver's wait (schedule)
        return Cost(unit, cycles + link_excess(r.rows * ceil_div(r.n, cfg.vector_width), cfg), ring_bytes=2 * words)
    return Cost(unit, cycles)   # RECV: the block queued at the receiver into ABUF


def link_excess(beats: int, cfg: ArchConfig) -> int:
    """Cycles a block of `beats` payload beats (and its header beat) takes on a ring link of ring_link_gbps beyond
    the router's one beat per cycle (each beat is vector_width words)."""
    sent = 1 + beats
    return max(0, ceil_div(sent * 2 * cfg.vector_width, cfg.ring_bytes_per_cycle) - sent)


# --- DMA: the RTL unit's transfer, served by HBM's pseudo-channels (docs/cycle-model.md "DMA and HBM") ---------

def dma_cycles(r: Resolved, cfg: ArchConfig) -> int:
    """Busy cycles of an off-chip LOAD, STORE or GATHER: the RTL unit's own count (hw/core/dma.py,
    DMATiming.transfer_cycles: job generation, bursts and requests in flight per AXI port, hbm_latency_cycles
    per request) on memories that serve each port no faster than the physical HBM (`hbm_service`) or the host
    link (host_link_gbps) do. GATHER's table rows are taken as consecutive (the indices are data)."""
    return _modeled_dma(cfg).transfer_cycles(r, latency=cfg.hbm_latency_cycles)


_SERVED_LIMIT = 1 << 14
"""Port services one configuration remembers (the keys of long strided transfers are long tuples)."""


@functools.cache
def _modeled_dma(cfg: ArchConfig):
    """DMATiming of `cfg` whose per-port service (DMATiming._serve: one beat per cycle, a STORE's one beat per cycle in
    all, hbm_outstanding requests per latency + 1 cycles, one job per cycle) is bounded below by the memory's own time for the same rows:
    `hbm_service`, or the host buffer's bytes at host_link_gbps. Remembered by the rows' addresses modulo a
    period of the HBM map that keeps every channel's beats, 4 KiB pages and bursts (C x C granules, enough of them
    to move each channel's local addresses by whole pages), so the tiles of transposed LOADs and the layers'
    alike transfers cost one computation."""
    c, g = cfg.hbm_channels, cfg.hbm_interleave_words
    periods = {False: c * c * g * (AXI_PAGE_BYTES // math.gcd(2 * c * g, AXI_PAGE_BYTES)), True: AXI_PAGE_BYTES // 2}
    host_rate = cfg.host_link_gbps * 1e3 / cfg.clock_mhz    # bytes per cycle
    served: dict = {}

    class ModeledDMA(DMATiming):
        def _serve(self, starts, length: int, latency: int, host: bool, *, jobs: int, serial: bool = False) -> int:
            starts = np.asarray(starts, dtype=np.int64)
            period = periods[host]
            key = (tuple((starts - starts.min() // period * period).tolist()), length, latency, host, jobs, serial)
            if key not in served:
                if len(served) >= _SERVED_LIMIT:
                    served.clear()
                engine = super()._serve(np.array(key[0]), length, latency, host, jobs=jobs, serial=serial)
                memory = 2 * starts.size * length / host_rate if host else hbm_service(key[0], length, cfg).cycles
                served[key] = max(engine, math.ceil(memory) - 1)
            return served[key]

    return ModeledDMA(cfg)


class HbmService(NamedTuple):
    """What the pseudo-channels do for a set of rows (arrays indexed by channel)."""
    cycles: float
    """Kernel cycles the slowest channel or port needs."""
    bytes: object
    """Bytes each channel moves, every burst rounded out to whole hbm_access_bytes."""
    bursts: object
    """Bursts each channel serves (a burst: a run of consecutive channel-local addresses)."""
    channel_cycles: object
    port_cycles: object


def hbm_segments(starts, length: int, cfg: ArchConfig):
    """(bytes, bursts) per channel of rows of `length` words starting at word addresses `starts`, in issue order,
    through the ISA's HBM map (hw/hbm.py). Pieces that continue the channel's previous piece merge into one
    burst."""
    g, c = cfg.hbm_interleave_words, cfg.hbm_channels
    starts = np.asarray(starts, dtype=np.int64).ravel()
    zeros = np.zeros(c, dtype=np.int64)
    if length <= 0 or starts.size == 0:
        return zeros, zeros.copy()
    first = starts // g
    count = (starts + length - 1) // g - first + 1
    row = np.repeat(np.arange(starts.size), count)
    granule = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    lo = np.maximum(starts[row], granule * g)
    hi = np.minimum(starts[row] + length, (granule + 1) * g)
    channel = hbm_channel_of(granule, c)
    local_lo = (granule // c) * g + (lo - granule * g)
    local_hi = local_lo + (hi - lo)
    order = np.argsort(channel, kind="stable")
    channel, local_lo, local_hi = channel[order], local_lo[order], local_hi[order]
    new = np.ones(channel.size, dtype=bool)
    new[1:] = (channel[1:] != channel[:-1]) | (local_lo[1:] != local_hi[:-1])
    begin = np.flatnonzero(new)
    end = np.append(begin[1:], channel.size) - 1
    a = cfg.hbm_access_bytes
    rounded = (-(-2 * local_hi[end] // a) - (2 * local_lo[begin]) // a) * a
    burst_channel = channel[begin]
    nbytes = np.bincount(burst_channel, weights=rounded, minlength=c).astype(np.int64)
    bursts = np.bincount(burst_channel, minlength=c).astype(np.int64)
    return nbytes, bursts


def hbm_service(starts, length: int, cfg: ArchConfig) -> HbmService:
    """The cycles HBM itself needs for rows of `length` words at word addresses `starts`: per channel, its bytes
    at the channel's sustained rate (hbm_peak_gbps / hbm_channels x hbm_efficiency) plus hbm_page_miss_ns for
    every burst after its first; per AXI port (hbm_ports), its channels' bytes at the port's width, traffic to a
    channel outside the port's switch group at hbm_crossing_efficiency. The slowest of these."""
    nbytes, bursts = hbm_segments(starts, length, cfg)
    clock = cfg.clock_mhz
    channel_rate = cfg.hbm_peak_gbps / cfg.hbm_channels * cfg.hbm_efficiency * 1e3 / clock  # bytes per cycle
    miss = cfg.hbm_page_miss_ns * clock / 1e3
    channel_cycles = nbytes / channel_rate + np.maximum(bursts - 1, 0) * miss
    ports = cfg.dma_ports
    channels = np.arange(cfg.hbm_channels)
    port = channels % ports
    crossing = (port // cfg.hbm_switch_group) != (channels // cfg.hbm_switch_group)
    weighted = np.where(crossing, nbytes / cfg.hbm_crossing_efficiency, nbytes)
    port_cycles = np.bincount(port, weights=weighted, minlength=ports) / (cfg.hbm_port_bits / 8)
    return HbmService(float(max(channel_cycles.max(), port_cycles.max())), nbytes, bursts, channel_cycles, port_cycles)


_UNIT_CLASS = {Unit.CONTROL: "control", Unit.MATRIX: "matrix", Unit.VECTOR: "vector", Unit.ROUTER: "ring"}


def instruction_class(r: Resolved) -> str:
    """The class a run's busy cycles are broken down by."""
    unit = OPCODES[r.op].unit
    if unit is Unit.DMA:
        spaces = (r.dst[0], r.src1[0])
        return "dma-hbm" if Space.HBM in spaces else "dma-host" if Space.HOST in spaces else "dma-onchip"
    return _UNIT_CLASS[unit]


@dataclass
class CardReport:
    """One card's share of a run."""
    card: int
    cycles: int = 0
    """Cycle at which the card's HALT completed."""
    instructions: int = 0
    busy: dict = field(default_factory=dict)
    """Unit name -> cycles the unit was busy."""
    classes: dict = field(default_factory=dict)
    """Instruction class (see instruction_class) -> busy cycles."""
    opcodes: dict = field(default_factory=dict)
    """Opcode name -> busy cycles."""
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    ring_bytes: int = 0
    host_bytes: int = 0
    timeline: list = field(default_factory=list)
    """(opcode name, issue, start, done) cycles of every executed instruction, in program order."""


@dataclass
class CycleReport:
    """The modeled schedule of one run on every card."""
    clock_mhz: float
    hbm_peak_gbps: float
    cards: list
    cycles: int = 0
    """Cycles from the start until the last card's HALT completed."""

    @property
    def ms(self) -> float:
        return self.cycles / (self.clock_mhz * 1e3)

    @property
    def hbm_bytes(self) -> int:
        return sum(c.hbm_read_bytes + c.hbm_write_bytes for c in self.cards)

    @property
    def slowest(self) -> CardReport:
        return max(self.cards, key=lambda c: c.cycles)

    @property
    def hbm_bound_ms(self) -> float:
        """The HBM bytes read by the busiest card at the physical HBM peak."""
        return max(c.hbm_read_bytes for c in self.cards) / (self.hbm_peak_gbps * 1e6)

    @property
    def hbm_bound_pct(self) -> float:
        """hbm_bound_ms as a percentage of the modeled time (100% = running at the HBM bound)."""
        return 100.0 * self.hbm_bound_ms / self.ms if self.cycles else 0.0

    def summary(self) -> dict:
        slowest = self.slowest
        return {"cycles": self.cycles, "ms": self.ms, "hbm_bytes": self.hbm_bytes,
                "hbm_bound_ms": self.hbm_bound_ms, "hbm_bound_pct": self.hbm_bound_pct,
                "slowest_card": slowest.card, "busy": dict(slowest.busy), "classes": dict(slowest.classes)}


_ALLGATHER, _RECV = "allgather", "recv"


class _Costed(NamedTuple):
    """What the schedule needs of one instruction under one config, derived once (see _costed)."""
    unit: Unit
    slot: int
    """The unit's number (index of the schedule's per-unit state)."""
    kind: str
    """How the controller issues it: "control", "drain" (BARRIER, HALT: once nothing is in flight), _ALLGATHER,
    _RECV, "send" or "unit"."""
    cycles: int
    reads: tuple
    writes: tuple
    spaces: tuple
    """(read, written): the spaces of reads and writes as bit masks (1 << space), to rule out hazards quickly."""
    unit_name: str
    cls: str
    op_name: str
    hbm_read_bytes: int
    hbm_write_bytes: int
    ring_bytes: int
    host_bytes: int


_KINDS = {Opcode.BARRIER: "drain", Opcode.HALT: "drain", Opcode.ALLGATHER: _ALLGATHER, Opcode.RECV: _RECV,
          Opcode.SEND: "send"}

_COSTED: dict = {}
"""id(cfg) -> (cfg, {id(r): (r, _Costed)} of the last run scheduled under cfg), for the _COSTED_CONFIGS configs
scheduled last."""
_COSTED_CONFIGS = 8


_ROUTER_OPS = frozenset(op for op in Opcode if OPCODES[op].unit is Unit.ROUTER)


def _costed(r: Resolved, cfg: ArchConfig, last: dict, now: dict, alike: dict) -> _Costed:
    """instruction_cost, scoreboard_ranges and instruction_class of r under cfg, derived once and remembered from run
    to run: the simulator reuses one Resolved object while an instruction's registers are unchanged, so most
    instructions of a run are the same objects as in the previous run. Keyed by identity: `last` holds the entries of
    the previous run (each holding its r, so the ids stay theirs), `now` gathers this run's (what the next run
    keeps). A new object is derived once per value in the run (`alike`), its card left out but for the router's
    instructions (r.card enters only the router's costs): the cards run alike instructions."""
    key = id(r)
    hit = now.get(key) or last.get(key)
    if hit is None or hit[0] is not r:
        value = r if r.op in _ROUTER_OPS else r._replace(card=0)
        derived = alike.get(value)
        if derived is None:
            derived = alike[value] = _derive(r, cfg)
        hit = (r, derived)
    now[key] = hit
    return hit[1]


def _derive(r: Resolved, cfg: ArchConfig) -> _Costed:
    cost = instruction_cost(r, cfg)
    reads, writes = scoreboard_ranges(r)
    kind = "control" if cost.unit is Unit.CONTROL and r.op not in _KINDS else _KINDS.get(r.op, "unit")
    hbm_read = cost.hbm_bytes if r.src1[0] is Space.HBM else 0
    spaces = tuple(sum({1 << space._value_ for space, _, _ in ranges}) for ranges in (reads, writes))
    return _Costed(cost.unit, cost.unit._value_, kind, cost.cycles, reads, writes, spaces, cost.unit.name,
                   instruction_class(r), r.op.name, hbm_read, cost.hbm_bytes - hbm_read, cost.ring_bytes,
                   cost.host_bytes)


# --- the controller (hw/core/fetch.py, hw/core/controller.py, hw/core/scoreboard.py) -----------------------------

FETCH_REQUEST = 2
"""Cycles from the run's start to fetch's first read request (Fetch: start -> pending -> running, then the
request register); the handshake is the cycle after a request."""
FETCH_TO_DECISION = 3
"""Cycles from a word's last R beat to the controller deciding it: fetch's FIFO (SyncFIFOBuffered, 2) and the
controller's head register (1)."""
QUEUE_TO_UNIT = 2
"""Cycles from an instruction entering its unit's queue (SyncFIFOBuffered) to the unit taking it."""


@functools.cache
def _fetch_shape(cfg: ArchConfig) -> tuple:
    """(beats_per_word, FIFO depth in words, words per burst) of the RTL's fetch unit for `cfg`."""
    fetch = FetchTiming(cfg)
    return fetch.beats_per_word, fetch.depth, fetch.burst_words


class _FetchTimes:
    """When each program word is at the output of fetch's FIFO (hw/core/fetch.py): bursts of `burst` words, each
    requested once the FIFO has room for all of it (a word leaves the FIFO when it moves into the controller's
    head) and at most one request every 2 cycles, answered hbm_latency_cycles after the handshake, one beat per
    cycle on the R channel, beats_per_word beats a word."""

    def __init__(self, cfg: ArchConfig):
        self.beats, self.depth, self.burst = _fetch_shape(cfg)
        self.latency = cfg.hbm_latency_cycles
        self.taken: list = []        # cycle each word moved into the head
        self.request = FETCH_REQUEST  # earliest cycle of the next request
        self.beat_free = 0           # first cycle the R channel is free
        self.first_beat = 0          # first beat of the current burst

    def out(self, word: int) -> int:
        """The cycle word `word` (asked in order) is at the FIFO's output."""
        burst, index = divmod(word, self.burst)
        if index == 0:
            room = (burst + 1) * self.burst - self.depth - 1   # the word whose leaving makes room for this burst
            request = max(self.request, self.taken[room] + 1 if room >= 0 else 0)
            self.request = request + 2
            self.first_beat = max(request + 1 + self.latency, self.beat_free)
            self.beat_free = self.first_beat + self.burst * self.beats
        return self.first_beat + (index + 1) * self.beats - 1 + FETCH_TO_DECISION - 1

    def take(self, cycle: int) -> None:
        self.taken.append(cycle)


def _card_timeline(trace, cfg: ArchConfig, report: CardReport, links: dict, last: dict, now: dict, alike: dict):
    """Schedules one card's trace as its controller issues it. Per word, in program order: it reaches the head
    (fetch), is decided no earlier than the cycle after the previous word; a control instruction takes that
    cycle (BARRIER and HALT once nothing is in flight); a unit instruction enters its unit's queue once no
    instruction of another unit in flight conflicts with it (the scoreboard: RAW, WAR, WAW over scoreboard_ranges)
    and the queue has room; its unit takes it QUEUE_TO_UNIT cycles later, or when done with the previous one;
    it is done `cycles` later (the scoreboard frees it for that cycle's decision). At an ALLGATHER it yields
    (ALLGATHER, the cycle its unit could take it) and receives the joint start; at a RECV it yields (RECV, that
    cycle) and receives the cycle the block is there."""
    fetch = _FetchTimes(cfg)
    decided = -1                    # the previous word's decision cycle
    unit_free = [0] * len(Unit)     # by unit number: when the unit can take its next instruction
    unit_starts = [deque(maxlen=cfg.queue_depth) for _ in Unit]
    inflight = []                   # (done, unit, read spaces, written spaces, reads, writes) of instructions that
    #                                 may still block
    last_done = 0
    outgoing = links[report.card]
    timeline, busy_by_unit, classes, opcodes = report.timeline, report.busy, report.classes, report.opcodes
    hbm_read = hbm_write = ring_bytes = host_bytes = 0
    for word, r in enumerate(trace):
        c = _costed(r, cfg, last, now, alike)
        unit, kind = c.unit, c.kind
        taken = max(fetch.out(word), decided)
        fetch.take(taken)
        decision = taken + 1
        busy = c.cycles
        if kind == "control" or kind == "drain":
            if kind == "drain":
                decision = max(decision, last_done)
            start, done = decision, decision + 1
            if r.op is Opcode.HALT:
                report.cycles = done
        else:
            slot = c.slot
            starts = unit_starts[slot]
            if len(starts) == cfg.queue_depth:
                decision = max(decision, starts[0] + 1)
            inflight = [e for e in inflight if e[0] > decision]
            reads, writes = c.reads, c.writes
            read_spaces, write_spaces = c.spaces
            for done_e, unit_e, read_spaces_e, write_spaces_e, reads_e, writes_e in inflight:
                if (unit_e is not unit and done_e > decision
                        and (write_spaces & (read_spaces_e | write_spaces_e) or read_spaces & write_spaces_e)
                        and hazard(reads, writes, reads_e, writes_e)):
                    decision = done_e
            start = max(decision + QUEUE_TO_UNIT, unit_free[slot])
            ready = start
            if kind == _ALLGATHER or kind == _RECV:
                start = yield kind, start
            done = start + c.cycles
            busy = done - ready     # a router waiting for the other cards is busy (the RTL's counter)
            if kind == "send":
                outgoing.append(done + cfg.ring_latency_cycles)
            starts.append(ready)
            unit_free[slot] = done
            inflight.append((done, unit, read_spaces, write_spaces, reads, writes))
            last_done = max(last_done, done)
        decided = decision
        timeline.append((c.op_name, decision, start, done))
        busy_by_unit[c.unit_name] = busy_by_unit.get(c.unit_name, 0) + busy
        classes[c.cls] = classes.get(c.cls, 0) + busy
        opcodes[c.op_name] = opcodes.get(c.op_name, 0) + busy
        hbm_read += c.hbm_read_bytes
        hbm_write += c.hbm_write_bytes
        ring_bytes += c.ring_bytes
        host_bytes += c.host_bytes
    report.instructions = len(trace)
    report.hbm_read_bytes, report.hbm_write_bytes = hbm_read, hbm_write
    report.ring_bytes, report.host_bytes = ring_bytes, host_bytes


def schedule(traces: list, cfg: ArchConfig) -> CycleReport:
    """The joint schedule of every card's trace (one list of Resolved per card, as executed, each
    ending with HALT). Collectives start on all cards at once, when the last card can start them;
    a RECV starts no earlier than its matching SEND (the same link's next one) is done and its block has
    crossed the hop (ring_latency_cycles)."""
    if len(traces) != cfg.cards:
        raise ValueError(f"schedule needs one trace per card ({cfg.cards}), got {len(traces)}")
    reports = [CardReport(card) for card in range(cfg.cards)]
    links = {card: deque() for card in range(cfg.cards)}
    remembered = _COSTED.pop(id(cfg), None)
    last, now = remembered[1] if remembered is not None and remembered[0] is cfg else {}, {}
    alike: dict = {}
    timelines = [_card_timeline(trace, cfg, report, links, last, now, alike) for trace, report in zip(traces, reports)]
    waiting: dict = {}
    resume: dict = dict.fromkeys(range(cfg.cards))
    while resume:
        for card, value in resume.items():
            try:
                waiting[card] = timelines[card].send(value)
            except StopIteration:
                pass
        resume = {}
        gathering = [c for c, (kind, _) in waiting.items() if kind == _ALLGATHER]
        if len(gathering) == cfg.cards:
            start = max(t for _, t in waiting.values())
            resume = dict.fromkeys(gathering, start)
        for card, (kind, t) in waiting.items():
            incoming = links[(card - 1) % cfg.cards]
            if kind == _RECV and incoming:
                resume[card] = max(t, incoming.popleft())
        for card in resume:
            del waiting[card]
    if waiting:
        raise ValueError("traces cannot be scheduled: " + ", ".join(
            f"card {c} waits in {kind.upper()}" for c, (kind, _) in sorted(waiting.items())))
    _COSTED[id(cfg)] = (cfg, now)
    while len(_COSTED) > _COSTED_CONFIGS:
        del _COSTED[next(iter(_COSTED))]
    report = CycleReport(cfg.clock_mhz, cfg.hbm_peak_gbps, reports)
    report.cycles = max(r.cycles for r in reports)
    return report

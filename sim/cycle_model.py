"""The cycle model: what every instruction costs on the micro-architecture (`instruction_cost`, the
one place every cost formula lives, to be calibrated against RTL cycle counts), and how much of that
the scoreboard lets overlap (`schedule`, a list scheduler over in-order unit queues, all cards
jointly). Its input is the functional simulator's trace: each executed instruction with every
register-relative field resolved (`Resolved`). Definitions: docs/cycle-model.md."""
from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.hbm import hbm_channel_of
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit
from ringgpt.hw.resolved import Resolved, access_ranges


class Cost(NamedTuple):
    unit: Unit
    cycles: int
    hbm_bytes: int = 0
    ring_bytes: int = 0
    """Bytes this card puts on its outgoing ring link."""
    host_bytes: int = 0
    latency: int = 0
    """Cycles from the unit's release until the result is there (HBM: the request latency, overlapped with the
    next instruction's transfer because the ports keep several requests in flight)."""


def _ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b)


@functools.cache
def unit_timing(cfg: ArchConfig) -> dict:
    """The pipeline depths and fixed overheads of the matrix and vector units of `cfg`, read from the
    RTL units' own attributes (hw/core/matrix.py, hw/core/vector.py), not typed into the config."""
    from ringgpt.hw.core.matrix import MatrixUnit
    from ringgpt.hw.core.vector import VectorUnit
    matrix, vector = MatrixUnit(cfg), VectorUnit(cfg)
    for unit in (matrix, vector):
        unit._MustUse__silence = True
    return {"matrix": {"latency": matrix.latency, "row_max": matrix.row_max_latency, "overhead": matrix.overhead,
                       "loop": matrix.loop_latency},
            "vector": {"latency": dict(vector.latency), "overhead": vector.overhead, "loop": vector.loop_latency}}


def _issue_cycles(pairs: int, tiles: int, loop: int) -> int:
    """Cycles to issue `tiles` rounds over `pairs` independent sums through an accumulator whose adder
    loop is `loop` cycles: one beat per cycle when pairs >= loop, else each round waits for the loop."""
    if pairs <= 0 or tiles <= 0:
        return 0
    return pairs * tiles if pairs >= loop else (tiles - 1) * loop + pairs


_VECTOR_SUMS = (Opcode.VSUM, Opcode.VDOT)


def instruction_cost(r: Resolved, cfg: ArchConfig) -> Cost:
    """Cycles and bytes of one instruction on its unit, with nothing else running."""
    unit = OPCODES[r.op].unit
    words = r.rows * r.n
    if unit is Unit.CONTROL:
        return Cost(unit, 1)
    if unit is Unit.MATRIX:
        # One beat per cycle: an x tile broadcast to mpu_lanes lanes, each reading a mac_width weight tile;
        # (row, column group) pairs interleaved through the tile accumulator (hw/core/matrix.py).
        t = unit_timing(cfg)["matrix"]
        issue = _issue_cycles(r.rows * _ceil_div(r.n, cfg.mpu_lanes), _ceil_div(r.k, cfg.mac_width), t["loop"])
        tail = t["latency"] + (t["row_max"] if r.op is Opcode.MASKED_QK else 0)
        return Cost(unit, t["overhead"] + (issue + tail if issue else 0))
    if unit is Unit.VECTOR:
        # One chunk of vector_width elements per cycle; a row sum's chunks go through the accumulator loop.
        t = unit_timing(cfg)["vector"]
        chunks = _ceil_div(r.n, cfg.vector_width)
        if r.op in _VECTOR_SUMS:
            issue, tail = _issue_cycles(r.rows, chunks, t["loop"]), t["latency"]["sum"]
        else:
            issue = r.rows * chunks
            tail = t["latency"]["max" if r.op is Opcode.VMAX else "elementwise"]
        return Cost(unit, t["overhead"] + (issue + tail if issue else 0))
    if unit is Unit.DMA:
        spaces = (r.dst[0], r.src1[0])
        nbytes = 2 * words
        if Space.HBM in spaces:
            return Cost(unit, hbm_transfer(r, cfg).cycles, hbm_bytes=nbytes, latency=cfg.hbm_latency_cycles)
        if Space.HOST in spaces:
            host_bytes_per_cycle = cfg.host_link_gbps * 1e3 / cfg.clock_mhz
            return Cost(unit, _ceil_div(nbytes, host_bytes_per_cycle), host_bytes=nbytes)
        # On chip (ABUF -> ABUF/WBUF): the RTL unit's own count (hw/core/dma.py: straight chunks of vector_width
        # words per cycle; transposed copies through a vector_width x vector_width tile).
        from ringgpt.hw.core.dma import onchip_cycles
        return Cost(unit, onchip_cycles(cfg, r.rows, r.n, r.flags.transpose))
    # Router.
    if r.op is Opcode.ALLGATHER:
        if cfg.cards == 1:
            return Cost(unit, 0)
        largest = 2 * r.rows * max(n for n, _ in r.slices)
        step = cfg.ring_latency_cycles + _ceil_div(largest, cfg.ring_bytes_per_cycle)
        # In step s a card forwards the slice of card (id - s): every slice but its successor's.
        sent = 2 * r.rows * (sum(n for n, _ in r.slices) - r.slices[(r.card + 1) % cfg.cards][0])
        return Cost(unit, (cfg.cards - 1) * step, ring_bytes=sent)
    if r.op is Opcode.SEND:
        return Cost(unit, cfg.ring_latency_cycles + _ceil_div(2 * words, cfg.ring_bytes_per_cycle),
                    ring_bytes=2 * words)
    # RECV: drain the link's receive buffer into the activation buffer.
    return Cost(unit, _ceil_div(words, cfg.vector_width))


# --- HBM: the pseudo-channels one DMA instruction touches (docs/cycle-model.md "HBM") ---------------------------

AXI_MAX_BURST_BYTES = 4096
"""An AXI burst never crosses a 4 KiB boundary: one request moves at most this much."""


class HbmTransfer(NamedTuple):
    """What one DMA instruction does to the HBM pseudo-channels (arrays indexed by channel)."""
    cycles: int
    """Kernel cycles the transfer occupies the DMA unit: the slowest channel, port or request window."""
    bytes: object
    """Bytes each channel moves, every burst rounded out to whole hbm_access_bytes."""
    bursts: object
    """Bursts each channel serves (a burst: a run of consecutive channel-local addresses)."""
    requests: object
    """AXI requests each channel serves (bursts cut at 4 KiB)."""
    channel_cycles: object
    port_cycles: object
    window_cycles: object
    transpose_cycles: int = 0


def hbm_segments(starts, length: int, cfg: ArchConfig, merge: bool = True):
    """(bytes, bursts, requests) per channel of rows of `length` words starting at word addresses `starts`, in
    issue order, through the ISA's HBM map (hw/hbm.py). Pieces that continue the channel's previous piece merge
    into one burst (merge=False: every row piece is a burst of its own, as for a gather)."""
    import numpy as np
    g, c = cfg.hbm_interleave_words, cfg.hbm_channels
    starts = np.asarray(starts, dtype=np.int64).ravel()
    zeros = np.zeros(c, dtype=np.int64)
    if length <= 0 or starts.size == 0:
        return zeros, zeros.copy(), zeros.copy()
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
    if merge:
        new[1:] = (channel[1:] != channel[:-1]) | (local_lo[1:] != local_hi[:-1])
    begin = np.flatnonzero(new)
    end = np.append(begin[1:], channel.size) - 1
    a = cfg.hbm_access_bytes
    rounded = (-(-2 * local_hi[end] // a) - (2 * local_lo[begin]) // a) * a
    burst_channel = channel[begin]
    nbytes = np.bincount(burst_channel, weights=rounded, minlength=c).astype(np.int64)
    bursts = np.bincount(burst_channel, minlength=c).astype(np.int64)
    requests = np.bincount(burst_channel, weights=-(-rounded // AXI_MAX_BURST_BYTES), minlength=c).astype(np.int64)
    return nbytes, bursts, requests


def hbm_transfer(r: Resolved, cfg: ArchConfig) -> HbmTransfer:
    """The cycles a LOAD, STORE or GATHER that touches HBM occupies the DMA unit, from the channels it touches:
    per channel, its bytes at the channel's sustained rate plus hbm_page_miss_ns for every burst after its
    first; per AXI port, its channels' bytes at the port's width (traffic to a channel outside the port's switch
    group at hbm_crossing_efficiency) and its requests, hbm_outstanding at a time, each waiting
    hbm_latency_cycles; a transposed write at dma_transpose_words per cycle. The slowest of these
    sets the cycles (the request latency itself overlaps: Cost.latency)."""
    import numpy as np
    hbm_is_source = r.src1[0] is Space.HBM
    base = r.src1[1] if hbm_is_source else r.dst[1]
    stride = r.src1_stride if hbm_is_source else r.dst_stride
    rows, n = r.rows, r.n
    transpose = _ceil_div(rows * n, cfg.dma_transpose_words) if r.flags.transpose else 0
    if r.flags.transpose and not hbm_is_source:  # a transposed write into HBM: n rows of `rows` words
        rows, n = n, rows
    if r.op is Opcode.GATHER:  # table rows chosen by data: each row its own burst, rows spread as if consecutive
        starts, length, merge = base + np.arange(rows) * max(stride, n), n, False
    elif rows <= 1 or stride == n:  # one contiguous range
        starts, length, merge = [base], rows * n, True
    else:
        starts, length, merge = base + np.arange(rows) * stride, n, True
    nbytes, bursts, requests = hbm_segments(starts, length, cfg, merge)
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
    window_cycles = np.bincount(port, weights=requests, minlength=ports) * cfg.hbm_latency_cycles / cfg.hbm_outstanding
    cycles = math.ceil(max(channel_cycles.max(), port_cycles.max(), window_cycles.max(), transpose)) if rows * n else 0
    return HbmTransfer(cycles, nbytes, bursts, requests, channel_cycles, port_cycles, window_cycles, transpose)


_UNIT_CLASS = {Unit.CONTROL: "control", Unit.MATRIX: "matrix", Unit.VECTOR: "vector", Unit.ROUTER: "ring"}


def instruction_class(r: Resolved) -> str:
    """The class a run's busy cycles are broken down by."""
    unit = OPCODES[r.op].unit
    if unit is Unit.DMA:
        spaces = (r.dst[0], r.src1[0])
        return "dma-hbm" if Space.HBM in spaces else "dma-host" if Space.HOST in spaces else "dma-onchip"
    return _UNIT_CLASS[unit]


def _overlaps(a: tuple, b: tuple) -> bool:
    for space, lo, hi in a:
        for space2, lo2, hi2 in b:
            if space is space2 and lo < hi2 and lo2 < hi:
                return True
    return False


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


_COSTED: dict = {}
_COSTED_LIMIT = 1 << 18


def _costed(r: Resolved, cfg: ArchConfig) -> tuple:
    """(instruction_cost, access_ranges, instruction_class) of r under cfg, remembered: the simulator reuses one
    Resolved object while an instruction's registers are unchanged, so most instructions of a run are the same
    objects as in the previous run. Keyed by identity; the entry holds r and cfg, so the ids stay theirs."""
    key = (id(r), id(cfg))
    hit = _COSTED.get(key)
    if hit is not None and hit[0] is r and hit[1] is cfg:
        return hit[2]
    if len(_COSTED) >= _COSTED_LIMIT:
        _COSTED.clear()
    value = (instruction_cost(r, cfg), access_ranges(r), instruction_class(r))
    _COSTED[key] = (r, cfg, value)
    return value


def _card_timeline(trace, cfg: ArchConfig, report: CardReport, links: dict):
    """Schedules one card's trace in program order. At an ALLGATHER it yields (ALLGATHER, the
    cycle it could start on this card) and receives the joint start; at a RECV it yields (RECV,
    its local start) and receives the start once the matching SEND is scheduled."""
    issue = -1                      # cycle the decoder issued the previous instruction
    unit_free = [0] * len(Unit)     # by unit number: when the unit's last instruction completes
    unit_starts = [deque(maxlen=cfg.queue_depth) for _ in Unit]
    inflight = []                   # (done, reads, writes) of instructions that may still block
    last_done = 0
    outgoing = links[report.card]
    for r in trace:
        cost, (reads, writes), cls = _costed(r, cfg)
        unit = cost.unit
        slot = unit._value_
        report.instructions += 1
        if unit is Unit.CONTROL:
            issue += 1
            if r.op in (Opcode.BARRIER, Opcode.HALT):
                issue = max(issue, last_done)
            start, done = issue, issue + cost.cycles
            last_done = max(last_done, done)
            issue = done - 1
            report.cycles = last_done
        else:
            issue += 1
            starts = unit_starts[slot]
            if len(starts) == cfg.queue_depth:
                issue = max(issue, starts[0])
            inflight = [e for e in inflight if e[0] > issue + 1]
            start = max(issue + 1, unit_free[slot])
            for done_e, reads_e, writes_e in inflight:
                if done_e > start and (_overlaps(writes, writes_e) or _overlaps(writes, reads_e)
                                       or _overlaps(reads, writes_e)):
                    start = done_e
            if r.op is Opcode.ALLGATHER:
                start = yield _ALLGATHER, start
            elif r.op is Opcode.RECV:
                start = yield _RECV, start
            done = start + cost.cycles + cost.latency
            if r.op is Opcode.SEND:
                outgoing.append(done)
            starts.append(start)
            unit_free[slot] = start + cost.cycles
            inflight.append((done, reads, writes))
            last_done = max(last_done, done)
        report.timeline.append((r.op.name, issue, start, done))
        report.busy[unit.name] = report.busy.get(unit.name, 0) + cost.cycles
        report.classes[cls] = report.classes.get(cls, 0) + cost.cycles
        report.opcodes[r.op.name] = report.opcodes.get(r.op.name, 0) + cost.cycles
        if cost.hbm_bytes:
            if r.src1[0] is Space.HBM:
                report.hbm_read_bytes += cost.hbm_bytes
            else:
                report.hbm_write_bytes += cost.hbm_bytes
        report.ring_bytes += cost.ring_bytes
        report.host_bytes += cost.host_bytes


def schedule(traces: list, cfg: ArchConfig) -> CycleReport:
    """The joint schedule of every card's trace (one list of Resolved per card, as executed, each
    ending with HALT). Collectives start on all cards at once, when the last card can start them;
    a RECV starts no earlier than its matching SEND (the same link's next one) completes."""
    if len(traces) != cfg.cards:
        raise ValueError(f"schedule needs one trace per card ({cfg.cards}), got {len(traces)}")
    reports = [CardReport(card) for card in range(cfg.cards)]
    links = {card: deque() for card in range(cfg.cards)}
    timelines = [_card_timeline(trace, cfg, report, links) for trace, report in zip(traces, reports)]
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
    report = CycleReport(cfg.clock_mhz, cfg.hbm_peak_gbps, reports)
    report.cycles = max(r.cycles for r in reports)
    return report

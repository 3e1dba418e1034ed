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
from ringgpt.hw.isa import OPCODES, Flags, Opcode, Space, Unit

NO_OPERAND = (Space.NONE, 0)
ADDRESS_LIMIT = 1 << 32
"""End of every 32-bit word address space (a GATHER may read anywhere above its table base)."""


class Resolved(NamedTuple):
    """One executed instruction with its fields resolved: operands are (space, word address), or
    (Space.IMM, FP16 bits) for a constant; dimensions are plain integers."""
    op: Opcode
    card: int = 0
    rows: int = 0
    n: int = 0
    k: int = 0
    pos: int = 0
    dst: tuple = NO_OPERAND
    src1: tuple = NO_OPERAND
    src2: tuple = NO_OPERAND
    aux: tuple = NO_OPERAND
    dst_stride: int = 0
    src1_stride: int = 0
    src2_stride: int = 0
    aux_stride: int = 0
    flags: Flags = Flags()
    slices: tuple = ()
    """ALLGATHER only: (n_c, k_c) of every card c, in card order."""


class Cost(NamedTuple):
    unit: Unit
    cycles: int
    hbm_bytes: int = 0
    ring_bytes: int = 0
    """Bytes this card puts on its outgoing ring link."""
    host_bytes: int = 0


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
            return Cost(unit, _ceil_div(nbytes, cfg.hbm_bytes_per_cycle) + cfg.hbm_latency_cycles,
                        hbm_bytes=nbytes)
        if Space.HOST in spaces:
            host_bytes_per_cycle = cfg.host_link_gbps * 1e3 / cfg.clock_mhz
            return Cost(unit, _ceil_div(nbytes, host_bytes_per_cycle), host_bytes=nbytes)
        return Cost(unit, r.rows * _ceil_div(r.n, cfg.vector_width))
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


_UNIT_CLASS = {Unit.CONTROL: "control", Unit.MATRIX: "matrix", Unit.VECTOR: "vector", Unit.ROUTER: "ring"}


def instruction_class(r: Resolved) -> str:
    """The class a run's busy cycles are broken down by."""
    unit = OPCODES[r.op].unit
    if unit is Unit.DMA:
        spaces = (r.dst[0], r.src1[0])
        return "dma-hbm" if Space.HBM in spaces else "dma-host" if Space.HOST in spaces else "dma-onchip"
    return _UNIT_CLASS[unit]


class Block(NamedTuple):
    """The words an operand touches: `rows` rows of `cols` consecutive words, row i at base + i * stride.
    A GATHER's table is `unbounded`: its rows depend on the indices (data), so only its base is known."""
    operand: str
    space: Space
    base: int
    rows: int
    cols: int
    stride: int
    unbounded: bool = False

    @property
    def empty(self) -> bool:
        return self.rows <= 0 or self.cols <= 0

    def holds(self, space: Space, address: int) -> bool:
        """Whether the block touches word `address` of `space`."""
        if space is not self.space or self.empty or address < self.base:
            return False
        if self.stride < self.cols:  # rows overlap or touch: one contiguous range
            return address < self.base + (self.rows - 1) * self.stride + self.cols
        row, col = divmod(address - self.base, self.stride)
        return row < self.rows and col < self.cols

    def bounds(self):
        """(space, lo, hi): the bounding word range, or None when empty."""
        if self.empty:
            return None
        hi = ADDRESS_LIMIT if self.unbounded else self.base + (self.rows - 1) * self.stride + self.cols
        return self.space, self.base, hi


def _block(r: Resolved, name: str, rows: int, cols: int, stride: int | None = None, start: int = 0):
    space, base = getattr(r, name)
    stride = getattr(r, f"{name}_stride") if stride is None else stride
    return Block(name, space, base + start, rows, cols, stride)


def _memory(blocks: list) -> tuple:
    return tuple(b for b in blocks if b.space not in (Space.NONE, Space.IMM))


def access_blocks(r: Resolved) -> tuple[tuple, tuple]:
    """(reads, writes): the exact Blocks an instruction reads and writes, memory operands only (no IMM),
    in operand order (src1, src2, aux; dst, aux), empty blocks included, so that the list's shape
    depends on the instruction word alone."""
    op = r.op
    unit = OPCODES[op].unit
    if unit is Unit.CONTROL:
        return (), ()
    if op in (Opcode.LOAD, Opcode.STORE):
        dst = _block(r, "dst", r.n, r.rows) if r.flags.transpose else _block(r, "dst", r.rows, r.n)
        reads, writes = [_block(r, "src1", r.rows, r.n)], [dst]
    elif op is Opcode.GATHER:
        table = _block(r, "src1", 1, r.n)._replace(rows=int(r.rows > 0), unbounded=True)
        reads, writes = [table, _block(r, "src2", 1, r.rows, 0)], [_block(r, "dst", r.rows, r.n)]
    elif unit is Unit.MATRIX:
        reads = [_block(r, "src1", r.rows, r.k), _block(r, "src2", r.n, r.k)]
        writes = [_block(r, "dst", r.rows, r.n)]
        if op is Opcode.MATMUL:
            reads.append(_block(r, "aux", 1, r.n, 0))
        else:
            writes.append(_block(r, "aux", r.rows, 1))
    elif unit is Unit.VECTOR:
        reads = [_block(r, "src1", r.rows, r.n),
                 _block(r, "src2", r.rows, 1 if r.flags.src2_row_scalar else r.n),
                 _block(r, "aux", r.rows, 1 if r.flags.aux_row_scalar else r.n)]
        reduces = op in (Opcode.VSUM, Opcode.VDOT, Opcode.VMAX)
        writes = [_block(r, "dst", r.rows, 1 if reduces else r.n)]
    elif op is Opcode.ALLGATHER:
        first = min(k for _, k in r.slices)
        end = max(k + n for n, k in r.slices)
        reads = [_block(r, "src1", r.rows, r.n)]
        writes = [_block(r, "dst", r.rows, end - first, start=first)]
    elif op is Opcode.SEND:
        reads, writes = [_block(r, "src1", r.rows, r.n)], []
    else:  # RECV
        reads, writes = [], [_block(r, "dst", r.rows, r.n)]
    return _memory(reads), _memory(writes)


def access_ranges(r: Resolved) -> tuple[tuple, tuple]:
    """(reads, writes): the bounding word ranges (space, lo, hi) the scoreboard tracks."""
    reads, writes = access_blocks(r)
    return (tuple(b.bounds() for b in reads if not b.empty), tuple(b.bounds() for b in writes if not b.empty))


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
        cost = instruction_cost(r, cfg)
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
            reads, writes = access_ranges(r)
            start = max(issue + 1, unit_free[slot])
            for done_e, reads_e, writes_e in inflight:
                if done_e > start and (_overlaps(writes, writes_e) or _overlaps(writes, reads_e)
                                       or _overlaps(reads, writes_e)):
                    start = done_e
            if r.op is Opcode.ALLGATHER:
                start = yield _ALLGATHER, start
            elif r.op is Opcode.RECV:
                start = yield _RECV, start
            done = start + cost.cycles
            if r.op is Opcode.SEND:
                outgoing.append(done)
            starts.append(start)
            unit_free[slot] = done
            inflight.append((done, reads, writes))
            last_done = max(last_done, done)
        report.timeline.append((r.op.name, issue, start, done))
        report.busy[unit.name] = report.busy.get(unit.name, 0) + cost.cycles
        cls = instruction_class(r)
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

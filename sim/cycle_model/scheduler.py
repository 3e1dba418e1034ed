"""The schedule: how much of the instructions' costs the controller and scoreboard let overlap (the RTL
controller's in-order issue with fetch, unit queues and hazards, all cards jointly; hw/core/controller.py,
hw/core/scoreboard.py)."""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit
from ringgpt.hw.resolved import Resolved, hazard, scoreboard_ranges

from .costs import instruction_class, instruction_cost
from .fetch import FETCH_TO_DECISION, _FetchTimes
from .report import CardReport, CycleReport
from .shared_reads import blocked_cycles, reads_abuf, reads_tiles


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
    tally: tuple
    """(unit_name, cls, op_name): the key the schedule adds busy cycles under."""
    moves: bool
    """Whether any of the byte counts is non-zero."""
    reads_abuf: bool
    """A DMA instruction that reads ABUF through the unit's one ABUF read (shared_reads.reads_abuf)."""
    reads_tiles: bool
    """A vector or matrix instruction that reads ABUF through a tile port (shared_reads.reads_tiles)."""


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
        value = r if r.op in _ROUTER_OPS else (r[0],) + r[2:]  # its fields but the card
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
    cls = instruction_class(r)
    moved = (hbm_read, cost.hbm_bytes - hbm_read, cost.ring_bytes, cost.host_bytes)
    return _Costed(cost.unit, cost.unit._value_, kind, cost.cycles, reads, writes, spaces, cost.unit.name, cls,
                   r.op.name, *moved, (cost.unit.name, cls, r.op.name), any(moved),
                   cost.unit is Unit.DMA and reads_abuf(r), reads_tiles(r))


QUEUE_TO_UNIT = 2
"""Cycles from an instruction entering its unit's queue (SyncFIFOBuffered) to the unit taking it."""


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
    # fetch.out / fetch.take inlined (the same arithmetic, in _FetchTimes' fields held locally)
    f_beats, f_depth, f_burst, f_latency = fetch.beats, fetch.depth, fetch.burst, fetch.latency
    f_taken = fetch.taken
    f_request, f_beat_free, f_first_beat = fetch.request, fetch.beat_free, fetch.first_beat
    f_tail = FETCH_TO_DECISION - 1 - 1
    queue_depth = cfg.queue_depth
    decided = -1                    # the previous word's decision cycle
    unit_free = [0] * len(Unit)     # by unit number: when the unit can take its next instruction
    unit_starts = [deque(maxlen=queue_depth) for _ in Unit]
    inflight = []                   # (done, unit, read spaces, written spaces, reads, writes) of instructions that
    #                                 may still block
    last_done = 0
    readers = []                    # (take, done, r) of DMA instructions reading ABUF through the unit's one read
    outgoing = links[report.card]
    timeline, busy_by_key = report.timeline, {}
    hbm_read = hbm_write = ring_bytes = host_bytes = 0
    now_get, last_get = now.get, last.get
    for word, r in enumerate(trace):
        key = id(r)  # _costed, its hit inlined
        hit = now_get(key) or last_get(key)
        if hit is not None and hit[0] is r:
            now[key] = hit
            c = hit[1]
        else:
            c = _costed(r, cfg, last, now, alike)
        kind = c.kind
        index = word % f_burst
        if index == 0:
            room = word + f_burst - f_depth - 1   # the word whose leaving makes room for this burst
            request = f_request
            if room >= 0 and f_taken[room] + 1 > request:
                request = f_taken[room] + 1
            f_request = request + 2
            f_first_beat = request + 1 + f_latency
            if f_beat_free > f_first_beat:
                f_first_beat = f_beat_free
            f_beat_free = f_first_beat + f_burst * f_beats
        taken = f_first_beat + (index + 1) * f_beats + f_tail
        if decided > taken:
            taken = decided
        f_taken.append(taken)
        decision = taken + 1
        busy = c.cycles
        if kind == "control" or kind == "drain":
            if kind == "drain" and last_done > decision:
                decision = last_done
            start, done = decision, decision + 1
            if r.op is Opcode.HALT:
                report.cycles = done
        else:
            unit, slot = c.unit, c.slot
            starts = unit_starts[slot]
            if len(starts) == queue_depth and starts[0] + 1 > decision:
                decision = starts[0] + 1
            if inflight:
                inflight = [e for e in inflight if e[0] > decision]
                reads, writes = c.reads, c.writes
                read_spaces, write_spaces = c.spaces
                for done_e, unit_e, read_spaces_e, write_spaces_e, reads_e, writes_e in inflight:
                    if (unit_e is not unit and done_e > decision
                            and (write_spaces & (read_spaces_e | write_spaces_e) or read_spaces & write_spaces_e)
                            and hazard(reads, writes, reads_e, writes_e)):
                        decision = done_e
            start = decision + QUEUE_TO_UNIT
            if unit_free[slot] > start:
                start = unit_free[slot]
            ready = start
            if kind == _ALLGATHER or kind == _RECV:
                start = yield kind, start
            done = start + c.cycles
            if c.reads_abuf:
                readers.append((start, done, r))
            elif c.reads_tiles and readers:
                readers = [reader for reader in readers if reader[1] > start]
                if readers:         # its tile reads wait while the DMA's reads take their memories
                    done += blocked_cycles(start, r, [(take, reader) for take, _, reader in readers], cfg)
            busy = done - ready     # a router waiting for the other cards is busy (the RTL's counter)
            if kind == "send":
                outgoing.append(done + cfg.ring_latency_cycles)
            starts.append(ready)
            unit_free[slot] = done
            inflight.append((done, unit, c.spaces[0], c.spaces[1], c.reads, c.writes))
            if done > last_done:
                last_done = done
        decided = decision
        timeline.append((c.op_name, decision, start, done))
        tally = c.tally
        busy_by_key[tally] = busy_by_key.get(tally, 0) + busy
        if c.moves:
            hbm_read += c.hbm_read_bytes
            hbm_write += c.hbm_write_bytes
            ring_bytes += c.ring_bytes
            host_bytes += c.host_bytes
    # busy cycles by unit, class and opcode, each dict in the order of first occurrence (that of busy_by_key's keys)
    busy_by_unit, classes, opcodes = report.busy, report.classes, report.opcodes
    for (unit_name, cls, op_name), busy in busy_by_key.items():
        busy_by_unit[unit_name] = busy_by_unit.get(unit_name, 0) + busy
        classes[cls] = classes.get(cls, 0) + busy
        opcodes[op_name] = opcodes.get(op_name, 0) + busy
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

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
from .fetch import _FetchTimes
from .report import CardReport, CycleReport


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

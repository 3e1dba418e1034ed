"""Where each card's cycles of a run went: a partition of the run's cycles, read off the schedule's timeline.

Each cycle of a card, from the run's start to the last card's HALT, falls in exactly one term, the first of:

    hbm         an HBM transfer is in flight on the DMA unit (a LOAD, STORE or GATHER touching HBM, from the unit
                taking it to its done: the request latency included, as the unit is held for it)
    compute     the matrix or vector unit, or an on-chip DMA transfer (ABUF to ABUF/WBUF), is busy and no HBM
                transfer is (computing with HBM idle); split in the same way into compute_matrix, then
                compute_vector, then compute_onchip
    ring        only the router is busy: from the cycle the router could take its instruction (its queue's two
                cycles after the decision, or its previous instruction's done) to its done, so an ALLGATHER's wait
                for the other cards and a RECV's wait for its block are in it (waiting on the ring)
    host        only a host-buffer transfer is in flight (waiting on the host link: the token's upload, the logits'
                read-back)
    issue       nothing is in flight: the fetch unit filling, the controller deciding, an instruction's two cycles
                in its queue, control instructions
    after_halt  the card has halted and waits for the other cards' HALT (the run's end)

The intervals are the timeline's (`CardReport.timeline`: issue, start and done of every executed instruction) and
the classes `instruction_class`'s; nothing is estimated. The HBM bound of a card: the bytes it reads from HBM at
the physical peak (`hbm_peak_gbps`), as `CycleReport.hbm_bound_ms` counts it for the busiest card.
"""
from __future__ import annotations

from ringgpt.hw.isa import OPCODES, Unit

from .costs import instruction_class
from .report import CycleReport
from .scheduler import QUEUE_TO_UNIT

TERMS = ("hbm", "compute", "ring", "host", "issue", "after_halt")
"""The terms of `occupancy`, in the order a cycle is given to the first that applies."""
COMPUTE_PARTS = ("compute_matrix", "compute_vector", "compute_onchip")
"""The parts of the compute term, in the order a cycle is given to the first that applies."""

_ORDER = ("hbm", *COMPUTE_PARTS, "ring", "host", "issue", "after_halt")
_TERM_OF_CLASS = {"dma-hbm": "hbm", "matrix": "compute_matrix", "vector": "compute_vector",
                  "dma-onchip": "compute_onchip", "router": "ring", "dma-host": "host"}
_PRIORITY = {term: i for i, term in enumerate(_ORDER)}


def card_occupancy(timeline: list, trace: list, run_cycles: int) -> dict:
    """{term: cycles} of one card (TERMS, their sum run_cycles, and the COMPUTE_PARTS, their sum the compute term),
    from its timeline and the trace it was scheduled from (the same instructions in the same order), and
    "hbm_transfers": how many DMA instructions touched HBM."""
    if len(timeline) != len(trace):
        raise ValueError(f"the timeline has {len(timeline)} entries, the trace {len(trace)} instructions")
    events = []
    router_free = 0
    halt = transfers = 0
    for (_, issue, start, done), r in zip(timeline, trace):
        unit = OPCODES[r.op].unit
        if unit is Unit.CONTROL:
            halt = max(halt, done)
            continue
        term = _TERM_OF_CLASS[instruction_class(r)]
        transfers += term == "hbm"
        if unit is Unit.ROUTER:
            # when the router could take it (the schedule's `ready`): its waits for the other cards are the ring's
            start = max(issue + QUEUE_TO_UNIT, router_free)
            router_free = done
        if done > start:
            events.append((start, 1, _PRIORITY[term]))
            events.append((done, -1, _PRIORITY[term]))
        halt = max(halt, done)
    if halt > run_cycles:
        raise ValueError(f"the card runs to cycle {halt}, past the run's {run_cycles}")
    events.sort()
    active = [0] * len(_ORDER)
    cycles = [0] * len(_ORDER)
    issue_term = _PRIORITY["issue"]
    at = 0
    for t, change, priority in events:
        if t > at:
            current = next((p for p, n in enumerate(active) if n), issue_term)
            cycles[current] += t - at
            at = t
        active[priority] += change
    cycles[issue_term] += halt - at
    cycles[_PRIORITY["after_halt"]] = run_cycles - halt
    by = dict(zip(_ORDER, cycles))
    return {**{term: sum(by[p] for p in COMPUTE_PARTS) if term == "compute" else by[term] for term in TERMS},
            **{p: by[p] for p in COMPUTE_PARTS}, "hbm_transfers": transfers}


def occupancy(report: CycleReport, traces: list) -> list:
    """Per card of a scheduled run (`schedule(traces, cfg)` gave `report`): its `card_occupancy` terms and HBM
    transfers, the cycle its HALT completed, the bytes it read from HBM, its HBM bound in cycles (those bytes at the
    peak) and that bound as a percentage of the run's cycles."""
    bytes_per_cycle = report.hbm_peak_gbps * 1e3 / report.clock_mhz
    out = []
    for card, trace in zip(report.cards, traces):
        bound = card.hbm_read_bytes / bytes_per_cycle
        out.append({"card": card.card, **card_occupancy(card.timeline, trace, report.cycles), "halt": card.cycles,
                    "hbm_read_bytes": card.hbm_read_bytes, "hbm_bound_cycles": bound,
                    "hbm_bound_pct": 100.0 * bound / report.cycles if report.cycles else 0.0})
    return out

"""What every instruction costs on its unit, with nothing else running (`instruction_cost`, the one place every
cost formula lives, calibrated against the RTL's cycle counts: docs/rtl-calibration.md), and the class a run's busy
cycles are broken down by (`instruction_class`)."""
from __future__ import annotations

from typing import NamedTuple

from ringgpt.hw.intmath import ceil_div
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.timing import router_cycles
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit, weight_words
from ringgpt.hw.resolved import Resolved

from .hbm import _modeled_dma, dma_cycles
from .stalls import matrix_stall_cycles, vector_operands, vector_stall_cycles
from .timing import unit_timing


class Cost(NamedTuple):
    unit: Unit
    cycles: int
    """Cycles the unit is busy with the instruction (the RTL's Completion.cycles: from taking it to `done`)."""
    hbm_bytes: int = 0
    ring_bytes: int = 0
    """Bytes this card puts on its outgoing ring link."""
    host_bytes: int = 0


def _issue_cycles(pairs: int, tiles: int, loop: int) -> int:
    """Cycles to issue `tiles` rounds over `pairs` independent sums through an accumulator whose adder
    loop is `loop` cycles: one beat per cycle when pairs >= loop, else each round waits for the loop."""
    if pairs <= 0 or tiles <= 0:
        return 0
    return pairs * tiles if pairs >= loop else (tiles - 1) * loop + pairs


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
        tiles = ceil_div(weight_words(r.k, bool(r.flags.int8)), cfg.mac_width)   # a buffer row of weights a beat
        issue = _issue_cycles(r.rows * ceil_div(r.n, cfg.mpu_lanes), tiles, t["loop"])
        tail = t["int8_latency" if r.flags.int8 else "latency"] + (t["row_max"] if r.op is Opcode.MASKED_QK else 0)
        if issue:
            issue += matrix_stall_cycles(r, cfg)
        return Cost(unit, t["overhead"] + (issue + tail if issue else 0))
    if unit is Unit.VECTOR:
        # One step of a row's next step_words elements per cycle (vector_width, or special_lanes for a special
        # function); a row sum's chunks go through the accumulator loop.
        t = unit_timing(cfg)["vector"]
        step = t["step"][r.op]
        chunks = ceil_div(r.n, step)
        reduction = OPCODES[r.op].reduction
        issue = _issue_cycles(r.rows, chunks, t["loop"]) if reduction == "sum" else r.rows * chunks
        tail = t["latency"][reduction or "elementwise"]
        if issue:   # steps whose operands share a buffer memory stall (vector_stall_cycles)
            issue += vector_stall_cycles(r.rows, r.n, vector_operands(r, cfg), cfg, step)
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


def instruction_class(r: Resolved) -> str:
    """The class a run's busy cycles are broken down by: the unit's name, the DMA's by where its data lies."""
    unit = OPCODES[r.op].unit
    if unit is Unit.DMA:
        spaces = (r.dst[0], r.src1[0])
        return "dma-hbm" if Space.HBM in spaces else "dma-host" if Space.HOST in spaces else "dma-onchip"
    return unit.name.lower()

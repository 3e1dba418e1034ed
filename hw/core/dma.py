"""The DMA unit's on-chip moves: LOAD from ABUF into ABUF or WBUF, with 2-D strides and transposed writes.

    ABUF src (P = vector_width words per read, any address)
      ├─▶ straight:   row r, chunk c ─▶ write register ─▶ dst[dst + r*dst_stride + c*P ...] (P words, masked past n)
      └─▶ transposed: up to P source rows of one P-column chunk fill a P x P tile (one row per cycle),
                      which then drains one column per cycle (shifting left) ─▶ write register
                      ─▶ dst[dst + j*dst_stride + r0 ...] (one destination row j, up to P words)
    ─▶ ABUF dst or WBUF dst (one P-word write per cycle)

HBM and host traffic (LOAD from HBM/HOST, STORE, GATHER) belong to the whole core's DMA engine, not
written yet: this unit answers them with `ErrorCode.OFF_CHIP`, writing nothing.
"""
from __future__ import annotations

import functools

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import OPCODES, OPERANDS, Space, Unit

from .interfaces import (READ_LATENCY, WORD, Completion, ErrorCode, IssueLayout, ReadPort, WritePort, block_fits,
                         accept_states, check_instruction, done_state, error_code, pipe, resolve)


def _log2(value: int) -> int:
    return value.bit_length() - 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class OnChipDMA(wiring.Component):
    """On-chip DMA of `cfg`: `width` = vector_width words per cycle.

    Computes LOAD with src1 in ABUF and dst in ABUF or WBUF, exactly as the functional simulator's
    copy: for r < rows, j < n: dst[dst + r*dst_stride + j] = src1[src1 + r*src1_stride + j], or with
    the transpose flag dst[dst + j*dst_stride + r] = src1[src1 + r*src1_stride + j]. Any other DMA
    word with a legal HBM or HOST operand (LOAD from HBM/HOST, STORE, GATHER) completes with
    `ErrorCode.OFF_CHIP`; the other checks are those of every unit (interfaces.check_instruction).

    Throughput. Straight copies: one chunk of `width` words per cycle, rows * ceil(n / width) steps.
    Transposed copies go through a width x width register tile: for each group of R <= width source
    rows and each chunk of C <= width columns, R fill steps (one source row each), one step for the
    last row to land, and C drain steps (one destination row of R words each): `steps(rows, n, True)`
    = ceil(n / width) * (rows + groups) + groups * n, groups = ceil(rows / width); about width / 2
    words per cycle on full tiles, one destination row per cycle when rows = 1.

    Latency: `latency` = READ_LATENCY + 1 cycles from a straight step to its write (read, write
    register), `drain_latency` = 1 from a drain step to its write. Busy cycles (`Completion.cycles`)
    = `cycles(rows, n, transpose)` = `overhead` + steps + the latency of the last step.

    Preconditions it does not check (the compiler's copies meet them): the destination block does not
    overlap the source block unless exactly in place; a transposed copy of more than `width` rows has
    non-overlapping destination rows (dst_stride >= rows). Overlapping destination rows are otherwise
    written in the simulator's order (later rows win).
    """

    opcodes = tuple(op for op, spec in OPCODES.items() if spec.unit is Unit.DMA)

    def __init__(self, cfg: ArchConfig):
        if cfg.vector_width < 2:
            raise ValueError(f"the on-chip DMA needs vector_width >= 2, got {cfg.vector_width}")
        self.cfg = cfg
        self.width = P = cfg.vector_width
        self.latency = READ_LATENCY + 1
        self.drain_latency = 1
        self.overhead = 4
        """Cycles of the accept, check, drain-detect and done steps."""
        self.buffer_ports = {"abuf_src": (Space.ABUF, ReadPort(P)), "abuf_dst": (Space.ABUF, WritePort(P)),
                             "wbuf_dst": (Space.WBUF, WritePort(P))}
        super().__init__({"issue": In(stream.Signature(IssueLayout)), "status": Out(Completion()),
                          **{name: Out(sig) for name, (space, sig) in self.buffer_ports.items()}})

    def steps(self, rows: int, n: int, transpose: bool) -> int:
        """Issue steps of a copy of `rows` x `n` words (see the class docstring)."""
        P = self.width
        chunks = _ceil_div(n, P)
        if not transpose:
            return rows * chunks
        groups = _ceil_div(rows, P)
        return chunks * (rows + groups) + groups * n

    def cycles(self, rows: int, n: int, transpose: bool) -> int:
        """Busy cycles of a legal on-chip copy (`overhead` alone when rows or n is 0: ZERO_DIM)."""
        if rows <= 0 or n <= 0:
            return self.overhead
        return self.overhead + self.steps(rows, n, transpose) + (self.drain_latency if transpose else self.latency)

    def elaborate(self, platform):
        m = Module()
        cfg, P = self.cfg, self.width
        lp = _log2(P)

        held = Signal(IssueLayout)
        r = resolve(m, held)
        inst = held.inst
        (s_dst, dst), (_, src1) = r["dst"], r["src1"]
        rows, n = r["rows"], r["n"]
        sd, s1 = r["dst_stride"], r["src1_stride"]
        transpose = inst.flags.transpose

        # --- checks -------------------------------------------------------------------------
        checks = check_instruction(m, inst, self.opcodes)
        off_chip = Cat(*[(inst[o].space == Space.HBM) | (inst[o].space == Space.HOST) for o in OPERANDS]).any()
        dst_rows, dst_cols = Mux(transpose, n, rows), Mux(transpose, rows, n)
        in_range = (block_fits(src1, rows, n, s1, cfg.abuf_words)
                    & Mux(s_dst == Space.WBUF, block_fits(dst, dst_rows, dst_cols, sd, cfg.wbuf_words),
                          block_fits(dst, dst_rows, dst_cols, sd, cfg.abuf_words)))
        code = error_code(m, checks, zero_dim=(rows == 0) | (n == 0), out_of_range=~in_range, off_chip=off_chip)

        # --- control --------------------------------------------------------------------------
        chunks = Signal(32)
        error = Signal(ErrorCode)
        cycles = Signal(32)
        issued_all = Signal()
        written = Signal(64)
        expected = Signal(64)
        m.d.comb += [self.status.error.eq(error), self.status.cycles.eq(cycles + 1)]

        cur_r = Signal(32)      # straight: the row; transposed: the first row of the tile (r0)
        t = Signal(32)          # the column chunk
        i = Signal(range(P))    # transposed: the tile row being filled
        j = Signal(range(P))    # transposed: the tile column being drained
        phase = Signal(range(3))
        FILL, WAIT, DRAIN = 0, 1, 2
        running = Signal()
        last_chunk = t == chunks - 1
        left = rows - cur_r
        tile_rows = Signal(range(P + 1))
        m.d.comb += tile_rows.eq(Mux(left > P, P, left))
        cols_left = n - (t << lp)
        tile_cols = Signal(range(P + 1))
        m.d.comb += tile_cols.eq(Mux(cols_left > P, P, cols_left))
        straight = running & ~transpose
        fill = running & transpose & (phase == FILL)
        drain = running & transpose & (phase == DRAIN)

        with m.FSM():
            accept_states(m, self, held, cycles)
            with m.State("CHECK"):
                n_chunks = (n + P - 1) >> lp
                m.d.sync += [cycles.eq(cycles + 1), error.eq(code), chunks.eq(n_chunks),
                             expected.eq(Mux(transpose, ((rows + P - 1) >> lp) * n, rows * n_chunks)),
                             cur_r.eq(0), t.eq(0), i.eq(0), j.eq(0), phase.eq(FILL), written.eq(0),
                             issued_all.eq(0)]
                with m.If(code == ErrorCode.NONE):
                    m.d.sync += running.eq(1)
                    m.next = "RUN"
                with m.Else():
                    m.next = "DONE"
            with m.State("RUN"):
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(straight):
                    m.d.sync += t.eq(Mux(last_chunk, 0, t + 1))
                    with m.If(last_chunk):
                        m.d.sync += cur_r.eq(cur_r + 1)
                        with m.If(cur_r + 1 == rows):
                            m.d.sync += [running.eq(0), issued_all.eq(1)]
                with m.If(fill):
                    m.d.sync += i.eq(i + 1)
                    with m.If(i + 1 == tile_rows):
                        m.d.sync += [i.eq(0), phase.eq(WAIT)]
                with m.If(running & transpose & (phase == WAIT)):
                    m.d.sync += [j.eq(0), phase.eq(DRAIN)]
                with m.If(drain):
                    m.d.sync += j.eq(j + 1)
                    with m.If(j + 1 == tile_cols):
                        m.d.sync += [j.eq(0), phase.eq(FILL)]
                        with m.If(last_chunk):
                            m.d.sync += [t.eq(0), cur_r.eq(cur_r + P)]
                            with m.If(left <= P):
                                m.d.sync += [running.eq(0), issued_all.eq(1)]
                        with m.Else():
                            m.d.sync += t.eq(t + 1)
                with m.If(issued_all & (written == expected)):
                    m.next = "DONE"
            done_state(m, self, running, issued_all)

        # --- read (cycle c), data (c + 1) --------------------------------------------------------
        col = t << lp
        src_row = Mux(transpose, cur_r + i, cur_r)
        m.d.comb += self.abuf_src.addr.eq(src1 + src_row * s1 + col)
        dst_addr = Signal(32)
        m.d.comb += dst_addr.eq(dst + Mux(transpose, col + j, cur_r) * sd + Mux(transpose, cur_r, col))
        lane_mask = Signal(P)
        m.d.comb += [lane_mask[lane].eq(col + lane < n) for lane in range(P)]
        step = Signal(data.StructLayout({"valid": 1, "fill": 1, "i": range(P), "addr": 32, "mask": P}))
        m.d.comb += [step.valid.eq(straight), step.fill.eq(fill), step.i.eq(i), step.addr.eq(dst_addr),
                     step.mask.eq(lane_mask)]
        step1 = pipe(m, step, READ_LATENCY, name="step1")
        got = self.abuf_src.data

        # --- the transpose tile: rows filled from reads, columns drained by shifting left -------------
        tile = [[Signal(WORD, name=f"tile{row}_{c}") for c in range(P)] for row in range(P)]
        for row in range(P):
            with m.If(step1.fill & (step1.i == row)):
                m.d.sync += [tile[row][c].eq(got[c]) for c in range(P)]
            with m.Elif(drain):
                m.d.sync += [tile[row][c].eq(tile[row][c + 1] if c + 1 < P else 0) for c in range(P)]
        tile_mask = Signal(P)
        m.d.comb += [tile_mask[row].eq(row < tile_rows) for row in range(P)]

        # --- write register -> ABUF or WBUF (one registered enable per buffer) ---------------------------
        wreg = Signal(data.StructLayout({"abuf": 1, "wbuf": 1, "addr": 32, "mask": P,
                                         "data": data.ArrayLayout(WORD, P)}))
        to_wbuf = s_dst == Space.WBUF
        m.d.sync += [wreg.abuf.eq(0), wreg.wbuf.eq(0)]
        with m.If(step1.valid | drain):
            m.d.sync += [wreg.abuf.eq(~to_wbuf), wreg.wbuf.eq(to_wbuf)]
        with m.If(step1.valid):
            m.d.sync += [wreg.addr.eq(step1.addr), wreg.mask.eq(step1.mask), wreg.data.eq(got)]
        with m.Elif(drain):
            m.d.sync += [wreg.addr.eq(dst_addr), wreg.mask.eq(tile_mask)]
            m.d.sync += [wreg.data[row].eq(tile[row][0]) for row in range(P)]
        for port, enable in ((self.abuf_dst, wreg.abuf), (self.wbuf_dst, wreg.wbuf)):
            m.d.comb += [port.addr.eq(wreg.addr), port.data.eq(wreg.data), port.mask.eq(wreg.mask),
                         port.en.eq(enable)]
        with m.If(wreg.abuf | wreg.wbuf):
            m.d.sync += written.eq(written + 1)
        return m


@functools.cache
def _unit(cfg: ArchConfig) -> OnChipDMA:
    unit = OnChipDMA(cfg)
    unit._MustUse__silence = True
    return unit


def onchip_cycles(cfg: ArchConfig, rows: int, n: int, transpose: bool) -> int:
    """Busy cycles of an on-chip LOAD on the RTL unit of `cfg` (what the cycle model charges)."""
    return _unit(cfg).cycles(rows, n, bool(transpose))

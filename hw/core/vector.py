"""The vector unit: every vector opcode at vector_width FP16 elements per cycle.

    ABUF src1, src2, aux (vector_width words each, or one row scalar, or an IMM constant)
      ├─▶ per lane: FP16MulCore(a, b or 1) + FP16MulCore(b, -b, c or -0 times 1) ─▶ FP32AddCore ─▶ ToFP16
      │             VADD, VSUB, VMUL, VSCALE_SHIFT (numerics.vadd/vsub/vmul/vscale_shift: exact FP32
      │             operands and product, one FP32 add, one rounding)
      ├─▶ lanes 0 .. special_lanes - 1: SpecialFunctionCore exp, recip, rsqrt, gelu (numerics.special)
      ├─▶ MacTreeCore(vector_width) ─▶ TileAccumulator ─▶ ToFP16        VSUM (b = 1), VDOT
      │             (numerics.reduce_sum: exact products, block-aligned tile sums, tiles in order, one rounding)
      └─▶ MaxTreeCore(vector_width) ─▶ running max over the row's chunks  VMAX (numerics.reduce_max)
    ─▶ ABUF dst (vector_width words per cycle; one word per row for the reductions)

The operands are the lanes of one TileReadPort on ABUF: a chunk whose operands' chunks share a buffer
memory takes more than one cycle to read, and the unit waits, frozen (see `VectorUnit`).

Order of work: elementwise ops and VMAX walk rows, and within a row chunks of vector_width
elements, one chunk per cycle; a special function (exp, recip, rsqrt, gelu) steps through a row
special_lanes elements per cycle, since only those lanes have its cores (`VectorTiming.step_words`): its
operand is read and its result written at the step's element, through the same ports. VSUM and VDOT
accumulate a row's chunks in order through the tile accumulator's adder loop, so they walk rows in sets
of at least loop_latency (all remaining rows when fewer than 2 * loop_latency remain), chunk by chunk
across the set: one chunk per cycle when rows >= loop_latency; a single row takes loop_latency cycles
per chunk (the numerics fix the order of the additions, so a row's sum cannot be split).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.intmath import log2
from ringgpt.hw.arith.accumulator import TileAccumulator
from ringgpt.hw.arith.common import FP16
from ringgpt.hw.arith.fp16_mul import FP16MulCore
from ringgpt.hw.arith.fp32_add import FP32AddCore
from ringgpt.hw.arith.mac_tree import MacTreeCore
from ringgpt.hw.arith.max_tree import MaxTreeCore, order_key
from ringgpt.hw.arith.special import SpecialFunctionCore
from ringgpt.hw.arith.to_fp16 import ToFP16Core
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit, opcodes_of

from .timing import READ_LATENCY, VectorTiming
from .interfaces import (Completion, ErrorCode, Frozen, IssueLayout, SharedWritePort, TileReadPort, block_fits,
                         accept_states, check_instruction, done_state, error_code, pipe, reported, resolve, run_or_refuse)
from .matrix import FP16_MIN_KEY, FP16_NEG_ZERO, FP16_ONE

SPECIAL = {op: spec.special for op, spec in OPCODES.items() if spec.special}
SUMS = tuple(op for op, spec in OPCODES.items() if spec.reduction == "sum")
(MAX_REDUCTION,) = (op for op, spec in OPCODES.items() if spec.reduction == "max")
"""The one opcode the max tree serves."""
FP16_SIGN = 0x8000
SOURCES = ("src1", "src2", "aux")
"""The operands the unit reads from ABUF, lane by lane of its TileReadPort."""



class VectorUnit(VectorTiming, wiring.Component):
    """Vector unit of `cfg`: `vector_width` lanes.

    Latency (cycles from a chunk's issue to its write): `latency["elementwise"]` (read, multiply,
    add, FP16, or the special function padded to the same depth), `latency["sum"]` (read, MAC tree,
    accumulator, FP16) for VSUM/VDOT, `latency["max"]` (read, max tree) for VMAX. Throughput: one
    chunk of vector_width elements per cycle (VSUM/VDOT: with rows >= loop_latency; a special function:
    special_lanes elements; see the module docstring). A chunk's ABUF operands (src1, and src2 and aux when
    in ABUF, each on vector_align boundaries, else the unit refuses the word with MISALIGNED; one word a row, a row
    scalar's or n = 1, anywhere) are read through one TileReadPort, one memory row each (one read port per buffer
    memory);
    when they need c > 1 cycles (two of their chunks in one memory: banks.tile_read_cycles) the whole unit
    is frozen c - 1 cycles, the read data held, and longer while ABUF's other readers hold the memories it
    needs, or its other writers the memories of its result (a SharedWritePort in ABUF's write group). Busy cycles
    (`Completion.cycles`) = `overhead` + issue cycles + stalls + latency, the stalls (alone on the buffers) as
    sim/cycle_model.vector_stall_cycles counts them.
    """

    opcodes = opcodes_of(Unit.VECTOR)

    def __init__(self, cfg: ArchConfig):
        if cfg.vector_width < 2:
            raise ValueError(f"the vector unit needs vector_width >= 2, got {cfg.vector_width}")
        VectorTiming.__init__(self, cfg)
        V = self.width
        # the operands' lanes read one row each, stepping by special_lanes words (VectorTiming.step_words) from an
        # address on vector_align boundaries (hw/resolved.misaligned_vector); one word a row (a row scalar, n = 1)
        # any word
        S = cfg.special_lanes
        self.buffer_ports = {"abuf_src": (Space.ABUF, TileReadPort(len(SOURCES), V, aligned=(S,) * len(SOURCES),
                                                                   scalars=(True,) * len(SOURCES))),
                             "abuf_dst": (Space.ABUF, SharedWritePort(V))}
        wiring.Component.__init__(self, {"issue": In(stream.Signature(IssueLayout)), "status": Out(Completion()),
                          **{name: Out(sig) for name, (space, sig) in self.buffer_ports.items()}})

    def elaborate(self, platform):
        outer = Module()    # the read port's holding register and the stall count: never frozen
        frozen = Frozen(outer, self.issue, {"src": self.abuf_src}, {"dst": self.abuf_dst})
        m = frozen.core     # everything else: frozen while the operands' chunks share a memory
        operands, request = frozen.data["src"], frozen.request["src"]
        cfg, V, S = self.cfg, self.width, self.cfg.special_lanes
        lv, ls = log2(V), log2(S)
        LL = self.loop_latency

        held = Signal(IssueLayout)
        r = resolve(m, held)
        inst = held.inst
        opcode = inst.opcode
        (s_dst, dst), (s_src1, src1), (s_src2, src2), (s_aux, aux) = (r[o] for o in ("dst", "src1", "src2", "aux"))
        rows, n = r["rows"], r["n"]
        sd, s1, s2, sa = r["dst_stride"], r["src1_stride"], r["src2_stride"], r["aux_stride"]
        is_sum = Cat(opcode == op for op in SUMS).any()
        is_max = opcode == MAX_REDUCTION
        special = Cat(opcode == op for op in SPECIAL).any()
        reduces = is_sum | is_max
        b_scalar, c_scalar = inst.flags.src2_row_scalar, inst.flags.aux_row_scalar
        b_imm, c_imm = s_src2 == Space.IMM, s_aux == Space.IMM

        # --- checks -------------------------------------------------------------------------
        size = cfg.abuf_words
        in_range = (block_fits(src1, rows, n, s1, size)
                    & block_fits(dst, rows, Mux(reduces, 1, n), sd, size)
                    & ((s_src2 != Space.ABUF) | block_fits(src2, rows, Mux(b_scalar, 1, n), s2, size))
                    & ((s_aux != Space.ABUF) | block_fits(aux, rows, Mux(c_scalar, 1, n), sa, size)))
        checks = check_instruction(m, inst, self.opcodes)
        la = log2(cfg.vector_align)

        def off(address, stride):
            return (address[:la] != 0) | ((rows > 1) & (stride[:la] != 0)) if la else 0
        misaligned = (n > 1) & (off(src1, s1) | ((s_src2 == Space.ABUF) & ~b_scalar & off(src2, s2))
                                | ((s_aux == Space.ABUF) & ~c_scalar & off(aux, sa)))
        code = error_code(m, checks, empty=(rows == 0) | (n == 0), misaligned=misaligned, out_of_range=~in_range)

        # --- control --------------------------------------------------------------------------
        chunks = Signal(32)
        error = Signal(ErrorCode)
        cycles = Signal(32)
        issued_all = Signal()
        written = Signal(64)
        expected = Signal(64)
        m.d.comb += [self.status.error.eq(reported(error)), self.status.cycles.eq(cycles + 1 + frozen.stalls)]

        set_r, cur_r = Signal(32), Signal(32)
        remaining = Signal(32)
        t = Signal(32)
        slot = Signal(range(2 * LL))
        set_size = Signal(range(2 * LL))
        m.d.comb += set_size.eq(Mux(is_sum, Mux(remaining < 2 * LL, remaining, LL), 1))
        round_len = Mux(is_sum & (set_size < LL), LL, set_size)
        running = Signal()
        issuing = Signal()
        m.d.comb += issuing.eq(running & (slot < set_size))
        nxt_r = Mux(issuing, cur_r + 1, cur_r)
        end_round = running & (slot == round_len - 1)
        last_chunk = t == chunks - 1

        with m.FSM():
            accept_states(m, self, held, cycles)
            with m.State("CHECK"):
                n_chunks = Mux(special, (n + S - 1) >> ls, (n + V - 1) >> lv)     # steps of step_words
                m.d.sync += [cycles.eq(cycles + 1), error.eq(code), chunks.eq(n_chunks), remaining.eq(rows),
                             expected.eq(Mux(reduces, rows, rows * n_chunks)),
                             set_r.eq(0), cur_r.eq(0), t.eq(0), slot.eq(0), written.eq(0), issued_all.eq(0)]
                run_or_refuse(m, code, running)
            with m.State("RUN"):
                m.d.sync += [cycles.eq(cycles + 1), cur_r.eq(nxt_r)]
                with m.If(running):
                    m.d.sync += slot.eq(Mux(end_round, 0, slot + 1))
                    with m.If(end_round):
                        with m.If(last_chunk):
                            m.d.sync += [set_r.eq(nxt_r), remaining.eq(remaining - set_size), t.eq(0)]
                            with m.If(remaining == set_size):
                                m.d.sync += [running.eq(0), issued_all.eq(1)]
                        with m.Else():
                            m.d.sync += [t.eq(t + 1), cur_r.eq(set_r)]
                with m.If(issued_all & (written == expected)):
                    m.next = "DONE"
            done_state(m, self, running, issued_all)

        # --- issue: addresses (cycle c), operands (c + 1) ----------------------------------------
        col = Mux(special, t << ls, t << lv)
        one_word = n == 1           # every operand one word a row, anywhere (hw/resolved.misaligned_vector)
        m.d.comb += [request.addr[0].eq(src1 + cur_r * s1 + col), request.en[0].eq(issuing),
                     request.single[0].eq(one_word),
                     request.addr[1].eq(src2 + cur_r * s2 + Mux(b_scalar, 0, col)),
                     request.en[1].eq(issuing & (s_src2 == Space.ABUF)), request.single[1].eq(b_scalar | one_word),
                     request.addr[2].eq(aux + cur_r * sa + Mux(c_scalar, 0, col)),
                     request.en[2].eq(issuing & (s_aux == Space.ABUF)), request.single[2].eq(c_scalar | one_word)]
        beat = Signal(data.StructLayout({"valid": 1, "r": 32, "t": 32, "ctx": range(self.contexts),
                                         "first": 1, "last": 1, "sum": 1, "max": 1,
                                         "special": 1}))
        # a beat carries its instruction's kind: a pipeline longer than the instruction's own still holds its
        # beats when the next instruction starts, and must not take them for the next one's
        m.d.comb += [beat.valid.eq(issuing), beat.r.eq(cur_r), beat.t.eq(t), beat.ctx.eq(slot),
                     beat.first.eq(t == 0), beat.last.eq(last_chunk), beat.sum.eq(is_sum), beat.max.eq(is_max),
                     beat.special.eq(special)]
        beat1 = pipe(m, beat, READ_LATENCY, name="beat1")
        in_n = [((beat1.t << lv) + i) < n for i in range(V)]
        a = [operands[0][i] for i in range(V)]
        b = [Mux(b_imm, inst.src2.offset[:16], Mux(b_scalar, operands[1][0], operands[1][i])) for i in range(V)]
        c = [Mux(c_imm, inst.aux.offset[:16], Mux(c_scalar, operands[2][0], operands[2][i])) for i in range(V)]

        # elementwise: arithmetic and special functions, all padded to elementwise_depth
        multiplies = (opcode == Opcode.VMUL) | (opcode == Opcode.VSCALE_SHIFT)
        results = []
        for i in range(V):
            mul = m.submodules[f"mul{i}"] = FP16MulCore()
            m.d.comb += [mul.i.a.eq(a[i]), mul.i.b.eq(Mux(multiplies, b[i], FP16_ONE))]
            addend = Signal(16, name=f"addend{i}")
            with m.Switch(opcode):
                with m.Case(Opcode.VADD):
                    m.d.comb += addend.eq(b[i])
                with m.Case(Opcode.VSUB):
                    m.d.comb += addend.eq(b[i] ^ FP16_SIGN)
                with m.Case(Opcode.VSCALE_SHIFT):
                    m.d.comb += addend.eq(c[i])
                with m.Default():
                    m.d.comb += addend.eq(FP16_NEG_ZERO)
            widen = m.submodules[f"widen{i}"] = FP16MulCore()
            m.d.comb += [widen.i.a.eq(addend), widen.i.b.eq(FP16_ONE)]
            add = m.submodules[f"add{i}"] = FP32AddCore()
            m.d.comb += [add.i.a.eq(mul.o), add.i.b.eq(widen.o)]
            conv = m.submodules[f"fp16_{i}"] = ToFP16Core()
            m.d.comb += conv.i.eq(add.o)
            arith = FP16MulCore.latency + FP32AddCore.latency + ToFP16Core.latency
            value = pipe(m, Value.cast(conv.o), self.elementwise_depth - arith, name=f"arith{i}")
            for op, name in SPECIAL.items() if i < S else ():
                fn = m.submodules[f"{name}{i}"] = SpecialFunctionCore(name)
                m.d.comb += fn.i.eq(a[i])
                out = pipe(m, Value.cast(fn.o), self.elementwise_depth - fn.latency, name=f"{name}{i}_out")
                value = Mux(opcode == op, out, value)
            results.append(value)
        ew = pipe(m, beat1, self.elementwise_depth, name="ew")
        ew_col = Mux(ew.special, ew.t << ls, ew.t << lv)
        ew_mask = Signal(V)
        m.d.comb += [ew_mask[i].eq((ew_col + i < n) & (~ew.special if i >= S else 1)) for i in range(V)]

        # VSUM, VDOT: block-aligned sums of exact products, tiles accumulated in order, one rounding
        tree = m.submodules.sum_tree = MacTreeCore(V)
        for i in range(V):
            m.d.comb += [tree.i.x[i].eq(Mux(in_n[i], a[i], 0)),
                         tree.i.w[i].eq(Mux(in_n[i], Mux(opcode == Opcode.VDOT, b[i], FP16_ONE), 0))]
        acc = m.submodules.acc = TileAccumulator(self.contexts)
        tag = pipe(m, beat1, self.tree_latency, name="sum_tag")
        m.d.comb += [acc.i.valid.eq(tag.valid & tag.sum), acc.i.payload.data.eq(tree.o), acc.i.payload.ctx.eq(tag.ctx),
                     acc.i.payload.first.eq(tag.first), acc.i.payload.last.eq(tag.last), acc.o.ready.eq(1)]
        m.submodules.rows = row_fifo = fifo.SyncFIFO(width=32, depth=4 + self.latency["sum"])
        m.d.comb += [row_fifo.w_en.eq(issuing & is_sum & last_chunk), row_fifo.w_data.eq(cur_r),
                     row_fifo.r_en.eq(acc.o.valid)]
        m.submodules.sum_fp16 = sum_conv = ToFP16Core()
        m.d.comb += sum_conv.i.eq(acc.o.payload.data)
        sum_tag = Signal(data.StructLayout({"valid": 1, "r": 32}))
        m.d.comb += [sum_tag.valid.eq(acc.o.valid), sum_tag.r.eq(row_fifo.r_data)]
        sum_out = pipe(m, sum_tag, ToFP16Core.latency, name="sum_out")

        # VMAX: max tree per chunk (unused lanes hold the order's minimum), running max over the row
        maxer = m.submodules.max_tree = MaxTreeCore(V)
        m.d.comb += [maxer.i[i].eq(Mux(in_n[i], a[i], FP16_MIN_KEY)) for i in range(V)]
        mtag = pipe(m, beat1, self.max_latency, name="max_tag")
        best = Signal(16)
        newer = order_key(m, data.View(FP16, Value.cast(maxer.o)), name="max_new") > \
            order_key(m, data.View(FP16, best), name="max_best")
        row_max = Signal(16)
        m.d.comb += row_max.eq(Mux(mtag.first | newer, Value.cast(maxer.o), best))
        with m.If(mtag.valid & mtag.max):
            m.d.sync += best.eq(row_max)

        # --- write ----------------------------------------------------------------------------
        # Muxes, not Ifs: Icarus never evaluates an `always @*` whose inputs keep their initial values (before the
        # unit's first instruction), leaving this write's request X, and with it the grants of ABUF's later writers
        port = frozen.write["dst"]
        one = is_sum | is_max
        m.d.comb += [port.addr.eq(Mux(is_sum, dst + sum_out.r * sd, Mux(is_max, dst + mtag.r * sd,
                                                                         dst + ew.r * sd + ew_col))),
                     port.data[0].eq(Mux(is_sum, sum_conv.o, Mux(is_max, row_max, results[0]))),
                     port.mask.eq(Mux(one, 1, ew_mask)),
                     port.en.eq(Mux(is_sum, sum_out.valid, Mux(is_max, mtag.valid & mtag.max & mtag.last,
                                                               ew.valid & ~ew.sum & ~ew.max)))]
        m.d.comb += [port.data[i].eq(Mux(one, 0, results[i])) for i in range(1, V)]
        with m.If(port.en):
            m.d.sync += written.eq(written + 1)
        frozen.wrap()
        return outer

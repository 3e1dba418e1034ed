"""The controller: decode, the register file, the control instructions, in-order issue into per-unit
queues under the scoreboard, completion, errors and the run's counters.

    Fetch ──words──▶ head ──▶ control instruction: executed here (registers, NOP, BARRIER, HALT)
                         └──▶ unit instruction + registers ──(scoreboard: no hazard)──▶ queue_<unit>
                                                                                          │ issue_<unit>
    unit ──status_<unit> (Completion)──▶ scoreboard frees the entry; error -> stop ◀───────┘
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import EXECUTING_UNITS, HOST_POS_REG, HOST_ROWS_REG, NUM_REGS, OPCODES, REG_BITS, Opcode, Unit

from .axi import AXI_ADDRESS_BITS
from .fetch import PC_BITS, FetchedLayout, FetchPort
from .interfaces import Completion, ErrorCode, IssueLayout, check_instruction
from .scoreboard import Scoreboard

COUNTER_BITS = Shape.cast(Completion().members["cycles"].shape).width
"""Width of the run's cycle counter and busy counters: that of a unit's `Completion.cycles`."""
REGISTER_WRITES = (Opcode.SETI, Opcode.ADDI, Opcode.MULI, Opcode.ADD)
DRAINS = (Opcode.BARRIER, Opcode.HALT)


def illegal_word(m: Module, inst, *, name: str = "illegal") -> Signal:
    """Whether `inst` (an InstructionLayout view) is not a legal instruction, as isa.validate and isa.decode
    judge it: an unknown opcode, a reserved bit, a field, flag or register the opcode does not use, or an
    operand space it does not take (interfaces.check_instruction over every opcode)."""
    checks = check_instruction(m, inst, tuple(OPCODES), name=name)
    illegal = Signal(name=name)
    m.d.comb += illegal.eq(checks["wrong_unit"] | checks["reserved"] | checks["bad_space"])
    return illegal


def earliest_error(m: Module, candidates: list, *, name: str = "err") -> tuple:
    """(any, code, pc) of the candidate (present, code, pc) with the lowest pc, the first listed on equal pcs: a
    balanced tree of pairwise choices (log2 of the count deep, where a chain of choices was as deep as the list)."""
    level = 0
    while len(candidates) > 1:
        paired = []
        for index in range(0, len(candidates) - 1, 2):
            (a_any, a_code, a_pc), (b_any, b_code, b_pc) = candidates[index], candidates[index + 1]
            take_b = b_any & (~a_any | (b_pc < a_pc))
            chosen = (Signal(name=f"{name}{level}_{index}_any"), Signal(ErrorCode, name=f"{name}{level}_{index}_code"),
                      Signal(PC_BITS, name=f"{name}{level}_{index}_pc"))
            m.d.comb += [chosen[0].eq(a_any | b_any), chosen[1].eq(Mux(take_b, b_code, a_code)),
                         chosen[2].eq(Mux(take_b, b_pc, a_pc))]
            paired.append(chosen)
        candidates = paired + candidates[len(candidates) // 2 * 2:]
        level += 1
    return candidates[0]


def control_value(inst, regs):
    """The value SETI, ADDI, MULI or ADD writes to R[rd] (isa.control_result): 32-bit wrap, R0 reads 0."""
    rs, rt, imm = regs[inst.rs], regs[inst.rt], inst.imm.as_unsigned()
    return Mux(inst.opcode == Opcode.SETI, imm,
               Mux(inst.opcode == Opcode.ADDI, rs + imm,
                   Mux(inst.opcode == Opcode.MULI, rs * imm, rs + rt)))[:REG_BITS]


class Controller(wiring.Component):
    """Runs a program: decode, registers, control instructions, in-order issue, completion and errors.

    Host side: `start` (one-cycle pulse, ignored while `busy`) with `pos` and `rows` (R1 and R2 of the run;
    every other register starts at 0) and `program_base` (byte address of pc 0, a multiple of
    INSTRUCTION_BYTES); `busy` from `start` until `done`; `done` (held until the next start) once the run
    has ended: after a HALT, or after an error, in both cases once every instruction issued has completed;
    `error` (ErrorCode, NONE after a HALT) and `error_pc`; `pc`, the instruction at the head (the next to
    issue; after the run, the HALT or the word that stopped it); `cycles`, cycles from `start` to `done`;
    `busy_<unit>`, the sum of the unit's `Completion.cycles` in the run (for calibration).

    Core side: `fetch` (FetchPort, to `Fetch.control`); per unit of EXECUTING_UNITS (dma, matrix, vector,
    router) `issue_<unit>` (stream of IssueLayout: the word and the 16 registers at issue, R0 = 0) from a
    queue of `queue_depth` entries (SyncFIFOBuffered), and `status_<unit>` (Completion).

    Per word at the head, in program order: a word fetched with an AXI error stops the run with BUS, an
    illegal word (`illegal_word`) with ILLEGAL, both at its pc; SETI, ADDI, MULI, ADD write R[rd] (R0 stays
    0) and NOP passes, one cycle each; BARRIER waits until nothing is in flight, then passes; HALT waits
    until nothing is in flight and ends the run; any other instruction enters its unit's queue once the
    scoreboard sees no hazard and the queue has room. A unit completing with an error stops the run with
    that code at the instruction's pc (the scoreboard keeps the pc of each one in flight). A run that
    stops issues nothing more, lets what it issued complete, and reports the error of the lowest pc seen.

    Latency: a word at the head is decided in the same cycle (one instruction per cycle when nothing
    waits); a queued instruction is on `issue_<unit>` 2 cycles after it entered the queue (empty queue);
    a completion frees its scoreboard entry for the next cycle's decision. Throughput: one instruction per
    cycle, bounded by fetch (one word per 512 / hbm_port_bits cycles).
    """

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.units = EXECUTING_UNITS
        members = {"start": In(1), "pos": In(REG_BITS), "rows": In(REG_BITS), "program_base": In(AXI_ADDRESS_BITS),
                   "busy": Out(1), "done": Out(1), "error": Out(ErrorCode), "error_pc": Out(PC_BITS),
                   "pc": Out(PC_BITS), "cycles": Out(COUNTER_BITS), "fetch": Out(FetchPort())}
        for unit in self.units:
            name = unit.name.lower()
            members[f"issue_{name}"] = Out(stream.Signature(IssueLayout))
            members[f"status_{name}"] = In(Completion())
            members[f"busy_{name}"] = Out(COUNTER_BITS)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.scoreboard = board = Scoreboard(cfg)

        regs = Signal(data.ArrayLayout(unsigned(REG_BITS), NUM_REGS))
        head = Signal(FetchedLayout)
        head_valid = Signal()
        running = Signal()
        inst = head.word
        opcode = inst.opcode

        unit = Signal(Unit)
        with m.Switch(opcode):
            for u in self.units:
                with m.Case(*(op for op, spec in OPCODES.items() if spec.unit is u)):
                    m.d.comb += unit.eq(u)
        illegal = illegal_word(m, inst)
        payload = Signal(IssueLayout)
        m.d.comb += [payload.inst.eq(inst), payload.regs.eq(regs),
                     board.inst.eq(inst), board.regs.eq(regs), board.unit.eq(unit), board.pc.eq(head.pc)]

        # --- the word at the head ----------------------------------------------------------------------
        deciding = running & head_valid
        head_error = Signal(ErrorCode)
        with m.If(head.error):
            m.d.comb += head_error.eq(ErrorCode.BUS)
        with m.Elif(illegal):
            m.d.comb += head_error.eq(ErrorCode.ILLEGAL)
        legal = deciding & (head_error == ErrorCode.NONE)
        is_control = unit == Unit.CONTROL
        drains = Cat(opcode == op for op in DRAINS).any()
        room = Signal()
        queues = {}
        for u in self.units:
            name = u.name.lower()
            queues[u] = queue = SyncFIFOBuffered(width=IssueLayout.size, depth=cfg.queue_depth)
            m.submodules[f"queue_{name}"] = queue
            issue = getattr(self, f"issue_{name}")
            m.d.comb += [queue.w_data.eq(payload), issue.valid.eq(queue.r_rdy), issue.payload.eq(queue.r_data),
                         queue.r_en.eq(issue.ready),
                         getattr(board, f"done_{name}").eq(getattr(self, f"status_{name}").done)]
            with m.If(unit == u):
                m.d.comb += room.eq(queue.w_rdy)
        issue_now = legal & ~is_control & room & ~board.hazard
        for u, queue in queues.items():
            m.d.comb += queue.w_en.eq(issue_now & (unit == u))
        m.d.comb += board.push.eq(issue_now)
        passes = legal & is_control & (~drains | board.idle)
        halt_now = passes & (opcode == Opcode.HALT)
        consume = issue_now | (passes & ~halt_now)
        with m.If(legal & is_control & Cat(opcode == op for op in REGISTER_WRITES).any() & (inst.rd != 0)):
            m.d.sync += regs[inst.rd].eq(control_value(inst, regs))

        # --- errors: the lowest pc of this cycle's events and the one recorded --------------------------
        events = [(deciding & (head_error != ErrorCode.NONE), head_error, head.pc)]
        for u in self.units:
            status = getattr(self, f"status_{u.name.lower()}")
            events.append((status.done & (status.error != ErrorCode.NONE), status.error,
                           getattr(board, f"oldest_pc_{u.name.lower()}")))
        candidates = [(self.error != ErrorCode.NONE, self.error, self.error_pc)]
        candidates += [(happened & self.busy, code, pc) for happened, code, pc in events]
        _, best_code, best_pc = earliest_error(m, candidates)
        m.d.sync += [self.error.eq(best_code), self.error_pc.eq(best_pc)]
        failed = Cat(happened for happened, _, _ in events).any() & self.busy
        stop = running & (halt_now | failed)
        m.d.comb += [self.fetch.stop.eq(stop), self.fetch.base.eq(self.program_base)]
        with m.If(stop):
            m.d.sync += running.eq(0)

        # --- fetch into the head -----------------------------------------------------------------------
        words = self.fetch.words
        m.d.comb += words.ready.eq(running & ~stop & (~head_valid | consume))
        with m.If(words.valid & words.ready):
            m.d.sync += [head.eq(words.payload), head_valid.eq(1), self.pc.eq(words.payload.pc)]
        with m.Elif(consume):
            m.d.sync += head_valid.eq(0)

        # --- counters ----------------------------------------------------------------------------------
        with m.If(self.busy):
            m.d.sync += self.cycles.eq(self.cycles + 1)
            for u in self.units:
                name = u.name.lower()
                status = getattr(self, f"status_{name}")
                with m.If(status.done):
                    counter = getattr(self, f"busy_{name}")
                    m.d.sync += counter.eq(counter + status.cycles)

        # --- run control (last: overrides the above) ---------------------------------------------------
        with m.If(self.busy & ~running & ~stop & board.idle):
            m.d.sync += [self.busy.eq(0), self.done.eq(1)]
        with m.If(self.start & ~self.busy):
            # head: all ones until the first word (ignored, head_valid is 0), so that the first word changes it even
            # when it is a NOP (all zeros, the reset value): Icarus (-g2012) runs a combinational block only when
            # one of its inputs changes, and the decode of an unchanged head would stay X
            m.d.sync += [regs.eq(0), regs[HOST_POS_REG].eq(self.pos), regs[HOST_ROWS_REG].eq(self.rows),
                         head.eq(-1), self.busy.eq(1), self.done.eq(0), running.eq(1), head_valid.eq(0), self.pc.eq(0),
                         self.error.eq(ErrorCode.NONE), self.error_pc.eq(0), self.cycles.eq(0)]
            m.d.sync += [getattr(self, f"busy_{u.name.lower()}").eq(0) for u in self.units]
            m.d.comb += self.fetch.start.eq(1)
        return m

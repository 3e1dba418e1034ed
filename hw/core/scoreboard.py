"""The scoreboard: which instruction in flight a new instruction must wait for.

The rule is the footprint of `hw/resolved.py` (`access_blocks` / `access_ranges`), computed in RTL from the
resolved operands: every memory operand an instruction reads or writes is a word range [lo, hi) of its space,
lo = the operand's address, hi = lo + (rows - 1) * stride + cols for the block's rows, columns and stride
(`footprint_rules`, one entry per opcode group, written from `access_blocks`). A new instruction waits while an
instruction issued to another unit and not yet completed writes what it reads, reads what it writes or
writes what it writes in the same space (`Scoreboard.hazard`). Instructions of the same unit are not
compared: a unit takes its next instruction only after it has completed the previous one (interfaces.
accept_states / done_state), in queue order, so their order already holds.

Two blocks have no exact bound before they run, and are taken as [lo, 2**32): a GATHER's table (its rows are
data, as in `access_blocks`) and an ALLGATHER's destination (the other cards' column offsets are known
only to the router): a superset of `access_ranges`, so never a missed hazard.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import (EXECUTING_UNITS, NUM_REGS, REDUCTIONS, REG_BITS, STRIDE_BITS, InstructionLayout,
                             Opcode, Space, Unit, opcodes_of)
from ringgpt.hw.resolved import ADDRESS_LIMIT

from .fetch import PC_BITS
from .interfaces import ADDRESS_BITS, IssueLayout, resolve, weight_words_of

MEMORY_SPACES = (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST)
"""The spaces a footprint tracks (NONE and IMM operands touch no memory)."""

RangeLayout = data.StructLayout({"space": Space, "lo": ADDRESS_BITS, "hi": ADDRESS_BITS + 1})
"""Words [lo, hi) of `space`; `space` NONE: no range. hi saturates at 2**32 (ADDRESS_LIMIT), where every
operand of a legal instruction ends, so overlaps compare exactly as in Python."""
READ_OPERANDS = ("src1", "src2", "aux")
WRITE_OPERANDS = ("dst", "aux")
"""The operands `access_blocks` lists, in its order: reads (src1, src2, aux), writes (dst, aux)."""
FootprintLayout = data.StructLayout({"reads": data.ArrayLayout(RangeLayout, len(READ_OPERANDS)),
                                     "writes": data.ArrayLayout(RangeLayout, len(WRITE_OPERANDS))})


VECTOR_OPS, MATRIX_OPS = opcodes_of(Unit.VECTOR), opcodes_of(Unit.MATRIX)
COPIES = (Opcode.LOAD, Opcode.STORE)


def footprint_rules(r: dict, flags) -> dict:
    """hw/resolved.access_blocks in terms of the resolved fields `r` (interfaces.resolve) and the flags view:
    {(reads|writes, operand): [(opcodes, rows, cols, stride, unbounded), ...]}; an operand no rule names for
    an opcode is not part of its footprint."""
    rows, n, k = r["rows"], r["n"], r["k"]
    one, zero = Const(1, 1), Const(0, 1)

    def own(operand: str):
        return r[f"{operand}_stride"]

    def row_or_n(flag):
        return Mux(flag, one, n)
    return {
        ("reads", "src1"): [(COPIES + VECTOR_OPS + (Opcode.ALLGATHER, Opcode.SEND), rows, n, own("src1"), False),
                            (MATRIX_OPS, rows, k, own("src1"), False),
                            ((Opcode.GATHER,), rows, n, zero, True)],
        ("reads", "src2"): [((Opcode.GATHER,), one, rows, zero, False),
                            (MATRIX_OPS, n, weight_words_of(k, flags.int8), own("src2"), False),
                            (VECTOR_OPS, rows, row_or_n(flags.src2_row_scalar), own("src2"), False)],
        # MATMUL: the bias row, and with INT8 weights their column scales' row aux_stride after it
        ("reads", "aux"): [((Opcode.MATMUL,), Mux(flags.int8, 2, 1), n, Mux(flags.int8, own("aux"), 0), False),
                           (VECTOR_OPS, rows, row_or_n(flags.aux_row_scalar), own("aux"), False)],
        ("writes", "dst"): [(COPIES, Mux(flags.transpose, n, rows), Mux(flags.transpose, rows, n), own("dst"), False),
                            ((Opcode.GATHER, Opcode.RECV) + MATRIX_OPS, rows, n, own("dst"), False),
                            (tuple(op for op in VECTOR_OPS if op not in REDUCTIONS), rows, n, own("dst"), False),
                            (REDUCTIONS, rows, one, own("dst"), False),
                            ((Opcode.ALLGATHER,), rows, one, zero, True)],
        ("writes", "aux"): [((Opcode.MASKED_QK,), rows, one, own("aux"), False)],
    }


def footprint(m: Module, issue, *, name: str = "fp"):
    """The footprint (FootprintLayout view) of `issue` (an IssueLayout view), combinational: the RTL form
    of hw/resolved.access_ranges (see the module docstring)."""
    r = resolve(m, issue, name=f"{name}_r")
    inst = issue.inst
    out = Signal(FootprintLayout, name=name)
    for (kind, operand), rules in footprint_rules(r, inst.flags).items():
        slot = out[kind][(READ_OPERANDS if kind == "reads" else WRITE_OPERANDS).index(operand)]
        label = f"{name}_{kind}_{operand}"
        rows, cols = Signal(ADDRESS_BITS, name=f"{label}_rows"), Signal(ADDRESS_BITS, name=f"{label}_cols")
        stride = Signal(STRIDE_BITS, name=f"{label}_stride")
        unbounded, used = Signal(name=f"{label}_unbounded"), Signal(name=f"{label}_used")
        with m.Switch(inst.opcode):
            for opcodes, rows_v, cols_v, stride_v, unbounded_v in rules:
                with m.Case(*opcodes):
                    m.d.comb += [rows.eq(rows_v), cols.eq(cols_v), stride.eq(stride_v), unbounded.eq(unbounded_v),
                                 used.eq(1)]
        space, base = r[operand]
        memory = Cat(space == s for s in MEMORY_SPACES).any()
        rows_less_one = Signal(ADDRESS_BITS, name=f"{label}_rows1")
        m.d.comb += rows_less_one.eq(rows - 1)
        end = Signal(unsigned(ADDRESS_BITS + STRIDE_BITS + 1), name=f"{label}_end")
        m.d.comb += end.eq(base + rows_less_one * stride + cols)
        limit = Const(ADDRESS_LIMIT, ADDRESS_BITS + 1)
        m.d.comb += [slot.space.eq(Mux(used & memory & (rows != 0) & (cols != 0), space, Space.NONE)),
                     slot.lo.eq(base),
                     slot.hi.eq(Mux(unbounded | (end >= ADDRESS_LIMIT), limit, end))]
    return out


def overlaps(a, b):
    """Whether two RangeLayout views share a word of the same space."""
    return (a.space != Space.NONE) & (a.space == b.space) & (a.lo < b.hi) & (b.lo < a.hi)


def conflicts(new, old):
    """Whether footprint `new` (issued later) must wait for `old`: RAW, WAR or WAW in any space."""
    pairs = [(w, r) for w in new.writes for r in old.reads] + [(r, w) for r in new.reads for w in old.writes] \
        + [(w, v) for w in new.writes for v in old.writes]
    return Cat(overlaps(a, b) for a, b in pairs).any()


class Scoreboard(wiring.Component):
    """The footprints and pcs of the instructions in flight, per unit, and the hazard test of a new one.

    Members: the candidate (`inst`, `regs`, its `unit` and `pc`); `hazard`, combinational: the candidate
    conflicts with an instruction of another unit in flight; `push`: the candidate is issued this cycle
    (recorded as the newest of its unit); `done_<unit>` (the unit's `Completion.done`): its oldest
    instruction completed, which frees it; `oldest_pc_<unit>`: the pc of that oldest one (the one a `done`
    completes); `idle`: nothing in flight.

    Size: `entries` = queue_depth + 1 per unit (a full queue and the instruction in the unit). Latency: an
    entry pushed in one cycle counts for `hazard` from the next; a `done` frees its entry for `hazard` in the
    next cycle. Throughput: one push and one `done` per unit per cycle. Logic: one footprint (5 ranges, 5
    multipliers of 32 x 32 bits) and 16 range comparisons per entry.
    """

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.units = EXECUTING_UNITS
        self.entries = cfg.queue_depth + 1
        members = {"inst": In(InstructionLayout), "regs": In(data.ArrayLayout(unsigned(REG_BITS), NUM_REGS)),
                   "unit": In(Unit), "pc": In(PC_BITS), "push": In(1), "hazard": Out(1), "idle": Out(1)}
        for unit in self.units:
            members[f"done_{unit.name.lower()}"] = In(1)
            members[f"oldest_pc_{unit.name.lower()}"] = Out(PC_BITS)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        issue = Signal(IssueLayout)
        m.d.comb += [issue.inst.eq(self.inst), issue.regs.eq(self.regs)]
        new = footprint(m, issue)
        hazards, busy = [], []
        for unit in self.units:
            name = unit.name.lower()
            valid = Signal(self.entries, name=f"{name}_valid")
            prints = [Signal(FootprintLayout, name=f"{name}_fp{i}") for i in range(self.entries)]
            pcs = [Signal(PC_BITS, name=f"{name}_pc{i}") for i in range(self.entries)]
            head = Signal(range(self.entries), name=f"{name}_head")
            tail = Signal(range(self.entries), name=f"{name}_tail")
            push = self.push & (self.unit == unit)
            pop = getattr(self, f"done_{name}") & valid.bit_select(head, 1)
            with m.If(push):
                m.d.sync += tail.eq(_next(tail, self.entries))
                for i in range(self.entries):
                    with m.If(tail == i):
                        m.d.sync += [prints[i].eq(new), pcs[i].eq(self.pc)]
            with m.If(pop):
                m.d.sync += head.eq(_next(head, self.entries))
            for i in range(self.entries):
                with m.If(push & (tail == i)):
                    m.d.sync += valid[i].eq(1)
                with m.Elif(pop & (head == i)):
                    m.d.sync += valid[i].eq(0)
            m.d.comb += getattr(self, f"oldest_pc_{name}").eq(Cat(*pcs).word_select(head, PC_BITS))
            against = Cat(valid[i] & conflicts(new, prints[i]) for i in range(self.entries)).any()
            hazards.append((self.unit != unit) & against)
            busy.append(valid.any())
        m.d.comb += [self.hazard.eq(Cat(*hazards).any()), self.idle.eq(~Cat(*busy).any())]
        return m


def _next(index, size: int):
    return Mux(index == size - 1, 0, index + 1)

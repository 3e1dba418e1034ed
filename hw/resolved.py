"""One definition of a resolved instruction and of its read/write footprint, shared by the functional
simulator (sim/functional), the cycle model (sim/cycle_model/), the plan check (host/compiler/verify.py,
host/check.py) and the RTL (the scoreboard follows `access_ranges`; the units' issue payload carries the
fields `Resolved` names, resolved by `hw/core/interfaces.resolve` the same way).

* `Resolved`: one executed instruction with every register-relative field resolved.
* `Decoded`: an instruction pre-decoded once, resolved against the registers when executed.
* `resolve_run` / `with_gather_slices`: a whole card program resolved for one run, as the cards execute it.
* `Block`, `access_blocks`, `access_ranges`: the exact words an instruction reads and writes, and their
  bounding ranges (the scoreboard's rule).
* `misaligned_weights`: the matrix unit's alignment rule for its weights (src2, in WBUF).
* `misaligned_transfer`: the DMA engines' rule for a LOAD's or GATHER's rows from HBM or the host into a buffer.
* `misaligned_vector`: the vector unit's alignment rule for its ABUF operands.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

from ringgpt.hw.isa import (HOST_POS_REG, HOST_ROWS_REG, NUM_REGS, OPCODES, REG_MASK, Flags, Instruction, Opcode,
                            Space, Unit, control_result, weight_words)

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
        reads = [_block(r, "src1", r.rows, r.k), _block(r, "src2", r.n, weight_words(r.k, r.flags.int8))]
        writes = [_block(r, "dst", r.rows, r.n)]
        if op is Opcode.MATMUL:     # the bias row, and with INT8 weights their scales' row aux_stride after it
            reads.append(_block(r, "aux", 2, r.n) if r.flags.int8 else _block(r, "aux", 1, r.n, 0))
        else:
            writes.append(_block(r, "aux", r.rows, 1))
    elif unit is Unit.VECTOR:
        reads = [_block(r, "src1", r.rows, r.n),
                 _block(r, "src2", r.rows, 1 if r.flags.src2_row_scalar else r.n),
                 _block(r, "aux", r.rows, 1 if r.flags.aux_row_scalar else r.n)]
        writes = [_block(r, "dst", r.rows, 1 if OPCODES[op].reduces else r.n)]
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


def misaligned_weights(r: Resolved, align: int) -> str | None:
    """Why a MATMUL's or MASKED_QK's operands break the matrix unit's alignment rule, or None: src2 and src2_stride
    must be multiples of `align` words (ArchConfig.weight_align), in WBUF, so that each lane's weight tile is one
    memory row (the RTL refuses the word with ErrorCode.MISALIGNED); with INT8 weights src1 and src1_stride too, so
    that a beat's activations (2 x mac_width words) are whole memory rows at u280. An empty instruction (rows or n
    0) is exempt."""
    if r.op not in (Opcode.MATMUL, Opcode.MASKED_QK) or not (r.rows and r.n):
        return None
    operands = (("weights", "src2", r.src2, r.src2_stride, "column stride", "each lane's weight tile from one"),
                ("activations", "src1", r.src1, r.src1_stride, "row stride", "each beat's activations from whole"))
    for what, name, (space, address), stride, step, reads in operands[:2 if r.flags.int8 else 1]:
        if address % align or stride % align:
            return (f"its {what} ({name}) at {space.name} word {address} with {step} {stride} are not on "
                    f"{align}-word boundaries (the matrix unit reads {reads} {space.name} row{'s' if what[0] == 'a' else ''})")
    return None


def misaligned_vector(r: Resolved, align: int) -> str | None:
    """Why a vector instruction's ABUF operands break the vector unit's alignment rule, or None: with more than one
    word a row (n > 1), src1, and src2 and aux where they are in ABUF and not row scalars, must start on multiples
    of `align` words (ArchConfig.vector_align), their row strides too with more than one row, so that each step
    reads an operand from one memory row (the RTL refuses the word with ErrorCode.MISALIGNED). One word a row (n = 1,
    a row scalar) may lie anywhere; dst is free. An empty instruction (rows or n 0) is exempt."""
    if OPCODES[r.op].unit is not Unit.VECTOR or not r.rows or r.n <= 1:
        return None
    for name, scalar in (("src1", None), ("src2", "src2_row_scalar"), ("aux", "aux_row_scalar")):
        space, address = getattr(r, name)
        if space is not Space.ABUF or (scalar and getattr(r.flags, scalar, 0)):
            continue
        stride = getattr(r, f"{name}_stride") if r.rows > 1 else 0
        if address % align or stride % align:
            return (f"its {name} at ABUF word {address}{f' with row stride {stride}' if r.rows > 1 else ''} is not on "
                    f"{align}-word boundaries (the vector unit reads each step of an operand from one ABUF row)")
    return None


def misaligned_transfer(r: Resolved, beat: int) -> str | None:
    """Why a LOAD's or GATHER's rows from HBM or the host into ABUF or WBUF break the DMA engines' rule, or None:
    each word must lie at the same offset within its `beat`-word group (hbm_port_bits / 16) in the buffer as in
    HBM or the host, so that an engine writes a beat's words into a buffer row without shifting them
    (hw/core/port_engine.py, PortEngine; the RTL refuses the word with ErrorCode.MISALIGNED). A LOAD: dst - src1
    and, with more than one row, dst_stride - src1_stride multiples of `beat`; a GATHER (any table row): dst - src1,
    src1_stride and, with more than one row, dst_stride. Transposed LOADs (through the transpose tile), STOREs,
    on-chip copies and empty instructions (rows or n 0) are exempt."""
    if (r.op not in (Opcode.LOAD, Opcode.GATHER) or not (r.rows and r.n) or r.src1[0] not in (Space.HBM, Space.HOST)
            or (r.op is Opcode.LOAD and r.flags.transpose)):
        return None
    steps = {"dst - src1": r.dst[1] - r.src1[1]}
    if r.op is Opcode.GATHER:
        steps["src1_stride"] = r.src1_stride
    if r.rows > 1:
        steps["dst_stride" if r.op is Opcode.GATHER else "dst_stride - src1_stride"] = (
            r.dst_stride - (0 if r.op is Opcode.GATHER else r.src1_stride))
    off = {name: value for name, value in steps.items() if value % beat}
    if off:
        said = ", ".join(f"{name} = {value}" for name, value in off.items())
        return (f"its {r.src1[0].name} and {r.dst[0].name} words lie at different offsets within the {beat}-word "
                f"beat ({said}: not multiples of {beat}; the DMA engines write each beat into a buffer row unshifted)")
    return None


def _NO_REGISTERS(regs: list) -> tuple:
    return ()


def scoreboard_ranges(r: Resolved) -> tuple:
    """(reads, writes): the ranges the RTL's scoreboard tracks (hw/core/scoreboard.py): access_ranges, except an
    ALLGATHER's destination, from its base up to ADDRESS_LIMIT whenever it has rows (only the router learns the other
    cards' columns)."""
    reads, writes = access_ranges(r)
    if r.op is Opcode.ALLGATHER and r.rows:
        writes = ((r.dst[0], r.dst[1], ADDRESS_LIMIT),)
    return reads, writes


def hazard(reads: tuple, writes: tuple, reads_old: tuple, writes_old: tuple) -> bool:
    """Whether an instruction with footprint (reads, writes) must wait for one in flight with (reads_old,
    writes_old): it writes what the other reads or writes, or reads what the other writes (WAR, WAW, RAW), two
    ranges (space, lo, hi) of one space overlapping. The scoreboard's rule (hw/core/scoreboard.py), as the cycle
    model and the controller's testbench apply it."""
    for space, lo, hi in writes:
        for space_o, lo_o, hi_o in writes_old:
            if space is space_o and lo < hi_o and lo_o < hi:
                return True
        for space_o, lo_o, hi_o in reads_old:
            if space is space_o and lo < hi_o and lo_o < hi:
                return True
    for space, lo, hi in reads:
        for space_o, lo_o, hi_o in writes_old:
            if space is space_o and lo < hi_o and lo_o < hi:
                return True
    return False


class Decoded:
    """An instruction pre-decoded at load into plain tuples, resolved against the registers when
    executed (the last resolution is kept and reused while the registers it reads are unchanged)."""
    __slots__ = ("inst", "op", "operands", "dims", "strides", "flags", "ctrl", "regs_read", "_key", "_last")

    def __init__(self, inst: Instruction):
        self.inst = inst
        self.op = inst.opcode
        self.operands = tuple((o.space, o.reg, o.offset) for o in (inst.dst, inst.src1, inst.src2, inst.aux))
        self.dims = tuple((d.reg, d.imm) for d in (inst.rows, inst.n, inst.k, inst.pos))
        self.strides = (inst.dst_stride, inst.src1_stride, inst.src2_stride, inst.aux_stride)
        self.flags = inst.flags
        self.ctrl = (inst.rd, inst.rs, inst.rt, inst.imm)
        self.regs_read = tuple(sorted({reg for _, reg, _ in self.operands if reg}
                                      | {reg for reg, _ in self.dims if reg}))
        self._key = operator.itemgetter(*self.regs_read) if self.regs_read else _NO_REGISTERS
        self._last = (object(), None)

    def resolve(self, regs: list, card: int) -> Resolved:
        key = self._key(regs)  # the values of the registers it reads
        last_key, resolved = self._last
        if key == last_key:
            return resolved
        operands = [(space, (offset + regs[reg]) & REG_MASK) if reg else (space, offset)
                    for space, reg, offset in self.operands]
        rows, n, k, pos = [(imm + regs[reg]) & REG_MASK if reg else imm for reg, imm in self.dims]
        resolved = Resolved(self.op, card, rows, n, k, pos, *operands, *self.strides, self.flags)
        self._last = (key, resolved)
        return resolved


_WRITES_RD = frozenset(op for op, spec in OPCODES.items() if "rd" in spec.control)


def trace_run(program: list, card: int, pos: int, rows: int, *, to_halt: bool = True) -> list:
    """The Resolved of each instruction of a card's program (Decoded list) in the run at (pos, rows), in the order the
    card executes them, up to and with its first HALT (to_halt=False: the whole program): what the card's trace holds,
    as programs have no branches and only control instructions change the registers operands read. ALLGATHER slices
    are left empty: `with_gather_slices` fills them from all cards. A Decoded whose registers are unchanged since its
    last resolution gives the same object."""
    regs = [0] * NUM_REGS
    regs[HOST_POS_REG], regs[HOST_ROWS_REG] = pos, rows
    resolved = []
    for decoded in program:
        r = decoded.resolve(regs, card)
        resolved.append(r)
        if r.op in _WRITES_RD:
            rd, rs, rt, imm = decoded.ctrl
            if rd:
                regs[rd] = control_result(r.op, regs, rs, rt, imm)
        elif r.op is Opcode.HALT and to_halt:
            break
    return resolved


def resolve_run(program: list, card: int, pos: int, rows: int) -> list:
    """Each instruction of a card's program (Instruction list) resolved for the run at (pos, rows), as the card
    executes it (`trace_run`), None in the place of control instructions. ALLGATHER slices are left empty:
    `with_gather_slices` fills them from all cards."""
    return [None if OPCODES[r.op].unit is Unit.CONTROL else r
            for r in trace_run([Decoded(inst) for inst in program], card, pos, rows, to_halt=False)]


def with_gather_slices(runs: list) -> list:
    """Every card's resolve_run output with each ALLGATHER's slices filled ((n, k) of every card, in card order):
    the i-th ALLGATHERs of all cards meet. Raises ValueError when the cards' ALLGATHER counts differ."""
    gathers = [[pc for pc, r in enumerate(run) if r is not None and r.op is Opcode.ALLGATHER] for run in runs]
    if len({len(g) for g in gathers}) > 1:
        raise ValueError(f"the cards' programs have different ALLGATHER counts {[len(g) for g in gathers]}")
    runs = [list(run) for run in runs]
    for meeting in zip(*gathers):
        slices = tuple((runs[c][pc].n, runs[c][pc].k) for c, pc in enumerate(meeting))
        for c, pc in enumerate(meeting):
            runs[c][pc] = runs[c][pc]._replace(slices=slices)
    return runs

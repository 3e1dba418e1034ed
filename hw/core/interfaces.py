"""Every signature and payload layout the core's units share, in one place.

* `IssueLayout`: what the controller hands a unit: the instruction word as the ISA's own
  `InstructionLayout` view and the 16 register values. Units resolve register-relative fields
  themselves (`resolve`): an operand's address is `offset + R[reg]`, a dimension `imm + R[reg]`
  (32-bit wrap, R0 reads 0), exactly as `sim/functional` does.
* `Completion`: the unit's answer: a one-cycle `done` pulse, an `ErrorCode` and the cycles the unit
  was busy with the instruction (from accepting it to `done`).
* `ReadPort(words)` / `WritePort(words)`: a buffer port `words` FP16 words wide at any word address
  (the buffers shift the words of two chunk rows into place; see `buffers.py`). Reads return data one cycle after the
  address (`READ_LATENCY`). Signatures are seen from the unit (the unit drives the address).
* `TileReadPort(lanes, words)`: `lanes` reads at once through the buffer's one read port per bank, which may
  take several cycles (`ready`); the matrix unit's tiles, the vector unit's operands.
* `SharedReadPort(words)` / `RowWritePort(chunk, rows)` / `BankWritePort(chunk, banks)` / `SharedWritePort(words)`:
  requesters of a group that shares one read (write) port per memory, granted in priority order (`ready`), the
  reads ahead of the tile ports; the DMA's beats and on-chip chunks (its engines' rows one row per memory,
  already chosen), the router's payload and writes, the units' results.
* `Frozen`: a unit whose logic stops while its tile reads and shared writes wait.

Checks every unit applies before it touches a buffer (`check_instruction`), derived from
`isa.OPCODES`, so no field width, opcode number or space code is restated here.
"""
from __future__ import annotations


from amaranth.hdl import Cat, Const, EnableInserter, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw import isa
from ringgpt.hw.isa import DIMS, FLAG_NAMES, NUM_REGS, OPCODES, OPERANDS, REG_BITS, STRIDES, InstructionLayout, Space

WORD = 16
"""Bits of one buffer word (FP16)."""
ADDRESS_BITS = REG_BITS
"""Word addresses and dimensions after register resolution (32-bit wrap)."""

IssueLayout = data.StructLayout({"inst": InstructionLayout, "regs": data.ArrayLayout(unsigned(REG_BITS), NUM_REGS)})
"""One instruction issued to a unit: the word and the register file at issue."""


class ErrorCode(enum.Enum, shape=4):
    """Why a unit refused an instruction (it then writes nothing and completes at once), or why the core
    stopped."""
    NONE = 0
    WRONG_UNIT = 1
    """The opcode is not one this unit executes (or no opcode at all)."""
    RESERVED = 2
    """A reserved bit is set, or a field, flag or register the opcode does not use is not zero."""
    BAD_SPACE = 3
    """An operand names a memory space the opcode does not take there."""
    ZERO_DIM = 4
    """A dimension that must not be zero resolves to zero (a MATMUL's k, a router op's rows)."""
    OUT_OF_RANGE = 5
    """An operand block runs past the end of its buffer (or past 2**32)."""
    ILLEGAL = 6
    """The fetched word is not an instruction (unknown opcode, or a field the opcode forbids): the
    controller stops the core at its pc."""
    BUS = 7
    """An AXI4 response was SLVERR or DECERR (an address outside the memory behind the port)."""
    RING = 8
    """A collective did not match the other cards' (rows, slices, or a RECV of the wrong size)."""
    EMPTY = 9
    """Not an error: rows or n resolves to zero, so the instruction does nothing, as in the functional
    simulator (no address is checked). A unit takes its error path, writing nothing, and `reported` turns the
    code into NONE on its Completion."""
    MISALIGNED = 10
    """A MATMUL's or MASKED_QK's weights (in WBUF) start, or step from column to column, off a multiple of
    `ArchConfig.weight_align` words (hw/resolved.misaligned_weights); or a LOAD's or GATHER's HBM/host words lie at
    other offsets within the beat than their buffer words (hw/resolved.misaligned_transfer)."""


class Completion(wiring.Signature):
    """Unit -> controller: `done` (one cycle per instruction), its `error` and busy `cycles`."""

    def __init__(self):
        super().__init__({"done": Out(1), "error": Out(ErrorCode), "cycles": Out(32)})

    def __eq__(self, other):
        return type(other) is Completion

    def __repr__(self):
        return "Completion()"


class ReadPort(wiring.Signature):
    """A `words`-wide read at any word address: `data[i]` = buffer[addr + i], READ_LATENCY after `addr`."""

    def __init__(self, words: int):
        self.words = words
        super().__init__({"addr": Out(ADDRESS_BITS), "data": In(data.ArrayLayout(WORD, words))})

    def __eq__(self, other):
        return type(other) is ReadPort and other.words == self.words

    def __repr__(self):
        return f"ReadPort({self.words})"


class WritePort(wiring.Signature):
    """A `words`-wide write at any word address: buffer[addr + i] = data[i] where en and mask[i]."""

    def __init__(self, words: int):
        self.words = words
        super().__init__({"addr": Out(ADDRESS_BITS), "data": Out(data.ArrayLayout(WORD, words)),
                          "mask": Out(words), "en": Out(1)})

    def __eq__(self, other):
        return type(other) is WritePort and other.words == self.words

    def __repr__(self):
        return f"WritePort({self.words})"


class TileReadPort(wiring.Signature):
    """`lanes` reads of `words` words each, at any word addresses, through one memory port per bank:
    `data[l][i]` = buffer[addr[l] + i] for the lanes with `en[l]` and i < widths[l] (the words lane l needs,
    by default `words`; only i = 0 for a lane with `single[l]`: a row scalar), READ_LATENCY after the cycle in
    which `ready` is high, and as long after as the unit holds `addr` and `single` with no lane enabled. A lane
    not enabled keeps the rows it last read: while its `addr` and `single` stay those of that read, its data are
    those words again (the matrix unit's x tile, re-used by consecutive beats). A lane reads its first chunk and
    the next one when its wanted words run past it. A bank serves one distinct chunk per cycle, so a request
    whose busiest bank holds c distinct chunks takes c cycles (`banks.tile_read_cycles`), more while the
    buffer's other readers hold its banks: `ready` is low until the last chunk is read, and the unit holds
    `addr`, `en` and `single` until it is high. With no lane enabled `ready` is high.

    An *aligned* lane (`aligned[l]`: True for a step of `words`, or a step of that many words, a power of two) reads
    the one chunk holding its address, which the unit keeps a multiple of the step (the buffer ignores the low
    bits), its words wanted lying within that chunk: it needs no second row and shifts its words by whole steps
    only (a `words`-word step: no shift), so it costs about a third of a lane at any address. Of the aligned lanes,
    those in `scalars` may also be `single` at any word: its word arrives as data[l][0]."""

    def __init__(self, lanes: int, words: int, widths: tuple | None = None, aligned: tuple | None = None,
                 scalars: tuple | None = None):
        self.lanes, self.words = lanes, words
        self.widths = tuple(widths) if widths is not None else (words,) * lanes
        steps = tuple(aligned) if aligned is not None else (False,) * lanes
        self.aligned = tuple(words if a is True else int(a) for a in steps)
        """Each lane's step in words (0: a lane at any address)."""
        self.scalars = tuple(bool(s) for s in scalars) if scalars is not None else (False,) * lanes
        if len(self.widths) != lanes or not all(1 <= w <= words for w in self.widths):
            raise ValueError(f"lane widths {self.widths}: need one of 1 to {words} words for each of {lanes} lanes")
        if len(self.aligned) != lanes or any(a and (a & (a - 1) or a > words) for a in self.aligned):
            raise ValueError(f"aligned lanes {steps}: need one flag or step for each of {lanes} lanes, each step a "
                             f"power of two of at most {words} words")
        if len(self.scalars) != lanes or any(s and not a for s, a in zip(self.scalars, self.aligned)):
            raise ValueError(f"scalar lanes {self.scalars}: need one flag for each of {lanes} lanes, set only on "
                             "aligned lanes (any lane may be single)")
        super().__init__({"addr": Out(data.ArrayLayout(ADDRESS_BITS, lanes)), "en": Out(lanes), "single": Out(lanes),
                          "ready": In(1), "data": In(data.ArrayLayout(data.ArrayLayout(WORD, words), lanes))})

    def __eq__(self, other):
        return type(other) is TileReadPort and (other.lanes, other.words, other.widths, other.aligned,
                                                other.scalars) == (self.lanes, self.words, self.widths, self.aligned,
                                                                   self.scalars)

    def __repr__(self):
        return f"TileReadPort({self.lanes}, {self.words}, {self.widths}, aligned={self.aligned}, scalars={self.scalars})"


class SharedReadPort(wiring.Signature):
    """A `words`-wide read at any word address through the buffer's one read port per memory, which a group
    of requesters shares in priority order: `data[i]` = buffer[addr + i], READ_LATENCY after the cycle in
    which `en` and `ready` are high. `ready`: no requester granted before it reads one of the (one or two)
    memories the read touches this cycle (the `urgent` ones first, each class in the group's order); the
    requester holds `addr` and `en` until then."""

    def __init__(self, words: int):
        self.words = words
        super().__init__({"addr": Out(ADDRESS_BITS), "en": Out(1), "urgent": Out(1), "ready": In(1),
                          "data": In(data.ArrayLayout(WORD, words))})

    def __eq__(self, other):
        return type(other) is SharedReadPort and other.words == self.words

    def __repr__(self):
        return f"SharedReadPort({self.words})"


class SharedWritePort(wiring.Signature):
    """A `words`-wide write at any word address through the buffer's one write port per memory, which a group
    of requesters shares in priority order: buffer[addr + i] = data[i] where mask[i], in the cycle in which `en`
    and `ready` are high. The write claims the memories of its whole window (the chunk of `addr`, and the next
    when the words run past it), whatever its mask. `ready`: no requester granted before it writes one of those
    memories this cycle (the `urgent` ones first, each class in the group's order); the requester holds the
    request until then (a unit frozen on it: `Frozen`)."""

    def __init__(self, words: int):
        self.words = words
        super().__init__({"addr": Out(ADDRESS_BITS), "data": Out(data.ArrayLayout(WORD, words)), "mask": Out(words),
                          "en": Out(1), "urgent": Out(1), "ready": In(1)})

    def __eq__(self, other):
        return type(other) is SharedWritePort and other.words == self.words

    def __repr__(self):
        return f"SharedWritePort({self.words})"


class RowWritePort(wiring.Signature):
    """A write into `rows` (1 or 2) consecutive chunks of `chunk` words from `first` on, through the buffer's one
    write port per memory, which a group of requesters shares in priority order: word chunk * first + i
    (i < rows * chunk) takes data[i] where mask[i], in the cycle in which `en` and `ready` are high. `ready`: no
    requester granted before it writes one of the memories of the chunks with a mask bit set this cycle (the
    `urgent` ones first, each class in the group's order); the requester holds the request until then. Whole rows
    are what the memories write at once, so a requester that merges its words into rows before asking needs the
    fewest grants; each memory chooses among its requesters' rows, so one row a requester halves that choice."""

    def __init__(self, chunk: int, rows: int = 2):
        if rows not in (1, 2):
            raise ValueError(f"a RowWritePort writes 1 or 2 chunks, not {rows}")
        self.chunk, self.rows = chunk, rows
        super().__init__({"first": Out(ADDRESS_BITS), "data": Out(data.ArrayLayout(WORD, rows * chunk)),
                          "mask": Out(rows * chunk), "en": Out(1), "urgent": Out(1), "ready": In(1)})

    def __eq__(self, other):
        return type(other) is RowWritePort and (other.chunk, other.rows) == (self.chunk, self.rows)

    def __repr__(self):
        return f"RowWritePort({self.chunk}, rows={self.rows})"


class BankWritePort(wiring.Signature):
    """A write of one row into each of the buffer's `banks` memories at once, the rows already chosen outside
    the buffer (the DMA engines' crossbar, shared by ABUF and WBUF): memory b writes data[b] into its row
    `row[b]` where mask[b], in the cycle in which en[b] and ready[b] are high. As a requester of the buffer's
    write group each memory's row is one requester, granted on its own (`urgent[b]` ones first); ready[b]: no
    requester granted before it writes memory b this cycle. A row past the buffer's end writes nothing."""

    def __init__(self, chunk: int, banks: int):
        self.chunk, self.banks = chunk, banks
        super().__init__({"row": Out(data.ArrayLayout(ADDRESS_BITS, banks)),
                          "data": Out(data.ArrayLayout(data.ArrayLayout(WORD, chunk), banks)),
                          "mask": Out(data.ArrayLayout(chunk, banks)), "en": Out(banks), "urgent": Out(banks),
                          "ready": In(banks)})

    def __eq__(self, other):
        return type(other) is BankWritePort and (other.chunk, other.banks) == (self.chunk, self.banks)

    def __repr__(self):
        return f"BankWritePort({self.chunk}, banks={self.banks})"


class Frozen:
    """A unit whose logic stops while its reads and writes wait for the buffers. `tiles`: name -> the unit's
    TileReadPort members; `writes`: name -> its SharedWritePort members. The frozen logic is built in `core`
    (wrapped by `wrap` in an EnableInserter on `advance`: every port ready) and drives each tile port's request
    through `request[name]` (addr, en, single) and each write through `write[name]` (addr, data, mask, en);
    `data[name]` is what it sees of a tile port: the data of the request granted when it last advanced. A port
    served before the others (`ready` while another is not) is not asked again until the unit advances: its
    enables are masked (`done`), so a read does not start over and a write is not repeated, and a read's data
    stay (the request is held). The writes are `urgent`. `stalls`: the cycles not advanced since the unit last
    accepted an instruction (`issue`), for Completion.cycles."""

    def __init__(self, m: Module, issue, tiles: dict, writes: dict | None = None):
        self.m, self.core = m, Module()
        self.advance = Signal(name="advance")
        writes = writes or {}
        m.d.comb += self.advance.eq(Cat(port.ready for port in [*tiles.values(), *writes.values()]).all())
        advanced = Signal(init=1, name="advanced")
        m.d.sync += advanced.eq(self.advance)
        self.request, self.data, self.write = {}, {}, {}
        for name, port in tiles.items():
            request = self.request[name] = Signal(data.StructLayout({"addr": port.addr.shape(), "en": len(port.en),
                                                                     "single": len(port.single)}), name=f"{name}_request")
            m.d.comb += [port.addr.eq(request.addr), port.single.eq(request.single),
                         port.en.eq(Mux(self._done(m, name, port), 0, request.en))]
            held, seen = Signal(port.data.shape(), name=f"{name}_held"), Signal(port.data.shape(), name=f"{name}_seen")
            m.d.comb += seen.eq(Mux(advanced, port.data, held))
            m.d.sync += held.eq(seen)
            self.data[name] = seen
        for name, port in writes.items():
            request = self.write[name] = Signal(data.StructLayout({"addr": ADDRESS_BITS, "data": port.data.shape(),
                                                                   "mask": len(port.mask), "en": 1}), name=f"{name}_write")
            m.d.comb += [port.addr.eq(request.addr), port.data.eq(request.data), port.mask.eq(request.mask),
                         port.en.eq(Mux(self._done(m, name, port), 0, request.en)), port.urgent.eq(1)]
        self.stalls = Signal(32)
        with m.If(issue.valid & issue.ready):
            m.d.sync += self.stalls.eq(0)
        with m.Elif(~self.advance):
            m.d.sync += self.stalls.eq(self.stalls + 1)

    def _done(self, m: Module, name: str, port) -> Signal:
        """Whether `port` was served since the unit last advanced."""
        done = Signal(name=f"{name}_done")
        m.d.sync += done.eq(~self.advance & (done | port.ready))
        return done

    def wrap(self, name: str = "core") -> None:
        self.m.submodules[name] = EnableInserter(self.advance)(self.core)


def pipe(m: Module, value, cycles: int, *, name: str):
    """`value` delayed by `cycles` registers, keeping its shape (a layout stays a view)."""
    shape = value.shape()
    for n in range(cycles):
        reg = Signal(shape, name=f"{name}_d{n + 1}")
        m.d.sync += reg.eq(value)
        value = reg
    return value


# --- operand resolution ----------------------------------------------------------------------

def accept_states(m: Module, unit, held, cycles) -> None:
    """The states every unit's FSM begins with (call first inside `with m.FSM()`): START, one cycle out of
    reset (Icarus evaluates an FSM's outputs only once its state register has changed), and IDLE, which
    accepts an instruction from `unit.issue` into `held`, starts the busy-cycle count and goes to CHECK."""
    with m.State("START"):
        m.next = "IDLE"
    with m.State("IDLE"):
        m.d.comb += unit.issue.ready.eq(1)
        with m.If(unit.issue.valid):
            m.d.sync += [held.eq(unit.issue.payload), cycles.eq(1)]
            m.next = "CHECK"


def run_or_refuse(m: Module, code, running) -> None:
    """The end of a unit's CHECK state: a legal instruction (`code` NONE) starts running (RUN), any other code
    (an error, or EMPTY) goes straight to DONE, writing nothing."""
    with m.If(code == ErrorCode.NONE):
        m.d.sync += running.eq(1)
        m.next = "RUN"
    with m.Else():
        m.next = "DONE"


def done_state(m: Module, unit, *clear) -> None:
    """DONE: `unit.status.done` for one cycle, the signals `clear` to 0, back to IDLE."""
    with m.State("DONE"):
        m.d.comb += unit.status.done.eq(1)
        m.d.sync += [signal.eq(0) for signal in clear]
        m.next = "IDLE"


def resolve(m: Module, issue, *, name: str = "r") -> dict:
    """The register-relative fields of `issue` (an IssueLayout view) resolved, as combinational
    signals: {operand: (space view, address)}, {dim: value}, {stride: value} (R0 reads 0)."""
    inst = issue.inst
    regs = regs_with_zero(m, issue.regs, name=f"{name}_regs")
    out = {}
    for operand in OPERANDS:
        op = inst[operand]
        addr = Signal(ADDRESS_BITS, name=f"{name}_{operand}")
        m.d.comb += addr.eq(op.offset + regs[op.reg])
        out[operand] = (op.space, addr)
    for dim in DIMS:
        d = inst[dim]
        value = Signal(ADDRESS_BITS, name=f"{name}_{dim}")
        m.d.comb += value.eq(d.imm + regs[d.reg])
        out[dim] = value
    for stride in STRIDES:
        out[stride] = inst[stride]
    return out


def regs_with_zero(m: Module, issue_regs, *, name: str = "regs") -> Signal:
    """The register values with R0 forced to read 0."""
    regs = Signal(data.ArrayLayout(unsigned(REG_BITS), NUM_REGS), name=name)
    m.d.comb += regs.eq(issue_regs)
    m.d.comb += regs[0].eq(0)
    return regs


def weight_words_of(k, int8) -> "Value":
    """isa.weight_words in RTL: the words of a MATMUL weight column of k weights, k FP16 words or k INT8 bytes two
    a word when `int8` (a 1-bit value) is set."""
    return Mux(int8, (k + 1) >> 1, k)


def block_fits(base, rows, cols, stride, size: int) -> "Value":
    """base + (rows - 1) * stride + cols <= size (rows, cols >= 1), computed without wrapping."""
    wide = unsigned(2 * ADDRESS_BITS + 2)
    end = base.as_unsigned() + (rows - 1) * stride + cols
    return end.as_unsigned() <= Const(size, wide)


def check_instruction(m: Module, inst, opcodes, *, name: str = "chk") -> dict:
    """Combinational legality checks of `inst` for a unit executing `opcodes`: {'wrong_unit',
    'reserved', 'bad_space'} as 1-bit signals (space and field rules from isa.OPCODES, as
    isa.validate applies them)."""
    mine = Signal(name=f"{name}_mine")
    reserved = Signal(name=f"{name}_reserved")
    bad_space = Signal(name=f"{name}_bad_space")
    m.d.comb += mine.eq(Cat(inst.opcode == op for op in opcodes).any())
    reserved_terms = [inst.reserved != 0, inst.flags.reserved != 0]
    space_terms = []
    for op in opcodes:
        spec = OPCODES[op]
        is_op = inst.opcode == op
        unused, wrong_space = [], []
        for operand in OPERANDS:
            field = inst[operand]
            allowed = spec.operands.get(operand)
            if allowed is None:
                unused.append(Value.cast(field) != 0)
                continue
            wrong_space.append(~Cat(field.space == s for s in allowed).any())
            for s in (Space.NONE, Space.IMM):
                if s in allowed:
                    unused.append((field.space == s) & (field.reg != 0))
            if Space.IMM in allowed:
                unused.append((field.space == Space.IMM) & (field.offset[WORD:] != 0))
        for group, used in ((DIMS, spec.dims), (STRIDES, spec.strides), (isa.CONTROL_FIELDS, spec.control)):
            for field in group:
                if field not in used:
                    unused.append(Value.cast(inst[field]) != 0)
        for flag in FLAG_NAMES:
            if flag not in spec.flags:
                unused.append(inst.flags[flag] != 0)
        for flag, fields in spec.flag_fields.items():
            unused += [(inst.flags[flag] == 0) & (Value.cast(inst[field]) != 0) for field in fields]
        for flag, operands in spec.flag_operands.items():
            wrong_space += [(inst.flags[flag] != 0) & ~Cat(inst[operand].space == s for s in allowed).any()
                            for operand, allowed in operands.items()]
        if unused:
            reserved_terms.append(is_op & Cat(*unused).any())
        if wrong_space:
            space_terms.append(is_op & Cat(*wrong_space).any())
    m.d.comb += reserved.eq(Cat(*reserved_terms).any())
    m.d.comb += bad_space.eq(Cat(*space_terms).any() if space_terms else 0)
    return {"wrong_unit": ~mine, "reserved": reserved, "bad_space": bad_space}


def error_code(m: Module, checks: dict, *, empty, out_of_range, zero_dim=0, misaligned=0, name: str = "err") -> Signal:
    """The ErrorCode of the first failing check, in the order WRONG_UNIT, RESERVED, BAD_SPACE, EMPTY (a no-op),
    ZERO_DIM, MISALIGNED, OUT_OF_RANGE."""
    code = Signal(ErrorCode, name=name)
    order = [(checks["wrong_unit"], ErrorCode.WRONG_UNIT), (checks["reserved"], ErrorCode.RESERVED),
             (checks["bad_space"], ErrorCode.BAD_SPACE), (empty, ErrorCode.EMPTY), (zero_dim, ErrorCode.ZERO_DIM),
             (misaligned, ErrorCode.MISALIGNED), (out_of_range, ErrorCode.OUT_OF_RANGE)]
    for index, (failed, value) in enumerate(order):
        with (m.If if index == 0 else m.Elif)(failed):
            m.d.comb += code.eq(value)
    return code


def reported(error) -> "Value":
    """The code a unit's Completion carries for its `error` register: NONE for EMPTY (a no-op)."""
    return Mux(error == ErrorCode.EMPTY, ErrorCode.NONE, error)

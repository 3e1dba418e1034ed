"""The instruction set, defined once.

The binary format is the `amaranth.lib.data` layout `InstructionLayout` (512 bits: one HBM beat):
the RTL decoder uses it as a signal view; the assembler, the disassembler, the compiler and the
functional simulator encode and decode with `Layout.const` / `Layout.from_bits`, no simulation
involved. The Python value types (`Operand`, `Dim`, `Flags`, `Instruction`) are named tuples
generated from the layouts, and `OPCODES` says for every opcode which unit runs it, which fields it
reads, which memory spaces each operand may name and what it does; `docs/isa.md` is generated from
it (`python -m ringgpt.hw.isa_doc`).

Addressing. Every address and size can be register-relative: an operand's effective address is
`offset + R[reg]`, a dimension's value is `imm + R[reg]`. R0 reads 0. Before a run the host sets
R1 = position of the first token of the run and R2 = number of tokens (rows) in the run, so one
program serves every token position and prompt length without recompiling.

Addresses count FP16 words in every space. Spaces: ABUF (activation buffer), WBUF (weight buffer),
HBM (the card's HBM, interleaved over all pseudo-channels in granules of the config's hbm_interleave_words, each
stripe of granules permuted by its number: docs/cycle-model.md "HBM"), HOST (the run's host buffer), IMM (the
operand is the FP16 constant in the low 16 bits of `offset`, broadcast everywhere).
"""
# No `from __future__ import annotations`: amaranth.lib.data.Struct reads real annotations.
# Beside this module: the assembly text (hw/assembly.py), the program file (hw/program.py), docs/isa.md (hw/isa_doc.py).

import collections
import dataclasses
from dataclasses import dataclass

from amaranth import signed, unsigned
from amaranth.lib import data, enum

from ringgpt.hw.errors import RingGPTError

INSTRUCTION_BITS = 512
INSTRUCTION_BYTES = INSTRUCTION_BITS // 8
NUM_REGS = 16
REG_BITS = 32
HOST_POS_REG = 1
"""R1: position of the run's first token, written by the host before each run."""
HOST_ROWS_REG = 2
"""R2: number of tokens (rows) in the run, written by the host before each run."""


class IllegalInstructionError(RingGPTError, ValueError):
    """An instruction word, assembly text or program file that does not encode a legal instruction or program."""


class Space(enum.Enum, shape=unsigned(3)):
    __hash__ = object.__hash__  # members are singletons: identity hashing is C-level (Enum's hashes the name)

    NONE = 0
    ABUF = 1
    WBUF = 2
    HBM = 3
    HOST = 4
    IMM = 5


class Unit(enum.Enum, shape=unsigned(3)):
    __hash__ = object.__hash__  # members are singletons: identity hashing is C-level (Enum's hashes the name)

    CONTROL = 0
    DMA = 1
    MATRIX = 2
    VECTOR = 3
    ROUTER = 4


class Opcode(enum.Enum, shape=unsigned(6)):
    __hash__ = object.__hash__  # members are singletons: identity hashing is C-level (Enum's hashes the name)

    NOP = 0x00
    HALT = 0x01
    BARRIER = 0x02
    SETI = 0x03
    ADDI = 0x04
    MULI = 0x05
    ADD = 0x06
    LOAD = 0x10
    STORE = 0x11
    GATHER = 0x12
    MATMUL = 0x20
    MASKED_QK = 0x21
    VADD = 0x30
    VSUB = 0x31
    VMUL = 0x32
    VSCALE_SHIFT = 0x33
    VEXP = 0x34
    VRECIP = 0x35
    VRSQRT = 0x36
    VGELU = 0x37
    VSUM = 0x38
    VDOT = 0x39
    VMAX = 0x3A
    ALLGATHER = 0x28
    SEND = 0x29
    RECV = 0x2A


class OperandLayout(data.Struct):
    space: Space
    reg: unsigned(4)
    offset: unsigned(32)


DIM_IMM_BITS = 28


class DimLayout(data.Struct):
    reg: unsigned(4)
    imm: unsigned(DIM_IMM_BITS)


class FlagsLayout(data.Struct):
    gelu: unsigned(1)
    transpose: unsigned(1)
    src2_row_scalar: unsigned(1)
    aux_row_scalar: unsigned(1)
    int8: unsigned(1)
    reserved: unsigned(3)


STRIDE_BITS = 20


class InstructionLayout(data.Struct):
    opcode: Opcode
    flags: FlagsLayout
    dst: OperandLayout
    src1: OperandLayout
    src2: OperandLayout
    aux: OperandLayout
    rows: DimLayout
    n: DimLayout
    k: DimLayout
    pos: DimLayout
    dst_stride: unsigned(STRIDE_BITS)
    src1_stride: unsigned(STRIDE_BITS)
    src2_stride: unsigned(STRIDE_BITS)
    aux_stride: unsigned(STRIDE_BITS)
    rd: unsigned(4)
    rs: unsigned(4)
    rt: unsigned(4)
    imm: signed(32)
    reserved: unsigned(90)


assert InstructionLayout.as_shape().size == INSTRUCTION_BITS, InstructionLayout.as_shape().size

OPERANDS = ("dst", "src1", "src2", "aux")
DIMS = ("rows", "n", "k", "pos")
STRIDES = ("dst_stride", "src1_stride", "src2_stride", "aux_stride")
CONTROL_FIELDS = ("rd", "rs", "rt", "imm")
FLAG_NAMES = ("gelu", "transpose", "src2_row_scalar", "aux_row_scalar", "int8")


def _tuple_type(name: str, layout) -> type:
    fields = [field for field, _ in data.Layout.cast(layout)]
    return collections.namedtuple(name, fields, defaults=[0] * len(fields))


Operand = _tuple_type("Operand", OperandLayout)
Dim = _tuple_type("Dim", DimLayout)
Flags = _tuple_type("Flags", FlagsLayout)
Operand.__new__.__defaults__ = (Space.NONE, 0, 0)
_NESTED = {"flags": Flags, **{o: Operand for o in OPERANDS}, **{d: Dim for d in DIMS}}


class Instruction(_tuple_type("InstructionFields", InstructionLayout)):
    """One instruction: a named tuple of the InstructionLayout fields (nested tuples for operands,
    dimensions and flags). Build them with `make()`; unset fields are zero."""
    __slots__ = ()

    @classmethod
    def make(cls, opcode: Opcode, **fields) -> "Instruction":
        full = {name: _NESTED[name]() for name in _NESTED}
        full.update(fields)
        inst = cls(opcode=opcode, **full)
        _check_ranges(inst)
        validate(inst)
        return inst

    @property
    def unit(self) -> Unit:
        return OPCODES[self.opcode].unit

    def encode(self) -> int:
        return InstructionLayout.const(_to_dict(self)).as_bits()

    def __str__(self) -> str:
        from ringgpt.hw.assembly import format_instruction   # the assembly text is built on this module
        return format_instruction(self)


def _to_dict(value):
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {name: _to_dict(getattr(value, name)) for name in value._fields}
    return value


# --- what each opcode does -------------------------------------------------------------------

ON_CHIP = (Space.ABUF, Space.WBUF)
VECTOR_SRC = (Space.ABUF, Space.IMM)


@dataclass(frozen=True)
class OpSpec:
    unit: Unit
    summary: str
    action: str
    operands: dict = dataclasses.field(default_factory=dict)
    """operand name -> allowed spaces"""
    dims: tuple = ()
    strides: tuple = ()
    control: tuple = ()
    flags: tuple = ()
    flag_fields: dict = dataclasses.field(default_factory=dict)
    """flag -> the dims and strides the opcode reads only with that flag (zero without it)"""
    flag_operands: dict = dataclasses.field(default_factory=dict)
    """flag -> {operand: the spaces it may name when the flag is set}"""
    reduction: str | None = None
    """"sum" or "max" when the opcode reduces each row to one word (VSUM, VDOT; VMAX), else None."""
    special: str | None = None
    """The special function (a key of numerics.SPECIAL_FUNCTIONS) the opcode applies elementwise, else None."""

    @property
    def reduces(self) -> bool:
        return self.reduction is not None


_ELEMENTWISE = ("for r < rows, j < n: ", "dst[dst + r*dst_stride + j] = ")


def _vector_binary(op: str) -> OpSpec:
    return OpSpec(Unit.VECTOR, f"elementwise {op}",
                  f"{_ELEMENTWISE[0]}{_ELEMENTWISE[1]}fp16(a {op} b), a = src1[src1 + r*src1_stride + j], "
                  "b = src2[src2 + r*src2_stride + j] (src2[src2 + r*src2_stride] with src2_row_scalar; "
                  "the constant with IMM); computed in FP32, rounded once (numerics.vadd/vsub/vmul)",
                  {"dst": (Space.ABUF,), "src1": (Space.ABUF,), "src2": VECTOR_SRC},
                  ("rows", "n"), ("dst_stride", "src1_stride", "src2_stride"), flags=("src2_row_scalar",))


def _vector_unary(fn: str) -> OpSpec:
    return OpSpec(Unit.VECTOR, f"special function {fn}",
                  f"{_ELEMENTWISE[0]}{_ELEMENTWISE[1]}special('{fn}', src1[src1 + r*src1_stride + j]) "
                  "(numerics.special: within 1 FP16 step of the correctly rounded value, IEEE signed zeros and specials)",
                  {"dst": (Space.ABUF,), "src1": (Space.ABUF,)},
                  ("rows", "n"), ("dst_stride", "src1_stride"), special=fn)


OPCODES: dict[Opcode, OpSpec] = {
    Opcode.NOP: OpSpec(Unit.CONTROL, "no operation", "nothing"),
    Opcode.HALT: OpSpec(Unit.CONTROL, "end of program", "waits for every unit to drain, then ends the run"),
    Opcode.BARRIER: OpSpec(Unit.CONTROL, "wait for all units",
                           "issues nothing further until every instruction issued before it has completed"),
    Opcode.SETI: OpSpec(Unit.CONTROL, "set register", "R[rd] = imm", control=("rd", "imm")),
    Opcode.ADDI: OpSpec(Unit.CONTROL, "add immediate", "R[rd] = R[rs] + imm (32-bit wrap)", control=("rd", "rs", "imm")),
    Opcode.MULI: OpSpec(Unit.CONTROL, "multiply by immediate", "R[rd] = R[rs] * imm (32-bit wrap)",
                        control=("rd", "rs", "imm")),
    Opcode.ADD: OpSpec(Unit.CONTROL, "add registers", "R[rd] = R[rs] + R[rt] (32-bit wrap)", control=("rd", "rs", "rt")),
    Opcode.LOAD: OpSpec(Unit.DMA, "copy a 2-D block into an on-chip buffer",
                        "for r < rows, j < n: dst[dst + r*dst_stride + j] = src1[src1 + r*src1_stride + j]; "
                        "with transpose: dst[dst + j*dst_stride + r] = src1[src1 + r*src1_stride + j]. "
                        "From HBM or the host without transpose, dst - src1 and (rows > 1) dst_stride - src1_stride "
                        "are multiples of the beat (hbm_port_bits / 16 words), else the DMA unit refuses the word "
                        "(MISALIGNED)",
                        {"dst": ON_CHIP, "src1": (Space.HBM, Space.HOST, Space.ABUF)},
                        ("rows", "n"), ("dst_stride", "src1_stride"), flags=("transpose",)),
    Opcode.STORE: OpSpec(Unit.DMA, "copy a 2-D block from the activation buffer out to HBM or the host",
                         "for r < rows, j < n: dst[dst + r*dst_stride + j] = src1[src1 + r*src1_stride + j]; "
                         "with transpose: dst[dst + j*dst_stride + r] = src1[src1 + r*src1_stride + j] "
                         "(how V is appended to the transposed V cache)",
                         {"dst": (Space.HBM, Space.HOST), "src1": (Space.ABUF,)},
                         ("rows", "n"), ("dst_stride", "src1_stride"), flags=("transpose",)),
    Opcode.GATHER: OpSpec(Unit.DMA, "gather table rows by index (embedding lookup)",
                          "for r < rows: i = uint16 bits of src2[src2 + r]; for j < n: "
                          "dst[dst + r*dst_stride + j] = src1[src1 + i*src1_stride + j]. dst - src1, src1_stride "
                          "and (rows > 1) dst_stride are multiples of the beat (hbm_port_bits / 16 words), else the "
                          "DMA unit refuses the word (MISALIGNED)",
                          {"dst": (Space.ABUF,), "src1": (Space.HBM,), "src2": (Space.HOST, Space.ABUF)},
                          ("rows", "n"), ("dst_stride", "src1_stride")),
    Opcode.MATMUL: OpSpec(Unit.MATRIX, "matrix product with optional bias and fused GELU, FP16 or INT8 weights",
                          "for r < rows, j < n: acc = dot(src1[src1 + r*src1_stride + 0:k], "
                          "src2[src2 + j*src2_stride + 0:k]) (+ aux[aux + j] in FP32 when aux is set); "
                          "dst[dst + r*dst_stride + j] = fp16(acc), then GELU when the gelu flag is set "
                          "(numerics.matmul: exact products, mac_width-wide block-aligned tile sums, tile accumulation). "
                          "The weight operand is column-major: column j is k contiguous words. src2 and src2_stride are "
                          "multiples of weight_align (mac_width) words, else the unit refuses the word (MISALIGNED). "
                          "With the int8 flag the weights are INT8, two a word (the low byte first): column j is k "
                          "bytes from word src2 + j*src2_stride (weight_words), summed in tiles of 2 x mac_width "
                          "(numerics.int8_tile_sums: one buffer row of weights a lane and beat), src1 and src1_stride "
                          "multiples of weight_align too (MISALIGNED), and acc is multiplied in FP32 by the column's "
                          "FP16 scale aux[aux + aux_stride + j] before the bias (numerics.quantize_int8). "
                          "The weights, the bias and the scales are in WBUF",
                          {"dst": (Space.ABUF,), "src1": (Space.ABUF,), "src2": (Space.WBUF,),
                           "aux": (Space.NONE, Space.WBUF)},
                          ("rows", "n", "k"), ("dst_stride", "src1_stride", "src2_stride", "aux_stride"),
                          flags=("gelu", "int8"), flag_fields={"int8": ("aux_stride",)},
                          flag_operands={"int8": {"aux": (Space.WBUF,)}}),
    Opcode.MASKED_QK: OpSpec(Unit.MATRIX, "attention scores with causal mask, and each row's maximum",
                             "for r < rows, j < n: dst[dst + r*dst_stride + j] = -Inf if j > pos + r else "
                             "fp16(dot(src1[src1 + r*src1_stride + 0:k], src2[src2 + j*src2_stride + 0:k])); "
                             "aux[aux + r*aux_stride] = max_j of that row (numerics.reduce_max). src2 and src2_stride "
                             "are multiples of weight_align (mac_width) words, else the unit refuses the word "
                             "(MISALIGNED). The keys (src2) are in WBUF",
                             {"dst": (Space.ABUF,), "src1": (Space.ABUF,), "src2": (Space.WBUF,),
                              "aux": (Space.ABUF,)},
                             ("rows", "n", "k", "pos"), STRIDES),
    Opcode.VADD: _vector_binary("+"),
    Opcode.VSUB: _vector_binary("-"),
    Opcode.VMUL: _vector_binary("*"),
    Opcode.VSCALE_SHIFT: OpSpec(Unit.VECTOR, "scale and shift",
                                f"{_ELEMENTWISE[0]}{_ELEMENTWISE[1]}fp16(a * b + c) with a = src1[src1 + r*src1_stride + j], "
                                "b from src2 and c from aux (per element, per row with the *_row_scalar flags, or IMM); "
                                "exact FP32 product, one rounded FP32 add (numerics.vscale_shift)",
                                {"dst": (Space.ABUF,), "src1": (Space.ABUF,), "src2": VECTOR_SRC, "aux": VECTOR_SRC},
                                ("rows", "n"), STRIDES, flags=("src2_row_scalar", "aux_row_scalar")),
    Opcode.VEXP: _vector_unary("exp"),
    Opcode.VRECIP: _vector_unary("recip"),
    Opcode.VRSQRT: _vector_unary("rsqrt"),
    Opcode.VGELU: _vector_unary("gelu"),
    Opcode.VSUM: OpSpec(Unit.VECTOR, "row sum",
                        "for r < rows: dst[dst + r*dst_stride] = reduce_sum(src1[src1 + r*src1_stride + 0:n]) "
                        "(vector_width-wide block-aligned tile sums, FP32 tile accumulation, one rounding)",
                        {"dst": (Space.ABUF,), "src1": (Space.ABUF,)}, ("rows", "n"), ("dst_stride", "src1_stride"),
                        reduction="sum"),
    Opcode.VDOT: OpSpec(Unit.VECTOR, "row dot product",
                        "for r < rows: dst[dst + r*dst_stride] = reduce_sum(a * b over j < n) with a from src1, "
                        "b from src2 (or IMM); exact products, FP32 accumulation, one rounding",
                        {"dst": (Space.ABUF,), "src1": (Space.ABUF,), "src2": VECTOR_SRC},
                        ("rows", "n"), ("dst_stride", "src1_stride", "src2_stride"), reduction="sum"),
    Opcode.VMAX: OpSpec(Unit.VECTOR, "row maximum",
                        "for r < rows: dst[dst + r*dst_stride] = reduce_max(src1[src1 + r*src1_stride + 0:n])",
                        {"dst": (Space.ABUF,), "src1": (Space.ABUF,)}, ("rows", "n"), ("dst_stride", "src1_stride"),
                        reduction="max"),
    Opcode.ALLGATHER: OpSpec(Unit.ROUTER, "ring all-gather of every card's column slice",
                             "every card contributes rows x n words (its own n) from src1 (row stride src1_stride) "
                             "to be placed at column k (its own offset); afterwards, on every card, "
                             "dst[dst + r*dst_stride + k_c + j] holds card c's word (r, j) for every card c. "
                             "All cards must reach their matching ALLGATHER (same rows)",
                             {"dst": (Space.ABUF,), "src1": (Space.ABUF,)},
                             ("rows", "n", "k"), ("dst_stride", "src1_stride")),
    Opcode.SEND: OpSpec(Unit.ROUTER, "send a block to the next card on the ring",
                        "sends rows x n words from src1 (row stride src1_stride) to card (id + 1) mod cards",
                        {"src1": (Space.ABUF,)}, ("rows", "n"), ("src1_stride",)),
    Opcode.RECV: OpSpec(Unit.ROUTER, "receive a block from the previous card on the ring",
                        "receives rows x n words from card (id - 1) mod cards into dst (row stride dst_stride); "
                        "the sender's rows and n must match",
                        {"dst": (Space.ABUF,)}, ("rows", "n"), ("dst_stride",)),
}

VECTOR_ALIGNMENT = ("With more than one word a row (n > 1), src1, and src2 and aux where they are in ABUF and not row "
                    "scalars, start on multiples of vector_align (vector_width) words, and so do their row strides "
                    "with more than one row, else the unit refuses the word (MISALIGNED)")
"""The vector unit's alignment rule (hw/resolved.misaligned_vector), part of every vector opcode's action."""
OPCODES.update({op: dataclasses.replace(spec, action=f"{spec.action}. {VECTOR_ALIGNMENT}")
                for op, spec in OPCODES.items() if spec.unit is Unit.VECTOR})

assert set(OPCODES) == set(Opcode), "every opcode needs a specification"


def weight_words(k: int, int8: bool) -> int:
    """Words of a MATMUL weight column of k weights: k FP16 words, or k INT8 bytes two a word."""
    return -(-k // 2) if int8 else k


def opcodes_of(unit: Unit) -> tuple:
    """The opcodes `unit` executes, in Opcode order."""
    return tuple(op for op, spec in OPCODES.items() if spec.unit is unit)


EXECUTING_UNITS = tuple(unit for unit in Unit if unit is not Unit.CONTROL and opcodes_of(unit))
"""The units that execute opcodes, in Unit order: each has a queue, a status port and a busy counter."""
REDUCTIONS = tuple(op for op, spec in OPCODES.items() if spec.reduces)
"""The opcodes that write one word per row."""


REG_MASK = (1 << 32) - 1
"""Registers are 32 bits; control arithmetic wraps."""


def control_result(opcode: Opcode, regs, rs: int, rt: int, imm: int) -> int:
    """The value SETI, ADDI, MULI or ADD writes to R[rd], given the register values `regs`."""
    value = {Opcode.SETI: lambda: imm, Opcode.ADDI: lambda: regs[rs] + imm, Opcode.MULI: lambda: regs[rs] * imm,
             Opcode.ADD: lambda: regs[rs] + regs[rt]}[opcode]()
    return value & REG_MASK


def _fail(word: str, field: str, message: str):
    raise IllegalInstructionError(f"illegal instruction {word}: field '{field}': {message}")


def validate(inst: Instruction, word: str | None = None) -> None:
    """Raises IllegalInstructionError (naming the field) unless `inst` is legal: operands in allowed
    spaces, fields the opcode does not use left zero, register numbers in range."""
    where = word or inst.opcode.name
    spec = OPCODES[inst.opcode]
    for name in OPERANDS:
        op = getattr(inst, name)
        allowed = spec.operands.get(name)
        if allowed is None:
            if op != Operand():
                _fail(where, name, f"{inst.opcode.name} does not use this operand; it must be zero")
        elif op.space not in allowed:
            _fail(where, f"{name}.space", f"{inst.opcode.name} takes {'/'.join(s.name for s in allowed)} here, "
                                          f"not {op.space.name}")
        elif op.space in (Space.NONE, Space.IMM) and op.reg:
            _fail(where, f"{name}.reg", f"a {op.space.name} operand cannot be register-relative")
        elif op.space == Space.IMM and op.offset >> 16:
            _fail(where, f"{name}.offset", "an IMM operand holds a 16-bit FP16 constant")
    for group, used in ((DIMS, spec.dims), (STRIDES, spec.strides), (CONTROL_FIELDS, spec.control)):
        for name in group:
            if name not in used and getattr(inst, name) not in (0, Dim()):
                _fail(where, name, f"{inst.opcode.name} does not use this field; it must be zero")
    for name in FLAG_NAMES:
        if getattr(inst.flags, name) and name not in spec.flags:
            _fail(where, f"flags.{name}", f"{inst.opcode.name} does not take this flag")
    for flag, fields in spec.flag_fields.items():
        for name in fields:
            if not getattr(inst.flags, flag) and getattr(inst, name) not in (0, Dim()):
                _fail(where, name, f"{inst.opcode.name} reads this field only with the {flag} flag; it must be zero")
    for flag, operands in spec.flag_operands.items():
        for name, allowed in operands.items():
            if getattr(inst.flags, flag) and getattr(inst, name).space not in allowed:
                _fail(where, f"{name}.space", f"{inst.opcode.name} +{flag} takes "
                                              f"{'/'.join(s.name for s in allowed)} here, not {getattr(inst, name).space.name}")
    if inst.flags.reserved:
        _fail(where, "flags.reserved", "reserved bits must be zero")
    if inst.reserved:
        _fail(where, "reserved", "reserved bits must be zero")


def _read_field(view, name: str, path: str, label: str):
    """A field of a decoded view as Python values (nested tuples), naming `path` on a bad encoding."""
    try:
        value = view[name]
    except ValueError:
        _fail(label, path, "no such encoding")
    if isinstance(value, data.Const):
        return _NESTED[name](**{sub: _read_field(value, sub, f"{path}.{sub}", label) for sub, _ in value.shape()})
    return value


def decode(word: int) -> Instruction:
    """Decodes a 512-bit instruction word; raises IllegalInstructionError naming the word and field."""
    if not (isinstance(word, int) and 0 <= word < (1 << INSTRUCTION_BITS)):
        raise IllegalInstructionError(f"illegal instruction word ({type(word).__name__}, "
                                      f"{word.bit_length() if isinstance(word, int) else '?'} bits): "
                                      f"not a {INSTRUCTION_BITS}-bit unsigned word")
    label = f"0x{word:0{INSTRUCTION_BITS // 4}x}"
    view = InstructionLayout.from_bits(word)
    inst = Instruction(**{name: _read_field(view, name, name, label) for name, _ in InstructionLayout.as_shape()})
    validate(inst, label)
    return inst


# --- field widths ------------------------------------------------------------------------------

def _bit_ranges(layout, prefix="", base=0):
    for name, field in data.Layout.cast(layout):
        shape = field.shape
        full = f"{prefix}{name}"
        if isinstance(shape, type) and issubclass(shape, data.Struct):
            yield from _bit_ranges(shape, f"{full}.", base + field.offset)
        else:
            yield full, base + field.offset, field.width, shape


_FIELD_RANGES = tuple(_bit_ranges(InstructionLayout))
"""(path, bit offset, width, shape) of every leaf field of the layout."""


def _check_ranges(inst: Instruction) -> None:
    """Raises IllegalInstructionError for an integer field outside its width in the layout (encoding
    would otherwise truncate it)."""
    for path, _, width, shape in _FIELD_RANGES:
        value = inst
        for part in path.split("."):
            value = getattr(value, part)
        if isinstance(value, enum.Enum) or not isinstance(value, int):
            continue
        signed_ = getattr(shape, "signed", False)
        lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed_ else (0, (1 << width) - 1)
        if not lo <= value <= hi:
            raise IllegalInstructionError(f"{inst.opcode.name}: field '{path}' = {value} does not fit in {width} bits")

"""The instruction set: encode/decode and assemble/disassemble round trips for every opcode
(property-based), the errors for illegal encodings and text, the program container, and that
docs/isa.md is the one generated from the definition."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from ringgpt.hw import assembly, isa, isa_doc
from ringgpt.hw.isa import (DIMS, FLAG_NAMES, OPCODES, OPERANDS, STRIDES, Dim, Flags, IllegalInstructionError,
                            Instruction, InstructionLayout, Opcode, Operand, Space, decode)
from ringgpt.hw.program import Program

ROOT = Path(__file__).resolve().parents[1]


BITS = {  # (first bit, width) of every field, written out by hand from the format in docs/isa.md
    "opcode": (0, 6), "flags.gelu": (6, 1), "flags.transpose": (7, 1), "flags.src2_row_scalar": (8, 1),
    "flags.aux_row_scalar": (9, 1), "flags.int8": (10, 1), "flags.reserved": (11, 3),
    "dst.space": (14, 3), "dst.reg": (17, 4), "dst.offset": (21, 32),
    "src1.space": (53, 3), "src1.reg": (56, 4), "src1.offset": (60, 32),
    "src2.space": (92, 3), "src2.reg": (95, 4), "src2.offset": (99, 32),
    "aux.space": (131, 3), "aux.reg": (134, 4), "aux.offset": (138, 32),
    "rows.reg": (170, 4), "rows.imm": (174, 28), "n.reg": (202, 4), "n.imm": (206, 28),
    "k.reg": (234, 4), "k.imm": (238, 28), "pos.reg": (266, 4), "pos.imm": (270, 28),
    "dst_stride": (298, 20), "src1_stride": (318, 20), "src2_stride": (338, 20), "aux_stride": (358, 20),
    "rd": (378, 4), "rs": (382, 4), "rt": (386, 4), "imm": (390, 32), "reserved": (422, 90),
}


def _field_offset(path: str) -> int:
    """Where a field starts, from the hand-written table (not from the layout under test)."""
    return BITS[path][0]


@st.composite
def instructions(draw, opcode=None):
    """A random legal instruction: only the fields its opcode uses are non-zero."""
    opcode = opcode or draw(st.sampled_from(list(Opcode)))
    spec = OPCODES[opcode]
    flags = {f: draw(st.integers(0, 1)) for f in spec.flags}
    narrowed = {name: spaces for flag, operands in spec.flag_operands.items() if flags[flag]
                for name, spaces in operands.items()}
    unread = {name for flag, names in spec.flag_fields.items() if not flags[flag] for name in names}
    fields = {}
    for name, spaces in spec.operands.items():
        space = draw(st.sampled_from(narrowed.get(name, spaces)))
        if space == Space.NONE:
            continue
        if space == Space.IMM:
            fields[name] = Operand(space, 0, draw(st.integers(0, 0xFFFF)))
        else:
            fields[name] = Operand(space, draw(st.integers(0, 15)), draw(st.integers(0, 2 ** 32 - 1)))
    for name in spec.dims:
        fields[name] = Dim(draw(st.integers(0, 15)), draw(st.integers(0, 2 ** isa.DIM_IMM_BITS - 1)))
    for name in spec.strides:
        fields[name] = 0 if name in unread else draw(st.integers(0, 2 ** isa.STRIDE_BITS - 1))
    for name in spec.control:
        fields[name] = draw(st.integers(-2 ** 31, 2 ** 31 - 1)) if name == "imm" else draw(st.integers(0, 15))
    fields["flags"] = Flags(**flags)
    return Instruction.make(opcode, **fields)


@settings(max_examples=300, deadline=None)
@given(instructions())
def test_encode_decode_round_trip(inst):
    word = inst.encode()
    assert 0 <= word < 2 ** isa.INSTRUCTION_BITS
    assert decode(word) == inst


@settings(max_examples=300, deadline=None)
@given(instructions())
def test_assemble_disassemble_round_trip(inst):
    text = assembly.format_instruction(inst)
    assert assembly.parse_instruction(text) == inst
    assert assembly.assemble(assembly.disassemble([inst, inst])) == [inst, inst]


@pytest.mark.parametrize("opcode", list(Opcode))
def test_every_opcode_round_trips(opcode):
    spec = OPCODES[opcode]
    operands = {}
    for name, spaces in spec.operands.items():
        space = spaces[-1]
        operands[name] = Operand(space, 0, 0x3C00) if space == Space.IMM else Operand(space, 1, 8)
    inst = Instruction.make(opcode, **operands, **{d: Dim(2, 3) for d in spec.dims},
                            **{s: 5 for s in spec.strides}, **{c: 1 for c in spec.control},
                            flags=Flags(**{f: 1 for f in spec.flags}))
    assert decode(inst.encode()) == inst
    assert assembly.parse_instruction(str(inst)) == inst
    assert inst.unit == spec.unit


def test_layout_has_the_documented_bit_positions():
    """The layout against the hand-written table: a field moved, resized or added changes the binary format."""
    assert {name: (offset, width) for name, offset, width, _ in isa._bit_ranges(InstructionLayout)} == BITS
    assert sum(width for _, width in BITS.values()) == isa.INSTRUCTION_BITS


def test_known_encoding():
    """Whole words built bit by bit from literal positions (opcode in bits 5:0, flags from 6, dst.space at 16:14,
    ...), compared with what the encoder produces and what the decoder reads back."""
    assert Instruction.make(Opcode.HALT).encode() == 0x01
    load = assembly.parse_instruction("LOAD dst=WBUF[64+r3] src1=HBM[0x100] rows=r2+1 n=8 dst_stride=8 src1_stride=8 "
                                 "+transpose")
    word = (0x10 | 1 << 7 | 2 << 14 | 3 << 17 | 64 << 21 | 3 << 53 | 0x100 << 60 | 2 << 170 | 1 << 174
            | 8 << 206 | 8 << 298 | 8 << 318)
    assert load.encode() == word and decode(word) == load
    seti = Instruction.make(Opcode.SETI, rd=3, imm=-5)
    word = 0x03 | 3 << 378 | (2 ** 32 - 5) << 390
    assert seti.encode() == word and decode(word) == seti
    vadd = assembly.parse_instruction("VADD dst=ABUF[1] src1=ABUF[2] src2=IMM[0x3c00] rows=4 n=r5 src1_stride=9")
    word = 0x30 | 1 << 14 | 1 << 21 | 1 << 53 | 2 << 60 | 5 << 92 | 0x3C00 << 99 | 4 << 174 | 5 << 202 | 9 << 318
    assert vadd.encode() == word and decode(word) == vadd


def test_illegal_opcode_names_word_and_field():
    with pytest.raises(IllegalInstructionError, match=r"illegal instruction 0x0+3f: field 'opcode'"):
        decode(0x3F)


def test_illegal_space_encoding():
    word = Opcode.VADD.value | (7 << _field_offset("dst.space"))
    with pytest.raises(IllegalInstructionError, match=r"field 'dst.space': no such encoding"):
        decode(word)


def test_operand_space_not_allowed():
    word = Opcode.VADD.value | (Space.HBM.value << _field_offset("dst.space"))
    with pytest.raises(IllegalInstructionError, match=r"field 'dst.space': VADD takes ABUF here, not HBM"):
        decode(word)


@pytest.mark.parametrize("opcode,field,text", [
    ("MATMUL", "aux", "MATMUL dst=ABUF[0] src1=ABUF[64] src2=WBUF[0] aux=WBUF[9] rows=1 n=16 k=64"),
    ("MATMUL", "src2", "MATMUL dst=ABUF[0] src1=ABUF[64] src2=WBUF[0] aux=WBUF[9] rows=1 n=16 k=64"),
    ("MASKED_QK", "src2", "MASKED_QK dst=ABUF[0] src1=ABUF[64] src2=WBUF[0] aux=ABUF[9] rows=1 n=16 k=64")])
def test_matrix_weights_and_bias_are_in_wbuf(opcode, field, text):
    """The matrix unit reads weights, keys, V^T and biases through WBUF's tile port only (hw/core/matrix.py)."""
    legal = assembly.parse_instruction(text).encode()
    decode(legal)
    word = legal ^ ((Space.WBUF.value ^ Space.ABUF.value) << _field_offset(f"{field}.space"))
    allowed = "NONE/WBUF" if field == "aux" else "WBUF"
    with pytest.raises(IllegalInstructionError, match=rf"field '{field}.space': {opcode} takes {allowed} here, not ABUF"):
        decode(word)


def test_unused_field_must_be_zero():
    word = Instruction.make(Opcode.HALT).encode() | (5 << _field_offset("k.imm"))
    with pytest.raises(IllegalInstructionError, match=r"field 'k': HALT does not use this field"):
        decode(word)


def test_reserved_bits_must_be_zero():
    with pytest.raises(IllegalInstructionError, match=r"field 'reserved'"):
        decode(Opcode.NOP.value | (1 << (isa.INSTRUCTION_BITS - 1)))
    with pytest.raises(IllegalInstructionError, match=r"field 'flags.reserved'"):
        decode(Opcode.NOP.value | (1 << _field_offset("flags.reserved")))


def test_flag_not_taken_by_opcode():
    vadd = Instruction.make(Opcode.VADD, dst=Operand(Space.ABUF), src1=Operand(Space.ABUF), src2=Operand(Space.ABUF))
    word = vadd.encode() | (1 << _field_offset("flags.gelu"))
    with pytest.raises(IllegalInstructionError, match=r"field 'flags.gelu': VADD does not take this flag"):
        decode(word)


def test_word_out_of_range():
    with pytest.raises(IllegalInstructionError, match="not a 512-bit unsigned word"):
        decode(1 << 512)
    with pytest.raises(IllegalInstructionError, match="not a 512-bit unsigned word"):
        decode(-1)


@pytest.mark.parametrize("fields, message", [
    ({"n": Dim(0, 2 ** 28)}, "LOAD: field 'n.imm' = 268435456 does not fit in 28 bits"),
    ({"dst": Operand(Space.WBUF, 16, 0)}, "field 'dst.reg' = 16 does not fit in 4 bits"),
    ({"src1": Operand(Space.HBM, 0, 2 ** 32)}, "field 'src1.offset' = 4294967296 does not fit in 32 bits"),
    ({"src1_stride": -1}, "field 'src1_stride' = -1 does not fit in 20 bits"),
])
def test_make_rejects_values_that_would_be_truncated(fields, message):
    """Encoding never truncates silently: a value wider than its field is an error at construction."""
    base = {"dst": Operand(Space.WBUF), "src1": Operand(Space.HBM), "rows": Dim(0, 1), "n": Dim(0, 8)}
    with pytest.raises(IllegalInstructionError, match=message):
        Instruction.make(Opcode.LOAD, **{**base, **fields})


def test_imm_operand_checks():
    with pytest.raises(IllegalInstructionError, match="cannot be register-relative"):
        Instruction.make(Opcode.VADD, dst=Operand(Space.ABUF), src1=Operand(Space.ABUF),
                         src2=Operand(Space.IMM, 3, 0x3C00))
    with pytest.raises(IllegalInstructionError, match="16-bit FP16 constant"):
        Instruction.make(Opcode.VADD, dst=Operand(Space.ABUF), src1=Operand(Space.ABUF),
                         src2=Operand(Space.IMM, 0, 0x10000))


@pytest.mark.parametrize("text, message", [
    ("FROB dst=ABUF[0]", "line 1: unknown mnemonic 'FROB'"),
    ("VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] +fast", "unknown flag '\\+fast'"),
    ("VADD dst=ABUF[x] src1=ABUF[0] src2=ABUF[0]", "bad token 'dst=ABUF\\[x\\]'"),
    ("VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] rows=q", "bad token 'rows=q'"),
    ("VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] rows=300000000", "'rows.imm' = 300000000 does not fit in 28 bits"),
    ("VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] dst_stride=1048576", "'dst_stride' = 1048576 does not fit in 20 bits"),
    ("VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] colour=3", "bad token 'colour=3'"),
    ("VADD dst=ABUF[0] src1=ABUF[0] src2=ABUF[0] wat", "expected key=value"),
    ("SETI rd=r16 imm=1", "'rd' = 16 does not fit in 4 bits"),
    ("SETI rd=r1 imm=4294967296", "'imm' = 4294967296 does not fit in 32 bits"),
    ("HALT rows=3", "HALT does not use this field"),
])
def test_assembler_errors(text, message):
    with pytest.raises(IllegalInstructionError, match=message):
        assembly.assemble(text)


def test_assembler_comments_and_line_numbers():
    program = assembly.assemble("# header\nSETI rd=r3 imm=7  # set\n\nHALT\n")
    assert [i.opcode for i in program] == [Opcode.SETI, Opcode.HALT]
    with pytest.raises(IllegalInstructionError, match="line 3: "):
        assembly.assemble("NOP\nNOP\nBOGUS\n")


def test_register_relative_text():
    inst = assembly.parse_instruction("LOAD dst=WBUF[64+r3] src1=HBM[0x100] rows=r2+1 n=r4 dst_stride=8 src1_stride=8")
    assert inst.dst == Operand(Space.WBUF, 3, 64)
    assert inst.src1 == Operand(Space.HBM, 0, 256)
    assert inst.rows == Dim(2, 1) and inst.n == Dim(4, 0)


def test_program_round_trip_and_errors():
    body = [Instruction.make(Opcode.SETI, rd=3, imm=-5), Instruction.make(Opcode.HALT)]
    program = Program(body, "u280-x4", "0123456789abcdef", card=2, cards=4, meta={"layer": 1})
    again = Program.from_bytes(program.to_bytes())
    assert again == program
    blob = program.to_bytes()
    with pytest.raises(IllegalInstructionError, match="bad magic"):
        Program.from_bytes(b"XXXXXXXX" + blob[8:])
    with pytest.raises(IllegalInstructionError, match="truncated program"):
        Program.from_bytes(blob[:-1])
    corrupt = bytearray(blob)
    corrupt[-isa.INSTRUCTION_BYTES] = 0x3F  # the last instruction's opcode
    with pytest.raises(IllegalInstructionError, match="instruction 1: illegal instruction .* field 'opcode'"):
        Program.from_bytes(bytes(corrupt))


def test_spec_covers_layout():
    """Every operand, dimension, stride and flag the opcode table names exists in the layout."""
    layout_fields = {name for name, _ in InstructionLayout.as_shape()}
    assert set(OPERANDS) | set(DIMS) | set(STRIDES) <= layout_fields
    assert set(FLAG_NAMES) <= {name for name, _ in isa.FlagsLayout.as_shape()}
    for spec in OPCODES.values():
        assert set(spec.operands) <= set(OPERANDS) and set(spec.dims) <= set(DIMS)
        assert set(spec.strides) <= set(STRIDES) and set(spec.flags) <= set(FLAG_NAMES)


def test_docs_are_generated_from_definition():
    doc = (ROOT / "docs" / "isa.md").read_text()
    assert doc == isa_doc.docs_markdown() + "\n", "docs/isa.md is stale: python -m ringgpt.hw.isa_doc > docs/isa.md"

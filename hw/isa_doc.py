"""docs/isa.md, generated from the instruction set's definition (hw/isa.py):

    python -m ringgpt.hw.isa_doc > docs/isa.md
"""
import sys

from ringgpt.hw import isa
from ringgpt.hw.isa import INSTRUCTION_BITS, OPCODES, InstructionLayout, Space, Unit, _bit_ranges


def docs_markdown() -> str:
    """docs/isa.md, generated from hw/isa.py."""
    out = ["# ringgpt instruction set", "",
           "Generated from `hw/isa.py` by `python -m ringgpt.hw.isa_doc > docs/isa.md`; do not edit.", "",
           isa.__doc__.split("\n\n", 1)[1].strip(), "",
           f"## Format\n\nEvery instruction is one {INSTRUCTION_BITS}-bit word (little-endian in memory). "
           "Fields an opcode does not use must be zero; reserved bits must be zero; decoding anything else "
           "raises `IllegalInstructionError` naming the word and the field.", "",
           "| field | bits | width | type |", "|---|---|---|---|"]
    for name, offset, width, shape in _bit_ranges(InstructionLayout):
        kind = shape.__name__ if isinstance(shape, type) else ("signed" if shape.signed else "unsigned")
        out.append(f"| `{name}` | {offset + width - 1}:{offset} | {width} | {kind} |")
    out += ["", "Spaces: " + ", ".join(f"`{s.name}` = {s.value}" for s in Space) + ".",
            "", "Assembly: `MNEMONIC key=value ... +flag`; operands `SPACE[offset]` or `SPACE[offset+rN]` "
            "(`IMM[0x3c00]` is the FP16 constant 1.0), dimensions `N`, `rK` or `rK+N`, registers `rN`. "
            "An instruction's register and immediate fields and its operands that cannot be `NONE` must be given; "
            "dimensions, strides and flags default to zero. A field given twice, or one the opcode does not use, "
            "is an error, as is a program file whose header lacks a field or has one of the wrong type "
            "(`IllegalInstructionError` naming the line or field).", ""]
    for unit in Unit:
        out.append(f"## {'DMA' if unit is Unit.DMA else unit.name.title()} unit\n")
        for opcode, spec in OPCODES.items():
            if spec.unit != unit:
                continue
            fields = list(spec.control) + [f"{o} ({'/'.join(s.name for s in spec.operands[o])})" for o in spec.operands]
            fields += list(spec.dims) + list(spec.strides) + [f"+{f}" for f in spec.flags]
            out += [f"### `{opcode.name}` (0x{opcode.value:02x}): {spec.summary}", "",
                    f"- format: `{opcode.name}` " + (", ".join(f"`{f}`" for f in fields) or "no fields"),
                    f"- action: {spec.action}", ""]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:]:
        print("usage: python -m ringgpt.hw.isa_doc > docs/isa.md", file=sys.stderr)
        sys.exit(2)
    print(docs_markdown())

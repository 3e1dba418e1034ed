"""Assembly text of the instruction set (hw/isa.py): `MNEMONIC key=value ... +flag` per instruction, one a line
(docs/isa.md, "Assembly"); `format_instruction` and `disassemble` write it, `parse_instruction` and `assemble`
read it."""
import re

from ringgpt.hw.isa import (CONTROL_FIELDS, DIMS, FLAG_NAMES, OPCODES, OPERANDS, STRIDES, Dim, Flags,
                            IllegalInstructionError, Instruction, Opcode, Operand, Space)


def _format_operand(op: Operand) -> str:
    if op.space == Space.IMM:
        return f"IMM[0x{op.offset:04x}]"
    reg = f"+r{op.reg}" if op.reg else ""
    return f"{op.space.name}[{op.offset}{reg}]"


def _format_dim(dim: Dim) -> str:
    if dim.reg and dim.imm:
        return f"r{dim.reg}+{dim.imm}"
    return f"r{dim.reg}" if dim.reg else str(dim.imm)


def format_instruction(inst: Instruction) -> str:
    """Assembly text of one instruction: the mnemonic, then key=value for every non-zero field."""
    spec = OPCODES[inst.opcode]
    parts = [inst.opcode.name]
    parts += [f"{name}=r{getattr(inst, name)}" for name in ("rd", "rs", "rt") if name in spec.control]
    if "imm" in spec.control:
        parts.append(f"imm={inst.imm}")
    parts += [f"{name}={_format_operand(getattr(inst, name))}" for name in OPERANDS
              if getattr(inst, name).space != Space.NONE]
    parts += [f"{name}={_format_dim(getattr(inst, name))}" for name in DIMS if getattr(inst, name) != Dim()]
    parts += [f"{name}={getattr(inst, name)}" for name in STRIDES if getattr(inst, name)]
    parts += [f"+{name}" for name in FLAG_NAMES if getattr(inst.flags, name)]
    return " ".join(parts)


_OPERAND_RE = re.compile(r"^(\w+)\[(0x[0-9a-fA-F]+|\d+)(?:\+r(\d+))?\]$", re.ASCII)
_DIM_RE = re.compile(r"^(?:r(\d+))?(?:\+?(\d+))?$", re.ASCII)
_REG_RE = re.compile(r"r\d+", re.ASCII)
_INT_RE = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|\d+)", re.ASCII)


def required_fields(opcode: Opcode) -> tuple:
    """The fields an instruction's text must give: its control fields (rd, rs, rt, imm) and the operands whose
    space cannot be NONE. Dimensions, strides and flags default to zero."""
    spec = OPCODES[opcode]
    return tuple(spec.control) + tuple(o for o, spaces in spec.operands.items() if Space.NONE not in spaces)


def _fields_of(opcode: Opcode) -> set:
    spec = OPCODES[opcode]
    return set(spec.control) | set(spec.operands) | set(spec.dims) | set(spec.strides)


def parse_instruction(text: str, line: int | None = None) -> Instruction:
    """Parses one line of assembly (see format_instruction); errors name the line and token. Every field the
    opcode needs must be given (required_fields), none twice, and none that the opcode does not use."""
    where = f"line {line}: " if line is not None else ""
    tokens = text.split()
    if not tokens:
        raise IllegalInstructionError(f"{where}empty instruction")
    try:
        opcode = Opcode[tokens[0].upper()] if tokens[0].isascii() else None
    except KeyError:
        opcode = None
    if opcode is None:
        raise IllegalInstructionError(f"{where}unknown mnemonic {tokens[0]!r}")
    usable = _fields_of(opcode)
    fields: dict = {}
    flags: dict = {}
    for token in tokens[1:]:
        if token.startswith("+"):
            if token[1:] not in FLAG_NAMES:
                raise IllegalInstructionError(f"{where}unknown flag {token!r}; flags: {', '.join(FLAG_NAMES)}")
            if token[1:] in flags:
                raise IllegalInstructionError(f"{where}flag {token!r} is given twice")
            flags[token[1:]] = 1
            continue
        key, eq, value = token.partition("=")
        if not eq:
            raise IllegalInstructionError(f"{where}expected key=value or +flag, got {token!r}")
        if key in fields:
            raise IllegalInstructionError(f"{where}field '{key}' is given twice ({key}=... and {token!r})")
        known = key in OPERANDS or key in DIMS or key in STRIDES or key in CONTROL_FIELDS
        if known and key not in usable:
            raise IllegalInstructionError(f"{where}field '{key}': {opcode.name} does not use this field ({token!r}); "
                                          f"it takes {', '.join(sorted(usable)) or 'no fields'}")
        try:
            if key in OPERANDS:
                m = _OPERAND_RE.match(value)
                if not m:
                    raise ValueError(f"expected SPACE[offset] or SPACE[offset+rN], got {value!r}")
                fields[key] = Operand(Space[m.group(1).upper()], int(m.group(3) or 0), int(m.group(2), 0))
            elif key in DIMS:
                m = _DIM_RE.match(value)
                if not m or value == "":
                    raise ValueError(f"expected N, rK or rK+N, got {value!r}")
                fields[key] = Dim(int(m.group(1) or 0), int(m.group(2) or 0))
            elif key in ("rd", "rs", "rt"):
                if not _REG_RE.fullmatch(value):
                    raise ValueError(f"expected a register rN, got {value!r}")
                fields[key] = int(value[1:])
            elif key in STRIDES or key == "imm":
                if not _INT_RE.fullmatch(value):
                    raise ValueError(f"expected an integer, got {value!r}")
                fields[key] = int(value, 0)
            else:
                raise ValueError("unknown field")
        except (ValueError, KeyError) as exc:
            raise IllegalInstructionError(f"{where}bad token {token!r}: {exc}") from None
    missing = [name for name in required_fields(opcode) if name not in fields]
    if missing:
        raise IllegalInstructionError(f"{where}{opcode.name} needs {', '.join(missing)}: e.g. "
                                      f"{' '.join(f'{n}=...' for n in required_fields(opcode))}")
    try:
        return Instruction.make(opcode, flags=Flags(**flags), **fields)
    except IllegalInstructionError as exc:
        raise IllegalInstructionError(f"{where}{exc}") from None


def assemble(text: str) -> list[Instruction]:
    """Assembly text (one instruction per line; '#' starts a comment) to instructions."""
    program = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            program.append(parse_instruction(line, number))
    return program


def disassemble(instructions) -> str:
    return "\n".join(format_instruction(i) for i in instructions) + "\n"

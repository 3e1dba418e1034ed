"""Small helpers that build instructions: operands by space, register-relative dimensions, FP16
immediates, and an instruction list."""
from __future__ import annotations

import numpy as np

from ringgpt.host.compiler.verify import Flow
from ringgpt.hw.isa import Dim, Flags, Instruction, Opcode, Operand, Space


def abuf(offset: int, reg: int = 0) -> Operand:
    return Operand(Space.ABUF, reg, offset)


def wbuf(offset: int, reg: int = 0) -> Operand:
    return Operand(Space.WBUF, reg, offset)


def hbm(offset: int, reg: int = 0) -> Operand:
    return Operand(Space.HBM, reg, offset)


def host(offset: int, reg: int = 0) -> Operand:
    return Operand(Space.HOST, reg, offset)


def imm(value: float) -> Operand:
    """The FP16 constant nearest to `value`, broadcast."""
    return Operand(Space.IMM, 0, int(np.float16(value).view(np.uint16)))


def reg(number: int, plus: int = 0) -> Dim:
    """A dimension read from register `number` (plus a constant)."""
    return Dim(number, plus)


def dim(value) -> Dim:
    return value if isinstance(value, Dim) else Dim(0, value)


def _names(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value)


class Asm:
    """An instruction list with one method per use: `asm(Opcode.X, field=...)`; dims may be ints. Each
    instruction states its dataflow for the plan check (verify.py): `writes` and `reads`, the names of the
    values its memory operands write and read (a name or a tuple, in `access_blocks` operand order)."""

    def __init__(self):
        self.code: list[Instruction] = []
        self.flow: list[Flow] = []

    def __call__(self, opcode: Opcode, *, writes=(), reads=(), flags: dict | None = None, **fields) -> None:
        for name in ("rows", "n", "k", "pos"):
            if name in fields:
                fields[name] = dim(fields[name])
        self.code.append(Instruction.make(opcode, flags=Flags(**(flags or {})), **fields))
        self.flow.append(Flow(_names(writes), _names(reads)))

    def count(self, opcode: Opcode) -> int:
        return sum(1 for inst in self.code if inst.opcode == opcode)

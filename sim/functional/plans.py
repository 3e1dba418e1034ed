"""Plans: an instruction a card executes again with the same resolution (the same `Resolved` object: the registers it
reads unchanged since its last execution) prepared once as a closure over numpy views of its operands, so that executing
it again is the numerics call and the store, without the operand look-ups, address and alignment checks of `Card`'s
methods.

A plan is made only after the instruction has executed once through `Card`'s own method with that `Resolved`: every
check then depends on the `Resolved` alone and has passed. Views are made only of ABUF and the host buffer (arrays that
live as long as the card); WBUF and HBM operands are read through `Card.read` at each execution (deferred weight loads,
see `Card`), and instructions that write them, move data by a deferred LOAD, write overlapping rows, use the ring,
GATHER or only set registers get no plan (`plan` returns None: the card's method runs each time). A plan calls the same
numerics functions with the same operands as the method, so results are the method's, bit for bit.
"""
from __future__ import annotations

import numpy as np

from ringgpt.hw import native, numerics
from ringgpt.hw.resolved import misaligned_vector, misaligned_weights
from ringgpt.hw.isa import OPCODES, Opcode, Space, Unit, weight_words

_STATIC = (Space.ABUF, Space.HOST)
_BINARY = {Opcode.VADD: numerics.vadd, Opcode.VSUB: numerics.vsub, Opcode.VMUL: numerics.vmul}
_NEG_INF = numerics.fp16_from_bits(np.uint16(numerics.FP16_NEG_INF))
_VECTOR = frozenset(op for op, spec in OPCODES.items() if spec.unit is Unit.VECTOR)


def group_plan(cards: list, stack: np.ndarray, rs: tuple):
    """A zero-argument callable that executes rs[c] on every card c at once, or None (the cards then execute it one
    by one). The instruction at one pc of every card, the same but for the card's number, of one row, its operands
    in ABUF (an immediate aside) and within it, the cards' ABUFs the rows of `stack` (`abuf_stack`): a vector
    instruction's operands are then (cards, n) views of `stack`, one row a card, and one call of the numerics function
    computes every card's row (the vector unit's operations act on each row alone, so each card's words are its own
    execution's, bit for bit); a MASKED_QK, `_group_scores`. It is made at the instruction's first execution with
    these operands, as it has the method's only checks (each block within its memory, the vector unit's alignment
    rule, else None: the methods report it)."""
    r = rs[0]
    op = r.op
    if (op not in _VECTOR and op is not Opcode.MASKED_QK) or r.rows != 1:
        return None
    for other in rs[1:]:
        if other != r._replace(card=other.card):
            return None
    if r.n == 0:
        return _nothing

    def rows(operand: tuple, n: int):
        """The cards' (cards, n) view of an operand, an immediate as its FP16 scalar, None outside ABUF."""
        space, value = operand
        if space is Space.IMM:
            return np.array(value, np.uint16).view(np.float16)
        if space is not Space.ABUF or not 0 <= value <= stack.shape[1] - n:
            return None
        return np.ndarray((len(cards), n), np.float16, stack, 2 * value, (stack.strides[0], 2))

    if op is Opcode.MASKED_QK:
        return _group_scores(cards, r, rows)
    if misaligned_vector(r, cards[0].cfg.vector_align):
        return None
    n = r.n
    reduction = OPCODES[op].reduction
    a, out = rows(r.src1, n), rows(r.dst, 1 if reduction else n)
    if a is None or out is None or r.src1[0] is Space.IMM or r.dst[0] is Space.IMM:
        return None
    return _vector_run(r, a, out, lambda name, row_scalar: rows(getattr(r, name), 1 if row_scalar else n),
                       cards[0].cfg.vector_width)


def future_columns(r):
    """MASKED_QK's mask: the (rows, n) positions j > pos + row of `r`'s scores, set to -Inf; None where there are
    none (a decode step: n = pos + 1)."""
    if r.n <= r.pos + 1:
        return None
    return np.arange(r.n)[None, :] > r.pos + np.arange(r.rows)[:, None]


def abuf_stack(cards: list):
    """The (cards, abuf_words) array whose row c is card c's ABUF (`machine.stacked_abuf`), or None."""
    abuf = cards[0]._mem[Space.ABUF]
    stack = abuf.base
    if stack is None or stack.shape != (len(cards), len(abuf)):
        return None
    for index, card in enumerate(cards):
        mine = card._mem[Space.ABUF]
        if mine.base is not stack or native.address(mine) != native.address(stack) + index * stack.strides[0]:
            return None
    return stack


def _group_scores(cards: list, r, rows):
    """MASKED_QK of one row on every card: each card's scores from its own keys (one product a card, as its method
    forms them), the mask, then one reduce_max over the cards' rows into their aux words; None where a card's method
    would fault (it reports it): misaligned keys, or keys, scores or maximum outside their memory."""
    n, k = r.n, r.k
    x, out, top = rows(r.src1, k), rows(r.dst, n), rows(r.aux, 1)
    if x is None or out is None or top is None or Space.IMM in (r.src1[0], r.dst[0], r.aux[0]):
        return None
    if misaligned_weights(r, cards[0].cfg.weight_align):
        return None
    space, base = r.src2
    if space not in (Space.ABUF, Space.WBUF) or base + (n - 1) * r.src2_stride + k > min(
            len(card._mem[space]) for card in cards):
        return None
    reads, src2, stride, width = [card.read for card in cards], r.src2, r.src2_stride, cards[0].cfg.mac_width
    masked = future_columns(r)

    def run():
        for index, read in enumerate(reads):
            scores = numerics.matmul(x[index:index + 1], read("src2", src2, n, k, stride).T, width)
            if masked is not None:
                scores[masked] = _NEG_INF
            out[index:index + 1] = scores
        top[...] = numerics.reduce_max(out, axis=1)[:, None]
    return run


def _nothing() -> None:
    """An instruction with no rows or no columns."""


def plan(card, r):
    """A zero-argument callable that executes `r` on `card` as `card._execute[r.op](r)` does, or None."""
    op = r.op
    if op in _VECTOR:
        return _vector(card, r)
    if op is Opcode.MATMUL or op is Opcode.MASKED_QK:
        return _matrix(card, r)
    if op is Opcode.LOAD or op is Opcode.STORE:
        return _copy(card, r)
    return None


def _view(card, name: str, operand: tuple, rows: int, n: int, stride: int):
    """A (rows, n) view of a block in ABUF or the host buffer, or None for another space."""
    if operand[0] not in _STATIC:
        return None
    return card.read(name, operand, rows, n, stride)


def _target(card, operand: tuple, rows: int, n: int, stride: int):
    """The (rows, n) view a write lands in (ABUF or the host buffer, rows that do not overlap), or None."""
    if operand[0] not in _STATIC or (stride < n and rows > 1):
        return None
    return card.read("dst", operand, rows, n, stride)


def _vector_operand(card, r, name: str, row_scalar: bool):
    space, value = getattr(r, name)
    if space is Space.IMM:
        return np.array(value, np.uint16).view(np.float16)
    return _view(card, name, (space, value), r.rows, 1 if row_scalar else r.n, getattr(r, f"{name}_stride"))


def _vector(card, r):
    if r.rows == 0 or r.n == 0:
        return _nothing
    a = _view(card, "src1", r.src1, r.rows, r.n, r.src1_stride)
    out = _target(card, r.dst, r.rows, 1 if OPCODES[r.op].reduction else r.n, r.dst_stride)
    if a is None or out is None:
        return None
    return _vector_run(r, a, out, lambda name, row_scalar: _vector_operand(card, r, name, row_scalar),
                       card.cfg.vector_width)


def _vector_run(r, a, out, operand, width: int):
    """The closure that computes vector instruction `r` from its src1 view `a` into its dst view `out`, its other
    operands given by operand(name, row_scalar) (a view, an immediate's FP16 scalar, or None: no plan), or None."""
    op = r.op
    reduction = OPCODES[op].reduction
    if reduction == "max":
        def run():
            out[...] = numerics.reduce_max(a, axis=1)[:, None]
        return run
    if reduction:
        b = operand("src2", False) if op is Opcode.VDOT else None
        if op is Opcode.VDOT and b is None:
            return None

        def run():
            out[...] = numerics.reduce_sum(a, width, b, axis=1)[:, None]
        return run
    if OPCODES[op].special:
        name = OPCODES[op].special

        def run():
            out[...] = numerics.special(name, a)
        return run
    b = operand("src2", r.flags.src2_row_scalar)
    if b is None:
        return None
    if op is Opcode.VSCALE_SHIFT:
        c = operand("aux", r.flags.aux_row_scalar)
        if c is None:
            return None

        def run():
            out[...] = numerics.vscale_shift(a, b, c)
        return run
    fn = _BINARY[op]

    def run():
        out[...] = fn(a, b)
    return run


def _matrix(card, r):
    """MATMUL and MASKED_QK: x a view, the weights (and a MATMUL's bias) read through Card.read, in the method's
    order (bias, then weights)."""
    if r.rows == 0 or r.n == 0:
        return _nothing
    rows, n, k = r.rows, r.n, r.k
    x = _view(card, "src1", r.src1, rows, k, r.src1_stride)
    out = _target(card, r.dst, rows, n, r.dst_stride)
    if x is None or out is None:
        return None
    read, src2, src2_stride, width = card.read, r.src2, r.src2_stride, card.cfg.mac_width
    if r.op is Opcode.MATMUL:
        gelu, aux = bool(r.flags.gelu), r.aux
        if r.flags.int8:
            words, aux_stride = weight_words(k, True), r.aux_stride

            def run():
                bias, scale = read("aux", aux, 2, n, aux_stride)
                w = numerics.unpack_int8(read("src2", src2, n, words, src2_stride), k)
                out[...] = numerics.matmul(x, w.T, width, bias, gelu, scale)
        elif aux[0] is Space.NONE:
            def run():
                out[...] = numerics.matmul(x, read("src2", src2, n, k, src2_stride).T, width, None, gelu)
        else:
            def run():
                bias = read("aux", aux, 1, n, 0)[0]
                out[...] = numerics.matmul(x, read("src2", src2, n, k, src2_stride).T, width, bias, gelu)
        return run
    top = _target(card, r.aux, rows, 1, r.aux_stride)
    if top is None:
        return None
    masked = future_columns(r)

    def run():
        scores = numerics.matmul(x, read("src2", src2, n, k, src2_stride).T, width)
        if masked is not None:
            scores[masked] = _NEG_INF
        out[...] = scores
        top[...] = numerics.reduce_max(scores, axis=1)[:, None]
    return run


def _copy(card, r):
    """LOAD and STORE between ABUF and the host buffer, and a deferred LOAD from HBM into WBUF (the card remembers it
    again, its checks passed: `Card._defer`); None for others (no view of HBM or WBUF)."""
    if r.rows == 0 or r.n == 0:
        return _nothing
    if card.deferrable(r):
        return lambda: card._defer(r)
    transpose = bool(r.flags.transpose)
    src = _view(card, "src1", r.src1, r.rows, r.n, r.src1_stride)
    out = _target(card, r.dst, *((r.n, r.rows) if transpose else (r.rows, r.n)), r.dst_stride)
    if src is None or out is None:
        return None
    if transpose:
        src = src.T
    if r.src1[0] is r.dst[0]:
        def run():
            out[...] = src.copy()
        return run

    def run():
        out[...] = src
    return run

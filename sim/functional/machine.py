"""The simulated cards and the ring between them.

Each card executes its program in program order (the scoreboard makes the parallel hardware equal
to that order), one whole instruction at a time, with numerics.py for every arithmetic result.
Router instructions synchronise the cards: a card runs until it halts or reaches an ALLGATHER, or a
RECV whose link is empty; `run_ring` then completes the collective (when every card has reached
it) or the receive (when the block has arrived), or reports a deadlock.
"""
from __future__ import annotations

import enum
from collections import deque

import numpy as np

from ringgpt.host.device import AddressFault, AlignmentFault, CollectiveMismatchError, RingDeadlockError
from ringgpt.hw import numerics
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import NUM_REGS, OPCODES, REDUCTIONS, Instruction, Opcode, Space, Unit, control_result, weight_words
from ringgpt.hw.resolved import Resolved, access_ranges, misaligned_transfer, misaligned_vector, misaligned_weights
from ringgpt.sim.functional.errors import StepLimitError
from ringgpt.sim.functional.plans import abuf_stack, future_columns, group_plan, plan

_BINARY = {Opcode.VADD: numerics.vadd, Opcode.VSUB: numerics.vsub, Opcode.VMUL: numerics.vmul}
_NEG_INF = numerics.fp16_from_bits(np.uint16(numerics.FP16_NEG_INF))
_SPACE_NAMES = {Space.ABUF: "ABUF", Space.WBUF: "WBUF", Space.HBM: "HBM", Space.HOST: "the host buffer"}


class State(enum.Enum):
    RUNNING = "running"
    WAIT_GATHER = "waits in ALLGATHER"
    WAIT_RECV = "waits in RECV"
    HALTED = "halted"


class Message:
    """A block in flight on a ring link, with where it was sent from (for error reports)."""
    __slots__ = ("rows", "n", "data", "card", "pc", "inst")

    def __init__(self, rows: int, n: int, data: np.ndarray, card: int, pc: int, inst: Instruction):
        self.rows, self.n, self.data, self.card, self.pc, self.inst = rows, n, data, card, pc, inst

    @property
    def text(self) -> str:
        return str(self.inst)


class _Memories(dict):
    """A card's memories by space, as the device, testbenches and tests see them: WBUF and HBM read or written
    through it first carry out the card's deferred HBM -> WBUF copies (Card._defer)."""

    def __init__(self, memories: dict, write_deferred):
        super().__init__(memories)
        self._write_deferred = write_deferred

    def __getitem__(self, space: Space) -> np.ndarray:
        if space is Space.WBUF or space is Space.HBM:
            self._write_deferred()
        return super().__getitem__(space)

    def get(self, space: Space, default=None):
        return self[space] if space in self else default

    def values(self):
        self._write_deferred()
        return super().values()

    def items(self):
        self._write_deferred()
        return super().items()


class Card:
    """One card: its memories, registers, program and the trace of the current run.

    A LOAD of a contiguous block from HBM into WBUF (the weight stream) is deferred rather than copied: the card
    remembers that WBUF[lo:hi] holds HBM[h:h + hi - lo], reads within it come from HBM, and the copy is carried out
    before anything else could tell the difference (a read that is not wholly inside one deferred block, a write
    to the WBUF words or the HBM words concerned, any access through `mem`). Results are those of the copy."""

    def __init__(self, index: int, cfg: ArchConfig, program: list, hbm_words: int, host_words: int,
                 compute: bool = True, abuf: np.ndarray | None = None):
        """`abuf`: the card's ABUF (cfg.abuf_words zeros) where the caller gives it, a row of the ring's `stacked_abuf`
        (run_ring then executes the vector instructions the cards share once for every card); else its own."""
        self.index, self.cfg, self.program, self.compute = index, cfg, program, compute
        self._mem = {Space.ABUF: np.zeros(cfg.abuf_words, np.float16) if abuf is None else abuf,
                     Space.WBUF: np.zeros(cfg.wbuf_words, np.float16),
                     Space.HBM: np.zeros(hbm_words, np.float16),
                     Space.HOST: np.zeros(host_words, np.float16)}
        self._deferred: list = []
        """(lo, hi, h): WBUF[lo:hi] holds HBM[h:h + hi - lo] (a deferred LOAD; the blocks do not overlap)."""
        self.mem = _Memories(self._mem, self._write_deferred)
        self.regs = [0] * NUM_REGS
        self.pc = 0
        self.state = State.RUNNING
        self.pending: Resolved | None = None
        self.trace: list = []
        self.gathered: dict = {}
        """pc -> the ALLGATHER's Resolved with its slices, from the last run (reused while equal: the cycle model
        remembers costs by the Resolved object)."""
        self.plans: dict = {}
        """pc -> (Resolved, step): the instruction's last resolution and False after its first execution with it, then
        from its second its plan (plans.py), or None where it has none (the method runs)."""
        self.watch: dict | None = None
        """pc -> callback(card index, pc), called right after the instruction at pc has executed (None: no
        watch, the fast path). Set by SimulatorDevice.run_watched for one run."""
        self._execute = {Opcode.NOP: _nothing, Opcode.BARRIER: _nothing,
                         Opcode.SETI: self._control, Opcode.ADDI: self._control, Opcode.MULI: self._control,
                         Opcode.ADD: self._control, Opcode.LOAD: self._copy, Opcode.STORE: self._copy,
                         Opcode.GATHER: self._gather, Opcode.MATMUL: self._matmul,
                         Opcode.MASKED_QK: self._masked_qk, Opcode.VSCALE_SHIFT: self._scale_shift,
                         **dict.fromkeys(REDUCTIONS, self._reduce), **dict.fromkeys(_BINARY, self._binary),
                         **{op: self._unary for op, spec in OPCODES.items() if spec.special}}
        if not compute:
            data_ops = [op for op, run in self._execute.items() if run not in (_nothing, self._control)]
            self._execute.update(dict.fromkeys(data_ops, self._check_ranges))

    # --- run control ---------------------------------------------------------------------------
    def start(self, pos: int, rows: int) -> None:
        self.regs = [0] * NUM_REGS
        self.regs[1], self.regs[2] = pos, rows
        self.pc, self.state, self.pending, self.trace = 0, State.RUNNING, None, []

    def text(self, pc: int | None = None) -> str:
        return str(self.program[self.pc if pc is None else pc].inst)

    def next_resolved(self, max_steps: int) -> Resolved:
        """The resolution of the instruction at pc (`pending`), resolved now unless it already is."""
        if self.pending is None:
            if len(self.trace) >= max_steps:
                raise StepLimitError(self.index, self.pc, self.text(),
                                     f"no HALT within the step limit of {max_steps} instructions")
            self.pending = self.program[self.pc].resolve(self.regs, self.index)
        return self.pending

    def advance(self, links: dict, max_steps: int) -> None:
        """Executes until the card halts or blocks on a router instruction."""
        program, trace, index = self.program, self.trace, self.index
        outgoing, incoming = links[index], links[(index - 1) % self.cfg.cards]
        while True:
            r = self.next_resolved(max_steps)
            op = r.op
            if op is Opcode.HALT:
                self.state = State.HALTED
                trace.append(r)
                if self.watch is not None and self.pc in self.watch:
                    self.watch[self.pc](index, self.pc)
                return
            if op is Opcode.ALLGATHER:
                self.state = State.WAIT_GATHER
                return
            if op is Opcode.RECV:
                if not incoming:
                    self.state = State.WAIT_RECV
                    return
                self._receive(r, incoming.popleft())
            elif op is Opcode.SEND:
                data = self.read("src1", r.src1, r.rows, r.n, r.src1_stride).copy() if self.compute else None
                outgoing.append(Message(r.rows, r.n, data, index, self.pc, program[self.pc].inst))
            else:
                self.execute(r)
            self.complete(r)

    def execute(self, r: Resolved) -> None:
        """Executes `r`, the resolution of the instruction at pc (neither a router instruction nor HALT), without
        completing it: through its plan from its second execution with `r` on, else through the opcode's method."""
        step = self.plans.get(self.pc)
        if step is not None and step[0] is r:
            run = step[1]
            if run is False:  # its second execution with r: planned now
                run = plan(self, r)
                self.plans[self.pc] = (r, run)
            if run is not None:
                run()
            else:
                self._execute[r.op](r)
        else:
            self._execute[r.op](r)
            if self.compute:
                self.plans[self.pc] = (r, False)

    def complete(self, r: Resolved) -> None:
        self.trace.append(r)
        self.pending = None
        self.state = State.RUNNING
        self.pc += 1
        if self.watch is not None and self.pc - 1 in self.watch:
            self.watch[self.pc - 1](self.index, self.pc - 1)

    # --- memory access -------------------------------------------------------------------------
    def _check(self, name: str, space: Space, lo: int, hi: int, verb: str, what: str = "") -> None:
        limit = len(self._mem[space])
        if hi <= limit:
            return
        if space is Space.HBM and hi <= self.cfg.hbm_words:
            beyond = f"the image's HBM memory map of {limit} words"
        elif space is Space.HBM:
            beyond = f"the card's HBM of {self.cfg.hbm_words} words"
        else:
            beyond = f"{_SPACE_NAMES[space]} of {limit} words"
        raise AddressFault(self.index, self.pc, self.text(),
                           f"{name}{what} {verb} {space.name} words [{lo}, {hi}), beyond {beyond}")

    def read(self, name: str, operand: tuple, rows: int, n: int, stride: int) -> np.ndarray:
        """A (rows, n) view of a strided block (row r at base + r*stride)."""
        space, base = operand
        mem = self._mem[space]
        if rows == 0 or n == 0:
            return np.empty((rows, n), np.float16)
        end = base + (rows - 1) * stride + n
        if end > len(mem):
            self._check(name, space, base, end, "reads")
        if space is Space.WBUF and self._deferred:
            for lo, hi, h in self._deferred:
                if lo <= base and end <= hi:
                    return np.ndarray((rows, n), np.float16, self._mem[Space.HBM], 2 * (base - lo + h),
                                      (2 * stride, 2))
            self._write_deferred(base, end)
        return np.ndarray((rows, n), np.float16, mem, 2 * base, (2 * stride, 2))

    def write(self, name: str, operand: tuple, rows: int, n: int, stride: int, values) -> None:
        space, base = operand
        if rows == 0 or n == 0:
            return
        mem = self._mem[space]
        end = base + (rows - 1) * stride + n
        if end > len(mem):
            self._check(name, space, base, end, "writes")
        if self._deferred and (space is Space.WBUF or space is Space.HBM):
            self._write_deferred(base, end, space)
        if stride < n and rows > 1:  # overlapping rows: written in row order
            values = np.broadcast_to(values, (rows, n))
            for row in range(rows):
                mem[base + row * stride:base + row * stride + n] = values[row]
        else:
            np.ndarray((rows, n), np.float16, mem, 2 * base, (2 * stride, 2))[...] = values

    def _defer(self, r: Resolved) -> None:
        """A contiguous LOAD HBM -> WBUF, remembered instead of copied (see the class)."""
        words = r.rows * r.n
        (_, src), (_, dst) = r.src1, r.dst
        if src + words > len(self._mem[Space.HBM]):
            self._check("src1", Space.HBM, src, src + words, "reads")
        if dst + words > len(self._mem[Space.WBUF]):
            self._check("dst", Space.WBUF, dst, dst + words, "writes")
        if self._deferred:
            kept = []
            for lo, hi, h in self._deferred:  # what the new block covers is superseded
                if hi <= dst or lo >= dst + words:
                    kept.append((lo, hi, h))
                    continue
                if lo < dst:
                    kept.append((lo, dst, h))
                if hi > dst + words:
                    kept.append((dst + words, hi, h + dst + words - lo))
            self._deferred = kept
        self._deferred.append((dst, dst + words, src))

    def _write_deferred(self, start: int = 0, stop: int | None = None, space: Space = Space.WBUF) -> None:
        """Carries out the deferred copies whose WBUF words (or, for space HBM, whose HBM source words) meet
        [start, stop) (all of them by default)."""
        wbuf, hbm = self._mem[Space.WBUF], self._mem[Space.HBM]
        kept = []
        for lo, hi, h in self._deferred:
            a, b = (lo, hi) if space is Space.WBUF else (h, h + hi - lo)
            if stop is None or (a < stop and start < b):
                wbuf[lo:hi] = hbm[h:h + hi - lo]
            else:
                kept.append((lo, hi, h))
        self._deferred = kept

    def _vector_operand(self, r: Resolved, name: str, row_scalar: bool):
        space, value = getattr(r, name)
        if space is Space.IMM:
            return np.array(value, np.uint16).view(np.float16)
        return self.read(name, (space, value), r.rows, 1 if row_scalar else r.n, getattr(r, f"{name}_stride"))

    # --- instructions --------------------------------------------------------------------------
    def _check_alignment(self, r: Resolved) -> None:
        """The alignment rules of the matrix unit's weights, the vector unit's operands and the DMA engines' reads
        (AlignmentFault)."""
        problem = (misaligned_weights(r, self.cfg.weight_align)
                   or misaligned_vector(r, self.cfg.vector_align)
                   or misaligned_transfer(r, self.cfg.beat_words))
        if problem:
            raise AlignmentFault(self.index, self.pc, self.text(), problem)

    def _check_ranges(self, r: Resolved) -> None:
        """Timing-only execution: the address checks of an instruction, without its data."""
        self._check_alignment(r)
        reads, writes = access_ranges(r)
        for verb, ranges in (("reads", reads), ("writes", writes)):
            for space, lo, hi in ranges:
                if space in self._mem:
                    # A GATHER's table extent depends on the indices (data): only its base is checked.
                    gathered_table = r.op is Opcode.GATHER and verb == "reads" and space is Space.HBM
                    self._check("operand", space, lo, lo if gathered_table else hi, verb)

    def _control(self, r: Resolved) -> None:
        rd, rs, rt, imm = self.program[self.pc].ctrl
        if rd:
            self.regs[rd] = control_result(r.op, self.regs, rs, rt, imm)

    @staticmethod
    def deferrable(r: Resolved) -> bool:
        """Whether LOAD or STORE `r` is a contiguous, non-empty copy from HBM into WBUF, which `_defer` remembers
        instead of carrying out."""
        return bool(r.dst[0] is Space.WBUF and r.src1[0] is Space.HBM and not r.flags.transpose and r.rows and r.n
                    and (r.rows == 1 or r.src1_stride == r.n == r.dst_stride))

    def _copy(self, r: Resolved) -> None:
        self._check_alignment(r)
        if self.deferrable(r):
            self._defer(r)
            return
        src = self.read("src1", r.src1, r.rows, r.n, r.src1_stride)
        if r.src1[0] is r.dst[0]:
            src = src.copy()
        if r.flags.transpose:
            self.write("dst", r.dst, r.n, r.rows, r.dst_stride, src.T)
        else:
            self.write("dst", r.dst, r.rows, r.n, r.dst_stride, src)

    def _gather(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        index = self.read("src2", r.src2, 1, r.rows, 0)[0].view(np.uint16).astype(np.int64)
        space, base = r.src1
        starts = base + index * r.src1_stride
        worst = int(np.argmax(starts))
        self._check("src1", space, int(starts[worst]), int(starts[worst]) + r.n, "reads",
                    f" (index {int(index[worst])} of row {worst})")
        rows = self._mem[space][starts[:, None] + np.arange(r.n)]
        self.write("dst", r.dst, r.rows, r.n, r.dst_stride, rows)

    def _products(self, r: Resolved, bias=None, gelu: bool = False, scale=None) -> np.ndarray:
        x = self.read("src1", r.src1, r.rows, r.k, r.src1_stride)
        w_cols = self.read("src2", r.src2, r.n, weight_words(r.k, r.flags.int8), r.src2_stride)
        if r.flags.int8:
            w_cols = numerics.unpack_int8(w_cols, r.k)
        return numerics.matmul(x, w_cols.T, self.cfg.mac_width, bias, gelu, scale)

    def _matmul(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        bias = scale = None
        if r.flags.int8:
            bias, scale = self.read("aux", r.aux, 2, r.n, r.aux_stride)
        elif r.aux[0] is not Space.NONE:
            bias = self.read("aux", r.aux, 1, r.n, 0)[0]
        self.write("dst", r.dst, r.rows, r.n, r.dst_stride, self._products(r, bias, bool(r.flags.gelu), scale))

    def _masked_qk(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        scores = self._products(r)
        masked = future_columns(r)
        if masked is not None:
            scores[masked] = _NEG_INF
        self.write("dst", r.dst, r.rows, r.n, r.dst_stride, scores)
        self.write("aux", r.aux, r.rows, 1, r.aux_stride, numerics.reduce_max(scores, axis=1)[:, None])

    def _binary(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        a = self.read("src1", r.src1, r.rows, r.n, r.src1_stride)
        b = self._vector_operand(r, "src2", r.flags.src2_row_scalar)
        self.write("dst", r.dst, r.rows, r.n, r.dst_stride, _BINARY[r.op](a, b))

    def _scale_shift(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        a = self.read("src1", r.src1, r.rows, r.n, r.src1_stride)
        b = self._vector_operand(r, "src2", r.flags.src2_row_scalar)
        c = self._vector_operand(r, "aux", r.flags.aux_row_scalar)
        self.write("dst", r.dst, r.rows, r.n, r.dst_stride, numerics.vscale_shift(a, b, c))

    def _unary(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        a = self.read("src1", r.src1, r.rows, r.n, r.src1_stride)
        self.write("dst", r.dst, r.rows, r.n, r.dst_stride, numerics.special(OPCODES[r.op].special, a))

    def _reduce(self, r: Resolved) -> None:
        if r.rows == 0 or r.n == 0:
            return
        self._check_alignment(r)
        a = self.read("src1", r.src1, r.rows, r.n, r.src1_stride)
        if OPCODES[r.op].reduction == "max":
            result = numerics.reduce_max(a, axis=1)
        else:
            b = self._vector_operand(r, "src2", False) if r.op is Opcode.VDOT else None
            result = numerics.reduce_sum(a, self.cfg.vector_width, b, axis=1)
        self.write("dst", r.dst, r.rows, 1, r.dst_stride, result[:, None])

    def _receive(self, r: Resolved, message: Message) -> None:
        if (message.rows, message.n) != (r.rows, r.n):
            raise CollectiveMismatchError(
                f"RECV on card {self.index} does not match the SEND it received", [
                    (message.card, message.pc, message.text, f"sent rows={message.rows} n={message.n}"),
                    (self.index, self.pc, self.text(), f"expects rows={r.rows} n={r.n}")])
        if self.compute:
            self.write("dst", r.dst, r.rows, r.n, r.dst_stride, message.data)


def _nothing(r: Resolved) -> None:
    """NOP, and BARRIER (program order already completes everything before it)."""


def _allgather(cards: list, stack: np.ndarray | None) -> None:
    """Completes the ALLGATHER every card is waiting in (`stack`: the cards' stacked ABUF, or None)."""
    pending = [card.pending for card in cards]

    def report(problem: str):
        return CollectiveMismatchError(problem, [(c.index, c.pc, c.text(), f"rows={r.rows} n={r.n} k={r.k}")
                                                 for c, r in zip(cards, pending)])
    if len({r.rows for r in pending}) > 1:
        raise report("cards met at ALLGATHER with different rows")
    slices = tuple((r.n, r.k) for r in pending)
    placed = sorted((k, n) for n, k in slices if n)
    if any(k0 + n0 > k1 for (k0, n0), (k1, _) in zip(placed, placed[1:])):
        raise report("ALLGATHER slices overlap: each card's columns [k, k + n) must be disjoint")
    if cards[0].compute:
        blocks = [card.read("src1", r.src1, r.rows, r.n, r.src1_stride).copy() for card, r in zip(cards, pending)]
        if _lands_in_rows(stack, pending, slices):  # each block into every card's row at once
            for (n, k), block in zip(slices, blocks):
                stack[:, pending[0].dst[1] + k:][:, :n] = block
        else:
            for card, r in zip(cards, pending):
                space, dst = r.dst
                for (n, k), block in zip(slices, blocks):
                    card.write("dst", (space, dst + k), r.rows, n, r.dst_stride, block)
    for card, r in zip(cards, pending):
        resolved = r._replace(slices=slices)
        if card.gathered.get(card.pc) == resolved:
            resolved = card.gathered[card.pc]
        else:
            card.gathered[card.pc] = resolved
        if not card.compute:
            card._check_ranges(resolved)
        card.complete(resolved)


def _lands_in_rows(stack: np.ndarray | None, pending: list, slices: tuple) -> bool:
    """Whether an ALLGATHER's blocks may land in every card's row of the cards' stacked ABUF (`plans.abuf_stack`; None:
    not stacked) at once: one row, the same ABUF destination on every card, every block within ABUF (else the cards
    write them one by one, and report what does not fit)."""
    r = pending[0]
    return (stack is not None and r.rows == 1 and r.dst[0] is Space.ABUF
            and all(other.dst == r.dst for other in pending)
            and all(r.dst[1] + k + n <= stack.shape[1] for n, k in slices))


def stacked_abuf(cfg: ArchConfig) -> np.ndarray:
    """Zeroed ABUFs for a ring of cfg.cards cards, one (cards, abuf_words) array whose row c is card c's (`Card`'s
    `abuf`), so that an instruction the cards share reads and writes every card's words in one numpy operation."""
    return np.zeros((cfg.cards, cfg.abuf_words), np.float16)


_SYNCHRONISING = frozenset(op for op, spec in OPCODES.items() if spec.unit is Unit.ROUTER) | {Opcode.HALT}


def _lockstep(cards: list, stack: np.ndarray, groups: dict, max_steps: int) -> None:
    """Executes the cards' instructions one pc at a time, every card at once, while every card runs at the same pc
    an instruction that is neither HALT nor a router instruction: once for all cards through a group plan
    (plans.group_plan: the instructions the cards share, over their stacked ABUF `stack`) where there is one, else
    card by card in card order. `groups` keeps pc -> (the cards' Resolved, group plan or None) across runs. Each
    card's results and trace are those of executing alone: the cards share no state between router instructions."""
    first = cards[0]
    while first.state is State.RUNNING:
        pc = first.pc
        for card in cards:
            if card.state is not State.RUNNING or card.pc != pc:
                return
        rs = tuple(card.next_resolved(max_steps) for card in cards)
        for r in rs:
            if r.op in _SYNCHRONISING:
                return
        entry = groups.get(pc)
        if entry is None or entry[0] != rs:
            entry = groups[pc] = (rs, group_plan(cards, stack, rs))
        run = entry[1]
        if run is not None:
            run()
            for card, r in zip(cards, rs):
                card.complete(r)
        else:
            for card, r in zip(cards, rs):
                card.execute(r)
                card.complete(r)


def run_ring(cards: list, max_steps: int, groups: dict | None = None) -> None:
    """Runs every card until all have halted; raises RingDeadlockError when none can progress. `groups`, where given
    (a dict the caller keeps for the ring across runs, emptied when the programs or memories change), makes computing
    cards that no watch observes execute in lockstep where they can (`_lockstep`): the same results and traces; where
    several cards fault, the fault reported is the first in lockstep order (card order at each pc)."""
    links = {card.index: deque() for card in cards}
    stack = abuf_stack(cards) if cards[0].compute else None
    lockstep = (groups is not None and stack is not None and len(cards) > 1
                and all(card.compute and card.watch is None for card in cards))
    while True:
        if lockstep:
            _lockstep(cards, stack, groups, max_steps)
        progressed = False
        for card in cards:
            if card.state is State.RUNNING or (card.state is State.WAIT_RECV
                                               and links[(card.index - 1) % len(cards)]):
                card.advance(links, max_steps)
                progressed = True
        if all(card.state is State.HALTED for card in cards):
            break
        if all(card.state is State.WAIT_GATHER for card in cards):
            _allgather(cards, stack)
        elif not progressed:
            raise RingDeadlockError("ring deadlock: no card can make progress", [
                (c.index, c.pc, c.text(), _blocked_reason(c, len(cards))) for c in cards])
    unreceived = [m for index in sorted(links) for m in links[index]]
    if unreceived:
        raise CollectiveMismatchError("the run ended with blocks sent but never received", [
            (m.card, m.pc, m.text, f"sent rows={m.rows} n={m.n} to card {(m.card + 1) % len(cards)}")
            for m in unreceived])


def _blocked_reason(card: Card, cards: int) -> str:
    if card.state is State.WAIT_RECV:
        return f"waits in RECV for a block from card {(card.index - 1) % cards}, which will never send it"
    if card.state is State.WAIT_GATHER:
        return "waits in ALLGATHER for every card to reach theirs"
    return "halted"

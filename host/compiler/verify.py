"""The compiler checks its own plan before it emits a program.

Every instruction the compiler emits carries a statement of its dataflow (`Flow`): the name of the value
each memory operand writes (a region of the activation or weight buffer: "L3.qkv", "L3.Vt g1", a weight
piece, ...; an HBM or host-buffer region by its map name) and the name of the value each operand must
read. `verify_card` executes the card's program symbolically, for the register values of a few runs
(first and last prompt chunk, last decode step), keeping for every ABUF and WBUF word the name of the
value that holds it and the instruction that wrote it, and raises `PlanError` (a CompileError) naming
the card, the instruction and the region when:

* an address is outside its space, or an HBM / host-buffer access leaves the region it names;
* a read finds another value than the one it names (it does not see the last write of that value);
* a write overwrites a value that a later instruction still reads (two live regions overlap); this
  covers a weight-buffer slot loaded before its previous piece's last MATMUL;
* a matrix, vector or DMA instruction's destination shares a word with one of its own sources other than
  exactly in place over src1 (the units stream; the RTL's precondition);
* a LOAD or GATHER from HBM or the host puts words at other offsets within the HBM beat than they had
  (hw/resolved.py's misaligned_transfer), a MATMUL's or MASKED_QK's weights are off weight_align boundaries
  (misaligned_weights), or a vector instruction's operands off vector_align (misaligned_vector): the RTL refuses
  each (ErrorCode.MISALIGNED).

The check follows program order, which is what the hardware computes: the scoreboard makes the
overlapped units equal to it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ringgpt.host.compiler.errors import CompileError
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import OPCODES, Space, Unit
from ringgpt.hw.resolved import (Block, access_blocks, misaligned_transfer, misaligned_vector, misaligned_weights,
                                 resolve_run, with_gather_slices)


class PlanError(CompileError):
    """The compiler's plan breaks one of its invariants (a compiler bug, reported instead of wrong numbers)."""

    exit_code = 1  # not the user's input: the CLI reports it as an internal fault
    label = "internal error"


@dataclass(frozen=True)
class CardPlan:
    """What the check needs of one card: its program, the program's dataflow, its HBM and host-buffer regions
    ({name: (first word, end word)}) and the sizes of those spaces."""
    code: list
    flow: list
    hbm_regions: dict
    host_regions: dict
    hbm_words: int
    host_words: int


@dataclass(frozen=True)
class Flow:
    """What an instruction writes and reads: one value name per memory operand, in `access_blocks` order."""
    writes: tuple = ()
    reads: tuple = ()


NOTHING = 0
"""Tag of a word no instruction of the run has written."""


STREAMING_UNITS = (Unit.MATRIX, Unit.VECTOR, Unit.DMA)
"""Units that read their sources while they write their destination."""


def _words(b: Block) -> np.ndarray:
    """Every word address of a block, flat."""
    return (b.base + np.arange(b.rows)[:, None] * b.stride + np.arange(b.cols)).ravel()


def _view(array: np.ndarray, b: Block) -> np.ndarray:
    item = array.itemsize
    return as_strided(array[b.base:], (b.rows, b.cols), (b.stride * item, item), writeable=True)


def verification_cases(max_context: int, max_rows: int) -> list:
    """(pos, rows) of the runs checked: the first prompt chunk, the last full chunk, the last decode step."""
    cases = [(0, max_rows), (max_context - max_rows, max_rows), (max_context - 1, 1)]
    return sorted(set(cases), key=cases.index)


class _CardCheck:
    def __init__(self, card: int, plan: CardPlan, config: ArchConfig):
        self.card, self.code, self.flow, self.config = card, plan.code, plan.flow, config
        self.regions = {Space.HBM: plan.hbm_regions, Space.HOST: plan.host_regions}
        self.limits = {Space.ABUF: config.abuf_words, Space.WBUF: config.wbuf_words, Space.HBM: plan.hbm_words,
                       Space.HOST: plan.host_words}
        names = sorted({name for f in self.flow for name in (*f.writes, *f.reads)})
        self.ids = {name: i + 1 for i, name in enumerate(names)}
        self.names = ["(nothing)"] + names
        self.last_read = np.full(len(self.names), -1, np.int64)
        for pc, f in enumerate(self.flow):
            for name in f.reads:
                self.last_read[self.ids[name]] = pc

    def fail(self, pc: int, problem: str) -> None:
        raise PlanError(f"compiler plan check, card {self.card}, instruction {pc} ({self.code[pc]}), run "
                        f"pos={self.case[0]} rows={self.case[1]}: {problem}")

    def run(self, case: tuple, resolved: list) -> None:
        """Checks the run `case` = (pos, rows); `resolved`: the card's instructions resolved for it."""
        self.case = case
        shadows = {Space.ABUF: np.zeros(self.config.abuf_words, np.int32),
                   Space.WBUF: np.zeros(self.config.wbuf_words, np.int32)}
        self.written = []
        for pc, r in enumerate(resolved):
            if r is None:
                continue
            problem = (misaligned_transfer(r, self.config.beat_words) or misaligned_weights(r, self.config.weight_align)
                       or misaligned_vector(r, self.config.vector_align))
            if problem:
                self.fail(pc, problem)
            reads, writes = access_blocks(r)
            flow = self.flow[pc]
            if len(reads) != len(flow.reads) or len(writes) != len(flow.writes):
                self.fail(pc, f"its dataflow names {len(flow.reads)} reads and {len(flow.writes)} writes for "
                              f"{len(reads)} read and {len(writes)} written operands")
            for block, name in zip(reads, flow.reads):
                self.check_bounds(pc, block, name, "reads")
                if block.space in shadows and not block.empty:
                    self.check_read(pc, block, name, shadows[block.space])
            checked = set(zip(reads, flow.reads))
            streamed = OPCODES[r.op].unit in STREAMING_UNITS
            for block, name in zip(writes, flow.writes):
                self.check_bounds(pc, block, name, "writes")
                if streamed:
                    self.check_no_self_overlap(pc, block, reads)
                in_place = (block._replace(operand="src1"), name) in checked  # read as `name` just above
                if block.space in shadows and not block.empty and not in_place:
                    self.write(pc, block, name, shadows[block.space])
            self.written.append((pc, writes))

    def check_no_self_overlap(self, pc: int, w: Block, reads: tuple) -> None:
        """The matrix, vector and DMA units stream: a destination may coincide exactly with src1 (in place) but
        must share no other word with the instruction's own sources (docs/rtl-core.md)."""
        for b in reads:
            if b.space is not w.space or b.empty or w.empty or (b.operand == "src1" and
                                                                 b[1:] == w[1:]):
                continue
            _, lo, hi = b.bounds()
            _, wlo, whi = w.bounds()
            if lo >= whi or wlo >= hi:
                continue
            shared = np.intersect1d(_words(b), _words(w))
            if shared.size:
                self.fail(pc, f"{w.operand} shares {w.space.name} word {int(shared[0])} with its own {b.operand}: "
                              "a streaming unit may only write exactly in place over src1")

    def writer(self, space: Space, address: int) -> str:
        """', written by instruction N (...)' for the last instruction so far that wrote the word, or ''."""
        for pc, blocks in reversed(self.written):
            if any(b.holds(space, address) for b in blocks):
                return f", written by instruction {pc} ({self.code[pc]})"
        return ""

    def check_bounds(self, pc: int, b: Block, name: str, verb: str) -> None:
        if b.empty:
            return
        space, lo, hi = b.bounds()
        if b.unbounded:
            hi = lo + b.cols
        if lo < 0 or hi > self.limits[space]:
            self.fail(pc, f"{b.operand} {verb} {space.name} words [{lo}, {hi}) outside the space "
                          f"({self.limits[space]} words)")
        if space in self.regions:
            region = self.regions[space].get(name)
            if region is None:
                self.fail(pc, f"{b.operand} names {space.name} region {name!r}, which the map does not have")
            if not (region[0] <= lo and hi <= region[1]):
                self.fail(pc, f"{b.operand} {verb} {space.name} words [{lo}, {hi}), outside region {name!r} "
                              f"[{region[0]}, {region[1]})")

    def check_read(self, pc: int, b: Block, name: str, shadow: np.ndarray) -> None:
        wrong = _view(shadow, b) != self.ids[name]
        if wrong.any():
            row, col = divmod(int(np.argmax(wrong)), b.cols)
            address = b.base + row * b.stride + col
            self.fail(pc, f"{b.operand} should read {name!r} but {b.space.name} word {address} (row {row}, column "
                          f"{col}) holds {self.names[int(shadow[address])]!r}{self.writer(b.space, address)}")

    def write(self, pc: int, b: Block, name: str, shadow: np.ndarray) -> None:
        new = self.ids[name]
        held = _view(shadow, b)
        values = held.ravel()
        first = values[0]
        old = (first,) if (values == first).all() else np.flatnonzero(np.bincount(values))
        for tag in old:
            tag = int(tag)
            if tag not in (new, NOTHING) and self.last_read[tag] > pc:
                i = int(np.argmax((held == tag).ravel()))
                address = b.base + i // b.cols * b.stride + i % b.cols
                reader = int(self.last_read[tag])
                self.fail(pc, f"{b.operand} writes {name!r} over {b.space.name} word {address}, which holds "
                              f"{self.names[tag]!r}, still read by instruction {reader} ({self.code[reader]}): "
                              "two live regions overlap")
        held[...] = new


def verify_programs(cards: list, config: ArchConfig, cases: list) -> None:
    """Raises PlanError when a card's program (CardPlan, one per card in card order) breaks an invariant in any
    of the runs `cases` ((pos, rows) pairs)."""
    for card, plan in enumerate(cards):
        if len(plan.code) != len(plan.flow):
            raise PlanError(f"compiler plan check, card {card}: {len(plan.code)} instructions but {len(plan.flow)} "
                            "dataflow entries")
    checks = [_CardCheck(card, plan, config) for card, plan in enumerate(cards)]
    for case in cases:
        try:
            runs = with_gather_slices([resolve_run(plan.code, card, *case) for card, plan in enumerate(cards)])
        except ValueError as exc:
            raise PlanError(f"compiler plan check: {exc}") from None
        for check, resolved in zip(checks, runs):
            check.run(case, resolved)

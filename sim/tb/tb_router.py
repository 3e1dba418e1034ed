"""cocotb testbenches of the router (hw/core/router.py) against the functional simulator's ring.

One router in the single-instruction harness (Datapath("router")): cocotbext-axi's AxiStreamSource plays the
previous card (the blocks it would send, with random pauses) and AxiStreamSink the next (random
back-pressure), and the harness's `contend` port refuses its ABUF reads at random. Each ALLGATHER, SEND or
RECV is run on N functional-simulator cards (sim.functional.machine
.run_ring) from the same state; every ABUF word of the card under test must match its functional card, and
the blocks it sends must be the ones the next card needs (router.link_block of the functional cards' data).
Mismatched collectives must end with RING (a slice past ABUF with OUT_OF_RANGE) without writing, bad words
with their check's code, and a RECV that nothing feeds must be stopped by the cycle limit.

Routers on a ring (sim/cocotb_support/ring.py: RouterRing, sizes 1 to 3 in one build): ALLGATHERs with uneven
slices (3 heads on 2 cards, a card without columns), SEND/RECV rotations through the receive queues and a
loop-back on one card, under random link pauses; every ABUF word of every card against the functional cards
after each step. Mismatched rows give RING on the cards that see them; a ring that never delivers is
reported by the cycle limit. Busy cycles at full rate are exactly `Router.cycles`.
"""
import json
import logging
import os
import random

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSink, AxiStreamSource

from ringgpt.hw import numerics as nx
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.core.router import link_block
from ringgpt.hw.isa import Dim, Instruction, Opcode, Operand, Space
from ringgpt.hw.resolved import Decoded
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.cocotb_support.datapath import DatapathTB, finish_regs, fp16_data, new_regs, register_relative
from ringgpt.sim.cocotb_support.ring import RingTB
from ringgpt.sim.cocotb_support.runner import DESIGN_ENV
from ringgpt.sim.functional.machine import Card, run_ring
from ringgpt.sim.cocotb_support.cases import pauses, pick, set_field

ON_RING = json.loads(os.environ.get(DESIGN_ENV, "{}")).get("component", "").endswith(":RouterRing")
"""Which design this run simulates: the ring's tests skip on the lone harness and the other way round."""
HALT = Decoded(Instruction.make(Opcode.HALT))


# --- instructions and their golden runs -------------------------------------------------------------------

def abuf(address: int, reg: int = 0) -> Operand:
    return Operand(Space.ABUF, reg, address)


def uneven_slices(rng, cards: int, width: int) -> list[tuple[int, int]]:
    """(n, k) of every card: heads of `width` columns split as the compiler does (larger pieces first, a card
    without heads when there are fewer heads than cards), now and then a ragged width."""
    heads = int(rng.integers(max(1, cards - 1), 2 * cards + 1))
    base, extra = divmod(heads, cards)
    sizes = [(base + (c < extra)) * width for c in range(cards)]
    if rng.random() < 0.3:
        sizes = [int(rng.integers(0, 3 * width)) for _ in range(cards)]
    starts = np.cumsum([0] + sizes[:-1])
    return [(n, int(k)) for n, k in zip(sizes, starts)]


def gather_program(rng, cfg, cards: int, *, width: int | None = None, slices: list | None = None,
                   rows: int | None = None, in_place: bool | None = None, relative: bool = True) -> list:
    """One ALLGATHER per card: [(instruction, registers)], same rows and layout on every card, uneven slices
    ((n, k) per card), in place (src1 = dst + k, the compiler's form) or from a separate block."""
    P = cfg.vector_width
    rows = rows or pick(rng, [1, 1, 2, 3, P + 1, rng.integers(1, 2 * P + 1)])
    slices = slices or uneven_slices(rng, cards, width or pick(rng, [1, P - 1, P, P + 3, 2 * P]))
    total = sum(n for n, _ in slices)
    sd = total + int(rng.integers(0, 6))
    in_place = bool(rng.random() < 0.6) if in_place is None else in_place
    widest = max(n for n, _ in slices)
    s1 = widest + int(rng.integers(0, 4))
    while True:
        dst_extent = (rows - 1) * sd + max(total, 1)
        src_extent = 0 if in_place else (rows - 1) * s1 + max(widest, 1)
        if dst_extent + src_extent <= cfg.abuf_words:
            break
        rows //= 2
    dst = int(rng.integers(0, cfg.abuf_words - dst_extent - src_extent + 1))
    src = dst_extent + dst + int(rng.integers(0, cfg.abuf_words - dst - dst_extent - src_extent + 1)) \
        if not in_place else None
    program = []
    for n, k in slices:
        regs = new_regs()

        def field(value, imm_bits=32, regs=regs):
            return register_relative(rng, regs, value, imm_bits=imm_bits) if relative else (0, value)
        src1 = dst + k if in_place else src
        inst = Instruction.make(Opcode.ALLGATHER, dst=abuf(*reversed(field(dst))),
                                src1=abuf(*reversed(field(src1))), rows=Dim(*field(rows, 28)), n=Dim(*field(n, 28)),
                                k=Dim(*field(k, 28)), dst_stride=sd, src1_stride=sd if in_place else s1)
        program.append((inst, finish_regs(rng, regs)))
    return program


def point_program(rng, cfg, cards: int, sender: int, *, rows: int | None = None, n: int | None = None) -> list:
    """SEND on card `sender`, the matching RECV on the next card, nothing on the others (cards >= 2)."""
    P = cfg.vector_width
    rows = rows or pick(rng, [1, 2, 3, P, rng.integers(1, 2 * P + 1)])
    n = n or pick(rng, [1, P - 1, P, P + 1, 3 * P + 2, rng.integers(1, 4 * P + 1)])
    program = [None] * cards
    for card, op, name in ((sender, Opcode.SEND, "src1"), ((sender + 1) % cards, Opcode.RECV, "dst")):
        stride = n + int(rng.integers(0, 5))
        base = int(rng.integers(0, cfg.abuf_words - (rows - 1) * stride - n + 1))
        regs = new_regs()
        operand = abuf(*reversed(register_relative(rng, regs, base)))
        inst = Instruction.make(op, rows=Dim(*register_relative(rng, regs, rows, imm_bits=28)),
                                n=Dim(*register_relative(rng, regs, n, imm_bits=28)),
                                **{name: operand, f"{name}_stride": stride})
        program[card] = (inst, finish_regs(rng, regs))
    return program


def golden_ring(cfg, program: list, states: list) -> list[Card]:
    """The functional cards after running `program` (one instruction or None per card) from `states`."""
    cfg = cfg.with_cards(len(program))
    cards = []
    for index, (item, state) in enumerate(zip(program, states)):
        card = Card(index, cfg, [HALT] if item is None else [Decoded(item[0]), HALT], 0, 0)
        card.mem[Space.ABUF][:] = nx.fp16_from_bits(state)
        card.regs = [0] * 16 if item is None else list(item[1])
        cards.append(card)
    run_ring(cards, max_steps=4)
    return cards


def block_data(state, r) -> np.ndarray:
    """The rows x n block at src1 of resolved `r` in ABUF `state` (uint16)."""
    _, base = r.src1
    return np.array([[state[base + row * r.src1_stride + j] for j in range(r.n)] for row in range(r.rows)],
                    np.uint16).reshape(r.rows, r.n)


def link_traffic(program: list, states: list, cards: list[Card], P: int) -> dict:
    """{card: [blocks it sends, in order]}, each block a list of (tdata, tlast) beats: the protocol's
    reference, built from the functional cards' resolved instructions and their source data."""
    resolved = {c: card.trace[0] for c, card in enumerate(cards) if program[c] is not None}
    count = len(cards)
    traffic = {c: [] for c in range(count)}
    for c, r in resolved.items():
        if r.op is Opcode.SEND:
            traffic[c].append(link_block(Opcode.SEND, c, r.rows, r.n, 0, block_data(states[c], r), P))
        elif r.op is Opcode.ALLGATHER and count > 1:
            for step in range(count - 1):       # own slice, then those of cards c - 1, c - 2, ...
                origin = (c - step) % count
                o = resolved[origin]
                traffic[c].append(link_block(Opcode.ALLGATHER, origin, o.rows, o.n, o.k,
                                             block_data(states[origin], o), P))
    return traffic


# --- the lone router: AXI4-Stream neighbours -------------------------------------------------------------

def lanes(block: list, P: int) -> list[int]:
    """A block's beats as the P 16-bit lanes cocotbext-axi carries per beat (byte_size 16)."""
    return [(tdata >> (16 * lane)) & 0xFFFF for tdata, _ in block for lane in range(P)]



class RouterTB(DatapathTB):
    """DatapathTB of Datapath("router") with the link's two neighbours."""

    def __init__(self, dut, *, pause: float = 0.3):
        super().__init__(dut)
        self.unit = self.top.unit
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(dut, "rx_"), dut.clk, dut.rst, byte_size=16)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "tx_"), dut.clk, dut.rst, byte_size=16)
        for end in (self.source, self.sink):
            end.log.setLevel(logging.WARNING)
        self.link_rng = random.Random(bench.args().get("seed", 0) + 1)
        if pause:
            self.source.set_pause_generator(pauses(self.link_rng, pause))
            self.sink.set_pause_generator(pauses(self.link_rng, pause))
        dut.card_id.value = 0
        dut.cards.value = 1

    async def reset(self):
        """Empties the router's queues and the neighbours (the buffers keep their words)."""
        self.source.clear()
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 2)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)      # the units' START state
        await FallingEdge(self.dut.clk)
        while not self.sink.empty():
            self.sink.recv_nowait()

    def state(self, rng) -> dict:
        return {Space.ABUF: fp16_data(rng, self.cfg.abuf_words), Space.WBUF: self.held[Space.WBUF]}

    async def run_case(self, label: str, program: list, card: int, states: list, *, error=ErrorCode.NONE,
                       incoming: list | None = None, golden: bool = True, bound: int = 3000) -> int:
        """Runs card `card`'s instruction of `program` with the blocks the previous card sends (`incoming`, by
        default the functional cards') on rx; checks its code, its ABUF (functional card, or unchanged on an
        error) and what it sent on tx. Returns the busy cycles."""
        P, cards = self.P, len(program)
        self.dut.card_id.value, self.dut.cards.value = card, cards
        after = golden_ring(self.cfg, program, states) if golden else None
        traffic = link_traffic(program, states, after, P) if golden else {c: [] for c in range(cards)}
        incoming = traffic[(card - 1) % cards] if incoming is None else incoming
        await self.sync({Space.ABUF: states[card], Space.WBUF: self.held[Space.WBUF]})
        for block in incoming:
            self.source.send_nowait(AxiStreamFrame(lanes(block, P)))
        inst, regs = program[card]
        code, cycles, _ = await self.execute(inst.encode(), regs, bound=bound)
        assert code == error, f"{label} {inst}: error {code.name}, expected {error.name}"
        got = (await self.dump())[Space.ABUF]
        expected = nx.fp16_bits(after[card].mem[Space.ABUF]) if error is ErrorCode.NONE else states[card]
        bad = np.nonzero(got != expected)[0]
        if len(bad):
            lines = [f"  ABUF[{a}]: got {got[a]:#06x}, expected {expected[a]:#06x} (before {states[card][a]:#06x})"
                     for a in bad[:12]]
            raise AssertionError(f"{label} card {card} of {cards} {inst} regs={regs}: {len(bad)} ABUF words differ\n"
                                 + "\n".join(lines))
        self.held[Space.ABUF] = got
        if error is not ErrorCode.NONE:       # what it had sent before the error is dropped at the reset
            return cycles
        sent = []
        while not self.sink.empty():
            sent.append(list(self.sink.recv_nowait().tdata))
        wanted = [lanes(block, P) for block in traffic[card]]
        assert sent == wanted, (f"{label} card {card} of {cards} {inst}: sent {len(sent)} blocks "
                                f"{[len(b) // P for b in sent]} beats, expected {[len(b) // P for b in wanted]}"
                                f"{'' if len(sent) != len(wanted) else ' (contents differ)'}")
        assert self.source.empty() and not self.source.active, f"{label}: blocks left on rx"
        return cycles


@cocotb.test(skip=ON_RING)
async def collectives_bit_exact(dut):
    """Random ALLGATHERs (1 to 4 cards, any card under test, uneven slices), SENDs and RECVs against the
    functional ring, under random pauses on rx and back-pressure on tx, and urgent reads on the harness's
    `contend` port refusing the router's shared ABUF reads at random."""
    args = bench.args()
    tb = RouterTB(dut, pause=float(args.get("link_pause", 0.3)))
    await tb.start()
    tb.contend(0.5)
    rng = np.random.default_rng(args["seed"])
    for index in range(args["cases"]):
        kind = index % 3
        cards = int(rng.integers(1 if kind == 0 else 2, 5))
        card = int(rng.integers(cards))
        if kind == 0:
            program = gather_program(rng, tb.cfg, cards)
        else:
            program = point_program(rng, tb.cfg, cards, card if kind == 1 else (card - 1) % cards)
        states = [tb.state(rng)[Space.ABUF] for _ in range(cards)]
        await tb.run_case(f"#{index}", program, card, states)
    cocotb.log.info("%d router instructions bit-exact, link traffic as the next card needs it", args["cases"])


@cocotb.test(skip=ON_RING)
async def mismatched_collectives_raise_ring(dut):
    """Headers that do not match the instruction: RING (a slice past ABUF: OUT_OF_RANGE), nothing written,
    done within the bound; after a reset the router works again."""
    tb = RouterTB(dut)
    await tb.start()
    rng = np.random.default_rng(17)
    cfg, P = tb.cfg, tb.P
    zeros = np.zeros((2 * P + 1, 4 * P), np.uint16)
    cases = []
    gather = gather_program(rng, cfg, 3, slices=[(P, 0), (P + 1, P), (2, 2 * P + 1)], in_place=True, relative=False)
    r = [Decoded(inst).resolve(regs, c) for c, (inst, regs) in enumerate(gather)]

    def block(kind, origin, rows, n, k):
        return link_block(kind, origin, rows, n, k, zeros, P)
    cases += [
        ("ALLGATHER, rows differ", gather, [block(Opcode.ALLGATHER, 2, r[2].rows + 1, r[2].n, r[2].k)],
         ErrorCode.RING),
        ("ALLGATHER, a SEND's block", gather, [block(Opcode.SEND, 2, r[2].rows, r[2].n, 0)], ErrorCode.RING),
        ("ALLGATHER, from the wrong card", gather, [block(Opcode.ALLGATHER, 1, r[1].rows, r[1].n, r[1].k)],
         ErrorCode.RING),
        ("ALLGATHER, overlapping slice", gather, [block(Opcode.ALLGATHER, 2, r[0].rows, 1, r[0].k)], ErrorCode.RING),
        ("ALLGATHER, slice past ABUF", gather, [block(Opcode.ALLGATHER, 2, r[0].rows, 1, cfg.abuf_words)],
         ErrorCode.OUT_OF_RANGE),
    ]
    points = point_program(rng, cfg, 2, 1, rows=2, n=P + 1)
    cases += [
        ("RECV, other n", points, [block(Opcode.SEND, 1, 2, P, 0)], ErrorCode.RING),
        ("RECV, other rows", points, [block(Opcode.SEND, 1, 1, P + 1, 0)], ErrorCode.RING),
        ("RECV, an ALLGATHER's block", points, [block(Opcode.ALLGATHER, 1, 2, P + 1, 0)], ErrorCode.RING),
    ]
    for label, program, incoming, code in cases:
        card = 0
        await tb.run_case(label, program, card, [tb.state(rng)[Space.ABUF] for _ in program], error=code,
                          incoming=incoming, golden=False, bound=400)
        await tb.reset()
    program = gather_program(rng, cfg, 2)
    await tb.run_case("after RING", program, 0, [tb.state(rng)[Space.ABUF] for _ in program])


@cocotb.test(skip=ON_RING)
async def bad_instructions_raise_errors(dut):
    """Each check's code, nothing written, nothing sent, done within the bound."""
    tb = RouterTB(dut)
    await tb.start()
    rng = np.random.default_rng(23)
    cfg = tb.cfg
    gather = gather_program(rng, cfg, 1, relative=False)[0][0].encode()
    points = point_program(rng, cfg, 2, 0)
    send, recv = (item[0].encode() for item in points)
    vadd = Instruction.make(Opcode.VADD, dst=abuf(0), src1=abuf(0), src2=abuf(0), rows=Dim(0, 1), n=Dim(0, 4))
    cases = [
        ("reserved bit", set_field(send, "reserved", 1 << int(rng.integers(90))), ErrorCode.RESERVED),
        ("SEND with a dst", set_field(send, "dst.space", Space.ABUF.value), ErrorCode.RESERVED),
        ("RECV with k", set_field(recv, "k.imm", 3), ErrorCode.RESERVED),
        ("ALLGATHER with a flag", set_field(gather, "flags.transpose", 1), ErrorCode.RESERVED),
        ("SEND from WBUF", set_field(send, "src1.space", Space.WBUF.value), ErrorCode.BAD_SPACE),
        ("RECV into HBM", set_field(recv, "dst.space", Space.HBM.value), ErrorCode.BAD_SPACE),
        ("ALLGATHER rows 0", set_field(set_field(gather, "rows.reg", 0), "rows.imm", 0), ErrorCode.ZERO_DIM),
        ("SEND n 0", set_field(set_field(send, "n.reg", 0), "n.imm", 0), ErrorCode.ZERO_DIM),
        ("RECV rows 0", set_field(set_field(recv, "rows.reg", 0), "rows.imm", 0), ErrorCode.ZERO_DIM),
        ("SEND past ABUF", set_field(set_field(send, "src1.reg", 0), "src1.offset", cfg.abuf_words),
         ErrorCode.OUT_OF_RANGE),
        ("RECV past 2**32", set_field(set_field(recv, "dst.reg", 0), "dst.offset", (1 << 32) - 1),
         ErrorCode.OUT_OF_RANGE),
        ("ALLGATHER k past ABUF", set_field(set_field(gather, "k.reg", 0), "k.imm", cfg.abuf_words),
         ErrorCode.OUT_OF_RANGE),
        ("VADD to the router", vadd.encode(), ErrorCode.WRONG_UNIT),
        ("no such opcode", set_field(0, "opcode", 0x3F), ErrorCode.WRONG_UNIT),
    ]
    regs = [0] * 16
    for label, word, code in cases:
        state = tb.state(rng)
        await tb.sync(state)
        got, _, _ = await tb.execute(word, regs, bound=20)
        assert got == code, f"{label}: error {got.name}, expected {code.name}"
        assert (await tb.dump())[Space.ABUF].tolist() == state[Space.ABUF].tolist(), f"{label}: ABUF written"
        assert tb.sink.empty(), f"{label}: a block was sent"


@cocotb.test(skip=ON_RING)
async def recv_without_sender_is_stopped(dut):
    """A RECV that nothing feeds waits; the testbench's cycle limit stops and reports it."""
    tb = RouterTB(dut)
    await tb.start()
    rng = np.random.default_rng(29)
    program = point_program(rng, tb.cfg, 2, 0)
    dut.card_id.value, dut.cards.value = 1, 2
    try:
        await tb.execute(program[1][0].encode(), program[1][1], bound=300)
    except AssertionError as stopped:
        cocotb.log.info("cycle limit: %s", stopped)
    else:
        raise AssertionError("a RECV with nothing on rx completed")
    await tb.reset()
    await tb.run_case("after the stop", program, 1, [tb.state(rng)[Space.ABUF] for _ in program])


@cocotb.test(skip=ON_RING)
async def full_rate(dut):
    """Busy cycles exactly Router.cycles: SEND with tx always ready, RECV with its block queued, one-card
    ALLGATHERs (the local copy, in place or not)."""
    tb = RouterTB(dut, pause=0.0)
    tb.issue_probability = 1.0
    await tb.start()
    rng = np.random.default_rng(31)
    cfg, P, unit = tb.cfg, tb.P, tb.unit
    wrong = []
    for rows, n in ((1, 1), (1, P), (3, 2 * P + 1), (2 * P, 3)):
        for sender, card in ((0, 0), (0, 1)):
            program = point_program(rng, cfg, 2, sender, rows=rows, n=n)
            states = [tb.state(rng)[Space.ABUF] for _ in program]
            op = program[card][0].opcode
            if op is Opcode.RECV:     # the block waits in the receive queue before the RECV is issued
                after = golden_ring(cfg, program, states)
                block = link_traffic(program, states, after, P)[sender][0]
                tb.source.send_nowait(AxiStreamFrame(lanes(block, P)))
                await ClockCycles(dut.clk, len(block) + 8)
                await FallingEdge(dut.clk)
                incoming = []
            else:
                incoming = None
            cycles = await tb.run_case("full rate", program, card, states, incoming=incoming)
            if cycles != unit.cycles(op, rows, n):
                wrong.append(f"{op.name} {rows}x{n}: {cycles} busy cycles, Router.cycles {unit.cycles(op, rows, n)}")
    for in_place in (True, False):
        program = gather_program(rng, cfg, 1, in_place=in_place, relative=False)
        r = Decoded(program[0][0]).resolve(program[0][1], 0)
        cycles = await tb.run_case("full rate", program, 0, [tb.state(rng)[Space.ABUF]])
        expected = unit.cycles(Opcode.ALLGATHER, r.rows, r.n, slices=((r.n, r.k),), in_place=in_place)
        if cycles != expected:
            wrong.append(f"ALLGATHER on 1 card {r.rows}x{r.n} in place {in_place}: {cycles}, Router.cycles {expected}")
    assert not wrong, "\n".join(wrong)


@cocotb.test(skip=ON_RING)
async def forward_after_a_refused_write(dut):
    """A slice the router forwards is read back from ABUF only once its last beat's write has landed: ALLGATHERs on 3
    cards (card 0 under test, the slice it forwards one beat), with ABUF's one unit write taken by `contend_write`
    for 6 cycles from each of 20 offsets after the issue (the router's write refused meanwhile). Before the fix the
    router read the slice back while its beat still waited in the write register and sent the old words (tb_router
    at u280 width found it: tests/test_rtl_u280_units.py)."""
    tb = RouterTB(dut, pause=0.0)
    tb.issue_probability = 1.0
    await tb.start()
    rng = np.random.default_rng(43)
    P = tb.P

    async def hold(delay: int, length: int):
        while not dut.issue__valid.value:
            await FallingEdge(dut.clk)
        for _ in range(delay):
            await FallingEdge(dut.clk)
        dut.contend_write__addr.value = 0
        dut.contend_write__en.value = 1
        for _ in range(length):
            await FallingEdge(dut.clk)
        dut.contend_write__en.value = 0

    for delay in range(20):
        program = gather_program(rng, tb.cfg, 3, slices=[(P, 0), (P - 1, P), (2, 2 * P - 1)], rows=1, in_place=True,
                                 relative=False)
        holding = cocotb.start_soon(hold(delay, 6))
        await tb.run_case(f"unit write held from {delay} cycles after the issue", program, 0,
                          [tb.state(rng)[Space.ABUF] for _ in program])
        await holding


# --- routers on a ring ---------------------------------------------------------------------------------

def ring_states(rng, cfg, count: int) -> list:
    return [fp16_data(rng, cfg.abuf_words) for _ in range(count)]


async def ring_steps(tb: RingTB, steps: list, bound: int) -> None:
    """Runs each (label, programs) on the ring and checks every ABUF word of every card after it."""
    for label, programs in steps:
        for index, outcomes in enumerate(await tb.run(programs, bound=bound)):
            column = [program[index] if index < len(program) else None for program in programs]
            stuck = RingTB.stuck(column, outcomes, bound)
            assert not stuck, f"{label}:\n{stuck}"
            wrong = [f"card {c}: {o.error.name}" for c, o in enumerate(outcomes) if o.error is not ErrorCode.NONE]
            assert not wrong, f"{label}: {', '.join(wrong)}"
        await tb.check(label)


def each(program: list) -> list:
    """One instruction (or none) per card as per-card programs."""
    return [[] if item is None else [item] for item in program]


def rotation(rng, cfg, size: int) -> list:
    """Every card SENDs to the next, then RECVs from the previous: every block waits in a receive queue."""
    P = cfg.vector_width
    rows, n = pick(rng, [1, 2, P + 1]), pick(rng, [1, P, 2 * P + 3])
    programs = []
    for card in range(size):
        stride = n + int(rng.integers(0, 4))
        extent = (rows - 1) * stride + n
        src, dst = (int(v) for v in rng.choice(cfg.abuf_words // extent, 2, replace=False) * extent)
        regs = finish_regs(rng, new_regs())
        programs.append([(Instruction.make(Opcode.SEND, src1=abuf(src), rows=Dim(0, rows), n=Dim(0, n),
                                           src1_stride=stride), regs),
                         (Instruction.make(Opcode.RECV, dst=abuf(dst), rows=Dim(0, rows), n=Dim(0, n),
                                           dst_stride=stride), regs)])
    return [("SEND then RECV on every card", programs)]


@cocotb.test(skip=not ON_RING)
async def ring_collectives_bit_exact(dut):
    """Rings of 2 and 3 routers (and one looped back) under random link pauses: ALLGATHERs with uneven
    slices (3 heads on 2 cards among them), SEND/RECV rotations, every ABUF word of every card."""
    args = bench.args()
    rng = np.random.default_rng(args["seed"])
    tb = RingTB(dut, seed=args["seed"], pause_probability=float(args.get("link_pause", 0.3)))
    P = tb.cfg.vector_width
    await tb.start(ring_states(rng, tb.cfg, len(tb.cards)))
    for size in (2, 3, 1):
        tb.resize(size)
        steps = []
        if size == 2:
            head_dim = P + 2
            steps.append(("ALLGATHER, 3 heads on 2 cards",
                          each(gather_program(rng, tb.cfg, 2, slices=[(2 * head_dim, 0), (head_dim, 2 * head_dim)],
                                              in_place=True))))
        if size > 1:
            steps += [(f"ALLGATHER #{i}", each(gather_program(rng, tb.cfg, size))) for i in range(args["gathers"])]
            steps += rotation(rng, tb.cfg, size)
            steps += [(f"SEND and RECV, card {c} to card {(c + 1) % size}", each(point_program(rng, tb.cfg, size, c)))
                      for c in range(size)]
        else:
            steps += [("ALLGATHER on 1 card", each(gather_program(rng, tb.cfg, 1, in_place=False)))]
            steps += rotation(rng, tb.cfg, 1)
        await ring_steps(tb, steps, bound=4000)
        await tb.load(ring_states(rng, tb.cfg, len(tb.cards)))
        cocotb.log.info("ring of %d: %d steps bit-exact", size, len(steps))


@cocotb.test(skip=not ON_RING)
async def ring_allgather_full_rate(dut):
    """Every card starting the same ALLGATHER in the same cycle, links never paused: busy cycles exactly
    Router.cycles on every card."""
    tb = RingTB(dut, seed=5)
    for card in tb.cards:
        card.issue_probability = 1.0
    rng = np.random.default_rng(37)
    await tb.start(ring_states(rng, tb.cfg, len(tb.cards)))
    wrong = []
    for size, rows, slices, in_place in ((3, 2, [(8, 0), (8, 8), (8, 16)], True),
                                         (3, 3, [(10, 0), (5, 10), (0, 15)], False),
                                         (3, 2, [(24, 0), (1, 24), (9, 25)], False),
                                         (2, 5, [(22, 0), (11, 22)], True), (2, 4, [(3, 0), (17, 3)], False)):
        tb.resize(size)
        program = gather_program(rng, tb.cfg, size, slices=slices, rows=rows, in_place=in_place, relative=False)
        [outcomes] = await tb.run(each(program), bound=3000)
        await tb.check(f"full rate, ring of {size}")
        r = [Decoded(inst).resolve(regs, c) for c, (inst, regs) in enumerate(program)]
        for c, outcome in enumerate(outcomes):
            expected = tb.unit.cycles(Opcode.ALLGATHER, r[c].rows, r[c].n, slices=tuple(slices), card=c,
                                      in_place=in_place)
            if outcome.cycles != expected:
                wrong.append(f"ring of {size}, card {c}, slices {slices} x {r[c].rows} rows: {outcome.cycles} busy "
                             f"cycles, Router.cycles {expected}")
    assert not wrong, "\n".join(wrong)


@cocotb.test(skip=not ON_RING)
async def ring_faults(dut):
    """ALLGATHERs whose rows differ: RING on both cards; a RECV whose sender never sends: the cycle limit stops
    it and names the card; after a reset the ring works again."""
    rng = np.random.default_rng(41)
    tb = RingTB(dut, seed=41)
    await tb.start(ring_states(rng, tb.cfg, len(tb.cards)))
    tb.resize(2)
    program = gather_program(rng, tb.cfg, 2, in_place=True, relative=False)
    inst, regs = program[1]
    rows = inst.rows.imm
    program[1] = (inst._replace(rows=inst.rows._replace(imm=rows - 1 if rows > 1 else rows + 1)), regs)
    [outcomes] = await tb.run(each(program), bound=600, golden=False)
    codes = [o.error for o in outcomes]
    assert codes == [ErrorCode.RING, ErrorCode.RING], f"rows differ: {codes} {RingTB.stuck(program, outcomes, 600)}"
    await tb.reset()
    await tb.check("after RING (nothing written: in place)")
    program = point_program(rng, tb.cfg, 2, 0)
    program[0] = None
    [outcomes] = await tb.run(each(program), bound=300, golden=False)
    stuck = RingTB.stuck(program, outcomes, 300)
    assert outcomes[1].error is None and "card 1" in stuck and "RECV" in stuck, f"never delivered: {outcomes}"
    cocotb.log.info("cycle limit: %s", stuck)
    await tb.reset()
    await ring_steps(tb, [("ALLGATHER after the faults", each(gather_program(rng, tb.cfg, 2)))], bound=3000)

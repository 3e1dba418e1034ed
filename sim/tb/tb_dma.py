"""cocotb testbench of the DMA unit in the single-instruction harness (Datapath("dma")), with a cocotbext-axi
AxiRam behind every AXI port: one per HBM pseudo-channel (at its byte base `hbm_base[c]`, holding the channel's
share of a small test HBM through hw/hbm.py's map) and one for the host buffer, each under random pause
generators on all five channels while an instruction runs.

* on chip: random LOADs from ABUF into ABUF or WBUF, straight and transposed (rows and n of 1, port-width
  edges and non-multiples, zero and overlapping source strides, overlapping destination rows where the unit
  defines their order, in-place copies);
* off chip: random LOADs from HBM and HOST (straight, strided, transposed, into ABUF and WBUF), STOREs to HBM
  and HOST (straight and transposed, overlapping destination rows included), GATHERs with indices in ABUF or
  HOST; dimensions at beat and granule edges, random alignments and 4 KiB page crossings, register-relative
  operands and dimensions (R0 holding garbage that must read as 0);
* every word of ABUF, WBUF, the test HBM (read back through the channel map, each AxiRam compared whole) and
  the host buffer is compared with the functional simulator run from the same state;
* bad words: each error code, BUS from addresses outside an AxiRam, the unit working after each;
* full rate: on chip, busy cycles exactly `DMAUnit.cycles`; off chip, a long sequential LOAD at one beat per
  cycle on every port, within a few cycles of `DMAUnit.transfer_cycles`.
"""
import logging
import random

import cocotb
import numpy as np
from cocotbext.axi import AxiBus, AxiRam
from cocotbext.axi.sparse_memory import SparseMemory

from ringgpt.hw import numerics as nx
from ringgpt.hw.core.axi import AXI_PAGE_BYTES
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.hbm import hbm_port, hbm_word
from ringgpt.hw.isa import Dim, Flags, Instruction, Opcode, Operand, Space, decode
from ringgpt.hw.resolved import Decoded
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.cocotb_support.datapath import (DatapathTB, finish_regs, fp16_data, new_regs, random_state,
                                                 register_relative, resolved_of)
from ringgpt.sim.cycle_model import instruction_cost
from ringgpt.sim.functional.errors import AddressFault, AlignmentFault
from ringgpt.sim.functional.machine import Card
from ringgpt.sim.cocotb_support.cases import extent, pauses, pick, place, set_field, stride_for

HBM_WORDS = int(bench.args().get("hbm_words", 8192))
"""The test HBM (testbench argument `hbm_words`, default 8,192): 2,048 words (4 KiB) a channel at sim-small; an
address past it (but inside the config's HBM) reaches past the channel's AxiRam: SLVERR."""
HOST_WORDS = 2048
AXIRAM_LATENCY = 2
"""Cycles from an AR handshake to the AxiRam's first R beat, and from the last W beat to its B response
(measured; transfer_cycles' `latency`)."""
SPACES = (Space.ABUF, Space.WBUF, Space.HBM, Space.HOST)


class BoundedMemory(SparseMemory):
    """An AxiRam's memory that does not wrap addresses: an access at or past its `size` bytes raises, which
    the AxiRam answers with SLVERR (AxiRam alone reduces addresses modulo its length, which this one states
    as 2**48, far above any address the unit issues here)."""

    def __len__(self):
        return 1 << 48



class DmaTB(DatapathTB):
    """DatapathTB with the AxiRams: `check_dma` loads and compares ABUF, WBUF, the test HBM and the host buffer
    (the on-chip tests use DatapathTB.check_instruction, whose records the cycle table reads)."""

    def __init__(self, dut):
        super().__init__(dut)
        cfg = self.cfg
        beat = cfg.hbm_port_bits // 8
        self.channel_words = HBM_WORDS // cfg.hbm_channels
        # bases one beat short of a page and further: bursts cross 4 KiB pages at every alignment (each base the
        # first page end at or past its distance from it: at sim-small the first page's, at u280's 32 channels of
        # 64-byte beats also the second's)
        self.hbm_bases = [-(-beat * (1 + 3 * c) // AXI_PAGE_BYTES) * AXI_PAGE_BYTES - beat * (1 + 3 * c)
                          for c in range(cfg.hbm_channels)]
        self.host_base = 2 * AXI_PAGE_BYTES - 5 * beat
        self.hbm_rams = [self._ram(hbm_port(c), base + 2 * self.channel_words) for c, base in enumerate(self.hbm_bases)]
        self.host_ram = self._ram("host", self.host_base + 2 * HOST_WORDS)
        dut.hbm_base.value = bench.pack(self.top.signature.members["hbm_base"].shape, self.hbm_bases)
        dut.host_base.value = self.host_base
        self.pause_probability = float(bench.args().get("axi_pause", 0.0))
        local = np.arange(self.channel_words)
        self.channel_map = [hbm_word(c, local, cfg) for c in range(cfg.hbm_channels)]

    def _ram(self, port: str, size: int) -> AxiRam:
        logging.getLogger(f"cocotb.{self.dut._name}.{port}_").setLevel(logging.WARNING)
        return AxiRam(AxiBus.from_prefix(self.dut, f"{port}_"), self.dut.clk, self.dut.rst, mem=BoundedMemory(size))

    def _channels(self):
        for ram in self.hbm_rams + [self.host_ram]:
            yield from (ram.read_if.ar_channel, ram.read_if.r_channel, ram.write_if.aw_channel,
                        ram.write_if.w_channel, ram.write_if.b_channel)

    def set_pauses(self, on: bool) -> None:
        for channel in self._channels():
            if on and self.pause_probability:
                channel.set_pause_generator(pauses(random.Random(self.rng.random()), self.pause_probability))
            else:
                channel.clear_pause_generator()

    # --- the AxiRams as the test HBM and host buffer --------------------------------------------------------
    def images(self, state: dict) -> list:
        """The bytes every AxiRam should hold for `state` (zeros below each base)."""
        out = []
        for base, words in zip(self.hbm_bases, self.channel_map):
            out.append(bytes(base) + state[Space.HBM][words].astype("<u2").tobytes())
        out.append(bytes(self.host_base) + state[Space.HOST].astype("<u2").tobytes())
        return out

    def write_memories(self, state: dict) -> None:
        for ram, image in zip(self.hbm_rams + [self.host_ram], self.images(state)):
            ram.write(0, image)

    def read_memories(self) -> tuple[list, dict]:
        """(every AxiRam's bytes, {HBM: words, HOST: words} read back through the map)."""
        rams = [ram.read(0, ram.mem.size) for ram in self.hbm_rams + [self.host_ram]]
        hbm = np.zeros(HBM_WORDS, np.uint16)
        for base, words, image in zip(self.hbm_bases, self.channel_map, rams):
            hbm[words] = np.frombuffer(image[base:], "<u2")
        host = np.frombuffer(rams[-1][self.host_base:], "<u2").copy()
        return rams, {Space.HBM: hbm, Space.HOST: host}

    # --- one instruction ----------------------------------------------------------------------------------------
    def golden(self, state: dict, inst: Instruction, regs) -> dict | None:
        """Every space after the functional simulator executes `inst` from `state`; None on an AddressFault or an
        AlignmentFault."""
        card = Card(0, self.cfg, [Decoded(inst)], HBM_WORDS, HOST_WORDS)
        for space in SPACES:
            card.mem[space][:] = nx.fp16_from_bits(state[space])
        card.regs = list(regs)
        try:
            card._execute[inst.opcode](card.program[0].resolve(card.regs, 0))
        except (AddressFault, AlignmentFault):
            return None
        return {space: nx.fp16_bits(card.mem[space]).copy() for space in SPACES}

    def estimate(self, inst: Instruction, regs, state: dict) -> int:
        """transfer_cycles (or, on chip, cycles) of a legal `inst` (GATHER with its indices)."""
        r = resolved_of(inst, regs)
        unit = self.top.unit
        if Space.HBM not in (r.src1[0], r.dst[0]) and Space.HOST not in (r.src1[0], r.dst[0]):
            return unit.cycles(r.rows, r.n, r.flags.transpose)
        indices = None
        if r.op is Opcode.GATHER:
            space, base = r.src2
            indices = state[space][base:base + r.rows]
        return unit.transfer_cycles(r, latency=AXIRAM_LATENCY, indices=indices)

    async def check_dma(self, inst: Instruction, regs, state: dict, *, label: str = "", word: int | None = None,
                        error: ErrorCode = ErrorCode.NONE, may_write: dict | None = None) -> int:
        """Loads `state` (ABUF, WBUF, HBM, HOST), runs `inst` (or the raw `word`) under AXI pauses and compares
        every space with the functional simulator, or for an expected error with `state` except the words
        `may_write` ({space: (lo, hi)}: what a BUS error may have written). Returns the busy cycles."""
        await self.sync(state)
        self.write_memories(state)
        if error is ErrorCode.NONE:
            expected = self.golden(state, inst, regs)
            assert expected is not None, f"{label} {inst}: the simulator faults on a case meant to be legal"
            bound = 40 * self.estimate(inst, regs, state) + 2000
        else:
            expected, bound = state, 2000
        self.set_pauses(True)
        code, cycles, _ = await self.execute(inst.encode() if word is None else word, regs, bound=bound)
        self.set_pauses(False)
        got = await self.dump()
        rams, memories = self.read_memories()
        got.update(memories)
        assert code == error, f"{label} {inst} regs={list(regs)}: error {code.name}, expected {error.name}"
        for space in SPACES:
            differ = got[space] != expected[space]
            if may_write and space in may_write:
                lo, hi = may_write[space]
                differ[lo:hi] = False
            bad = np.nonzero(differ)[0]
            if len(bad):
                lines = [f"  {space.name}[{a}]: got {got[space][a]:#06x}, expected {expected[space][a]:#06x} "
                         f"(before {state[space][a]:#06x})" for a in bad[:12]]
                raise AssertionError(f"{label} {inst} regs={list(regs)}: {len(bad)} words of {space.name} differ\n"
                                     + "\n".join(lines))
        if not may_write:
            for index, (ram, image) in enumerate(zip(rams, self.images(expected))):
                assert ram == image, f"{label} {inst}: AxiRam {index} holds bytes outside its words that changed"
        self.held = {space: got[space].copy() for space in (Space.ABUF, Space.WBUF)}
        return cycles


def full_state(rng, cfg) -> dict:
    state = random_state(rng, cfg)
    state.update({Space.HBM: fp16_data(rng, HBM_WORDS), Space.HOST: fp16_data(rng, HOST_WORDS)})
    return state


# --- on chip ----------------------------------------------------------------------------------------------------

def dma_case(rng, cfg, *, transpose: bool | None = None, dst_space: Space | None = None):
    """A random legal on-chip LOAD: (instruction, registers)."""
    P = cfg.vector_width
    transpose = bool(rng.random() < 0.4) if transpose is None else transpose
    dst_space = (Space.WBUF if rng.random() < 0.4 else Space.ABUF) if dst_space is None else dst_space
    capacity = {Space.ABUF: cfg.abuf_words, Space.WBUF: cfg.wbuf_words}
    while True:
        rows = pick(rng, [1, 1, 2, 3, P - 1, P, P + 1, 2 * P + 3, rng.integers(1, 3 * P + 1)])
        n = pick(rng, [1, P - 1, P, P + 1, 2 * P, 3 * P + 3, rng.integers(1, 6 * P + 1)])
        s1 = stride_for(rng, n, overlap=True)
        if transpose:
            # overlapping destination rows only where the unit writes them in the simulator's order
            sd = stride_for(rng, rows, overlap=rows <= P)
            dst_extent = extent(n, rows, sd)
        else:
            sd = stride_for(rng, n, overlap=True)
            dst_extent = extent(rows, n, sd)
        in_place = not transpose and dst_space == Space.ABUF and rng.random() < 0.1
        if in_place:
            sd = s1
        src_extent = extent(rows, n, s1)
        if dst_space == Space.ABUF and not in_place:
            bases = place(rng, {"src1": src_extent, "dst": dst_extent}, cfg.abuf_words)
        else:
            bases = place(rng, {"src1": src_extent}, cfg.abuf_words)
            other = place(rng, {"dst": dst_extent}, capacity[dst_space]) if not in_place else {}
            bases = None if bases is None or other is None else {**bases, **other}
        if bases is not None:
            break
    if in_place:
        bases["dst"] = bases["src1"]
    regs = new_regs()

    def operand(space, name):
        reg, offset = register_relative(rng, regs, bases[name])
        return Operand(space, reg, offset)
    inst = Instruction.make(Opcode.LOAD, dst=operand(dst_space, "dst"), src1=operand(Space.ABUF, "src1"),
                            rows=Dim(*register_relative(rng, regs, rows, imm_bits=28)),
                            n=Dim(*register_relative(rng, regs, n, imm_bits=28)), dst_stride=sd, src1_stride=s1,
                            flags=Flags(transpose=int(transpose)))
    return inst, finish_regs(rng, regs)


@cocotb.test()
async def random_instructions_bit_exact(dut):
    """On-chip LOADs (the cycle table's records: `instructions`, `record`)."""
    args = bench.args()
    tb = DmaTB(dut)
    await tb.start()
    rng = np.random.default_rng(args["seed"])
    for index in range(args["instructions"]):
        inst, regs = dma_case(rng, tb.cfg, transpose=bool(index % 2))
        await tb.check_instruction(inst, regs, random_state(rng, tb.cfg), label=f"#{index}")
    tb.save_records(args.get("record"))


def abuf(address: int, reg: int = 0) -> Operand:
    return Operand(Space.ABUF, reg, address)


@cocotb.test()
async def bad_instructions_raise_errors(dut):
    """Each error code of an on-chip word: the right one, nothing written, done within the bound."""
    tb = DmaTB(dut)
    await tb.start()
    rng = np.random.default_rng(13)
    cfg = tb.cfg
    cases = []
    for transpose in (False, True):
        inst, regs = dma_case(rng, cfg, transpose=transpose)
        word = inst.encode()
        cases += [
            ("reserved bit", inst, regs, set_field(word, "reserved", 1 << int(rng.integers(90))), ErrorCode.RESERVED),
            ("unused k", inst, regs, set_field(word, "k.imm", 5), ErrorCode.RESERVED),
            ("gelu flag", inst, regs, set_field(word, "flags.gelu", 1), ErrorCode.RESERVED),
            ("unused src2", inst, regs, set_field(word, "src2.space", Space.ABUF.value), ErrorCode.RESERVED),
            ("src1 in WBUF", inst, regs, set_field(word, "src1.space", Space.WBUF.value), ErrorCode.BAD_SPACE),
            ("dst NONE", inst, regs, set_field(word, "dst.space", Space.NONE.value), ErrorCode.BAD_SPACE),
            ("dst in HBM", inst, regs, set_field(word, "dst.space", Space.HBM.value), ErrorCode.BAD_SPACE),
            ("rows 0: a no-op", decode(set_field(set_field(word, "rows.reg", 0), "rows.imm", 0)), regs, None,
             ErrorCode.NONE),
            ("n 0: a no-op", decode(set_field(set_field(word, "n.reg", 0), "n.imm", 0)), regs, None, ErrorCode.NONE),
            ("src1 past ABUF", inst, regs, set_field(set_field(word, "src1.reg", 0), "src1.offset", cfg.abuf_words),
             ErrorCode.OUT_OF_RANGE),
            ("dst past 2**32", inst, regs, set_field(set_field(word, "dst.reg", 0), "dst.offset", (1 << 32) - 1),
             ErrorCode.OUT_OF_RANGE),
        ]
    # a block that fits only when not transposed: 2 rows of 3 words at stride 3 end at 6; transposed,
    # 3 rows of 2 at stride 3 end at 8
    edge = Instruction.make(Opcode.LOAD, dst=Operand(Space.WBUF, 0, cfg.wbuf_words - 6), src1=abuf(0),
                            rows=Dim(0, 2), n=Dim(0, 3), dst_stride=3, src1_stride=3)
    cases.append(("straight block at WBUF's end", edge, [0] * 16, None, ErrorCode.NONE))
    cases.append(("transposed block past WBUF", edge, [0] * 16, set_field(edge.encode(), "flags.transpose", 1),
                  ErrorCode.OUT_OF_RANGE))
    vadd = Instruction.make(Opcode.VADD, dst=abuf(0), src1=abuf(0), src2=abuf(0), rows=Dim(0, 1), n=Dim(0, 4))
    cases.append(("VADD to the DMA", vadd, [0] * 16, vadd.encode(), ErrorCode.WRONG_UNIT))
    cases.append(("no such opcode", vadd, [0] * 16, set_field(0, "opcode", 0x3F), ErrorCode.WRONG_UNIT))
    for label, inst, regs, word, code in cases:
        await tb.check_instruction(inst, regs, random_state(rng, cfg), label=label, word=word, error=code)
    inst, regs = dma_case(rng, cfg, transpose=True)
    await tb.check_instruction(inst, regs, random_state(rng, cfg), label="after errors")


@cocotb.test()
async def full_rate(dut):
    """On chip: busy cycles exactly `DMAUnit.cycles` (= the cycle model's instruction_cost) with the issue
    stream at full rate: straight copies one chunk per cycle, transposed copies through the tile."""
    tb = DmaTB(dut)
    tb.issue_probability = 1.0
    await tb.start()
    unit, cfg = tb.top.unit, tb.cfg
    P = unit.width
    rng = np.random.default_rng(7)
    wrong = []
    for transpose, rows, n, dst_space in ((False, 3, 4 * P + 1, Space.ABUF), (False, 1, 7 * P, Space.WBUF),
                                          (True, P, 2 * P, Space.ABUF), (True, 1, 3 * P - 1, Space.ABUF),
                                          (True, P + 3, P + 1, Space.WBUF), (True, 2 * P, 1, Space.ABUF)):
        sd = rows if transpose else n
        above = max(1024, 2 * P * P)        # past the largest source block (P x 2P words)
        inst = Instruction.make(Opcode.LOAD, dst=Operand(dst_space, 0, above if dst_space == Space.ABUF else 0),
                                src1=abuf(0), rows=Dim(0, rows), n=Dim(0, n), dst_stride=sd, src1_stride=n,
                                flags=Flags(transpose=int(transpose)))
        cycles = await tb.check_instruction(inst, [0] * 16, random_state(rng, cfg), label="full rate")
        expected = unit.cycles(rows, n, transpose)
        model = instruction_cost(resolved_of(inst, [0] * 16), cfg).cycles
        if cycles != expected or model != expected:
            wrong.append(f"{inst}: {cycles} busy cycles, expected {expected}, cycle model {model}")
    tb.save_records(bench.args().get("record"))
    assert not wrong, "\n".join(wrong)


# --- off chip ----------------------------------------------------------------------------------------------------

KINDS = ("load", "load_t", "store", "store_t", "gather")


def offchip_case(rng, cfg, kind: str):
    """A random legal off-chip instruction of `kind`: (instruction, registers, {space: (address, uint16 words)}
    to place in the state (GATHER's indices)). A LOAD's or GATHER's rows keep their words at the same offsets within
    the beat in the buffer as in HBM or the host (hw/resolved.misaligned_transfer): their strides differ by, and
    GATHER's are, multiples of the beat, and the off-chip base is moved to the buffer base's offset."""
    P, B, G = cfg.vector_width, cfg.beat_words, cfg.hbm_interleave_words
    x_space = Space.HBM if rng.random() < 0.65 else Space.HOST
    x_words = HBM_WORDS if x_space == Space.HBM else HOST_WORDS
    buf_space = Space.WBUF if kind in ("load", "load_t") and rng.random() < 0.4 else Space.ABUF
    capacity = {Space.ABUF: cfg.abuf_words, Space.WBUF: cfg.wbuf_words}[buf_space]
    word_jobs = kind == "store_t"
    while True:
        rows = pick(rng, [1, 1, 2, 3, P - 1, P, P + 1, 2 * P + 3, rng.integers(1, 3 * P + 1)])
        n = pick(rng, [1, B - 1, B, B + 1, 2 * B + 3, G - 1, G + 1, 2 * G + 5, rng.integers(1, 3 * G + 1)])
        if rows * n > (200 if word_jobs else 1500):
            continue
        if kind == "load":
            s1, sd = stride_for(rng, n, overlap=True), stride_for(rng, n, overlap=False)
            sd += (s1 - sd) % B
            x_extent, b_extent = extent(rows, n, s1), extent(rows, n, sd)
        elif kind == "load_t":
            s1, sd = stride_for(rng, n, overlap=True), stride_for(rng, rows, overlap=rows <= P)
            x_extent, b_extent = extent(rows, n, s1), extent(n, rows, sd)
        elif kind == "store":
            s1, sd = stride_for(rng, n, overlap=True), stride_for(rng, n, overlap=True)
            x_extent, b_extent = extent(rows, n, sd), extent(rows, n, s1)
        elif kind == "store_t":
            s1, sd = stride_for(rng, n, overlap=True), stride_for(rng, rows, overlap=True)
            x_extent, b_extent = extent(n, rows, sd), extent(rows, n, s1)
        else:
            x_space, x_words = Space.HBM, HBM_WORDS
            s1, sd = B * int(rng.integers(1, -(-(2 * n + 1) // B) + 1)), stride_for(rng, n, overlap=False)
            sd += -sd % B
            x_extent, b_extent = n, extent(rows, n, sd)
        if x_extent + B > x_words:
            continue
        if kind == "gather":
            index_space = Space.HOST if rng.random() < 0.5 else Space.ABUF
            sizes = {"dst": b_extent, **({"src2": rows} if index_space == Space.ABUF else {})}
            bases = place(rng, sizes, capacity)
            if index_space == Space.HOST:
                bases and bases.update(src2=int(rng.integers(0, HOST_WORDS - rows + 1)))
        else:
            bases = place(rng, {"buf": b_extent}, capacity)
        if bases is not None:
            break
    x_base = int(rng.integers(0, x_words - x_extent - B + 1))
    if kind in ("load", "gather"):
        x_base += (bases["dst" if kind == "gather" else "buf"] - x_base) % B
    regs = new_regs()

    def operand(space, address):
        return Operand(space, *register_relative(rng, regs, address))
    dims = {"rows": Dim(*register_relative(rng, regs, rows, imm_bits=28)),
            "n": Dim(*register_relative(rng, regs, n, imm_bits=28))}
    placed = {}
    if kind == "gather":
        table_rows = (HBM_WORDS - x_base - n) // s1 + 1
        indices = rng.integers(0, min(table_rows, 1 << 16), rows).astype(np.uint16)
        placed[index_space] = (bases["src2"], indices)
        inst = Instruction.make(Opcode.GATHER, dst=operand(Space.ABUF, bases["dst"]), src1=operand(Space.HBM, x_base),
                                src2=operand(index_space, bases["src2"]), **dims, dst_stride=sd, src1_stride=s1)
    elif kind.startswith("load"):
        inst = Instruction.make(Opcode.LOAD, dst=operand(buf_space, bases["buf"]), src1=operand(x_space, x_base),
                                **dims, dst_stride=sd, src1_stride=s1, flags=Flags(transpose=int(kind == "load_t")))
    else:
        inst = Instruction.make(Opcode.STORE, dst=operand(x_space, x_base), src1=operand(Space.ABUF, bases["buf"]),
                                **dims, dst_stride=sd, src1_stride=s1, flags=Flags(transpose=int(word_jobs)))
    return inst, finish_regs(rng, regs), placed


def state_with(rng, cfg, placed: dict) -> dict:
    state = full_state(rng, cfg)
    for space, (address, words) in placed.items():
        state[space][address:address + len(words)] = words
    return state


@cocotb.test()
async def offchip_bit_exact(dut):
    """Random off-chip LOAD, STORE and GATHER (`offchip` instructions, every kind in turn) under AXI pauses."""
    args = bench.args()
    tb = DmaTB(dut)
    await tb.start()
    rng = np.random.default_rng(args["seed"] + 1)
    for index in range(args.get("offchip", 0)):
        kind = KINDS[index % len(KINDS)]
        inst, regs, placed = offchip_case(rng, tb.cfg, kind)
        await tb.check_dma(inst, regs, state_with(rng, tb.cfg, placed), label=f"#{index} {kind}")
    cocotb.log.info("%d off-chip instructions bit-exact (AXI pause probability %.2f)", args.get("offchip", 0),
                    tb.pause_probability)


@cocotb.test()
async def offchip_errors(dut):
    """Each error code of an off-chip word, and BUS from addresses outside an AxiRam (the simulator faults
    there too): the right code, nothing written (BUS: nothing outside the destination block), done within the
    bound, and the unit working after."""
    tb = DmaTB(dut)
    await tb.start()
    rng = np.random.default_rng(17)
    cfg = tb.cfg
    hbm, host = (lambda address: Operand(Space.HBM, 0, address)), (lambda address: Operand(Space.HOST, 0, address))
    B = cfg.beat_words
    load = Instruction.make(Opcode.LOAD, dst=abuf(64), src1=hbm(64 + 4 * B), rows=Dim(0, 3), n=Dim(0, 40),
                            dst_stride=50 - B, src1_stride=50)
    store = Instruction.make(Opcode.STORE, dst=host(30), src1=abuf(8), rows=Dim(0, 2), n=Dim(0, 20), dst_stride=24,
                             src1_stride=20)
    gather = Instruction.make(Opcode.GATHER, dst=abuf(256), src1=hbm(0), src2=abuf(16), rows=Dim(0, 2), n=Dim(0, 9),
                              dst_stride=2 * B, src1_stride=B)
    word, sword, gword = load.encode(), store.encode(), gather.encode()
    refused = [
        ("GATHER +transpose", gather, set_field(gword, "flags.transpose", 1), ErrorCode.RESERVED),
        ("STORE with src2", store, set_field(sword, "src2.space", Space.ABUF.value), ErrorCode.RESERVED),
        ("STORE from WBUF", store, set_field(sword, "src1.space", Space.WBUF.value), ErrorCode.BAD_SPACE),
        ("STORE to ABUF", store, set_field(sword, "dst.space", Space.ABUF.value), ErrorCode.BAD_SPACE),
        ("GATHER from HOST", gather, set_field(gword, "src1.space", Space.HOST.value), ErrorCode.BAD_SPACE),
        ("GATHER indices in WBUF", gather, set_field(gword, "src2.space", Space.WBUF.value), ErrorCode.BAD_SPACE),
        ("LOAD into HOST", load, set_field(word, "dst.space", Space.HOST.value), ErrorCode.BAD_SPACE),
        ("STORE rows 0: a no-op", decode(set_field(sword, "rows.imm", 0)), None, ErrorCode.NONE),
        ("GATHER n 0: a no-op", decode(set_field(gword, "n.imm", 0)), None, ErrorCode.NONE),
        # 96 words before the end (a multiple of the beat, 8 or 32 words): the block's 140 words run past it
        ("LOAD past HBM", load, set_field(word, "src1.offset", cfg.hbm_words - 96), ErrorCode.OUT_OF_RANGE),
        ("STORE past 2**32", store, set_field(sword, "dst.offset", (1 << 32) - 30), ErrorCode.OUT_OF_RANGE),
        ("GATHER past ABUF", gather, set_field(gword, "dst.offset", cfg.abuf_words - 2 * B), ErrorCode.OUT_OF_RANGE),
        ("LOAD off the beat", load, set_field(word, "dst.offset", 65), ErrorCode.MISALIGNED),
        ("LOAD strides off the beat", load, set_field(word, "dst_stride", 51), ErrorCode.MISALIGNED),
        ("GATHER table stride off the beat", gather, set_field(gword, "src1_stride", B + 1), ErrorCode.MISALIGNED),
        ("GATHER rows off the beat", gather, set_field(gword, "dst_stride", 2 * B + 1), ErrorCode.MISALIGNED),
        ("GATHER off the beat", gather, set_field(gword, "dst.offset", 257), ErrorCode.MISALIGNED),
        ("GATHER indices past ABUF", gather, set_field(gword, "src2.offset", cfg.abuf_words - 1),
         ErrorCode.OUT_OF_RANGE),
    ]
    for label, inst, bad_word, code in refused:
        state = full_state(rng, cfg)
        if code is ErrorCode.MISALIGNED:     # the simulator refuses it too
            assert tb.golden(state, decode(bad_word), [0] * 16) is None, label
        await tb.check_dma(inst, [0] * 16, state, label=label, word=bad_word, error=code)

    # a table row past the config's HBM (index 0xFFFF at stride 2**19): OUT_OF_RANGE before any read
    far = Instruction.make(Opcode.GATHER, dst=abuf(256), src1=hbm(cfg.hbm_words - 4096), src2=abuf(16),
                           rows=Dim(0, 2), n=Dim(0, 9), dst_stride=2 * B, src1_stride=1 << 19)
    state = state_with(rng, cfg, {Space.ABUF: (16, np.array([0xFFFF, 0], np.uint16))})
    assert tb.golden(state, far, [0] * 16) is None
    await tb.check_dma(far, [0] * 16, state, label="table row past HBM", error=ErrorCode.OUT_OF_RANGE)

    # BUS: addresses inside the config's HBM / 2**32 but past the AxiRams (the simulator faults: past its map)
    outside = HBM_WORDS + 64
    bus = [
        ("LOAD past the HBM AxiRams", load._replace(src1=hbm(HBM_WORDS - 6 * B)), {Space.ABUF: (64, 64 + 140)}),
        ("transposed LOAD past them", load._replace(src1=hbm(outside), flags=Flags(transpose=1), dst_stride=3),
         {Space.ABUF: (64, 64 + 140)}),
        ("LOAD past the host AxiRam", load._replace(src1=host(HOST_WORDS - 3 * B)), {Space.ABUF: (64, 64 + 140)}),
        ("STORE past the host AxiRam", store._replace(dst=host(HOST_WORDS - 30)), {Space.HOST: (HOST_WORDS - 30,
                                                                                               HOST_WORDS)}),
        ("STORE past the HBM AxiRams", store._replace(dst=hbm(HBM_WORDS - 10)), {Space.HBM: (HBM_WORDS - 10,
                                                                                             HBM_WORDS)}),
        ("transposed STORE past them", store._replace(dst=hbm(HBM_WORDS - 30), flags=Flags(transpose=1)),
         {Space.HBM: (HBM_WORDS - 30, HBM_WORDS)}),
        ("GATHER row past the AxiRams", gather, {Space.ABUF: (256, 256 + 18)}),
        ("GATHER indices past the host AxiRam", gather._replace(src2=host(HOST_WORDS - 1)), {Space.ABUF: (256, 274)}),
    ]
    for label, inst, may_write in bus:
        indices = np.array([3, (outside + 10) // B], np.uint16)
        state = state_with(rng, cfg, {Space.ABUF: (16, indices)})
        assert tb.golden(state, inst, [0] * 16) is None, label
        await tb.check_dma(inst, [0] * 16, state, label=label, error=ErrorCode.BUS, may_write=may_write)
    for kind in KINDS:
        inst, regs, placed = offchip_case(rng, cfg, kind)
        await tb.check_dma(inst, regs, state_with(rng, cfg, placed), label=f"after errors: {kind}")


@cocotb.test()
async def offchip_full_rate(dut):
    """Long sequential LOADs from HBM move one beat per cycle on every port, and a STORE one beat per cycle in all
    (the engines' one ABUF read): their busy cycles are exactly `DMAUnit.transfer_cycles` (no AXI pauses, issue at
    full rate), whose transfer term is the beats of the busiest port (of all ports for the STORE), and their words
    per cycle after the fixed cycles at least 90% of that rate. One instruction of every other kind is compared
    with the estimate too (reported, not asserted)."""
    tb = DmaTB(dut)
    tb.issue_probability = 1.0
    tb.pause_probability = 0.0
    await tb.start()
    cfg, unit = tb.cfg, tb.top.unit
    rng = np.random.default_rng(3)
    lines, wrong = [], []
    sequential = [Instruction.make(Opcode.LOAD, dst=Operand(space, 0, 0), src1=Operand(Space.HBM, 0, 512),
                                   rows=Dim(0, 1), n=Dim(0, words))
                  for words, space in ((cfg.abuf_words, Space.ABUF), (cfg.wbuf_words, Space.WBUF))]
    sequential.append(Instruction.make(Opcode.STORE, dst=Operand(Space.HBM, 0, 1024), src1=abuf(0), rows=Dim(0, 1),
                                       n=Dim(0, cfg.abuf_words)))
    for inst in sequential:
        words = inst.n.imm
        cycles = await tb.check_dma(inst, [0] * 16, full_state(rng, cfg), label="sequential")
        estimate = tb.estimate(inst, [0] * 16, None)
        ports_rate = unit.beat_words * (1 if inst.opcode is Opcode.STORE else cfg.hbm_channels)
        fixed = estimate - words // ports_rate
        rate = words / (cycles - fixed)
        lines.append(f"{inst}: {cycles} busy cycles, estimate {estimate}; {rate:.1f} words per cycle after the "
                     f"fixed {fixed} (ports: {ports_rate})")
        if cycles != estimate or rate < 0.9 * ports_rate:
            wrong.append(lines[-1])
    for kind in KINDS:
        inst, regs, placed = offchip_case(rng, cfg, kind)
        state = state_with(rng, cfg, placed)
        cycles = await tb.check_dma(inst, regs, state, label=f"estimate {kind}")
        lines.append(f"{inst}: {cycles} busy cycles, estimate {tb.estimate(inst, regs, state)}")
    cocotb.log.info("\n".join(lines))
    assert not wrong, "\n".join(wrong)


@cocotb.test()
async def contended_bit_exact(dut):
    """On-chip LOADs (straight and transposed) and every off-chip kind while other readers take ABUF's memories in
    half the cycles (the harness's `contend` port, urgent: ahead of the on-chip reads, GATHER's ABUF indices and
    the STOREs' beats): bit-exact, and the on-chip copies waited."""
    args = bench.args()
    tb = DmaTB(dut)
    await tb.start()
    rng = np.random.default_rng(args["seed"] + 2)
    cases = [(*dma_case(rng, tb.cfg, transpose=bool(index % 2)), random_state(rng, tb.cfg))
             for index in range(max(4, args["instructions"] // 5))]
    await tb.check_contended(cases)
    for index in range(max(len(KINDS), args.get("offchip", 0) // 5)):
        kind = KINDS[index % len(KINDS)]
        inst, regs, placed = offchip_case(rng, tb.cfg, kind)
        await tb.check_dma(inst, regs, state_with(rng, tb.cfg, placed), label=f"contended #{index} {kind}")

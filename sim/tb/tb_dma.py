"""cocotb testbench of the on-chip DMA in the single-instruction harness (Datapath("dma")): random
LOADs from ABUF into ABUF or WBUF, straight and transposed, with rows and n of 1, port-width edges and
non-multiples, source strides (zero and overlapping rows included), overlapping destination rows where
the unit defines their order, register-relative operands and dimensions (R0 holding garbage that must
read as 0), and in-place copies. Every word of ABUF and WBUF is compared with the functional simulator
after each instruction. Bad words (each error code, HBM/HOST operands among them) must raise the right
code, write nothing and complete; the busy cycles at full rate are exactly `OnChipDMA.cycles`."""
import cocotb
import numpy as np

from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import Dim, Flags, Instruction, Opcode, Operand, Space
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.cocotb_support.datapath import (DatapathTB, finish_regs, new_regs, random_state, register_relative,
                                                 resolved_of)
from ringgpt.sim.cycle_model import instruction_cost
from ringgpt.sim.tb.tb_matrix import extent, pick, place, set_field, stride_for


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
    args = bench.args()
    tb = DatapathTB(dut)
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
    """Each error code: the right one, nothing written, done within the bound; HBM and HOST operands
    (LOAD from HBM/HOST, STORE, GATHER) answer OFF_CHIP until the core's DMA engine exists."""
    tb = DatapathTB(dut)
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
            ("src1 in HBM", inst, regs, set_field(word, "src1.space", Space.HBM.value), ErrorCode.OFF_CHIP),
            ("src1 in HOST", inst, regs, set_field(word, "src1.space", Space.HOST.value), ErrorCode.OFF_CHIP),
            ("rows 0", inst, regs, set_field(set_field(word, "rows.reg", 0), "rows.imm", 0), ErrorCode.ZERO_DIM),
            ("n 0", inst, regs, set_field(set_field(word, "n.reg", 0), "n.imm", 0), ErrorCode.ZERO_DIM),
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
    store = Instruction.make(Opcode.STORE, dst=Operand(Space.HBM, 0, 0), src1=abuf(0), rows=Dim(0, 1), n=Dim(0, 4))
    cases.append(("STORE", store, [0] * 16, store.encode(), ErrorCode.OFF_CHIP))
    gather = Instruction.make(Opcode.GATHER, dst=abuf(0), src1=Operand(Space.HBM, 0, 0), src2=abuf(64),
                              rows=Dim(0, 2), n=Dim(0, 4))
    cases.append(("GATHER", gather, [0] * 16, gather.encode(), ErrorCode.OFF_CHIP))
    vadd = Instruction.make(Opcode.VADD, dst=abuf(0), src1=abuf(0), src2=abuf(0), rows=Dim(0, 1), n=Dim(0, 4))
    cases.append(("VADD to the DMA", vadd, [0] * 16, vadd.encode(), ErrorCode.WRONG_UNIT))
    cases.append(("no such opcode", vadd, [0] * 16, set_field(0, "opcode", 0x3F), ErrorCode.WRONG_UNIT))
    for label, inst, regs, word, code in cases:
        await tb.check_instruction(inst, regs, random_state(rng, cfg), label=label, word=word, error=code)
    inst, regs = dma_case(rng, cfg, transpose=True)
    await tb.check_instruction(inst, regs, random_state(rng, cfg), label="after errors")


@cocotb.test()
async def full_rate(dut):
    """Busy cycles exactly `OnChipDMA.cycles` (= the cycle model's instruction_cost) with the issue
    stream at full rate: straight copies one chunk per cycle, transposed copies through the tile."""
    tb = DatapathTB(dut)
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
        inst = Instruction.make(Opcode.LOAD, dst=Operand(dst_space, 0, 1024 if dst_space == Space.ABUF else 0),
                                src1=abuf(0), rows=Dim(0, rows), n=Dim(0, n), dst_stride=sd, src1_stride=n,
                                flags=Flags(transpose=int(transpose)))
        cycles = await tb.check_instruction(inst, [0] * 16, random_state(rng, cfg), label="full rate")
        expected = unit.cycles(rows, n, transpose)
        model = instruction_cost(resolved_of(inst, [0] * 16), cfg).cycles
        if cycles != expected or model != expected:
            wrong.append(f"{inst}: {cycles} busy cycles, expected {expected}, cycle model {model}")
    tb.save_records(bench.args().get("record"))
    assert not wrong, "\n".join(wrong)

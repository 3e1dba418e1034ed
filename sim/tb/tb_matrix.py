"""cocotb testbench of the matrix unit in the single-instruction harness (Datapath("matrix")):
random MATMUL (with and without FP32 bias, with and without GELU, FP16 or INT8 weights with their column
scales; weights, bias and scales in WBUF, as the ISA requires) and MASKED_QK instructions: dimensions 1, lane and
tile edges and non-multiples, strides (zero and overlapping source rows included), register-relative operands and
dimensions (R0 holding garbage that must read as 0), operand data with NaN, Inf, signed zeros and subnormals. Every word of
ABUF and WBUF is compared with the functional simulator after each instruction. Bad instruction
words must raise the right error code, write nothing and complete."""
import cocotb
import numpy as np

from ringgpt.hw import banks
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import Dim, Flags, Instruction, Opcode, Operand, Space, decode, weight_words
from ringgpt.sim.cocotb_support import bench
from ringgpt.sim.cocotb_support.cases import extent, pick, place, set_field, stride_for
from ringgpt.sim.cycle_model.stalls import matrix_stall_cycles
from ringgpt.sim.cocotb_support.datapath import (DatapathTB, finish_regs, fp16_data, new_regs, random_state,
                                                 register_relative, resolved_of)


def matrix_case(rng, cfg, op: Opcode, int8: bool = False):
    """A random legal MATMUL (with `int8`: INT8 weights, their bias and column scales) or MASKED_QK:
    (instruction, registers)."""
    W, L, align = cfg.mac_width, cfg.mpu_lanes, cfg.weight_align
    up = lambda value: -(-value // align) * align        # noqa: E731
    T = 2 * W if int8 else W                             # weights a tile
    while True:
        rows = pick(rng, [1, 1, 2, 3, 4, 5, 6, 7, 9])
        n = pick(rng, [1, L - 1, L, L + 1, 2 * L, 3 * L + 1, 5 * L - 1, rng.integers(1, 4 * L + 1)]) or 1
        k = pick(rng, [1, T - 1, T, T + 1, 2 * T, 3 * T - 1, rng.integers(1, 5 * T + 1)]) or 1
        s1 = stride_for(rng, k, overlap=True)
        s2 = up(stride_for(rng, weight_words(k, int8), overlap=True))   # on weight_align boundaries
        sd = stride_for(rng, n, overlap=False)
        if int8:                                         # INT8: the activations too
            s1 = up(s1)
        abuf = {"src1": extent(rows, k, s1) + (align - 1 if int8 else 0), "dst": extent(rows, n, sd)}
        # the aligned blocks have room to round their bases up
        wbuf = {"src2": extent(n, weight_words(k, int8), s2) + align - 1}
        aux_space, sa = Space.NONE, 0
        if op == Opcode.MASKED_QK:
            aux_space, sa = Space.ABUF, int(rng.integers(1, 4))
            abuf["aux"] = extent(rows, 1, sa)
        elif int8:                              # the bias, and the column scales aux_stride after it
            aux_space, sa = Space.WBUF, pick(rng, [n, n + int(rng.integers(1, 9)), rng.integers(0, n + 1)])
            wbuf["aux"] = extent(2, n, sa)
        elif rng.random() < 0.6:                # the bias: a weight, in WBUF
            aux_space = Space.WBUF
            wbuf["aux"] = n
        a_bases, w_bases = place(rng, abuf, cfg.abuf_words), place(rng, wbuf, cfg.wbuf_words)
        if a_bases is not None and w_bases is not None:
            break
    bases = {**a_bases, **w_bases}
    bases["src2"] = up(bases["src2"])
    if int8:
        bases["src1"] = up(bases["src1"])
    regs = new_regs()
    spaces = {"dst": Space.ABUF, "src1": Space.ABUF, "src2": Space.WBUF, "aux": aux_space}

    def operand(name):
        if spaces[name] == Space.NONE:
            return Operand()
        reg, offset = register_relative(rng, regs, bases[name])
        return Operand(spaces[name], reg, offset)

    def dim(value):
        return Dim(*register_relative(rng, regs, value, imm_bits=28))
    fields = dict(dst=operand("dst"), src1=operand("src1"), src2=operand("src2"), rows=dim(rows), n=dim(n), k=dim(k),
                  dst_stride=sd, src1_stride=s1, src2_stride=s2)
    if op == Opcode.MASKED_QK:
        fields.update(aux=operand("aux"), pos=dim(int(rng.integers(0, n + 2))), aux_stride=sa)
    else:
        fields.update(aux=operand("aux"), flags=Flags(gelu=int(rng.random() < 0.4), int8=int(int8)))
        if int8:
            fields.update(aux_stride=sa)
    return Instruction.make(op, **fields), finish_regs(rng, regs)


async def run_random(dut, count: int, seed: int):
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(seed)
    cfg = tb.cfg
    for index in range(count):
        op = Opcode.MATMUL if index % 3 else Opcode.MASKED_QK
        inst, regs = matrix_case(rng, cfg, op, int8=index % 3 == 2)
        state = random_state(rng, cfg)
        if index % 4 == 0:    # no specials: every output finite, the rounding paths exercised
            state = {space: fp16_data(rng, len(words), specials=0.0) for space, words in state.items()}
        await tb.check_instruction(inst, regs, state, label=f"#{index}")
    tb.save_records(bench.args().get("record"))


@cocotb.test()
async def random_instructions_bit_exact(dut):
    args = bench.args()
    await run_random(dut, args["instructions"], args["seed"])


@cocotb.test()
async def bad_instructions_raise_errors(dut):
    """Reserved bits, unused fields, wrong unit, bad spaces, zero dimensions, WBUF weights off weight_align
    boundaries, blocks past a buffer or past 2**32: the right code, nothing written, done within the bound."""
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(11)
    cfg = tb.cfg
    cases = []
    for op in (Opcode.MATMUL, Opcode.MASKED_QK):
        inst, regs = matrix_case(rng, cfg, op)
        word = inst.encode()
        cases += [
            ("reserved bit", inst, regs, set_field(word, "reserved", 1 << int(rng.integers(90))), ErrorCode.RESERVED),
            ("flags.reserved", inst, regs, set_field(word, "flags.reserved", 4), ErrorCode.RESERVED),
            ("unused field rd", inst, regs, set_field(word, "rd", 3), ErrorCode.RESERVED),
            ("src1 in WBUF", inst, regs, set_field(word, "src1.space", Space.WBUF.value), ErrorCode.BAD_SPACE),
            ("dst in HBM", inst, regs, set_field(word, "dst.space", Space.HBM.value), ErrorCode.BAD_SPACE),
            ("weights in ABUF", inst, regs, set_field(word, "src2.space", Space.ABUF.value), ErrorCode.BAD_SPACE),
            ("rows 0: a no-op", decode(set_field(set_field(word, "rows.reg", 0), "rows.imm", 0)), regs, None,
             ErrorCode.NONE),
            ("k 0", inst, regs, set_field(set_field(word, "k.reg", 0), "k.imm", 0), ErrorCode.ZERO_DIM),
            ("dst past ABUF", inst, regs, set_field(set_field(word, "dst.reg", 0), "dst.offset", cfg.abuf_words),
             ErrorCode.OUT_OF_RANGE),
            ("src1 past 2**32", inst, regs, set_field(set_field(word, "src1.reg", 0), "src1.offset", (1 << 32) - 2),
             ErrorCode.OUT_OF_RANGE),
        ]
    cases.append(("gelu on MASKED_QK", inst, regs, set_field(inst.encode(), "flags.gelu", 1), ErrorCode.RESERVED))
    matmul, regs = matrix_case(rng, cfg, Opcode.MATMUL)
    word = set_field(matmul.encode(), "aux.space", Space.WBUF.value)
    cases += [("aux_stride without the int8 flag", matmul, regs, set_field(word, "aux_stride", 8), ErrorCode.RESERVED),
              ("INT8 weights without their scales (aux NONE)", matmul, regs,
               set_field(set_field(matmul.encode(), "flags.int8", 1), "aux.space", Space.NONE.value),
               ErrorCode.BAD_SPACE),
              ("INT8 on MASKED_QK", inst, regs, set_field(inst.encode(), "flags.int8", 1), ErrorCode.RESERVED)]
    # weights off weight_align boundaries: their start (through R3 = 1), or their column stride
    align = cfg.weight_align
    aligned = dict(dst=Operand(Space.ABUF, 0, 0), src1=Operand(Space.ABUF, 0, 512), src2=Operand(Space.WBUF, 0, 0),
                   rows=Dim(0, 2), n=Dim(0, 3), k=Dim(0, align), dst_stride=3, src1_stride=align, src2_stride=align)
    r3 = [0, 0, 0, 1] + [0] * 12
    for label, change in (("weights start off a tile boundary", {"src2": Operand(Space.WBUF, 3, 2 * align)}),
                          ("weights step off a tile boundary", {"src2_stride": align + align // 2}),
                          ("weights start and step off", {"src2": Operand(Space.WBUF, 3, 1024),
                                                          "src2_stride": 2 * align - 1})):
        misaligned = Instruction.make(Opcode.MATMUL, **{**aligned, **change})
        cases.append((label, misaligned, r3, misaligned.encode(), ErrorCode.MISALIGNED))
    # INT8: the activations on weight_align boundaries too; the scales' row inside WBUF
    int8 = {**aligned, "aux": Operand(Space.WBUF, 0, 4 * align), "aux_stride": 3, "flags": Flags(int8=1)}
    for label, change, code in (
            ("INT8 activations start off a tile boundary", {"src1": Operand(Space.ABUF, 3, 512)}, ErrorCode.MISALIGNED),
            ("INT8 activations step off a tile boundary", {"src1_stride": align + 1}, ErrorCode.MISALIGNED),
            ("INT8 scales past WBUF (the bias inside)", {"aux": Operand(Space.WBUF, 0, cfg.wbuf_words - 3)},
             ErrorCode.OUT_OF_RANGE)):
        bad = Instruction.make(Opcode.MATMUL, **{**int8, **change})
        cases.append((label, bad, r3, bad.encode(), code))
    vadd = Instruction.make(Opcode.VADD, dst=Operand(Space.ABUF), src1=Operand(Space.ABUF), src2=Operand(Space.ABUF),
                            rows=Dim(0, 1), n=Dim(0, 4))
    cases.append(("VADD to the matrix unit", vadd, [0] * 16, vadd.encode(), ErrorCode.WRONG_UNIT))
    cases.append(("no such opcode", vadd, [0] * 16, set_field(0, "opcode", 0x3F), ErrorCode.WRONG_UNIT))
    for label, inst, regs, word, code in cases:
        await tb.check_instruction(inst, regs, random_state(rng, cfg), label=label, word=word, error=code)
    # the unit still works afterwards
    inst, regs = matrix_case(rng, cfg, Opcode.MATMUL)
    await tb.check_instruction(inst, regs, random_state(rng, cfg), label="after errors")


@cocotb.test()
async def full_rate(dut):
    """Enough (row, column group) pairs for the accumulator loop: one beat per cycle, the busy
    cycles exactly overhead + issue + the tiles' stalls + latency (+ the row max for MASKED_QK); the
    stalls are the cycle model's (none for weight rows a whole number of chunks apart, as the alignment rule
    makes them), and by hand where a pair's bias shares a memory with a weight tile of each of its beats (one a
    pair; none where one of its beats leaves the bias's memory free), a row maximum written in a cycle with
    results (one: ABUF's one unit write), or weight columns share a memory. (x, alone in ABUF's tile port, never stalls: the weights and the bias are in WBUF.)"""
    tb = DatapathTB(dut)
    tb.issue_probability = 1.0        # the full-rate case: valid never low
    await tb.start()
    unit = tb.top.unit
    cfg = tb.cfg
    rng = np.random.default_rng(5)
    W, L = cfg.mac_width, cfg.mpu_lanes
    period = banks.period(cfg.buffer_chunk_words, cfg.buffer_banks)
    wbuf = lambda address: Operand(Space.WBUF, 0, address)      # noqa: E731
    abuf = lambda address: Operand(Space.ABUF, 0, address)      # noqa: E731
    for op, rows, n, k, extra, stalls in (
            (Opcode.MATMUL, 1, 5 * L, 3 * W, {}, 0),
            # columns of 2 * W + 1 words 3 * W apart: three tiles, the last one word
            (Opcode.MATMUL, 6, L, 2 * W + 1, {"src2": wbuf(512), "src2_stride": 3 * W}, None),
            # 6 pairs, one beat each: row r's maximum comes row_max_latency after the results of its last pair,
            # 2r + 1, in the cycle of a later pair's results while that is below 6, and ABUF takes one unit write a
            # cycle, so each such maximum waits a cycle (sim-small, latency 2: rows 0 and 1, in pairs 3's and 5's
            # cycles; u280, latency 4: row 0, in pair 5's)
            (Opcode.MASKED_QK, 3, 2 * L, W, {}, sum(2 * r + 1 + unit.row_max_latency < 6 for r in range(3))),
            (Opcode.MATMUL, 1, 9 * L - 1, 1, {"src2_stride": W}, 0),
            (Opcode.MATMUL, 2, 7 * L, 2 * W, {}, 0),
            # the bias after 7 * L columns of 2 * W words, on a whole period (stalls counted by the model only)
            (Opcode.MATMUL, 2, 7 * L, 2 * W, {"aux": wbuf(period * -(-7 * L * 2 * W // period))}, None),
            (Opcode.MATMUL, 1, L, W, {"aux": wbuf(period)}, 1),
            # columns 2 * W apart, the bias where lane L would read its first tile: read with that tile, no stall
            (Opcode.MATMUL, 1, L, 2 * W, {"src2_stride": 2 * W, "aux": wbuf(2 * W * L)}, 0),
            # 3 weight columns a period apart: 3 cycles a beat
            (Opcode.MATMUL, 1, 3, W, {"src2_stride": period}, 2),
            # INT8 weights: 2 x W a beat (one buffer row a lane), the x tile two aligned rows; the bias and the
            # column scales each read in a beat that leaves its memory free (stalls counted by the model only)
            (Opcode.MATMUL, 1, 5 * L, 4 * W, {"src2_stride": 2 * W, "aux": wbuf(5 * L * 2 * W), "aux_stride": 5 * L,
                                              "flags": Flags(int8=1)}, None),
            (Opcode.MATMUL, 2, 3 * L, 2 * W + 3, {"src2_stride": 2 * W, "src1_stride": 3 * W,
                                                  "aux": wbuf(3 * L * 2 * W + 1), "aux_stride": 3 * L + 2,
                                                  "flags": Flags(int8=1, gelu=1)}, None)):
        fields = dict(dst=abuf(0), src1=abuf(1024), src2=wbuf(0), rows=Dim(0, rows), n=Dim(0, n), k=Dim(0, k),
                      dst_stride=n, src1_stride=k, src2_stride=k)
        if op == Opcode.MASKED_QK:
            fields.update(aux=abuf(900), aux_stride=1, pos=Dim(0, 2))
        fields.update(extra)
        inst = Instruction.make(op, **fields)
        modeled = matrix_stall_cycles(resolved_of(inst, [0] * 16), cfg)
        assert stalls is None or modeled == stalls, f"{inst}: the model counts {modeled} stalls, by hand {stalls}"
        cycles = await tb.check_instruction(inst, [0] * 16, random_state(rng, cfg), label="full rate")
        pairs, tiles = rows * -(-n // L), -(-weight_words(k, inst.flags.int8) // W)
        issue = pairs * tiles if pairs >= unit.loop_latency else (tiles - 1) * unit.loop_latency + pairs
        latency = unit.int8_latency if inst.flags.int8 else unit.latency
        expected = unit.overhead + issue + modeled + latency + (unit.row_max_latency if op == Opcode.MASKED_QK else 0)
        assert cycles == expected, f"{inst}: {cycles} busy cycles, expected {expected} ({issue} issue, {modeled} stalls)"
    tb.save_records(bench.args().get("record"))


@cocotb.test()
async def contended_instructions_bit_exact(dut):
    """Random MATMULs and MASKED_QKs while other readers take ABUF's memories in half the cycles (the harness's
    `contend` port, as the vector unit and the DMA do in the core): bit-exact, and the unit waited."""
    args = bench.args()
    tb = DatapathTB(dut)
    await tb.start()
    rng = np.random.default_rng(args["seed"] + 1)
    cases = [(*matrix_case(rng, tb.cfg, Opcode.MATMUL if index % 2 else Opcode.MASKED_QK, int8=index % 4 == 3),
              random_state(rng, tb.cfg))
             for index in range(max(4, args["instructions"] // 10))]
    await tb.check_contended(cases)

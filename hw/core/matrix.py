"""The matrix unit: MATMUL (FP32 bias, fused GELU; FP16 or INT8 weights) and MASKED_QK (causal mask, row max into
aux).

    ABUF x tile (mac_width words) ──broadcast──┬─▶ MacTreeCore lane 0 ─▶ TileAccumulator ─┐
    WBUF weight tiles (lanes x mac_width)      ├─▶ MacTreeCore lane 1 ─▶ TileAccumulator ─┤
                                               └─▶ ...                                   │
    INT8: x tiles (2 x mac_width) ─▶ Int8AlignerCore ─▶ Int8LaneCore lane l (its row's     │
          2 x mac_width INT8 weights) ─▶ the lane's TileAccumulator                       │
      ┌──────────────────────────────────────────────────────────────────────────────────┘
      └─▶ (INT8: x column scale, FP32Fp16MulCore) + bias (FP16 -> FP32 exact, FP32 add) ─▶ ToFP16 ─▶ GELU?
          ─▶ mask? ─▶ ABUF dst (lanes words)
                   └─▶ MaxTree ─▶ row max ─▶ ABUF aux

Order of work. Output element (r, j) is the sum over the k tiles of mac_width products. The unit
walks *pairs* (row r, column group g of mpu_lanes columns), row-major, in *sets* of at least
`loop_latency` pairs (the tile accumulator's adder loop): for each tile t, one beat per pair of the
set; so consecutive tiles of one sum are at least loop_latency beats apart and the accumulator never
stalls. A set holds loop_latency pairs, or all remaining pairs when fewer than 2 * loop_latency
remain (so `contexts` = 2 * loop_latency - 1). Each beat uses one x tile (broadcast to all lanes; read
only when its address differs from the previous beat's, else the tile port's kept rows serve it again:
consecutive pairs of one row share it) and reads one weight tile per lane (mpu_lanes x mac_width words from
WBUF, where the ISA puts every weight: the layers' weights, attention's keys and V^T), both zero-padded past k.
A pair's mpu_lanes bias words (in WBUF too) are read in the first of its beats whose weight tiles leave the
bias's memory free, else in its last (sim/cycle_model/stalls._bias_tiles), kept for the pair's context until its last
beat, and wait with the pair's row and group in a FIFO for its sums. All of a beat's reads are the lanes of the
two buffers' TileReadPorts (`abuf_tiles`: x; `wbuf_tiles`: weights, bias), one read port per buffer memory.

INT8 weights (the int8 flag, numerics.int8_tile_sums): a lane's weight tile is the same buffer row, 2 x mac_width
INT8 weights (low byte first), so a sum takes half the tiles; its activations are two aligned x tiles (the ISA puts
src1 on weight_align boundaries), aligned once for every lane by one Int8AlignerCore, and each lane keeps an
Int8LaneCore (products, integer tree, rounding) beside its MAC tree, the accumulator taking one or the other. A
pair's column scales (aux + aux_stride + g * mpu_lanes) are read as its bias is, wait with it, and multiply its
sums (FP32Fp16MulCore) while the bias is widened, so the scale costs no cycle: `int8_latency` is `latency` plus
the INT8 tile's depth over the MAC tree's (sim-small +1, u280 +3).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.banks import memory_of
from ringgpt.hw.intmath import log2
from ringgpt.hw import numerics as nx
from ringgpt.hw.arith.accumulator import TileAccumulator
from ringgpt.hw.arith.common import FP16, delay
from ringgpt.hw.arith.fp16_mul import FP16MulCore
from ringgpt.hw.arith.fp32_add import FP32AddCore
from ringgpt.hw.arith.fp32_mul import FP32Fp16MulCore
from ringgpt.hw.arith.int8_tile import Int8AlignerCore, Int8LaneCore
from ringgpt.hw.arith.mac_tree import MacTreeCore
from ringgpt.hw.arith.max_tree import MaxTreeCore, order_key
from ringgpt.hw.arith.special import SpecialFunctionCore
from ringgpt.hw.arith.to_fp16 import ToFP16Core
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Opcode, Space, Unit, opcodes_of

from .timing import READ_LATENCY, MatrixTiming
from .interfaces import (ADDRESS_BITS, Completion, ErrorCode, Frozen, IssueLayout, SharedWritePort, TileReadPort,
                         accept_states, block_fits, check_instruction, done_state, error_code, pipe, reported,
                         resolve, run_or_refuse, weight_words_of)

FP16_ONE = 0x3C00
FP16_NEG_ZERO = 0x8000
FP16_MIN_KEY = 0xFFFF
"""The smallest pattern in max's total order (-NaN with every payload bit set): fills unused lanes."""



class MatrixUnit(MatrixTiming, wiring.Component):
    """Matrix unit of `cfg`: `mpu_lanes` lanes of `mac_width`-wide MAC trees.

    Computes MATMUL (numerics.matmul: exact products, block-aligned sum per mac_width tile, tiles
    accumulated in order, + FP32 bias, one rounding, GELU by table; INT8 weights: int8_tile_sums per tile of
    2 x mac_width, the sum times the column's FP16 scale in FP32 before the bias) and MASKED_QK (the same product,
    -Inf where j > pos + r, each row's total-order maximum written to aux[r * aux_stride]).

    Throughput: one beat per cycle = mpu_lanes x mac_width MACs; an instruction issues
    rows * ceil(n / mpu_lanes) * ceil(weight_words(k) / mac_width) beats (when that many pairs (row, column group)
    >= loop_latency; fewer pairs wait for the accumulator loop: tiles * loop_latency).
    A beat's weight tiles, x tile and (in one of a pair's beats) bias are the lanes of the buffers' TileReadPorts
    (one read port per buffer memory); when they need c > 1 cycles (banks.tile_read_cycles, the slower buffer)
    the whole unit is frozen for c - 1 cycles, the read data held (interfaces.Frozen), and longer while the
    buffer's other readers (the vector unit, the DMA, the router) hold the memories it needs. Latency: `latency`
    cycles from a beat's issue to its result's write (read, MAC tree, accumulator, bias register, FP16 widen,
    add, FP16, GELU; `int8_latency` with INT8 weights); `row_max_latency` more for the row maximum. The results
    and the row maxima are SharedWritePorts in ABUF's write group (one write port per memory): a refused write
    freezes the unit too, and a MASKED_QK's maximum meeting results of the same cycle in one memory costs a cycle.
    Busy cycles (`Completion.cycles`) = `overhead` + beats + stalls + `latency` or `int8_latency` (+
    `row_max_latency` for MASKED_QK), the stalls (alone on the buffers) as sim/cycle_model.matrix_stall_cycles
    counts them.

    Ports: `issue` (stream of IssueLayout), `status` (Completion), and the buffer ports in
    `buffer_ports` (name -> (space, signature)).
    """

    opcodes = opcodes_of(Unit.MATRIX)

    def __init__(self, cfg: ArchConfig):
        if cfg.mac_width < 2:
            raise ValueError(f"the matrix unit needs mac_width >= 2, got {cfg.mac_width}")
        MatrixTiming.__init__(self, cfg)
        L, W = self.lanes, self.width
        # after the weight lanes in WBUF's port (isa: weights, bias and INT8 column scales in WBUF)
        self.bias_lane, self.scale_lane = L, L + 1
        # x: one tile at any address; with INT8 weights INT8_TILE_ROWS, the others on weight_align boundaries
        X = nx.INT8_TILE_ROWS
        ports = {"abuf_tiles": (Space.ABUF, TileReadPort(X, W, (W,) * X, aligned=(False,) + (True,) * (X - 1))),
                 "wbuf_tiles": (Space.WBUF, TileReadPort(L + 2, W, (W,) * L + (L, L),
                                                         aligned=(True,) * L + (False, False)))}
        ports["abuf_dst"] = (Space.ABUF, SharedWritePort(L))
        ports["abuf_aux"] = (Space.ABUF, SharedWritePort(1))
        self.buffer_ports = ports
        wiring.Component.__init__(self, {"issue": In(stream.Signature(IssueLayout)), "status": Out(Completion()),
                          **{name: Out(sig) for name, (space, sig) in ports.items()}})

    def elaborate(self, platform):
        m = Module()        # the read ports' holding registers and the stall count: never frozen
        frozen = Frozen(m, self.issue, {"abuf": self.abuf_tiles, "wbuf": self.wbuf_tiles},
                        {"dst": self.abuf_dst, "aux": self.abuf_aux})
        core = frozen.core  # everything else: frozen while a beat's tiles take more than one cycle
        tile_data = {Space.ABUF: frozen.data["abuf"], Space.WBUF: frozen.data["wbuf"]}
        requests = {Space.ABUF: frozen.request["abuf"], Space.WBUF: frozen.request["wbuf"]}
        x_data, weights = tile_data[Space.ABUF][0], tile_data[Space.WBUF]
        stalls = frozen.stalls
        cfg, L, W = self.cfg, self.lanes, self.width
        lw, ll = log2(W), log2(L)
        X, T = nx.INT8_TILE_ROWS, nx.INT8_TILE_ROWS * W        # an INT8 tile: X x tiles, T weights
        lt = log2(T)

        held = Signal(IssueLayout)
        r = resolve(core, held)
        inst = held.inst
        dst, src1, src2 = (r[o][1] for o in ("dst", "src1", "src2"))
        s_aux, aux = r["aux"]
        rows, n, k, pos = r["rows"], r["n"], r["k"], r["pos"]
        qk = inst.opcode == Opcode.MASKED_QK
        gelu, int8 = inst.flags.gelu, inst.flags.int8
        has_bias = ~qk & (s_aux != Space.NONE)

        # --- checks -------------------------------------------------------------------------
        def in_abuf(base, nrows, cols, stride):
            return block_fits(base, nrows, cols, stride, cfg.abuf_words)

        def in_wbuf(base, nrows, cols, stride):
            return block_fits(base, nrows, cols, stride, cfg.wbuf_words)
        checks = check_instruction(core, inst, self.opcodes)   # the spaces the ISA allows: x, dst, row max in ABUF
        column_words = weight_words_of(k, int8)
        # the bias row, and with INT8 weights their column scales' row aux_stride after it
        aux_fits = Mux(int8, in_wbuf(aux, 2, n, r["aux_stride"]), Mux(has_bias, in_wbuf(aux, 1, n, 0), 1))
        in_range = (in_abuf(src1, rows, k, r["src1_stride"]) & in_wbuf(src2, n, column_words, r["src2_stride"])
                    & in_abuf(dst, rows, n, r["dst_stride"])
                    & Mux(qk, in_abuf(aux, rows, 1, r["aux_stride"]), aux_fits))
        # weights on weight_align boundaries: each lane's tile is one row of its buffer's memories (an aligned lane);
        # with INT8 weights the activations too (a beat's 2 x mac_width are two aligned x lanes)
        la = log2(cfg.weight_align)
        misaligned = ((src2[:la] != 0) | (r["src2_stride"][:la] != 0)
                      | (int8 & ((src1[:la] != 0) | (r["src1_stride"][:la] != 0))))
        code = error_code(core, checks, empty=(rows == 0) | (n == 0), zero_dim=k == 0, misaligned=misaligned,
                          out_of_range=~in_range)

        # --- control --------------------------------------------------------------------------
        groups = Signal(32)
        tiles = Signal(32)
        pairs = Signal(64)
        error = Signal(ErrorCode)
        cycles = Signal(32)
        issued_all = Signal()
        written = Signal(64)
        maxes = Signal(32)
        core.d.comb += [self.status.error.eq(reported(error)), self.status.cycles.eq(cycles + 1 + stalls)]

        # issue iteration state
        set_r, set_g, cur_r, cur_g = (Signal(32, name=nm) for nm in ("set_r", "set_g", "cur_r", "cur_g"))
        remaining = Signal(64)
        t = Signal(32)
        slot = Signal(range(2 * self.loop_latency))
        size = Signal(range(2 * self.loop_latency))
        core.d.comb += size.eq(Mux(remaining < 2 * self.loop_latency, remaining, self.loop_latency))
        round_len = Mux(size > self.loop_latency, size, self.loop_latency)
        running = Signal()
        issuing = Signal()
        core.d.comb += issuing.eq(running & (slot < size))
        wrap_g = cur_g + 1 == groups
        nxt_r = Mux(issuing & wrap_g, cur_r + 1, cur_r)
        nxt_g = Mux(issuing, Mux(wrap_g, 0, cur_g + 1), cur_g)
        end_round = running & (slot == round_len - 1)
        last_tile = t == tiles - 1

        with core.FSM():
            accept_states(core, self, held, cycles)
            with core.State("CHECK"):
                core.d.sync += [cycles.eq(cycles + 1), error.eq(code),
                             groups.eq((n + L - 1) >> ll),
                             tiles.eq(Mux(int8, (k + T - 1) >> lt, (k + W - 1) >> lw)),
                             pairs.eq(rows * ((n + L - 1) >> ll)), remaining.eq(rows * ((n + L - 1) >> ll)),
                             set_r.eq(0), set_g.eq(0), cur_r.eq(0), cur_g.eq(0), t.eq(0), slot.eq(0),
                             written.eq(0), maxes.eq(0), issued_all.eq(0)]
                run_or_refuse(core, code, running)
            with core.State("RUN"):
                core.d.sync += cycles.eq(cycles + 1)
                core.d.sync += [cur_r.eq(nxt_r), cur_g.eq(nxt_g)]
                with core.If(running):
                    core.d.sync += slot.eq(Mux(end_round, 0, slot + 1))
                    with core.If(end_round):
                        with core.If(last_tile):
                            core.d.sync += [set_r.eq(nxt_r), set_g.eq(nxt_g), remaining.eq(remaining - size), t.eq(0)]
                            with core.If(remaining == size):
                                core.d.sync += [running.eq(0), issued_all.eq(1)]
                        with core.Else():
                            core.d.sync += [t.eq(t + 1), cur_r.eq(set_r), cur_g.eq(set_g)]
                with core.If(issued_all & (written == pairs) & (~qk | (maxes == rows))):
                    core.next = "DONE"
            done_state(core, self, running, issued_all)

        # --- beat: addresses (cycle c), operands (c + 1) ---------------------------------------
        # one beat: the lanes' weight tiles (a buffer row each: mac_width FP16 or 2 x mac_width INT8 weights), the
        # x tile (ABUF; with INT8 weights two) and, in one of a pair's beats each, its bias (aux + g * L) and with
        # INT8 weights its column scales (aux + aux_stride + g * L)
        tile_base = t << lw
        # x is read only when it differs from the previous beat's: a lane not enabled keeps its rows
        x_addr, x_last = Signal(ADDRESS_BITS, name="x_addr"), Signal(ADDRESS_BITS, name="x_last")
        x_kept, x_read = Signal(name="x_kept"), Signal(name="x_read")
        core.d.comb += [x_addr.eq(src1 + cur_r * r["src1_stride"] + Mux(int8, t << lt, tile_base)),
                        x_read.eq(issuing & ~(x_kept & (x_addr == x_last)))]
        for lane in range(X):
            core.d.comb += [requests[Space.ABUF].addr[lane].eq(x_addr + lane * W),
                            requests[Space.ABUF].en[lane].eq(x_read & (int8 if lane else 1))]
        with core.If(issuing):
            core.d.sync += [x_last.eq(x_addr), x_kept.eq(1)]
        with core.If(~running):
            core.d.sync += x_kept.eq(0)
        w_request = requests[Space.WBUF]
        for lane in range(L):
            column = cur_g * L + lane
            core.d.comb += [w_request.addr[lane].eq(src2 + column * r["src2_stride"] + tile_base),
                            w_request.en[lane].eq(issuing & (column < n))]
        # a pair's bias and column scales: each read at the first of its tiles whose weight lanes leave its first
        # memory free (lane L, one past the last, would fall in it), else at its last tile; kept for its context
        # until then
        C, P = cfg.buffer_chunk_words, cfg.buffer_banks
        free_addr = Signal(ADDRESS_BITS + 1, name="free_addr")
        core.d.comb += free_addr.eq(w_request.addr[L - 1] + r["src2_stride"])
        pair_words = {"bias": (self.bias_lane, aux, has_bias), "scale": (self.scale_lane, aux + r["aux_stride"], int8)}
        reads = {}
        for name, (lane, base, used) in pair_words.items():
            addr = Signal(ADDRESS_BITS, name=f"{name}_addr")
            core.d.comb += addr.eq(base + cur_g * L)
            free = memory_of(free_addr, C, P) == memory_of(addr, C, P)
            read_already = Signal(self.contexts, name=f"{name}_have")     # per context: its pair's words are read
            have = read_already.bit_select(slot, 1) & (t != 0)
            reads[name] = Signal(name=f"read_{name}")
            core.d.comb += [reads[name].eq(issuing & used & ~have & (free | last_tile)),
                            w_request.addr[lane].eq(addr), w_request.en[lane].eq(reads[name])]
            with core.If(issuing):
                core.d.sync += read_already.bit_select(slot, 1).eq(have | reads[name])
        beat_layout = data.StructLayout({"valid": 1, "t": 32, "ctx": range(self.contexts), "first": 1, "last": 1,
                                         "bias": 1, "scale": 1, "r": 32, "g": 32})
        beat = Signal(beat_layout)
        core.d.comb += [beat.valid.eq(issuing), beat.t.eq(t), beat.ctx.eq(slot), beat.first.eq(t == 0),
                        beat.last.eq(last_tile), beat.bias.eq(reads["bias"]), beat.scale.eq(reads["scale"]),
                        beat.r.eq(cur_r), beat.g.eq(cur_g)]
        beat1 = pipe(core, beat, 1, name="beat1")

        # a pair's row, column group, bias and scales wait for its sums
        meta_layout = data.StructLayout({"r": 32, "g": 32, "bias": data.ArrayLayout(16, L),
                                         "scale": data.ArrayLayout(16, L)})
        core.submodules.meta = meta = fifo.SyncFIFO(width=meta_layout.size,
                                                    depth=2 + READ_LATENCY + self.int8_tree_latency + self.latency)
        pair_values = []
        for name, (lane, _, _) in pair_words.items():
            read = weights[lane].as_value()[:16 * L]
            kept_value = 0
            for c in range(self.contexts):
                kept = Signal(16 * L, name=f"{name}_ctx{c}")
                with core.If(beat1.valid & beat1[name] & (beat1.ctx == c)):
                    core.d.sync += kept.eq(read)
                kept_value = Mux(beat1.ctx == c, kept, kept_value)
            pair_values.append(Mux(beat1[name], read, kept_value))
        core.d.comb += [meta.w_en.eq(beat1.valid & beat1.last), meta.w_data.eq(Cat(beat1.r, beat1.g, *pair_values))]

        # FP16 weights: a MAC tree a lane. INT8 weights (numerics.int8_tile_sums): the beat's 2 x W activations
        # aligned once (Int8AlignerCore), then a lane's products with its row's 2 x W weights (low byte first)
        in_k = [((beat1.t << lw) + i) < k for i in range(W)]
        in_k8 = [((beat1.t << lt) + i) < k for i in range(T)]
        x_tiles = [tile_data[Space.ABUF][i // W][i % W] for i in range(T)]
        aligner = core.submodules.int8_aligner = Int8AlignerCore(T)
        core.d.comb += [aligner.i[i].eq(Mux(in_k8[i], x_tiles[i], 0)) for i in range(T)]
        tag16 = pipe(core, beat1, self.tree_latency, name="tag")
        tag8 = pipe(core, beat1, self.int8_tree_latency, name="tag8")
        tag = Signal(beat_layout, name="tag_sums")
        core.d.comb += tag.eq(Mux(int8, tag8, tag16))
        accs = []
        for lane in range(L):
            tree = core.submodules[f"tree{lane}"] = MacTreeCore(W)
            for i in range(W):
                core.d.comb += [tree.i.x[i].eq(Mux(in_k[i], x_data[i], 0)),
                             tree.i.w[i].eq(Mux(in_k[i], weights[lane][i], 0))]
            lane8 = core.submodules[f"int8_lane{lane}"] = Int8LaneCore(T)
            row = weights[lane].as_value()
            core.d.comb += [lane8.i.a.eq(aligner.o.a), lane8.i.cls.eq(aligner.o.cls), lane8.i.emax.eq(aligner.o.emax)]
            core.d.comb += [lane8.i.q[i].eq(delay(core, Mux(in_k8[i], row[8 * i:8 * i + 8], 0), aligner.latency,
                                                  name=f"q{lane}_{i}")) for i in range(T)]
            acc = core.submodules[f"acc{lane}"] = TileAccumulator(self.contexts)
            accs.append(acc)
            core.d.comb += [acc.i.valid.eq(tag.valid), acc.i.payload.data.eq(Mux(int8, lane8.o, tree.o)),
                            acc.i.payload.ctx.eq(tag.ctx), acc.i.payload.first.eq(tag.first),
                            acc.i.payload.last.eq(tag.last), acc.o.ready.eq(1)]

        # --- output: bias, FP16, GELU, mask, write; row max ---------------------------------------
        out_valid = accs[0].o.valid
        core.d.comb += meta.r_en.eq(out_valid)
        pair = data.View(meta_layout, meta.r_data)
        bias = pipe(core, pair.bias, READ_LATENCY, name="bias")    # in step with the sums, as when it was read here
        # INT8: sum x column scale (FP32Fp16MulCore) while the bias is widened; the product meets it at the adder
        scale_wait = READ_LATENCY + FP16MulCore.latency - FP32Fp16MulCore.latency
        assert scale_wait >= 0
        # a result carries whether its instruction is a MASKED_QK and whether it ends its row: the row maximum's
        # tree is row_max_latency behind the write, and a MATMUL is done at its last write, so its last groups'
        # maxima still leave the tree when the next instruction is already held (at u280, 4 cycles: a MASKED_QK
        # taken next wrote the MATMUL's row maximum as its own and counted it)
        tag = Signal(data.StructLayout({"valid": 1, "r": 32, "g": 32, "qk": 1, "last": 1}))
        core.d.comb += [tag.valid.eq(out_valid), tag.r.eq(pair.r), tag.g.eq(pair.g), tag.qk.eq(qk),
                        tag.last.eq(pair.g == groups - 1)]
        tag1 = pipe(core, tag, 1, name="out1")
        results = []
        for lane in range(L):
            sums = delay(core, accs[lane].o.payload.data, READ_LATENCY + FP16MulCore.latency, name=f"sum{lane}")
            scaled = core.submodules[f"scale{lane}"] = FP32Fp16MulCore()
            core.d.comb += [scaled.i.a.eq(accs[lane].o.payload.data), scaled.i.s.eq(pair.scale[lane])]
            product = delay(core, scaled.o, scale_wait, name=f"product{lane}")
            mul = core.submodules[f"bias{lane}"] = FP16MulCore()
            core.d.comb += [mul.i.a.eq(Mux(has_bias, bias[lane], FP16_NEG_ZERO)), mul.i.b.eq(FP16_ONE)]
            add = core.submodules[f"add{lane}"] = FP32AddCore()
            core.d.comb += [add.i.a.eq(Mux(int8, product, sums)), add.i.b.eq(mul.o)]
            conv = core.submodules[f"fp16_{lane}"] = ToFP16Core()
            core.d.comb += conv.i.eq(add.o)
            act = core.submodules[f"gelu{lane}"] = SpecialFunctionCore("gelu")
            core.d.comb += act.i.eq(conv.o)
            plain = delay(core, conv.o, act.latency, name=f"plain{lane}")
            results.append(Mux(gelu, Value.cast(act.o), Value.cast(plain)))
        fin = pipe(core, tag1, self.post_latency - READ_LATENCY, name="fin")
        col0 = fin.g * L
        outs = Signal(data.ArrayLayout(16, L))
        lane_ok = Signal(L)
        for lane in range(L):
            masked = qk & ((col0 + lane) > (pos + fin.r))
            core.d.comb += [outs[lane].eq(Mux(masked, nx.FP16_NEG_INF, results[lane])),
                         lane_ok[lane].eq((col0 + lane) < n)]
        write = frozen.write["dst"]
        core.d.comb += [write.addr.eq(dst + fin.r * r["dst_stride"] + col0), write.data.eq(outs),
                        write.mask.eq(lane_ok), write.en.eq(fin.valid)]
        with core.If(fin.valid):
            core.d.sync += written.eq(written + 1)

        # row max over the lanes (unused lanes hold the order's minimum), then over the row's groups
        padded = [Mux(lane_ok[lane], outs[lane], FP16_MIN_KEY) for lane in range(L)]
        if L >= 2:
            tree = core.submodules.row_max = MaxTreeCore(L)
            core.d.comb += [tree.i[lane].eq(padded[lane]) for lane in range(L)]
            group_max, tree_latency = tree.o.as_value(), tree.latency
        else:
            group_max, tree_latency = padded[0], 0
        mtag = pipe(core, fin, tree_latency, name="mtag")
        best = Signal(16)
        group_max_fp16 = data.View(FP16, group_max)
        best_fp16 = data.View(FP16, best)
        newer = order_key(core, group_max_fp16, name="max_new") > order_key(core, best_fp16, name="max_best")
        row_max = Signal(16)
        core.d.comb += row_max.eq(Mux((mtag.g == 0) | newer, group_max, best))
        row_end = mtag.valid & mtag.last & mtag.qk
        with core.If(mtag.valid):
            core.d.sync += best.eq(row_max)
        write = frozen.write["aux"]
        core.d.comb += [write.addr.eq(aux + mtag.r * r["aux_stride"]), write.data[0].eq(row_max),
                        write.mask.eq(1), write.en.eq(row_end)]
        with core.If(row_end):
            core.d.sync += maxes.eq(maxes + 1)
        frozen.wrap()
        return m

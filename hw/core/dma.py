"""The DMA unit: LOAD, STORE and GATHER between HBM, the host buffer and ABUF/WBUF, the only owner of the
core's AXI4 masters (one per HBM pseudo-channel, one for the host buffer).

    on chip  ABUF src (P = vector_width words per read)
               ├─▶ straight:   chunk ─▶ write register ─▶ ABUF/WBUF dst (P words per cycle)
               └─▶ transposed: P source rows ─▶ P x P tile ─▶ one column per cycle ─▶ write register ─▶ dst
    off chip job generator ── row jobs (X words [lo, hi), buffer address = X word + delta) ──▶
               PortEngine hbm00 .. hbm{C-1}, host: each takes the part of a job that lies in its memory (hw/hbm.py),
               as INCR bursts of up to 256 beats that stay in a 4 KiB page, up to hbm_outstanding in flight
               ├─▶ LOAD / GATHER: R beats ─▶ merged into whole rows ─▶ the engines' crossbar, a row per memory ─▶ ABUF/WBUF
               ├─▶ LOAD transposed: R beats ─▶ (one engine a cycle) ─▶ the P x P tile ─▶ columns ─▶ dst
               ├─▶ GATHER indices from HOST: R beats ─▶ index FIFO ─▶ one table-row job per index
               └─▶ STORE: one ABUF read for all engines, a beat a cycle ─▶ W beats (wstrb for partial beats); B counted
    The engines share one write port per buffer memory through one crossbar for both buffers (a row per memory,
    BankWritePorts) and the unit's one ABUF read (`abuf_src`, a SharedReadPort, which a STORE has to itself); the
    crossbar, the buffers and the store read grant first the engines that moved fewer beats than the leader.
The engines: hw/core/port_engine.py.
"""
from __future__ import annotations


from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.banks import place
from ringgpt.hw.intmath import log2
from ringgpt.hw import hbm
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Opcode, Space, Unit, opcodes_of

from .axi import AXI_ADDRESS_BITS, Axi4
from .buffers import one_hot_index, select, urgent_first
from .port_engine import JobLayout, PortEngine, Target, beat_layout
from .timing import READ_LATENCY, DMATiming
from .transpose import TransposeTile
from .interfaces import (ADDRESS_BITS, WORD, BankWritePort, Completion, ErrorCode, IssueLayout, RowWritePort,
                         SharedReadPort,
                         accept_states, block_fits, check_instruction, done_state, error_code, pipe, reported, resolve, run_or_refuse)


def to_lane0(m: Module, beat, *, name: str):
    """`beat` (beat_layout) with its words moved down by its `off`, so that its first valid word is lane 0: the one
    shift of the transpose tile's and of GATHER's index beats, which the engines hand over unshifted."""
    B = len(beat.mask)
    out = Signal(beat_layout(B), name=name)
    m.d.comb += [out.addr.eq(beat.addr), out.data.eq(beat.data.as_value() >> (beat.off * WORD)),
                 out.mask.eq(beat.mask >> beat.off)]
    return out


class DMAUnit(DMATiming, wiring.Component):
    """The DMA unit of `cfg`: LOAD, STORE and GATHER exactly as the functional simulator's `_copy` and
    `_gather` (docs/isa.md, "DMA unit"); docs/rtl-core.md describes how it works and what it costs.

    Outside ports: `hbm0` .. `hbm{C-1}` (C = hbm_channels) and `host`, AXI4 masters of hbm_port_bits; `hbm_base`
    (a byte base per channel, hw/hbm.py's word map) and `host_base`, multiples of the beat. Buffer ports:
    `abuf_src` (the unit's one ABUF read: on-chip copies' chunks, GATHER's indices, the engines' STORE beats),
    `abuf_dst`, `wbuf_dst` (on-chip copies and the transpose tile, never refused) and `engines_to_abuf`,
    `engines_to_wbuf` (the engines' rows, one per memory, through one crossbar, `_row_writes`).

    On chip: one chunk of vector_width words per cycle (`cycles`), transposed through the P x P tile. Off chip:
    one row job per cycle to the `PortEngine`s, each moving its part in bursts with hbm_outstanding in flight,
    one beat per port per cycle while the grants allow (`transfer_cycles`, from DMATiming). An off-chip LOAD's or
    GATHER's words keep their offsets within the beat (hw/resolved.misaligned_transfer), so beats go into rows
    unshifted; the transpose tile's and GATHER's index beats are shifted to lane 0 once, here (`to_lane0`).

    Errors: the checks of every unit (interfaces.check_instruction), MISALIGNED (the beat rule), OUT_OF_RANGE (a
    block past its space, or a gathered row past hbm_words while running), BUS (SLVERR/DECERR: no more bursts, the
    ones in flight finished, words already moved stay moved). Preconditions it does not check (the compiler meets
    them): a destination does not overlap its source unless exactly in place on chip; off-chip LOADs and GATHERs,
    and transposed copies of more than vector_width rows, write non-overlapping destination rows.
    """

    opcodes = opcodes_of(Unit.DMA)

    def __init__(self, cfg: ArchConfig):
        if cfg.vector_width < 2:
            raise ValueError(f"the DMA unit needs vector_width >= 2, got {cfg.vector_width}")
        DMATiming.__init__(self, cfg)
        P, B = self.width, self.beat_words
        self.ports = [hbm.hbm_port(c) for c in range(cfg.hbm_channels)] + ["host"]
        if cfg.hbm_interleave_words % B:
            raise ValueError(f"the HBM granule ({cfg.hbm_interleave_words} words) must be whole beats of {B} words")
        hbm.check_rtl_map(cfg.hbm_channels, cfg.hbm_interleave_words)
        # the on-chip writes first of each buffer's unit writers and urgent: always granted (see elaborate)
        self.read_words = max(P, B)
        """Words of the unit's one ABUF read: an on-chip copy's chunk, GATHER's index or an engine's STORE beat."""
        self.buffer_ports = {"abuf_src": (Space.ABUF, SharedReadPort(self.read_words)),
                             "abuf_dst": (Space.ABUF, RowWritePort(cfg.buffer_chunk_words)),
                             "wbuf_dst": (Space.WBUF, RowWritePort(cfg.buffer_chunk_words))}
        self.buffer_ports.update({"engines_to_abuf": (Space.ABUF, BankWritePort(cfg.buffer_chunk_words, cfg.buffer_banks)),
                                  "engines_to_wbuf": (Space.WBUF, BankWritePort(cfg.buffer_chunk_words, cfg.buffer_banks))})
        wiring.Component.__init__(self, {"issue": In(stream.Signature(IssueLayout)), "status": Out(Completion()),
                          **{name: Out(sig) for name, (space, sig) in self.buffer_ports.items()},
                          **{port: Out(Axi4(cfg.hbm_port_bits)) for port in self.ports},
                          "hbm_base": In(data.ArrayLayout(AXI_ADDRESS_BITS, cfg.hbm_channels)),
                          "host_base": In(AXI_ADDRESS_BITS)})

    # --- the unit ------------------------------------------------------------------------------------------------
    def _store_reads(self, m: Module, engines: list) -> tuple:
        """The engines' STORE beats through the unit's one ABUF read (`abuf_src`, which a STORE has to itself): each
        cycle the first engine asking, those behind the leader (`urgent`) first, is passed to the buffer, and its
        `ready` is the buffer's grant; the words go to every engine, and the one granted takes them (READ_LATENCY
        after). One 17:1 row pick for all engines instead of one each; STOREs move one beat per cycle in all
        (`transfer_cycles`). Returns the request: (asking, address, urgent)."""
        reads = [engine.from_abuf for engine in engines]
        port, B = self.abuf_src, self.beat_words
        asks, urgent = Signal(len(reads)), Signal(len(reads))
        m.d.comb += [asks.eq(Cat(read.en for read in reads)), urgent.eq(Cat(read.urgent for read in reads))]
        chosen = urgent_first(m, asks, urgent, name="store")
        addr = 0
        for k, read in enumerate(reads):
            addr = addr | Mux(chosen[k], read.addr, 0)
            m.d.comb += [read.ready.eq(chosen[k] & port.ready), read.data.eq(port.data.as_value()[:B * WORD])]
        return asks.any(), addr, (asks & urgent).any()

    def _row_writes(self, m: Module, engines: list):
        """The engines' rows through one crossbar for both buffers (`engines_to_abuf`, `engines_to_wbuf`:
        BankWritePorts with the same rows): each memory takes the row of the first engine asking for it, those
        behind the leader (`urgent`) first, into the buffer that engine writes, and the engine's `ready` is that
        buffer's grant of the memory. The buffers grant exactly as when each engine was a requester of its own
        (one memory each, in engine order); an engine writes one buffer at a time, so one choice of row among the
        engines per memory serves both buffers, where each buffer's memories chose among all the engines before."""
        P = self.cfg.buffer_banks
        into = {Target.ABUF: self.engines_to_abuf, Target.WBUF: self.engines_to_wbuf}
        n = len(engines)
        banks, rows, urgent = [], [], Signal(n)
        for k, engine in enumerate(engines):
            bank, row = Signal(range(P), name=f"e{k}_bank"), Signal(ADDRESS_BITS, name=f"e{k}_row")
            m.d.comb += [*(s.eq(v) for s, v in zip((bank, row), place(engine.rows.first, P))),
                         urgent[k].eq(engine.rows.urgent)]
            banks.append(bank)
            rows.append(row)
        grants = []
        for b in range(P):
            asks = Signal(n, name=f"b{b}_asks")
            m.d.comb += asks.eq(Cat(*(engine.rows.en & (bank == b) for engine, bank in zip(engines, banks))))
            chosen = urgent_first(m, asks, urgent, name=f"b{b}")
            index = Signal(range(max(2, n)), name=f"b{b}_index")
            m.d.comb += index.eq(one_hot_index(chosen))
            row, data, mask = (Signal(ADDRESS_BITS, name=f"b{b}_row"), Signal(len(engines[0].rows.data.as_value()),
                               name=f"b{b}_data"), Signal(len(engines[0].rows.mask), name=f"b{b}_mask"))
            m.d.comb += [row.eq(select(index, rows)), data.eq(select(index, [e.rows.data.as_value() for e in engines])),
                         mask.eq(select(index, [e.rows.mask for e in engines]))]
            granted = 0
            for target, port in into.items():       # the same row to both buffers, enabled in the target's
                m.d.comb += [port.en[b].eq((chosen & Cat(*(e.rows_target == target for e in engines))).any()),
                             port.urgent[b].eq((asks & urgent).any()),
                             port.row[b].eq(row), port.data[b].eq(data), port.mask[b].eq(mask)]
                granted = granted | (port.en[b] & port.ready[b])
            grants.append((chosen, granted))
        for k, engine in enumerate(engines):
            m.d.comb += engine.rows.ready.eq(Cat(*(chosen[k] & granted for chosen, granted in grants)).any())

    def elaborate(self, platform):
        m = Module()
        cfg, P, B = self.cfg, self.width, self.beat_words
        lp = log2(P)
        C = cfg.hbm_channels
        engines = [PortEngine(cfg, c) for c in range(C)] + [PortEngine(cfg, None)]
        hbm_engines, host_engine = engines[:C], engines[C]
        for index, (port, engine) in enumerate(zip(self.ports, engines)):
            m.submodules[f"{port}_engine"] = engine
            wiring.connect(m, engine.axi, wiring.flipped(getattr(self, port)))
            m.d.comb += engine.base.eq(self.hbm_base[index] if index < C else self.host_base)
        storing, store_addr, store_urgent = self._store_reads(m, engines)
        self._row_writes(m, engines)
        level = [engine.moved for engine in engines]       # the most any engine moved: a tree of maxima
        while len(level) > 1:
            level = [Mux(a > b, a, b) for a, b in zip(level[::2], level[1::2])] + level[len(level) // 2 * 2:]
        m.d.comb += [engine.behind.eq(engine.moved < level[0]) for engine in engines]

        held = Signal(IssueLayout)
        r = resolve(m, held)
        inst = held.inst
        (s_dst, dst), (s_src1, src1), (s_src2, src2) = r["dst"], r["src1"], r["src2"]
        rows, n = r["rows"], r["n"]
        sd, s1 = r["dst_stride"], r["src1_stride"]
        transpose = inst.flags.transpose

        # --- what the instruction is --------------------------------------------------------------------------
        is_load, is_store, is_gather = (inst.opcode == op for op in (Opcode.LOAD, Opcode.STORE, Opcode.GATHER))
        on_chip = is_load & (s_src1 == Space.ABUF)
        x_space = Mux(is_store, s_dst, s_src1)          # the off-chip operand's space
        x_hbm = x_space == Space.HBM
        tile_mode = is_load & transpose                  # on or off chip: through the tile
        word_jobs = is_store & transpose                 # one job per word
        host_indices = is_gather & (s_src2 == Space.HOST)

        # --- checks -------------------------------------------------------------------------------------------------
        checks = check_instruction(m, inst, self.opcodes)

        def fits(space, base, block_rows, block_cols, stride):
            sizes = {Space.ABUF: cfg.abuf_words, Space.WBUF: cfg.wbuf_words, Space.HBM: cfg.hbm_words,
                     Space.HOST: 1 << ADDRESS_BITS}
            result = 0
            for sp, size in sizes.items():
                result = Mux(space == sp, block_fits(base, block_rows, block_cols, stride, size), result)
            return result

        dst_rows, dst_cols = Mux(transpose, n, rows), Mux(transpose, rows, n)
        in_range = (fits(s_dst, dst, dst_rows, dst_cols, sd)
                    & Mux(is_gather, fits(s_src2, src2, 1, rows, 0), fits(s_src1, src1, rows, n, s1)))
        # the engines' rule (hw/resolved.misaligned_transfer): an HBM/host LOAD's or GATHER's words at the same
        # offsets within the beat in the buffer as in the memory
        lb = log2(B)
        off_chip_read = ((is_load & ~transpose) | is_gather) & ((s_src1 == Space.HBM) | (s_src1 == Space.HOST))
        steps = Mux(is_gather, sd, sd - s1)
        misaligned = off_chip_read & (((dst - src1)[:lb] != 0) | ((rows > 1) & (steps[:lb] != 0))
                                      | (is_gather & (s1[:lb] != 0))) if lb else 0
        code = error_code(m, checks, empty=(rows == 0) | (n == 0), out_of_range=~in_range, misaligned=misaligned)

        # --- control ----------------------------------------------------------------------------------------------------
        chunks = Signal(32)
        error = Signal(ErrorCode)
        cycles = Signal(32)
        issued_all = Signal()
        written = Signal(64)
        expected = Signal(64)
        m.d.comb += [self.status.error.eq(reported(error)), self.status.cycles.eq(cycles + 1)]
        abort = Signal()
        m.d.comb += abort.eq(error != ErrorCode.NONE)
        m.d.comb += [engine.abort.eq(abort) for engine in engines]
        bus_error = Cat(engine.bus_error for engine in engines).any()
        engines_busy = Cat(engine.busy for engine in engines).any()

        cur_r = Signal(32)      # straight: the row; transposed: the first row of the tile (r0)
        t = Signal(32)          # the column chunk
        i = Signal(range(P))    # transposed: the tile row being filled
        j = Signal(range(P))    # transposed: the tile column being drained
        phase = Signal(range(3))
        FILL, WAIT, DRAIN = 0, 1, 2
        running = Signal()
        last_chunk = t == chunks - 1
        left = rows - cur_r
        tile_rows = Signal(range(P + 1))
        m.d.comb += tile_rows.eq(Mux(left > P, P, left))
        cols_left = n - (t << lp)
        tile_cols = Signal(range(P + 1))
        m.d.comb += tile_cols.eq(Mux(cols_left > P, P, cols_left))
        straight = running & on_chip & ~transpose
        fill = running & tile_mode & (phase == FILL)
        # abuf_src shares ABUF's read ports (SharedReadPort): a step that reads it advances only when granted
        read_wanted = straight | (fill & on_chip) | (running & is_gather & ~host_indices & ~abort)
        granted = self.abuf_src.ready & ~storing
        m.d.comb += [self.abuf_src.en.eq(read_wanted | storing), self.abuf_src.urgent.eq(storing & store_urgent)]
        drain = running & tile_mode & (phase == DRAIN)
        tile_full = Signal()
        jobs_ready = Signal()
        fill_step = fill & Mux(on_chip, granted, jobs_ready)

        # the row-job generator (off-chip straight LOAD/STORE, GATHER, transposed STORE): an outer loop `u` and
        # an inner loop `v` over the off-chip address `x_addr` and the buffer address `b_addr`
        u, v = Signal(32), Signal(32)
        x_row, b_row, x_addr, b_addr = (Signal(ADDRESS_BITS, name=name) for name in ("x_row", "b_row", "x_addr", "b_addr"))
        x0, b0 = Mux(is_store, dst, src1), Mux(is_store, src1, dst)
        x_outer, b_outer = Mux(word_jobs, sd, Mux(is_store, sd, s1)), Mux(word_jobs, 1, Mux(is_store, s1, sd))
        x_inner, b_inner = 1, s1
        outer_count, inner_count = Mux(word_jobs, n, rows), Mux(word_jobs, rows, 1)
        generating = running & ~on_chip & ~tile_mode
        index_job = Signal()     # GATHER with host indices: the index read is still to be sent
        index_valid, index = Signal(), Signal(WORD)
        table_row = Signal(ADDRESS_BITS + 2 * WORD + 8)
        m.d.comb += table_row.eq(src1 + index * s1)
        table_bad = is_gather & (table_row + n > cfg.hbm_words)
        index_ok = ~is_gather | (index_valid & ~table_bad)
        emit_wanted = generating & ~index_job & index_ok & ~abort
        emit = emit_wanted & jobs_ready
        range_fault = generating & is_gather & ~index_job & index_valid & table_bad & ~abort
        done_ready = Signal()

        with m.FSM():
            accept_states(m, self, held, cycles)
            with m.State("CHECK"):
                m.d.comb += [engine.restart.eq(1) for engine in engines]
                n_chunks = (n + P - 1) >> lp
                m.d.sync += [cycles.eq(cycles + 1), error.eq(code), chunks.eq(n_chunks),
                             expected.eq(Mux(transpose, ((rows + P - 1) >> lp) * n, rows * n_chunks)),
                             cur_r.eq(0), t.eq(0), i.eq(0), j.eq(0), phase.eq(FILL), written.eq(0),
                             issued_all.eq(0), u.eq(0), v.eq(0), x_row.eq(x0), x_addr.eq(x0), b_row.eq(b0),
                             b_addr.eq(b0), index_job.eq(host_indices)]
                run_or_refuse(m, code, running)
            with m.State("RUN"):
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(straight & granted):
                    m.d.sync += t.eq(Mux(last_chunk, 0, t + 1))
                    with m.If(last_chunk):
                        m.d.sync += cur_r.eq(cur_r + 1)
                        with m.If(cur_r + 1 == rows):
                            m.d.sync += [running.eq(0), issued_all.eq(1)]
                with m.If(fill_step):
                    m.d.sync += i.eq(i + 1)
                    with m.If(i + 1 == tile_rows):
                        m.d.sync += [i.eq(0), phase.eq(WAIT)]
                with m.If(running & tile_mode & (phase == WAIT) & (on_chip | tile_full)):
                    m.d.sync += [j.eq(0), phase.eq(DRAIN)]
                with m.If(drain):
                    m.d.sync += j.eq(j + 1)
                    with m.If(j + 1 == tile_cols):
                        m.d.sync += [j.eq(0), phase.eq(FILL)]
                        with m.If(last_chunk):
                            m.d.sync += [t.eq(0), cur_r.eq(cur_r + P)]
                            with m.If(left <= P):
                                m.d.sync += [running.eq(0), issued_all.eq(1)]
                        with m.Else():
                            m.d.sync += t.eq(t + 1)
                with m.If(emit):
                    with m.If(v + 1 < inner_count):
                        m.d.sync += [v.eq(v + 1), x_addr.eq(x_addr + x_inner), b_addr.eq(b_addr + b_inner)]
                    with m.Else():
                        m.d.sync += [v.eq(0), u.eq(u + 1), x_row.eq(x_row + x_outer), b_row.eq(b_row + b_outer),
                                     x_addr.eq(x_row + x_outer), b_addr.eq(b_row + b_outer)]
                        with m.If(u + 1 == outer_count):
                            m.d.sync += [running.eq(0), issued_all.eq(1)]
                with m.If(range_fault):
                    m.d.sync += error.eq(ErrorCode.OUT_OF_RANGE)
                with m.If(bus_error & ~abort):
                    m.d.sync += error.eq(ErrorCode.BUS)
                with m.If(abort):
                    m.d.sync += [running.eq(0), issued_all.eq(1)]
                with m.If(issued_all & done_ready):
                    m.next = "DONE"
            done_state(m, self, running, issued_all)

        # --- jobs to the engines --------------------------------------------------------------------------------------
        col = t << lp
        src_row = Mux(transpose, cur_r + i, cur_r)
        tile_source = Signal(ADDRESS_BITS)       # the source row piece a fill step reads (on chip) or asks for
        m.d.comb += tile_source.eq(src1 + src_row * s1 + col)
        job = Signal(JobLayout)
        with m.If(index_job):
            m.d.comb += [job.target.eq(Target.STREAM), job.lo.eq(src2), job.hi.eq(src2 + rows)]
        with m.Elif(tile_mode):
            m.d.comb += [job.target.eq(Target.STREAM), job.lo.eq(tile_source), job.hi.eq(tile_source + tile_cols),
                         job.delta.eq((i << lp) - tile_source)]
        with m.Else():
            lo = Mux(is_gather, table_row, x_addr)
            m.d.comb += [job.write.eq(is_store), job.target.eq(Mux(s_dst == Space.WBUF, Target.WBUF, Target.ABUF)),
                         job.lo.eq(lo), job.hi.eq(lo + Mux(word_jobs, 1, n)), job.delta.eq(b_addr - lo)]
        offer_rows = (fill & ~on_chip) | emit_wanted
        to_host = running & ~abort & (index_job | (offer_rows & ~x_hbm))
        to_hbm = running & ~abort & ~index_job & offer_rows & x_hbm
        hbm_ready = Cat(engine.job.ready for engine in hbm_engines).all()
        m.d.comb += jobs_ready.eq(Mux(to_hbm, hbm_ready, host_engine.job.ready))
        for engine in hbm_engines:
            m.d.comb += [engine.job.payload.eq(job), engine.job.valid.eq(to_hbm & hbm_ready)]
        m.d.comb += [host_engine.job.payload.eq(job), host_engine.job.valid.eq(to_host)]
        with m.If(index_job & host_engine.job.ready & ~abort):
            m.d.sync += index_job.eq(0)

        # --- GATHER's indices: from ABUF (abuf_src, one per two cycles) or from the host engine's beats -----------------
        fresh = Signal()        # abuf_src.data holds the index of row u
        m.d.sync += fresh.eq(running & ~emit & granted)
        m.submodules.indices = indices = fifo.SyncFIFO(width=beat_layout(B).size, depth=2)
        head = beat_layout(B)(indices.r_data)
        lane = Signal(range(B))
        m.d.comb += [indices.w_data.eq(to_lane0(m, host_engine.beats.payload, name="index_beat")),
                     indices.w_en.eq(host_engine.beats.valid & is_gather)]
        with m.If(host_indices):
            m.d.comb += [index_valid.eq(indices.r_rdy & head.mask.bit_select(lane, 1)), index.eq(head.data[lane])]
        with m.Else():
            m.d.comb += [index_valid.eq(fresh), index.eq(self.abuf_src.data[0])]
        lane_last = (lane == B - 1) | ~(head.mask >> (lane + 1))[0]
        with m.If(~running | ~host_indices):
            m.d.comb += indices.r_en.eq(1)
        with m.Elif(emit):
            m.d.sync += lane.eq(Mux(lane_last, 0, lane + 1))
            m.d.comb += indices.r_en.eq(lane_last)

        # --- on chip: read (cycle c), data (c + 1) ------------------------------------------------------------------------
        m.d.comb += self.abuf_src.addr.eq(Mux(storing, store_addr, Mux(is_gather, src2 + u, tile_source)))
        dst_addr = Signal(32)
        m.d.comb += dst_addr.eq(dst + Mux(transpose, col + j, cur_r) * sd + Mux(transpose, cur_r, col))
        lane_mask = Signal(P)
        m.d.comb += [lane_mask[k].eq(col + k < n) for k in range(P)]
        step = Signal(data.StructLayout({"valid": 1, "fill": 1, "i": range(P), "addr": 32, "mask": P}))
        m.d.comb += [step.valid.eq(straight & granted), step.fill.eq(fill & on_chip & granted), step.i.eq(i),
                     step.addr.eq(dst_addr),
                     step.mask.eq(lane_mask)]
        step1 = pipe(m, step, READ_LATENCY, name="step1")
        got = data.View(data.ArrayLayout(WORD, P), self.abuf_src.data.as_value()[:P * WORD])

        # --- the transpose tile: rows filled from reads or engine beats, then its columns drained -----------------
        requests = [engine.beats.valid & tile_mode for engine in engines]
        grants = [req & ~Cat(*requests[:k]).any() if k else req for k, req in enumerate(requests)]
        for engine, grant in zip(engines, grants):
            m.d.comb += engine.beats.ready.eq(grant)
        m.d.comb += host_engine.beats.ready.eq(Mux(is_gather, indices.w_rdy, grants[-1]))
        offered = Signal(beat_layout(B))
        for engine, grant in zip(engines, grants):
            with m.If(grant):
                m.d.comb += offered.eq(engine.beats.payload)
        beat = to_lane0(m, offered, name="tile_beat")
        tile_write = Cat(*grants).any()
        tile_row, tile_col = beat.addr[lp:2 * lp], beat.addr[:lp]
        placed_mask = Signal(P)
        m.d.comb += placed_mask.eq((Cat(beat.mask, Const(0, P)) << tile_col)[:P])
        filled = Signal(range(P * P + 1))
        filled_next = Signal(range(P * P + B + 1))
        m.d.comb += [filled_next.eq(filled + Mux(tile_write, sum(placed_mask[k] for k in range(P)), 0)),
                     tile_full.eq(filled_next == tile_rows * tile_cols)]
        m.d.sync += filled.eq(Mux(drain | ~running, 0, filled_next))
        m.submodules.tile = tile = TransposeTile(P)
        with m.If(step1.fill):          # a source row read on chip: all P words
            m.d.comb += [tile.write_en.eq(1), tile.write_row.eq(step1.i), tile.write_data.eq(got),
                         tile.write_mask.eq(-1)]
        with m.Else():                  # an engine's beat: its words from column tile_col on
            m.d.comb += [tile.write_en.eq(tile_write), tile.write_row.eq(tile_row), tile.write_col.eq(tile_col),
                         tile.write_data.eq(Cat(beat.data.as_value(), Const(0, P * WORD))[:P * WORD]),
                         tile.write_mask.eq(Cat(beat.mask, Const(0, P))[:P])]
        m.d.comb += tile.read_col.eq(j)
        tile_mask = Signal(P)
        m.d.comb += [tile_mask[row].eq(row < tile_rows) for row in range(P)]

        # --- write register -> ABUF or WBUF (one registered enable per buffer) ---------------------------------------
        wreg = Signal(data.StructLayout({"abuf": 1, "wbuf": 1, "addr": 32, "mask": P,
                                         "data": data.ArrayLayout(WORD, P)}))
        to_wbuf = s_dst == Space.WBUF
        m.d.sync += [wreg.abuf.eq(0), wreg.wbuf.eq(0)]
        with m.If((step1.valid | drain) & ~abort):
            m.d.sync += [wreg.abuf.eq(~to_wbuf), wreg.wbuf.eq(to_wbuf)]
        with m.If(step1.valid):
            m.d.sync += [wreg.addr.eq(step1.addr), wreg.mask.eq(step1.mask), wreg.data.eq(got)]
        with m.Elif(drain):
            m.d.sync += [wreg.addr.eq(dst_addr), wreg.mask.eq(tile_mask)]
            m.d.sync += wreg.data.eq(tile.read_data)
        # as two rows of the buffers' chunks: the first of its group and urgent, so granted every cycle (its
        # engines, the rest of the group, are idle during on-chip copies); `ready` is not needed
        lc = log2(cfg.buffer_chunk_words)
        offset = wreg.addr[:lc]
        for port, enable in ((self.abuf_dst, wreg.abuf), (self.wbuf_dst, wreg.wbuf)):
            m.d.comb += [port.first.eq(wreg.addr >> lc), port.data.eq(wreg.data.as_value() << (offset * WORD)),
                         port.mask.eq(wreg.mask << offset), port.en.eq(enable), port.urgent.eq(1)]
        with m.If(wreg.abuf | wreg.wbuf):
            m.d.sync += written.eq(written + 1)

        quiet = ~engines_busy & ~wreg.abuf & ~wreg.wbuf & ~step1.valid & ~step1.fill
        m.d.comb += done_ready.eq(quiet & ((written == expected) | ~(on_chip | tile_mode) | abort))
        return m


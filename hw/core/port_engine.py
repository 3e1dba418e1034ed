"""The DMA unit's AXI4 port engines (hw/core/dma.py): one per HBM pseudo-channel and one for the host buffer, each
moving its memory's part of the unit's row jobs in bursts (`PortEngine`), with the job and beat layouts the unit
and the engines share."""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.intmath import log2
from ringgpt.hw import hbm
from ringgpt.hw.config import ArchConfig

from .axi import AXI_ADDRESS_BITS, AXI_MAX_BURST, AXI_PAGE_BYTES, Axi4
from .timing import PortTiming
from .interfaces import ADDRESS_BITS, WORD, RowWritePort, SharedReadPort


INCR = 1
"""AxBURST of an incrementing burst."""


class Target(enum.Enum, shape=2):
    """Where an engine puts the words it reads."""
    ABUF = 0
    WBUF = 1
    STREAM = 2
    """Its `beats` stream: the transpose tile, or the GATHER index FIFO."""


JobLayout = data.StructLayout({"write": 1, "target": Target, "lo": ADDRESS_BITS + 1, "hi": ADDRESS_BITS + 1,
                               "delta": ADDRESS_BITS})
"""A row job: move the words [lo, hi) of the engine's memory (HBM or host word addresses) from (write = 0) or
to (write = 1) the buffer words at X word + delta (32-bit wrap); `target` for reads."""


def beat_layout(words: int) -> data.StructLayout:
    """A beat an engine puts on its `beats` stream, as the bus gave it: the words `mask` marks are valid, the first
    at lane `off`; `addr` is that first one's target address (X word + delta)."""
    return data.StructLayout({"addr": ADDRESS_BITS, "data": data.ArrayLayout(WORD, words), "mask": words,
                              "off": range(words)})


class PortEngine(PortTiming, wiring.Component):
    """One AXI4 master of the DMA unit: HBM pseudo-channel `channel` (its words as hw/hbm.py maps them), or the
    host buffer (`channel` None: word a at byte `base` + 2a).

    Takes row jobs (`JobLayout`) from `job` (a FIFO of `job_depth`), keeps the part of each that lies in its
    memory (a contiguous range of its local words), and moves it as INCR bursts of up to AXI_MAX_BURST beats
    that never cross a 4 KiB page, up to `outstanding` bursts in flight (one AXI ID: responses in order).
    Reads: each beat's words are merged, unshifted, into whole buffer rows (`_rows`; the ISA's rule,
    hw/resolved.misaligned_transfer, puts each word at the same offset within the beat in the buffer as in the
    memory, so a beat is one of the chunk's chunk / beat slots): a row is written through `rows` (a RowWritePort
    into the buffer `rows_target` names) once the beat completes it, `data_latency` cycles after the R handshake
    when granted, and the beat waits in its register (`rready` low) until then; or the beat is offered on `beats`
    as it came (the DMA unit shifts what it takes from there, `to_lane0`). Writes: each beat's words are read
    from ABUF (`from_abuf`, a SharedReadPort: the fetch waits for its grant) at the buffer address of the beat's
    lane 0, so they arrive in their lanes, and sent with wstrb covering just the job's words. `moved` counts the beats moved since `restart`; `behind` (from the unit: fewer than the
    leader's) makes its buffer requests urgent. An SLVERR/DECERR response pulses `bus_error`. With `abort` it
    drops its queued jobs and writes nothing more, finishes the bursts in flight, and drops `busy`. Throughput: one beat per cycle, and
    one job per cycle (a job without words in this memory costs one cycle), when its buffer requests are
    granted (scripts/bank_conflicts.py counts what the grants cost). Latency: `request_cycles` from a
    job to its first request, `data_latency` from an R beat to its write, `fetch_cycles` from a write request
    to its first W beat.

    `base` must be a multiple of the beat (its low bits are ignored)."""

    job_depth = 4
    def __init__(self, cfg: ArchConfig, channel: int | None):
        self.cfg, self.channel = cfg, channel
        self.beat_words = cfg.beat_words
        self.outstanding = cfg.hbm_outstanding
        self.chunk = cfg.buffer_chunk_words
        B = self.beat_words
        super().__init__({"job": In(stream.Signature(JobLayout)), "abort": In(1), "busy": Out(1),
                          "restart": In(1), "moved": Out(ADDRESS_BITS), "behind": In(1),
                          "bus_error": Out(1), "base": In(AXI_ADDRESS_BITS), "axi": Out(Axi4(cfg.hbm_port_bits)),
                          "rows": Out(RowWritePort(self.chunk, 1)), "rows_target": Out(Target),
                          "from_abuf": Out(SharedReadPort(B)),
                          "beats": Out(stream.Signature(beat_layout(B)))})

    def _word_of(self, local):
        """The engine's memory word address of its local word `local`."""
        if self.channel is None:
            return local
        return hbm.word_of(self.channel, local, self.cfg.hbm_channels, self.cfg.hbm_interleave_words)

    def _lanes(self, m: Module, info, index, *, name: str):
        """For beat `index` of the burst `info` (first, lo, hi): (its local word address, lo_off, the lane mask of
        the job's words in it: lanes [lo_off, hi_off))."""
        B, lb = self.beat_words, log2(self.beat_words)
        local = Signal(ADDRESS_BITS + 1, name=f"{name}_local")
        m.d.comb += local.eq(info.first + (index << lb))
        lo_off, hi_off = Signal(range(B), name=f"{name}_lo_off"), Signal(range(B + 1), name=f"{name}_hi_off")
        m.d.comb += [lo_off.eq(Mux(local < info.lo, info.lo - local, 0)),
                     hi_off.eq(Mux(info.hi - local < B, info.hi - local, B))]
        mask = Signal(B, name=f"{name}_mask")
        m.d.comb += [mask[lane].eq((lane >= lo_off) & (lane < hi_off)) for lane in range(B)]
        return local, lo_off, mask

    def _rows(self, m: Module, stage, row_data, rows_taken):
        """The beat in `stage` merged into whole buffer rows, one row per grant (through `rows`, a RowWritePort of
        one chunk, into the buffer `rows_target`): its lane 0 is at a multiple of the beat within its chunk
        (`stage.addr`, by the ISA's rule), so its words fill one of the chunk's slots of a beat, unshifted; they were
        registered there (`row_data`, one register a slot, loaded at the R handshake: no multiplexer). The chunk is
        written when the beat fills it up to its last word, or when the job's words do not continue (`stage.ends`),
        and the grant takes the beat (`rows_taken`); else the words are held (their mask) and written with the next
        beat's, which a continuing job puts in the next slot. So a sequential transfer writes each chunk once, in
        one grant."""
        K, B = self.chunk, self.beat_words
        lk, lb = log2(K), log2(B)
        held = Signal(data.StructLayout({"valid": 1, "mask": K}))
        slot = stage.addr[lb:lk] if lk > lb else 0
        mask0 = Signal(K)
        m.d.comb += [mask0[i].eq(((slot == i // B) & stage.mask[i % B]) | (held.valid & held.mask[i])) for i in range(K)]
        full = ((slot == K // B - 1) & stage.mask[B - 1]) | stage.ends    # the chunk gets no more words
        write = Signal(K)
        m.d.comb += write.eq(Mux(full, mask0, 0))
        writing = stage.valid & (stage.target != Target.STREAM) & ~self.abort
        port = self.rows
        m.d.comb += [self.rows_target.eq(stage.target), port.en.eq(writing & (write != 0)),
                     port.first.eq(stage.addr >> lk), port.data.eq(row_data), port.mask.eq(write)]
        m.d.comb += rows_taken.eq((write == 0) | port.ready)
        with m.If(self.abort):
            m.d.sync += held.valid.eq(0)
        with m.Elif(writing & rows_taken):
            m.d.sync += [held.valid.eq(~full), held.mask.eq(mask0)]

    def elaborate(self, platform):
        m = Module()
        cfg, B = self.cfg, self.beat_words
        lb = log2(B)
        axi = self.axi
        beat_bytes = 2 * B
        base = Signal(AXI_ADDRESS_BITS)
        m.d.comb += base.eq(Cat(Const(0, log2(beat_bytes)), self.base[log2(beat_bytes):]))
        m.d.comb += [axi.arsize.eq(axi.signature.size_code), axi.awsize.eq(axi.signature.size_code),
                     axi.arburst.eq(INCR), axi.awburst.eq(INCR), axi.bready.eq(1)]

        # --- jobs -> the current job (its local range) ----------------------------------------------------
        m.submodules.jobs = jobs = fifo.SyncFIFO(width=JobLayout.size, depth=self.job_depth)
        m.d.comb += [jobs.w_data.eq(self.job.payload), jobs.w_en.eq(self.job.valid), self.job.ready.eq(jobs.w_rdy)]
        head = JobLayout(jobs.r_data)
        if self.channel is None:
            llo, lhi = head.lo, head.hi
        else:
            llo, lhi = hbm.local_range_of(m, self.channel, head.lo, head.hi, cfg.hbm_channels,
                                          cfg.hbm_interleave_words, name="range")
        cur = Signal(data.StructLayout({"valid": 1, "write": 1, "target": Target, "delta": ADDRESS_BITS,
                                        "lo": ADDRESS_BITS + 1, "hi": ADDRESS_BITS + 1, "next": ADDRESS_BITS + 1}))

        # --- the next burst of the current job ----------------------------------------------------------------
        beats_left = Signal(ADDRESS_BITS + 1)
        m.d.comb += beats_left.eq(((cur.hi - 1) >> lb) - (cur.next >> lb) + 1)
        address = Signal(AXI_ADDRESS_BITS)
        m.d.comb += address.eq(base + (cur.next << 1))
        page = log2(AXI_PAGE_BYTES)
        to_page = Signal(range(AXI_PAGE_BYTES // beat_bytes + 1))
        m.d.comb += to_page.eq((AXI_PAGE_BYTES - address[:page]) >> log2(beat_bytes))
        beats = Signal(range(AXI_MAX_BURST + 1))
        limit = Mux(to_page < AXI_MAX_BURST, to_page, AXI_MAX_BURST)
        m.d.comb += beats.eq(Mux(beats_left < limit, beats_left, limit))
        burst = data.StructLayout({"target": Target, "delta": ADDRESS_BITS, "lo": ADDRESS_BITS + 1,
                                   "hi": ADDRESS_BITS + 1, "first": ADDRESS_BITS + 1, "beats": range(AXI_MAX_BURST + 1)})
        m.submodules.reads = reads = fifo.SyncFIFO(width=burst.size, depth=self.outstanding)
        m.submodules.writes = writes = fifo.SyncFIFO(width=burst.size, depth=self.outstanding)
        info = Signal(burst)
        m.d.comb += [info.target.eq(cur.target), info.delta.eq(cur.delta), info.lo.eq(cur.lo), info.hi.eq(cur.hi),
                     info.first.eq(cur.next), info.beats.eq(beats)]
        m.d.comb += [reads.w_data.eq(info), writes.w_data.eq(info)]

        request = data.StructLayout({"valid": 1, "addr": AXI_ADDRESS_BITS, "len": 8})
        ar, aw = Signal(request), Signal(request)
        m.d.comb += [axi.arvalid.eq(ar.valid), axi.araddr.eq(ar.addr), axi.arlen.eq(ar.len),
                     axi.awvalid.eq(aw.valid), axi.awaddr.eq(aw.addr), axi.awlen.eq(aw.len)]
        writes_open = Signal(range(self.outstanding + 1))
        go_read = cur.valid & ~cur.write & ~self.abort & (~ar.valid | axi.arready) & reads.w_rdy
        go_write = (cur.valid & cur.write & ~self.abort & (~aw.valid | axi.awready) & writes.w_rdy
                    & (writes_open < self.outstanding))
        issue = go_read | go_write
        m.d.comb += [reads.w_en.eq(go_read), writes.w_en.eq(go_write)]
        for req, go, ready in ((ar, go_read, axi.arready), (aw, go_write, axi.awready)):
            with m.If(go):
                m.d.sync += [req.valid.eq(1), req.addr.eq(address), req.len.eq(beats - 1)]
            with m.Elif(ready):
                m.d.sync += req.valid.eq(0)
        m.d.sync += writes_open.eq(writes_open + go_write - axi.bvalid)

        with m.If(issue):
            m.d.sync += cur.next.eq(cur.next + (beats << lb))
            with m.If(beats == beats_left):
                m.d.sync += cur.valid.eq(0)
        with m.If(self.abort):
            m.d.comb += jobs.r_en.eq(1)
            m.d.sync += cur.valid.eq(0)
        with m.Elif((~cur.valid | (issue & (beats == beats_left))) & jobs.r_rdy):
            m.d.comb += jobs.r_en.eq(1)
            m.d.sync += [cur.valid.eq(llo < lhi), cur.write.eq(head.write), cur.target.eq(head.target),
                         cur.delta.eq(head.delta), cur.lo.eq(llo), cur.hi.eq(lhi),
                         cur.next.eq(llo & ~(B - 1))]

        # --- reads: R beats -> the write register -> rows of ABUF, WBUF, or `beats` --------------------------------
        rhead = burst(reads.r_data)
        r_index = Signal(8)
        r_local, r_off, r_mask = self._lanes(m, rhead, r_index, name="r")
        stage = Signal(data.StructLayout({"valid": 1, "target": Target, "addr": ADDRESS_BITS, "ends": 1,
                                          "data": data.ArrayLayout(WORD, B), "mask": B, "off": range(B)}))
        rows_taken = Signal()
        taken = Mux(stage.target == Target.STREAM, self.beats.ready, rows_taken) | self.abort
        m.d.comb += axi.rready.eq(reads.r_rdy & (~stage.valid | taken))
        r_error = axi.rresp[1]
        # the job's words continue in the next local beat, at the next buffer word, unless the job ends in this
        # beat or the beat ends an interleave granule (the channel's next granule lies elsewhere)
        ends = rhead.hi - r_local <= B
        if self.channel is not None and cfg.hbm_interleave_words > B:
            ends = ends | (r_local[lb:log2(cfg.hbm_interleave_words)] == (cfg.hbm_interleave_words // B) - 1)
        elif self.channel is not None:
            ends = Const(1)
        r_addr = Signal(ADDRESS_BITS)
        m.d.comb += r_addr.eq(self._word_of(r_local) + rhead.delta)
        K = self.chunk
        row_data = Signal(data.ArrayLayout(WORD, K))      # the beats of the row being merged, each in its slot
        with m.If(axi.rvalid & axi.rready):
            last = r_index == rhead.beats - 1
            m.d.sync += r_index.eq(Mux(last, 0, r_index + 1))
            m.d.comb += reads.r_en.eq(last)
            m.d.sync += [stage.valid.eq(~r_error & ~self.abort), stage.target.eq(rhead.target),
                         stage.addr.eq(r_addr), stage.ends.eq(ends),
                         stage.data.eq(axi.rdata), stage.mask.eq(r_mask), stage.off.eq(r_off)]
            for s in range(K // B):
                with m.If((r_addr[lb:log2(K)] == s) if K > B else 1):
                    m.d.sync += row_data.as_value()[s * B * WORD:(s + 1) * B * WORD].eq(axi.rdata)
        with m.Elif(taken):
            m.d.sync += stage.valid.eq(0)
        self._rows(m, stage, row_data, rows_taken)
        m.d.comb += [self.beats.valid.eq(stage.valid & (stage.target == Target.STREAM) & ~self.abort),
                     self.beats.payload.addr.eq(stage.addr + stage.off), self.beats.payload.data.eq(stage.data),
                     self.beats.payload.mask.eq(stage.mask), self.beats.payload.off.eq(stage.off)]

        # --- writes: ABUF words, read at the buffer address of the beat's lane 0 -> W beats; B responses ----------
        whead = burst(writes.r_data)
        w_index = Signal(8)
        w_local, _, w_mask = self._lanes(m, whead, w_index, name="w")
        m.d.comb += self.from_abuf.addr.eq(self._word_of(w_local) + whead.delta)
        w_beat = data.StructLayout({"data": B * WORD, "strb": 2 * B, "last": 1})
        w_depth = 4
        m.submodules.w_fifo = w_fifo = fifo.SyncFIFO(width=w_beat.size, depth=w_depth)
        fetched = Signal(data.StructLayout({"valid": 1, "strb": 2 * B, "last": 1}))
        m.d.comb += self.from_abuf.en.eq(writes.r_rdy & (w_fifo.level + fetched.valid < w_depth))
        fetch = self.from_abuf.en & self.from_abuf.ready
        with m.If(fetch):
            last = w_index == whead.beats - 1
            m.d.sync += w_index.eq(Mux(last, 0, w_index + 1))
            m.d.comb += writes.r_en.eq(last)
        m.d.sync += [fetched.valid.eq(fetch), fetched.last.eq(w_index == whead.beats - 1),
                     fetched.strb.eq(Cat(*[Cat(w_mask[lane], w_mask[lane]) for lane in range(B)]))]
        m.d.comb += [w_fifo.w_en.eq(fetched.valid),
                     w_fifo.w_data.eq(Cat(self.from_abuf.data.as_value(), fetched.strb, fetched.last))]
        w_out = w_beat(w_fifo.r_data)
        m.d.comb += [axi.wvalid.eq(w_fifo.r_rdy), axi.wdata.eq(w_out.data), axi.wstrb.eq(w_out.strb),
                     axi.wlast.eq(w_out.last), w_fifo.r_en.eq(axi.wready)]

        # beats moved between the buffers and this memory since `restart`: the unit marks the engines behind the
        # one that moved most `behind`, and the buffers grant those first (urgent), which keeps the engines in step
        m.d.sync += self.moved.eq(Mux(self.restart, 0, self.moved + ((stage.valid & taken) | fetch)))
        m.d.comb += [port.urgent.eq(self.behind) for port in (self.rows, self.from_abuf)]
        m.d.comb += [self.bus_error.eq((axi.rvalid & axi.rready & r_error) | (axi.bvalid & axi.bresp[1])),
                     self.busy.eq(jobs.r_rdy | cur.valid | ar.valid | aw.valid | reads.r_rdy | stage.valid
                                  | (writes_open != 0))]
        return m

"""Instruction fetch: the program's 512-bit words read ahead over a read-only AXI4 master into a FIFO.

    controller ── FetchPort: start, stop, base ──▶ Fetch ── prog (Axi4, read only) ──▶ memory
    controller ◀── words: stream of (pc, word, error) ── FIFO ◀── R beats assembled into words

The ISA has no branches, so fetch reads sequentially from pc 0 at `base` until the controller stops it.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ringgpt.hw.intmath import log2
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import INSTRUCTION_BITS, INSTRUCTION_BYTES, InstructionLayout

from .axi import AXI_ADDRESS_BITS, AXI_PAGE_BYTES, Axi4
from .interfaces import ADDRESS_BITS
from .timing import FetchTiming

PC_BITS = ADDRESS_BITS
"""An instruction's index in its program."""
AXI_INCR = 1
"""AxBURST of an incrementing burst."""

FetchedLayout = data.StructLayout({"pc": PC_BITS, "word": InstructionLayout, "error": 1})
"""One fetched word: its pc, the word and whether a beat of it came back with an AXI error (SLVERR/DECERR)."""


class FetchPort(wiring.Signature):
    """Controller -> fetch, seen from the controller: `start` (one-cycle pulse: fetch from pc 0 at `base`,
    a byte address), `stop` (one-cycle pulse: drop what was fetched, issue no more reads) and the `words`
    stream it reads from."""

    def __init__(self):
        super().__init__({"start": Out(1), "stop": Out(1), "base": Out(AXI_ADDRESS_BITS),
                          "words": In(stream.Signature(FetchedLayout))})

    def __eq__(self, other):
        return type(other) is FetchPort

    def __repr__(self):
        return "FetchPort()"



class Fetch(FetchTiming, wiring.Component):
    """Fetches the words of a program for the controller (see the module docstring).

    `depth` words of FIFO (default: hbm_latency_cycles rounded up to a power of two, enough to cover the
    read latency at one word per cycle); reads are INCR bursts of up to `burst_words` words (depth /
    FETCH_BURSTS, cut at 4 KiB pages), each `beats_per_word` = 512 / hbm_port_bits beats per word, issued
    while the FIFO has room for a whole burst, so several are in flight and the R channel is never stalled.
    A word with an SLVERR or DECERR beat is delivered with `error` set (the controller stops with BUS if it
    reaches it: words read ahead past the end of a program never fault). A `base` that is not a multiple
    of INSTRUCTION_BYTES reads nothing and delivers one word with `error` at pc 0.

    `start` may come at any time: fetch drops its FIFO, waits for the bursts still in flight (their data
    is dropped) and starts again. `stop` drops the FIFO and stops issuing reads.

    Latency: from `start` (when no burst is in flight) to the first word on `words`: 2 cycles to the AR
    request, the memory's latency, `beats_per_word` beats and 2 cycles through the FIFO. Throughput: one
    word per `beats_per_word` cycles (the port's rate) while the controller keeps up.
    """

    def __init__(self, cfg: ArchConfig, depth: int | None = None):
        FetchTiming.__init__(self, cfg, depth)
        self.axi = Axi4(cfg.hbm_port_bits, read_only=True)
        wiring.Component.__init__(self, {"control": In(FetchPort()), "prog": Out(self.axi)})

    def elaborate(self, platform):
        m = Module()
        ctl, axi = self.control, self.prog
        port_bits, beats = self.cfg.hbm_port_bits, self.beats_per_word
        page_words = AXI_PAGE_BYTES // INSTRUCTION_BYTES
        word_shift = log2(INSTRUCTION_BYTES)

        flush = Signal()
        m.d.comb += flush.eq(ctl.start | ctl.stop)
        fifo = SyncFIFOBuffered(width=INSTRUCTION_BITS + 1, depth=self.depth)
        m.submodules.fifo = ResetInserter(flush)(fifo)

        running = Signal()      # issuing reads for the current run
        discard = Signal(init=1)  # data of bursts still in flight belongs to a dropped run
        pending = Signal()      # a start waits for the bursts in flight
        fault = Signal()        # misaligned base: one error word at pc 0
        address = Signal(AXI_ADDRESS_BITS)
        credits = Signal(range(self.depth + 1))   # FIFO entries not yet promised to a burst
        in_flight = Signal(range(self.depth + 2))  # bursts accepted whose last beat has not come
        ar_valid = Signal()
        ar_addr = Signal(AXI_ADDRESS_BITS)
        ar_len = Signal(8)
        beat = Signal(range(beats))
        error_so_far = Signal()
        out_pc = Signal(PC_BITS)

        # --- read requests ---------------------------------------------------------------------------
        m.d.comb += [axi.arvalid.eq(ar_valid), axi.araddr.eq(ar_addr), axi.arlen.eq(ar_len), axi.arid.eq(0),
                     axi.arsize.eq(self.axi.size_code), axi.arburst.eq(AXI_INCR)]
        left = Signal(range(page_words + 1))
        m.d.comb += left.eq(page_words - address[word_shift:log2(AXI_PAGE_BYTES)])
        length = Signal(range(self.burst_words + 1))
        m.d.comb += length.eq(Mux(left < self.burst_words, left, self.burst_words))
        request = running & ~ar_valid & (credits >= self.burst_words)
        accepted = axi.arvalid & axi.arready
        last_beat = axi.rvalid & axi.rready & axi.rlast
        with m.If(request):
            m.d.sync += [ar_valid.eq(1), ar_addr.eq(address), ar_len.eq(length * beats - 1),
                         address.eq(address + length * INSTRUCTION_BYTES)]
        with m.Elif(accepted):
            m.d.sync += ar_valid.eq(0)
        m.d.sync += in_flight.eq(in_flight + accepted - last_beat)

        # --- data: beats into words, words into the FIFO ---------------------------------------------
        m.d.comb += axi.rready.eq(1)
        beat_error = axi.rresp[1]
        if beats == 1:
            word = axi.rdata
        else:
            gathered = Signal((beats - 1) * port_bits)
            word = Cat(gathered, axi.rdata)
        word_done = axi.rvalid & (beat == beats - 1)
        with m.If(axi.rvalid):
            if beats > 1:
                m.d.sync += gathered.eq(word[port_bits:])
            m.d.sync += [beat.eq(Mux(beat == beats - 1, 0, beat + 1)),
                         error_so_far.eq(~word_done & (error_so_far | beat_error))]
        m.d.comb += [fifo.w_data.eq(Cat(word, error_so_far | beat_error)), fifo.w_en.eq(word_done & ~discard)]

        # --- the words stream ------------------------------------------------------------------------
        words = ctl.words
        m.d.comb += [words.valid.eq(fifo.r_rdy | fault), words.payload.pc.eq(out_pc),
                     words.payload.word.eq(fifo.r_data[:INSTRUCTION_BITS]),
                     words.payload.error.eq(fifo.r_data[INSTRUCTION_BITS] | fault),
                     fifo.r_en.eq(words.ready & ~fault)]
        taken = words.valid & words.ready
        with m.If(taken):
            m.d.sync += out_pc.eq(out_pc + 1)
        m.d.sync += credits.eq(credits + (taken & ~fault) - Mux(request, length, 0))

        # --- run control (last: overrides the above) -------------------------------------------------
        with m.If(ctl.start):
            m.d.sync += [pending.eq(1), running.eq(0), discard.eq(1), fault.eq(0)]
        with m.Elif(ctl.stop):
            m.d.sync += [running.eq(0), discard.eq(1), fault.eq(0)]
        with m.Elif(pending & ~ar_valid & (in_flight == 0)):
            misaligned = ctl.base[:word_shift] != 0
            m.d.sync += [pending.eq(0), discard.eq(0), running.eq(~misaligned), fault.eq(misaligned),
                         address.eq(ctl.base), credits.eq(self.depth), out_pc.eq(0)]
        return m

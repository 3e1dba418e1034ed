"""The router unit: ALLGATHER, SEND and RECV over one AXI4-Stream link out (`tx`, to card id + 1) and one in
(`rx`, from card id - 1), the ring of docs/architecture.md.

    ABUF src (shared read, P = vector_width words)          rx ──▶ receive queue (ring_rx_buffer_bytes)
      │ own block, or a received slice read back                     │ header: checked against the instruction
      ▼                                                              ▼ payload: one P-word row chunk per beat
    transmit queue (4 beats) ──▶ tx                       write register ──▶ ABUF dst (shared write)
      (header beat, then payload beats)                     ▲ own ALLGATHER slice copy (not in place)

Link protocol. A block is a header beat, `HEADER` in the low bits of tdata (kind = the opcode that sent it,
ALLGATHER or SEND; the origin card; rows; n; k), then rows * ceil(n / P) payload beats, row by row, each
carrying words [t*P, t*P + P) of a row in lanes 0..P-1 (lane i in tdata bits [16i, 16i + 16), lanes past n
zero). tlast marks the block's last beat (the header when n = 0). Receivers frame by the header's rows and
n. Flow control is tready alone: a full receive queue holds tready low, nothing is dropped.
"""
from __future__ import annotations


from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import MAX_CARDS, ArchConfig
from ringgpt.hw.isa import OPCODES, STRIDE_BITS, Opcode, Space, Unit

from .axi import AxiStream
from .timing import READ_LATENCY, RouterTiming
from .interfaces import (ADDRESS_BITS, WORD, Completion, ErrorCode, IssueLayout, SharedReadPort, SharedWritePort,
                         accept_states, block_fits, check_instruction, done_state, error_code, pipe, reported, resolve, run_or_refuse)

HEADER = data.StructLayout({"kind": Opcode, "origin": range(MAX_CARDS), "rows": ADDRESS_BITS,
                            "n": ADDRESS_BITS, "k": ADDRESS_BITS})
"""The first beat of every block on the link (low bits of tdata; the rest zero)."""
TX_QUEUE_BEATS = 4
"""Transmit queue: enough for one beat per cycle through the read port's latency."""
FORWARDS = MAX_CARDS - 2
"""Received ALLGATHER slices a card forwards at most (all but the one its successor sent)."""
SLOT = data.StructLayout({"origin": range(MAX_CARDS), "n": ADDRESS_BITS, "k": ADDRESS_BITS})



def link_block(kind: Opcode, origin: int, rows: int, n: int, k: int, words, width: int) -> list[tuple[int, int]]:
    """The beats (tdata, tlast) of one block on a link of `width` words per beat; `words` is the rows x n
    block (uint16 FP16 bits). The reference the testbenches compare the RTL's link traffic with."""
    header = HEADER.const({"kind": kind, "origin": origin, "rows": rows, "n": n, "k": k}).as_value().value
    beats = [header]
    for row in range(rows):
        for start in range(0, n, width):
            chunk = [int(w) for w in words[row][start:start + width]]
            beats.append(sum(w << (WORD * lane) for lane, w in enumerate(chunk)))
    return [(beat, int(index == len(beats) - 1)) for index, beat in enumerate(beats)]


class Router(RouterTiming, wiring.Component):
    """Ring router of `cfg`: one link beat of P = vector_width words per cycle in each direction.

    Computes, exactly as the functional simulator's ring (sim/functional/machine.py: run_ring):
    * SEND: the rows x n block at src1 (row stride src1_stride) as one block to card id + 1; done when the
      link has taken its last beat.
    * RECV: the next block from card id - 1 into dst (row stride dst_stride); its header must be a SEND's with
      this RECV's rows and n and come from card id - 1, else `ErrorCode.RING`. With nothing arriving it waits.
    * ALLGATHER on `cards` cards: sends its own slice (rows x n from src1, header k = its own k) first, then
      forwards the slices it receives (origins id - 1, id - 2, ...), each read back from dst once fully
      received, except the last (whose origin is id + 1); meanwhile it writes every arriving slice into dst at
      the origin's k (`dst + k_c + r*dst_stride + j`) and copies its own slice there too (skipped when in place:
      src1 = dst + k with src1_stride = dst_stride, the compiler's form). The receive side never waits for the
      transmit side, so every card may start at once. Done when cards - 1 slices are written and its own and
      cards - 2 forwarded slices are on the link. With cards = 1 it is the local copy alone. A header that is not
      an ALLGATHER's of this rows, comes from another card than expected, or overlaps this card's own columns
      ends it with RING; a slice past ABUF with OUT_OF_RANGE. n = 0 is legal (a card without columns: a
      header-only block).

    Before it starts, the checks of every unit (interfaces.check_instruction): WRONG_UNIT, RESERVED, BAD_SPACE,
    ZERO_DIM (rows = 0; n = 0 for SEND and RECV), OUT_OF_RANGE (src1 or dst + k past ABUF or 2**32). A RING or
    incoming OUT_OF_RANGE leaves the offending header in the receive queue and completes at once; the block
    being sent (the own one, so that the next card sees the mismatch too) still leaves, in the background and
    without its copy into dst, and the next instruction posts its blocks once it has. The host resets the ring
    after a RING.

    Throughput: one beat per cycle on `tx` and on `rx` (header beat plus rows * ceil(n / P) payload beats a
    block). Payload reads go through ABUF's shared read port per memory (`SharedReadPort`, with the DMA
    engines' STORE reads; `urgent`: before the engines that are not behind), a refused read asked again the
    next cycle. The one ABUF write (a `SharedWritePort` in ABUF's write group, urgent) serves received beats and
    the own-slice copy, the copy winning; a refused write holds the write register and the receive queue, and an
    own-slice chunk already read waits in a skid register (no chunk is read for dst while either is full). Latency:
    `latency` = 2 cycles from a payload read to its beat on `tx` (read 1, transmit queue 1); `rx_latency` = 3
    from a beat taken on `rx` to its ABUF write (receive queue 2, write register 1). Busy cycles (`Completion.cycles`) of
    an uncontended instruction: `cycles(op, rows, n, ...)`. Preconditions (the compiler's collectives meet
    them): the gathered rows in dst do not overlap (dst_stride >= the last slice's k + n) and src1 does not
    overlap a slice but its own; SENDs not yet matched by a RECV on the next card fit its receive queue
    (`rx_beats`), else the ring waits.
    """

    opcodes = tuple(op for op, spec in OPCODES.items() if spec.unit is Unit.ROUTER)

    def __init__(self, cfg: ArchConfig):
        RouterTiming.__init__(self, cfg)
        P = self.width
        self.beat_bits = P * WORD
        if HEADER.size > self.beat_bits:
            raise ValueError(f"the router's {HEADER.size}-bit header does not fit a link beat of {P} words")
        self.rx_beats = max(2, cfg.ring_rx_buffer_bytes // (self.beat_bits // 8))
        """Receive queue depth in beats (ring_rx_buffer_bytes)."""
        self.buffer_ports = {"abuf_src": (Space.ABUF, SharedReadPort(P)), "abuf_dst": (Space.ABUF, SharedWritePort(P))}
        wiring.Component.__init__(self, {"issue": In(stream.Signature(IssueLayout)), "status": Out(Completion()),
                          **{name: Out(sig) for name, (space, sig) in self.buffer_ports.items()},
                          "card_id": In(range(MAX_CARDS)), "cards": In(range(MAX_CARDS + 1)),
                          "tx": Out(AxiStream(self.beat_bits)), "rx": In(AxiStream(self.beat_bits))})

    def elaborate(self, platform):
        m = Module()
        cfg, P = self.cfg, self.width
        W = cfg.abuf_words

        held = Signal(IssueLayout)
        r = resolve(m, held)
        inst = held.inst
        (_, dst), (_, src1) = r["dst"], r["src1"]
        rows, n, k = r["rows"], r["n"], r["k"]
        sd, s1 = r["dst_stride"], r["src1_stride"]
        gather, send, recv = (inst.opcode == op for op in (Opcode.ALLGATHER, Opcode.SEND, Opcode.RECV))
        own_dst = Signal(ADDRESS_BITS + 1)
        m.d.comb += own_dst.eq(dst + k)

        # --- checks -------------------------------------------------------------------------
        checks = check_instruction(m, inst, self.opcodes)
        src_fits = block_fits(src1, rows, n, s1, W)
        dst_fits = block_fits(own_dst, rows, n, sd, W)     # RECV: k is 0 (an unused field)
        in_range = Mux(send, src_fits, Mux(recv, dst_fits, (n == 0) | (src_fits & dst_fits)))
        code = error_code(m, checks, empty=0, zero_dim=(rows == 0) | ((n == 0) & ~gather), out_of_range=~in_range)

        # --- state of the instruction -----------------------------------------------------------
        error = Signal(ErrorCode)
        cycles = Signal(32)
        me = Signal(range(MAX_CARDS))
        ring = Signal(range(MAX_CARDS + 1))
        dst_span = Signal(ADDRESS_BITS + STRIDE_BITS)      # (rows - 1) * dst_stride
        in_place = Signal()
        own_pending = Signal()                             # own block (SEND, ALLGATHER) not yet handed to TX
        received = Signal(range(MAX_CARDS))                # blocks whose last beat has been taken
        expected = Mux(gather, ring - 1, recv)
        forwarded = Signal(range(FORWARDS + 1))
        forwards = Mux(gather & (ring > 2), ring - 2, 0)
        running = Signal()
        m.d.comb += [self.status.error.eq(reported(error)), self.status.cycles.eq(cycles + 1)]

        # --- transmit: a block descriptor -> header beat, payload reads -> transmit queue -> tx --------------
        m.submodules.tx_queue = tx_queue = fifo.SyncFIFO(width=self.beat_bits + 1, depth=TX_QUEUE_BEATS)
        m.d.comb += [self.tx.tdata.eq(tx_queue.r_data[:self.beat_bits]), self.tx.tlast.eq(tx_queue.r_data[-1]),
                     self.tx.tvalid.eq(tx_queue.r_rdy), tx_queue.r_en.eq(self.tx.tready)]
        tx_busy = Signal()              # the block has a header or reads left
        tx_head = Signal()              # its header is still to be queued
        tx_send, tx_copy = Signal(), Signal()
        tx_header = Signal(HEADER)
        rd_row, rd_col, rd_rows, rd_n = (Signal(ADDRESS_BITS, name=f"rd_{x}") for x in ("row", "col", "rows", "n"))
        rd_stride, cp_stride = Signal(STRIDE_BITS), Signal(STRIDE_BITS)
        cp_row = Signal(ADDRESS_BITS)

        step = Signal(data.StructLayout({"valid": 1, "send": 1, "copy": 1, "last": 1, "addr": ADDRESS_BITS,
                                         "mask": P}))
        step1 = pipe(m, step, READ_LATENCY, name="step1")
        landing = step1.valid & step1.send               # a payload beat enters the queue this cycle
        room = tx_queue.level + landing < TX_QUEUE_BEATS
        push_header = tx_busy & tx_head & ~landing & room
        # a write refused (stuck) holds the write register; an own-slice chunk read before it waits in `skid`,
        # and no chunk is read for dst while either is full
        stuck, skid_full = Signal(), Signal()
        wants = tx_busy & ~tx_head & (~tx_send | room) & (~tx_copy | ~(stuck | skid_full))
        read = wants & self.abuf_src.ready                 # granted: the memories its words lie in were free
        row_end = rd_col + P >= rd_n
        m.d.comb += [self.abuf_src.en.eq(wants), self.abuf_src.urgent.eq(1), step.valid.eq(read), step.send.eq(tx_send), step.copy.eq(tx_copy),
                     step.last.eq(row_end & (rd_rows == 1)), step.addr.eq(cp_row + rd_col),
                     self.abuf_src.addr.eq(rd_row + rd_col)]
        m.d.comb += [step.mask[lane].eq(rd_col + lane < rd_n) for lane in range(P)]
        with m.If(read):
            with m.If(row_end):
                m.d.sync += [rd_col.eq(0), rd_row.eq(rd_row + rd_stride), cp_row.eq(cp_row + cp_stride),
                             rd_rows.eq(rd_rows - 1)]
                with m.If(rd_rows == 1):
                    m.d.sync += tx_busy.eq(0)
            with m.Else():
                m.d.sync += rd_col.eq(rd_col + P)
        with m.If(push_header):
            m.d.sync += tx_head.eq(0)
            with m.If(tx_header.n == 0):
                m.d.sync += tx_busy.eq(0)
        got = self.abuf_src.data
        payload = Cat(Mux(step1.mask[lane], got[lane], 0) for lane in range(P))
        header_beat = Cat(tx_header.as_value(), Const(0, self.beat_bits - HEADER.size), tx_header.n == 0)
        m.d.comb += [tx_queue.w_en.eq(push_header | landing),
                     tx_queue.w_data.eq(Mux(push_header, header_beat, Cat(payload, step1.last)))]
        copying = step1.valid & step1.copy               # an own-slice chunk goes to dst this cycle

        def post(header: dict, source, stride, *, send, copy=0, copy_row=0):
            """Hands a block to the transmit side (which is idle)."""
            m.d.sync += [tx_header[name].eq(value) for name, value in header.items()]
            m.d.sync += [rd_row.eq(source), rd_stride.eq(stride), rd_col.eq(0),
                         rd_rows.eq(rows), rd_n.eq(header["n"]), tx_send.eq(send), tx_head.eq(send),
                         tx_copy.eq(copy), cp_row.eq(copy_row), cp_stride.eq(sd),
                         tx_busy.eq(send | (copy & (header["n"] != 0)))]

        # --- receive: rx -> receive queue -> header check -> payload beats -> write register -> ABUF dst -------
        m.submodules.rx_queue = rx_queue = fifo.SyncFIFOBuffered(width=self.beat_bits, depth=self.rx_beats)
        m.d.comb += [rx_queue.w_data.eq(self.rx.tdata), rx_queue.w_en.eq(self.rx.tvalid),
                     self.rx.tready.eq(rx_queue.w_rdy)]
        head = data.View(HEADER, rx_queue.r_data[:HEADER.size])
        rx_body = Signal()
        expect_origin = Signal(range(MAX_CARDS))
        wr_row, wr_col, wr_rows, wr_n = (Signal(ADDRESS_BITS, name=f"wr_{x}") for x in ("row", "col", "rows", "n"))
        slots = Signal(data.ArrayLayout(SLOT, max(FORWARDS, 1)))
        listening = running & (received < expected) & ~rx_body
        matches = (Mux(gather, head.kind == Opcode.ALLGATHER, head.kind == Opcode.SEND) & (head.rows == rows)
                   & (gather | (head.n == n)) & (head.origin == expect_origin))
        overlaps = gather & (head.n != 0) & (n != 0) & (head.k < k + n) & (k < head.k + head.n)
        slice_fits = ~gather | (head.n == 0) | (dst + head.k + dst_span + head.n <= W)
        rx_code = Signal(ErrorCode)
        with m.If(~matches | overlaps):
            m.d.comb += rx_code.eq(ErrorCode.RING)
        with m.Elif(~slice_fits):
            m.d.comb += rx_code.eq(ErrorCode.OUT_OF_RANGE)
        new_block = listening & rx_queue.r_rdy
        refused = new_block & (rx_code != ErrorCode.NONE)
        accepted = new_block & (rx_code == ErrorCode.NONE)
        take = rx_body & rx_queue.r_rdy & ~copying & ~stuck & ~skid_full
        m.d.comb += rx_queue.r_en.eq(accepted | take)
        with m.If(accepted):
            m.d.sync += [wr_row.eq(Mux(gather, dst + head.k, dst)), wr_col.eq(0), wr_rows.eq(rows),
                         wr_n.eq(head.n), expect_origin.eq(Mux(expect_origin == 0, ring - 1, expect_origin - 1))]
            for index in range(FORWARDS):
                with m.If(received == index):
                    m.d.sync += slots[index].eq(Cat(head.origin, head.n, head.k))
            with m.If(head.n == 0):
                m.d.sync += received.eq(received + 1)
            with m.Else():
                m.d.sync += rx_body.eq(1)
        wr_end = wr_col + P >= wr_n
        with m.If(take):
            with m.If(wr_end):
                m.d.sync += [wr_col.eq(0), wr_row.eq(wr_row + sd), wr_rows.eq(wr_rows - 1)]
                with m.If(wr_rows == 1):
                    m.d.sync += [rx_body.eq(0), received.eq(received + 1)]
            with m.Else():
                m.d.sync += wr_col.eq(wr_col + P)

        # one write register for both writers: the own-slice copy wins, received beats wait in the queue; it
        # holds while its write is refused (ABUF's writes share one port per memory), a chunk read before the
        # refusal waiting in `skid` (no chunk is read for dst while the register is stuck or the skid full)
        write = data.StructLayout({"en": 1, "addr": ADDRESS_BITS, "mask": P, "data": data.ArrayLayout(WORD, P)})
        wreg, skid, copied = Signal(write), Signal(write), Signal(write)
        m.d.comb += [stuck.eq(wreg.en & ~self.abuf_dst.ready), skid_full.eq(skid.en),
                     copied.en.eq(copying), copied.addr.eq(step1.addr), copied.mask.eq(step1.mask), copied.data.eq(got)]
        with m.If(stuck):
            with m.If(copying):
                m.d.sync += skid.eq(copied)
        with m.Elif(skid.en):
            m.d.sync += [wreg.eq(skid), skid.en.eq(0)]
        with m.Elif(copying):
            m.d.sync += wreg.eq(copied)
        with m.Else():
            m.d.sync += [wreg.en.eq(take), wreg.addr.eq(wr_row + wr_col), wreg.data.eq(rx_queue.r_data)]
            m.d.sync += [wreg.mask[lane].eq(wr_col + lane < wr_n) for lane in range(P)]
        m.d.comb += [self.abuf_dst.addr.eq(wreg.addr), self.abuf_dst.data.eq(wreg.data),
                     self.abuf_dst.mask.eq(wreg.mask), self.abuf_dst.en.eq(wreg.en), self.abuf_dst.urgent.eq(1)]

        # --- control ----------------------------------------------------------------------------
        slot = Signal(SLOT)
        for index in range(FORWARDS):
            with m.If(forwarded == index):
                m.d.comb += slot.eq(slots[index])
        tx_idle = ~tx_busy & ~step1.valid & (tx_queue.level == 0)
        finished = ~own_pending & (forwarded == forwards) & tx_idle & (received == expected) & ~stuck & ~skid_full
        with m.FSM():
            accept_states(m, self, held, cycles)
            with m.State("CHECK"):
                m.d.sync += [cycles.eq(cycles + 1), error.eq(code), me.eq(self.card_id), ring.eq(self.cards),
                             dst_span.eq((rows - 1) * sd), in_place.eq((own_dst == src1) & (sd == s1)),
                             own_pending.eq(send | gather), received.eq(0), forwarded.eq(0), rx_body.eq(0),
                             expect_origin.eq(Mux(self.card_id == 0, self.cards - 1, self.card_id - 1))]
                run_or_refuse(m, code, running)
            with m.State("RUN"):
                m.d.sync += cycles.eq(cycles + 1)
                with m.If(own_pending & ~tx_busy):
                    m.d.sync += own_pending.eq(0)
                    with m.If(send):
                        post({"kind": Opcode.SEND, "origin": me, "rows": rows, "n": n, "k": 0}, src1, s1, send=1)
                    with m.Else():
                        post({"kind": Opcode.ALLGATHER, "origin": me, "rows": rows, "n": n, "k": k}, src1, s1,
                             send=ring > 1, copy=~in_place, copy_row=own_dst)
                # a received slice is forwarded from ABUF: only once its last beat's write has landed (it may still
                # wait in the write register, refused; `received` counts the block when that beat is taken)
                with m.Elif((forwarded < forwards) & (forwarded < received) & ~tx_busy & ~stuck):
                    m.d.sync += forwarded.eq(forwarded + 1)
                    post({"kind": Opcode.ALLGATHER, "origin": slot.origin, "rows": rows, "n": slot.n, "k": slot.k},
                         dst + slot.k, sd, send=1)
                with m.If(refused):
                    m.d.sync += [error.eq(rx_code), tx_copy.eq(0), running.eq(0)]
                    m.next = "DONE"
                with m.Elif(finished):
                    m.d.sync += running.eq(0)
                    m.next = "DONE"
            done_state(m, self, running)
        return m


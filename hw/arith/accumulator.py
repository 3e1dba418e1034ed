"""Sequential FP32 accumulation across tiles (`numerics.add_in_order` of the MAC tree's tile sums): the first
tile's sum is loaded, later tile sums are added in order, the tile flagged `last` emits the total.

The adder's pipeline makes a loop: a tile cannot be added before the previous tile of the same sum
has left the adder. The accumulator therefore keeps `contexts` independent sums (selected by the
`ctx` field; e.g. the output columns a lane works through in turn) and stalls an input whose sum
still has a tile in flight. A tile may follow the previous tile of its own sum FP32AddCore.latency
(5) cycles later (the adder's result is forwarded), so interleaving >= 5 sums round-robin runs at
one tile per cycle, while a single sum runs at one tile per 5 cycles.
"""
from amaranth.hdl import C, Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .common import FP32
from .fp32_add import FP32AddCore

_NEG_ZERO = 1 << 31
"""-0.0, the identity of IEEE addition: the first tile is loaded as -0 + sum (exact, NaNs canonical)."""


class TileAccumulator(wiring.Component):
    """Stream accumulator of FP32 tile sums over `contexts` independent sums.

    Input payload {data: FP32 tile sum, ctx, first, last}; output payload {data: FP32 total, ctx},
    one output per input flagged `last`, in input order. A tile flagged both first and last is a
    one-tile sum. Latency: `latency` = FP32AddCore.latency + 1 = 6 cycles from accepting the last
    tile to its total on `o` (adder + output FIFO); `loop_latency` = 5 cycles between tiles of the
    same sum; up to one tile per cycle.
    """

    loop_latency = FP32AddCore.latency
    latency = FP32AddCore.latency + 1

    def __init__(self, contexts: int):
        if isinstance(contexts, bool) or not isinstance(contexts, int) or contexts < 1:
            raise ValueError(f"accumulator contexts must be an int >= 1, got {contexts!r}")
        self.contexts = contexts
        self.fifo_depth = FP32AddCore.latency + 2
        ctx = range(contexts)
        super().__init__({
            "i": In(stream.Signature(data.StructLayout({"data": FP32, "ctx": ctx, "first": 1, "last": 1}))),
            "o": Out(stream.Signature(data.StructLayout({"data": FP32, "ctx": ctx}))),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.add = add = FP32AddCore()
        m.submodules.store = store = memory.Memory(shape=32, depth=self.contexts, init=[])
        m.submodules.fifo = buf = fifo.SyncFIFO(width=len(self.o.payload.as_value()), depth=self.fifo_depth)
        read, write = store.read_port(domain="comb"), store.write_port()
        item = self.i.payload
        stages = add.latency

        # item k of `flight` is the tile that entered the adder k + 1 cycles ago; the last one's
        # sum is on add.o this cycle
        flight = [Signal(data.StructLayout({"valid": 1, "ctx": range(self.contexts), "last": 1}),
                         name=f"flight{k}") for k in range(stages)]
        accept = self.i.valid & self.i.ready
        m.d.sync += flight[0].eq(Cat(accept, item.ctx, item.last))
        m.d.sync += [flight[k].eq(flight[k - 1]) for k in range(1, stages)]
        done = flight[-1]

        busy = Cat(f.valid & (f.ctx == item.ctx) for f in flight[:-1]).any()
        forward = done.valid & (done.ctx == item.ctx)
        credits = Signal(range(self.fifo_depth + 1), init=self.fifo_depth)
        delivered = self.o.valid & self.o.ready
        m.d.sync += credits.eq(credits - (accept & item.last) + delivered)
        m.d.comb += [
            self.i.ready.eq(~(busy & ~item.first) & (~item.last | (credits != 0))),
            read.addr.eq(item.ctx),
            add.i.a.eq(item.data),
            add.i.b.eq(Mux(item.first, C(_NEG_ZERO, 32), Mux(forward, add.o, read.data))),
            write.addr.eq(done.ctx),
            write.data.eq(add.o),
            write.en.eq(done.valid),
            buf.w_en.eq(done.valid & done.last),
            buf.w_data.eq(Cat(add.o, done.ctx)),
            self.o.valid.eq(buf.r_rdy),
            self.o.payload.eq(buf.r_data),
            buf.r_en.eq(self.o.ready),
        ]
        return m

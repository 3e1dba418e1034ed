"""Ready/valid streams around free-running pipelines.

Every arithmetic unit is a *core*: a `wiring.Component` with one input port `i` and one output port
`o` that advances on every clock edge (no enables, no stalls); the value presented on `i` appears,
processed, on `o` exactly `core.latency` cycles later. `Streamed` puts such a core behind
`amaranth.lib.stream` interfaces: it tracks which pipeline slots hold valid data and parks results
in an output FIFO that is never allowed to overflow, by credits: a new input is accepted only while
the FIFO has room for every result already in flight. With `latency + 2` FIFO entries a sink that is
always ready sees one result per cycle.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Shape, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out


class Streamed(wiring.Component):
    """Stream wrapper of a free-running core: `i` stream -> core -> FIFO -> `o` stream.

    Latency `latency` = core.latency + 1 cycles from an accepted input to its result on `o`
    (the FIFO adds one); one result per cycle; results leave in input order.
    """

    def __init__(self, core: wiring.Component):
        self.core = core
        self.latency = core.latency + 1
        self.fifo_depth = core.latency + 2
        members = core.signature.members
        super().__init__({
            "i": In(stream.Signature(members["i"].shape)),
            "o": Out(stream.Signature(members["o"].shape)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.fifo = buf = fifo.SyncFIFO(width=Shape.cast(self.o.payload.shape()).width,
                                                 depth=self.fifo_depth)
        accept = self.i.valid & self.i.ready
        delivered = self.o.valid & self.o.ready
        in_flight = Signal(core.latency)
        m.d.sync += in_flight.eq(Cat(accept, in_flight[:-1]))
        credits = Signal(range(self.fifo_depth + 1), init=self.fifo_depth)
        m.d.sync += credits.eq(credits - accept + delivered)
        m.d.comb += [
            core.i.eq(self.i.payload),
            self.i.ready.eq(credits != 0),
            buf.w_en.eq(in_flight[-1]),
            buf.w_data.eq(core.o),
            self.o.valid.eq(buf.r_rdy),
            self.o.payload.eq(buf.r_data),
            buf.r_en.eq(self.o.ready),
        ]
        return m

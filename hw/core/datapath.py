"""The single-instruction harness: the buffers and one unit, as the tests (and the cycle table) drive them.

`Datapath(unit, config, abuf_words, wbuf_words)` holds `Buffers` sized from the config and one unit
(`units.UNIT_CLASSES`: dma, matrix, vector, router), wired port by port by name. Besides the unit's own `issue` stream and
`status`, it has a `load` port (port_words words per cycle into ABUF or WBUF; it shares the unit's
first write port into that buffer through a `WriteArbiter`, the unit winning) and a `dump` port
(port_words words per cycle out of either buffer, one cycle after the address). A unit that reads ABUF through
its shared read ports (a `TileReadPort` or a `SharedReadPort`) also gets a `contend` port, first in ABUF's shared
group: a testbench's reads, which take their memories before any tile port and, when `urgent`, before the
unit's shared reads (random stalls of the unit's reads, as other units cause in the core); one that writes ABUF
through a `SharedWritePort` also a `contend_write` port, first of ABUF's shared writes (writes of no word that
claim their memories ahead of the unit's). Every other member of
the unit (its outside ports: AXI4 masters, ring streams, card id, ...) is a member of the harness of the
same name and direction, wired straight through.

`small_config` shrinks a preset's buffers for simulation through ArchConfig's own validation.
"""
from __future__ import annotations

import dataclasses

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import ArchConfig, get_config
from ringgpt.hw.isa import Space

from .buffers import Buffers, WriteArbiter
from .units import UNIT_CLASSES
from .interfaces import ADDRESS_BITS, WORD, Completion, IssueLayout, ReadPort, SharedReadPort, SharedWritePort, TileReadPort, WritePort



def small_config(base: str = "sim-small", *, abuf_words: int, wbuf_words: int) -> ArchConfig:
    """Preset `base` with smaller buffers (validated like any ArchConfig)."""
    cfg = get_config(base)
    return dataclasses.replace(cfg, name=f"{base.split('-x')[0]}-rtl-x{cfg.cards}", abuf_words=abuf_words,
                               wbuf_words=wbuf_words)


class Datapath(wiring.Component):
    """Buffers + one unit + load/dump ports (see the module docstring)."""

    def __init__(self, unit: str = "matrix", config: str = "sim-small", abuf_words: int = 2048,
                 wbuf_words: int = 1024):
        self.cfg = small_config(config, abuf_words=abuf_words, wbuf_words=wbuf_words)
        self.unit_name = unit
        self.unit = UNIT_CLASSES[unit](self.cfg)
        self.port_words = min(self.cfg.mac_width, self.cfg.vector_width)
        P = self.port_words
        self.load_layout = data.StructLayout({"en": 1, "space": Space, "addr": ADDRESS_BITS,
                                              "data": data.ArrayLayout(WORD, P)})
        self.dump_layout = data.StructLayout({"space": Space, "addr": ADDRESS_BITS})
        self.outside = {name: member for name, member in self.unit.signature.members.items()
                        if name not in ("issue", "status") and name not in self.unit.buffer_ports}
        contended = any(space == Space.ABUF and isinstance(sig, (SharedReadPort, TileReadPort))
                        for space, sig in self.unit.buffer_ports.values())
        self.contend_port = SharedReadPort(self.cfg.buffer_chunk_words) if contended else None
        self.contend_write_port = SharedWritePort(self.cfg.buffer_chunk_words) if any(
            space == Space.ABUF and isinstance(sig, SharedWritePort) for space, sig in self.unit.buffer_ports.values()) \
            else None
        super().__init__({"issue": In(stream.Signature(IssueLayout)), "status": Out(Completion()),
                          "load": In(self.load_layout), "dump": In(self.dump_layout),
                          "dump_data": Out(data.ArrayLayout(WORD, P)), **self.outside,
                          **({"contend": In(self.contend_port)} if contended else {}),
                          **({"contend_write": In(self.contend_write_port)} if self.contend_write_port else {})})

    @property
    def latency(self) -> int:
        return self.unit.latency

    def elaborate(self, platform):
        m = Module()
        unit, P = self.unit, self.port_words
        m.submodules.unit = unit
        ports = dict(unit.buffer_ports)
        if self.contend_port is not None:       # first in ABUF's shared group
            ports = {"contend": (Space.ABUF, self.contend_port), **ports}
        if self.contend_write_port is not None:  # first of ABUF's shared writes
            ports = {"contend_write": (Space.ABUF, self.contend_write_port), **ports}
        shared = {}
        for space in (Space.ABUF, Space.WBUF):
            prefix = space.name.lower()
            ports[f"{prefix}_dump"] = (space, ReadPort(P))
            writer = next((name for name, (sp, sig) in unit.buffer_ports.items()
                           if sp == space and isinstance(sig, WritePort)), None)
            if writer is None:
                ports[f"{prefix}_load"] = (space, WritePort(P))
            else:
                width = max(P, unit.buffer_ports[writer][1].words)
                ports[writer] = (space, WritePort(width))
                shared[space] = writer
        m.submodules.buffers = buffers = Buffers(self.cfg, ports)
        wiring.connect(m, wiring.flipped(self.issue), unit.issue)
        wiring.connect(m, unit.status, wiring.flipped(self.status))
        if self.contend_port is not None:
            wiring.connect(m, wiring.flipped(self.contend), buffers.contend)
        if self.contend_write_port is not None:
            wiring.connect(m, wiring.flipped(self.contend_write), buffers.contend_write)
        for name, member in self.outside.items():
            if member.is_port:
                inner, outer = getattr(unit, name), getattr(self, name)
                m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
            else:
                wiring.connect(m, getattr(unit, name), wiring.flipped(getattr(self, name)))

        for name, (space, sig) in unit.buffer_ports.items():
            if shared.get(space) == name:
                continue
            wiring.connect(m, getattr(unit, name), getattr(buffers, name))

        load = self.load
        for space in (Space.ABUF, Space.WBUF):
            prefix = space.name.lower()
            if space in shared:
                name = shared[space]
                target = getattr(buffers, name)
                arb = m.submodules[f"{prefix}_arbiter"] = WriteArbiter(ports[name][1].words)
                src = getattr(unit, name)
                m.d.comb += [arb.first.addr.eq(src.addr), arb.first.en.eq(src.en), arb.first.mask.eq(src.mask)]
                m.d.comb += [arb.first.data[i].eq(src.data[i]) for i in range(src.signature.words)]
                wiring.connect(m, arb.out, target)
                port = arb.second
            else:
                port = getattr(buffers, f"{prefix}_load")
            m.d.comb += [port.addr.eq(load.addr), port.en.eq(load.en & (load.space == space)),
                         port.mask.eq((1 << P) - 1)]
            m.d.comb += [port.data[i].eq(load.data[i]) for i in range(P)]
            m.d.comb += getattr(buffers, f"{prefix}_dump").addr.eq(self.dump.addr)

        space_d = Signal(Space)
        m.d.sync += space_d.eq(self.dump.space)
        abuf_dump, wbuf_dump = buffers.abuf_dump.data, buffers.wbuf_dump.data
        m.d.comb += [self.dump_data[i].eq(Mux(space_d == Space.WBUF, wbuf_dump[i], abuf_dump[i])) for i in range(P)]
        return m

"""The core of one card: wiring only.

    host interface (start, pos, rows, card id/count, bases) ──▶ Controller ◀── words ── Fetch ── prog (AXI4)
                                                                  │ issue_<unit> / status_<unit>
                          ┌──────────────┬──────────────┬─────────┴────┐
                        DMAUnit      MatrixUnit     VectorUnit       Router ── tx / rx (AXI4-Stream)
             hbm0.., host (AXI4)         │              │              │
                          └──────────────┴──── Buffers (ABUF, WBUF) ───┘

Every unit's buffer ports go to `Buffers` under the unit's name (`matrix_abuf_tiles`, `dma_wbuf_dst`, ...);
every outside port keeps its unit's name (`hbm0`, `host`, `tx`, `rx`; fetch's `prog`). The host
interface is what the Vitis kernel exposes as registers: `start` (pulse), `pos` and `rows` (R1, R2),
`card_id` and `cards`, `program_base`, `hbm_base` (per channel) and `host_base` (byte addresses); status
`busy`, `done`, `error`, `error_pc`, `pc`, `cycles` and `busy_<unit>` (the controller's counters).
"""
from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring

from ringgpt.hw.config import ArchConfig

from .buffers import Buffers
from .controller import Controller
from .fetch import Fetch
from .units import UNIT_CLASSES, UNIT_NAMES

HOST_INPUTS = ("start", "pos", "rows", "program_base")
"""Host-interface inputs that go to the controller (card_id and cards go to the router, the bases to DMA)."""
STATUS = ("busy", "done", "error", "error_pc", "pc", "cycles") + tuple(f"busy_{unit}" for unit in UNIT_NAMES)
"""The host interface's outputs (the controller's)."""


SETTINGS = ("card_id", "cards", "hbm_base", "host_base")
"""Host-interface inputs that go to the units: the router's place on the ring, the DMA's base addresses."""


def outside_ports(signature: wiring.Signature) -> tuple:
    """Members of a core's signature that leave it as buses: fetch's AXI4 master `prog`, the DMA's (hbm0..,
    host), the ring links (tx, rx): everything but the host interface."""
    return tuple(name for name in signature.members if name not in HOST_INPUTS + STATUS + SETTINGS)


class Core(wiring.Component):
    """One card's core sized from `cfg` (see the module docstring). Latency and throughput are the units':
    docs/rtl-core.md."""

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.controller = Controller(cfg)
        self.fetch = Fetch(cfg)
        self.units = {name: UNIT_CLASSES[name](cfg) for name in UNIT_NAMES}
        router, dma = self.units["router"], self.units["dma"]
        control = self.controller.signature.members
        members = {name: control[name] for name in HOST_INPUTS + STATUS}
        members.update({name: (router if name in ("card_id", "cards") else dma).signature.members[name]
                        for name in SETTINGS})
        members["prog"] = self.fetch.signature.members["prog"]
        members.update({port: dma.signature.members[port] for port in dma.ports})
        members.update({name: router.signature.members[name] for name in ("tx", "rx")})
        super().__init__(members)

    @classmethod
    def signature_of(cls, cfg: ArchConfig) -> wiring.Signature:
        """The core's signature, without elaborating one (for a top that instantiates its Verilog)."""
        core = cls(cfg)
        for part in (core, core.controller, core.fetch, *core.units.values()):
            part._MustUse__silence = True
        return core.signature

    def elaborate(self, platform):
        m = Module()
        m.submodules.controller = controller = self.controller
        m.submodules.fetch = fetch = self.fetch
        wiring.connect(m, controller.fetch, fetch.control)
        wiring.connect(m, fetch.prog, wiring.flipped(self.prog))
        for name in HOST_INPUTS:
            m.d.comb += getattr(controller, name).eq(getattr(self, name))
        for name in STATUS:
            m.d.comb += getattr(self, name).eq(getattr(controller, name))

        ports = {}
        for name, unit in self.units.items():
            m.submodules[name] = unit
            wiring.connect(m, getattr(controller, f"issue_{name}"), unit.issue)
            wiring.connect(m, unit.status, getattr(controller, f"status_{name}"))
            ports.update({f"{name}_{port}": spec for port, spec in unit.buffer_ports.items()})
        m.submodules.buffers = buffers = Buffers(self.cfg, ports)
        for name, unit in self.units.items():
            for port in unit.buffer_ports:
                wiring.connect(m, getattr(unit, port), getattr(buffers, f"{name}_{port}"))

        router, dma = self.units["router"], self.units["dma"]
        m.d.comb += [router.card_id.eq(self.card_id), router.cards.eq(self.cards),
                     dma.hbm_base.eq(self.hbm_base), dma.host_base.eq(self.host_base)]
        for port in dma.ports:
            wiring.connect(m, getattr(dma, port), wiring.flipped(getattr(self, port)))
        wiring.connect(m, router.tx, wiring.flipped(self.tx))
        wiring.connect(m, wiring.flipped(self.rx), router.rx)
        return m

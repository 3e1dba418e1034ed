"""RingTop: the cores of a ring in one simulation, as RtlDevice and the whole-core tests drive them.

The core (`hw.core.core.Core`) is converted to Verilog once, as module `ringgpt_core`, and instantiated
once per card (`verilog_modules` returns its text; the runner appends it), so a ring of four builds no
more Verilog than one core. Card i's core gets card id i, the ring's card count and base address 0 on
every AXI4 port; its AXI4 ports and status are top-level ports prefixed `c<i>_` (`c0_hbm01__araddr`,
`c0_done`, ...), each answered by its own memory in the testbench. The ring is closed inside: core i's
`tx` drives core i+1's `rx`. All cores share `start`, `pos` and `rows`; `finished` is high once every core
is done or any core has stopped on an error. With `pause_links`, each link's handshake is gated by an
LFSR (random pauses on the ring, for tests).
"""
from __future__ import annotations

import functools
import json

from amaranth.hdl import Cat, ClockSignal, Instance, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import ArchConfig, get_config
from ringgpt.hw.core.core import STATUS, Core, outside_ports
from ringgpt.hw.core.units import UNIT_NAMES
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.isa import REG_BITS

CORE_MODULE = "ringgpt_core"


def config_of(config: str) -> ArchConfig:
    """A preset name ('sim-small-x2') or an ArchConfig as a JSON object."""
    return ArchConfig(**json.loads(config)) if config.lstrip().startswith("{") else get_config(config)


@functools.cache
def core_verilog(cfg: ArchConfig) -> str:
    from ringgpt.hw.verilog import convert

    return convert(Core(cfg), name=CORE_MODULE)


def lfsr_bit(m: Module, seed: int, name: str) -> Signal:
    """One pseudo-random bit per cycle (16-bit Fibonacci LFSR)."""
    state = Signal(16, init=seed or 1, name=f"{name}_lfsr")
    m.d.sync += state.eq(Cat(state[1:], state[0] ^ state[2] ^ state[3] ^ state[5]))
    return state[0]


class RingTop(wiring.Component):
    """`cards` cores on a ring (see the module docstring)."""

    def __init__(self, config: str = "sim-small", cards: int | None = None, pause_links: bool = False):
        cfg = config_of(config)
        self.cfg = cfg if cards is None else cfg.with_cards(cards)
        self.cards = self.cfg.cards
        self.pause_links = pause_links
        self.busy_units = UNIT_NAMES
        self.core_signature = Core.signature_of(self.cfg)
        self.outside_ports, self.status_ports = outside_ports(self.core_signature), STATUS
        members = {"start": In(1), "pos": In(REG_BITS), "rows": In(REG_BITS), "finished": Out(1)}
        for i in range(self.cards):
            for name in (*self.outside_ports, *self.status_ports):
                members[f"c{i}_{name}"] = self.core_signature.members[name]
        super().__init__(members)

    def verilog_modules(self) -> str:
        return core_verilog(self.cfg.with_cards(1))  # the same core for any ring: convert it once

    def _instance(self, m: Module, index: int):
        """Core `index` as an instance of CORE_MODULE, and an interface object standing for its ports."""
        core = self.core_signature.create(path=(f"core{index}",))
        ports = {"i_clk": ClockSignal(), "i_rst": ResetSignal()}
        for path, member, value in self.core_signature.flatten(core):
            ports[("i_" if member.flow == In else "o_") + "__".join(map(str, path))] = value
        m.submodules[f"core{index}"] = Instance(CORE_MODULE, **ports)
        return core

    def elaborate(self, platform):
        m = Module()
        cores = [self._instance(m, i) for i in range(self.cards)]
        halted, stopped = [], []
        for i, core in enumerate(cores):
            m.d.comb += [core.start.eq(self.start), core.pos.eq(self.pos), core.rows.eq(self.rows),
                         core.card_id.eq(i), core.cards.eq(self.cards), core.program_base.eq(0),
                         core.hbm_base.eq(0), core.host_base.eq(0)]
            for name in self.outside_ports:
                if name in ("tx", "rx"):
                    continue
                wiring.connect(m, getattr(core, name), wiring.flipped(getattr(self, f"c{i}_{name}")))
            for name in self.status_ports:
                m.d.comb += getattr(self, f"c{i}_{name}").eq(getattr(core, name))
            halted.append(core.done)
            stopped.append(core.error != ErrorCode.NONE)
            tx, rx = core.tx, cores[(i + 1) % self.cards].rx
            go = lfsr_bit(m, 0xACE1 + 77 * i, f"link{i}") if self.pause_links else 1
            m.d.comb += [rx.tdata.eq(tx.tdata), rx.tlast.eq(tx.tlast), rx.tvalid.eq(tx.tvalid & go),
                         tx.tready.eq(rx.tready & go)]
        m.d.comb += self.finished.eq(Cat(*halted).all() | Cat(*stopped).any())
        return m

"""KernelRing: the Vitis kernels of a ring in one simulation, as the simulated PYNQ platform drives them.

The kernel (`hw.kernel.kernel.KernelTop`, module `ringgpt_kernel`) is converted to Verilog once and instantiated
once per card (`verilog_modules` returns its text; the runner appends it), as RingTop does for the bare core.
Card i's kernel keeps its Vitis port names, prefixed `c<i>_` at the top: `c0_s_axi_control_awaddr`,
`c0_m_axi_hbm00_araddr`, `c0_interrupt`, ... The testbench drives each `s_axi_control` with an AXI4-Lite master
and answers each `m_axi_<port>` with a memory. All kernels share the top's clock (`ap_clk`) and reset:
`ap_rst_n` is `rst` inverted through a register, as a platform's reset block drives it, which starts high (so the
kernel's own reset register changes at the first edges, and Icarus evaluates every combinational block of the
kernel: it runs an `always @*` only when one of its inputs changes). The ring is closed inside: kernel i's
`ring_tx` drives kernel i+1's `ring_rx`; with `pause_links`, each link's handshake is gated by an LFSR (random
pauses on the ring, for tests).
"""
from __future__ import annotations

from amaranth.hdl import ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from ringgpt.hw.kernel.kernel import RING_PORTS, KernelTop

from .top import lfsr_bit, config_of

CLOCK, RESET = "ap_clk", "ap_rst_n"


class KernelRing(wiring.Component):
    """`cards` kernels on a ring (see the module docstring)."""

    def __init__(self, config: str = "sim-small", cards: int | None = None, pause_links: bool = False):
        cfg = config_of(config)
        self.cfg = cfg if cards is None else cfg.with_cards(cards)
        self.cards = self.cfg.cards
        self.pause_links = pause_links
        self.kernel_signature = KernelTop.signature_of(self.cfg)
        self.outside = {name: member for name, member in self.kernel_signature.members.items()
                        if name not in (CLOCK, RESET) and not name.startswith(tuple(RING_PORTS))}
        """The kernel's ports that the testbench drives or answers (s_axi_control, m_axi_*, interrupt)."""
        super().__init__({f"c{i}_{name}": member for i in range(self.cards) for name, member in self.outside.items()})

    def verilog_modules(self) -> str:
        return KernelTop.verilog(self.cfg.with_cards(1))  # the same kernel for any ring: convert it once

    def elaborate(self, platform):
        m = Module()
        reset_n = Signal(init=1, reset_less=True, name="ap_rst_n")
        m.d.sync += reset_n.eq(~ResetSignal())
        kernels = [self.kernel_signature.create(path=(f"kernel{i}",)) for i in range(self.cards)]
        for i, kernel in enumerate(kernels):
            m.submodules[f"kernel{i}"] = KernelTop.instance(kernel)
            m.d.comb += [getattr(kernel, CLOCK).eq(ClockSignal()), getattr(kernel, RESET).eq(reset_n)]
            for name, member in self.outside.items():
                inside, outside = getattr(kernel, name), getattr(self, f"c{i}_{name}")
                m.d.comb += inside.eq(outside) if member.flow == In else outside.eq(inside)
        tx, rx = RING_PORTS
        for i, kernel in enumerate(kernels):
            after = kernels[(i + 1) % self.cards]
            go = lfsr_bit(m, 0xACE1 + 77 * i, f"link{i}") if self.pause_links else 1
            m.d.comb += [getattr(after, f"{rx}_tdata").eq(getattr(kernel, f"{tx}_tdata")),
                         getattr(after, f"{rx}_tlast").eq(getattr(kernel, f"{tx}_tlast")),
                         getattr(after, f"{rx}_tvalid").eq(getattr(kernel, f"{tx}_tvalid") & go),
                         getattr(kernel, f"{tx}_tready").eq(getattr(after, f"{rx}_tready") & go)]
        return m

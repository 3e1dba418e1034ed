"""The Vitis RTL kernel: one core (hw/core/core.py) behind the `s_axi_control` register map of registers.py.

    host ── s_axi_control (AXI4-Lite) ──▶ control, GIE/IER/ISR, arguments ──▶ Core ── m_axi_prog, m_axi_hbmNN,
                                ◀── status words, ap_done ◀── busy/done ◀──┘        m_axi_host (AXI4 masters)
                                                                                    ring_tx / ring_rx (AXI4-Stream)

Ports, flat with the names Vitis requires (Amaranth would join a nested member's path with `__`):
`ap_clk`; `ap_rst_n` (active low, synchronous; registered once before it resets the kernel); `interrupt`
(level); `s_axi_control_<signal>` (AxiLite below); `m_axi_<port>_<signal>` for each port of
registers.master_ports(cfg), with the members of the core's Axi4 ports (hw/core/axi.py; `prog` reads only);
`ring_tx_<signal>` (source) and `ring_rx_<signal>` (sink) with the core's AxiStream members. Vitis infers the
AXI4 signals the core does not drive (lock, cache, prot, qos, region) with their defaults, as its RTL kernel
wizard's masters do, so none is added.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

from amaranth.hdl import C, Cat, ClockDomain, Instance, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.core import Core

from . import registers
from .registers import (AP_DONE, AP_IDLE, AP_READY, AP_START, CONTROL, DATA_BITS, GIE, IER, IRQ_DONE, IRQ_READY,
                        ISR, master_ports, register_map)

KERNEL_MODULE = "ringgpt_kernel"
RING_PORTS = {"ring_tx": "tx", "ring_rx": "rx"}
"""The kernel's ring ports and the core's members they bring out."""
IRQ_BITS = (IRQ_DONE | IRQ_READY).bit_length()
WORD_SHIFT = (DATA_BITS // 8).bit_length() - 1
"""log2 of the bytes in a register word."""


class AxiLite(wiring.Signature):
    """An AXI4-Lite port from the master's side (the host's), without the optional AxPROT."""

    def __init__(self, address_bits: int, data_bits: int):
        super().__init__({"awvalid": Out(1), "awready": In(1), "awaddr": Out(address_bits),
                          "wvalid": Out(1), "wready": In(1), "wdata": Out(data_bits), "wstrb": Out(data_bits // 8),
                          "arvalid": Out(1), "arready": In(1), "araddr": Out(address_bits),
                          "rvalid": In(1), "rready": Out(1), "rdata": In(data_bits), "rresp": In(2),
                          "bvalid": In(1), "bready": Out(1), "bresp": In(2)})


CONTROL_PORT = In(AxiLite(registers.ADDRESS_BITS, DATA_BITS))
"""`s_axi_control`, as the kernel sees it (a slave)."""


def flat_name(prefix: str, path: tuple) -> str:
    """A Vitis port name: `prefix` and the member's path joined with single underscores."""
    return "_".join((prefix, *map(str, path)))


def flat_members(prefix: str, member: wiring.Member) -> dict[str, wiring.Member]:
    """The port members of interface member `member` as flat members `<prefix>_<name>`, with the flows the
    member gives them (an `In(...)` member's signature is the flipped one)."""
    return {flat_name(prefix, path): port for path, port in member.signature.members.flatten()}


def _bit(mask: int) -> int:
    return mask.bit_length() - 1


class KernelTop(wiring.Component):
    """The Vitis kernel `ringgpt_kernel` for `cfg` (see the module docstring), ap_ctrl_hs as registers.py lays out.

    Control: writing AP_START sets ap_start; the core takes it (its `start` pulse, with the argument registers
    as they are then) on the next cycle it is not busy, which clears ap_start. ap_done and ap_ready are set
    together when the core halts or stops on an error, and cleared by the read of the control register that
    returns them (each run's done is read once); ap_idle is high while neither ap_start nor a run is pending.
    ISR bit i is set when its event happens while IER bit i is set, and toggled by writing 1 to it;
    `interrupt` is GIE & (IER & ISR) != 0. Arguments feed the core directly (they must stay as they are
    while it runs: the DMA reads its bases and the router its place on the ring throughout); status words
    read the core's outputs (the low DATA_BITS of wider ones); writes to them, to unmapped words and to the
    unused high word of a 32-bit argument are ignored, and such words read 0.

    Latency: a write's address is accepted the cycle it is valid (when no write is in progress), its data a
    cycle later at the earliest, and its response is valid the cycle after the data (the register holds the
    new value from then); a read's address is accepted the cycle it is valid (when no read is in progress)
    and its data, sampled then, is valid the next cycle. Throughput: a write per 3 cycles, a read per 2.
    """

    def __init__(self, cfg: ArchConfig):
        self.cfg = cfg
        self.core = Core(cfg)
        core_members = self.core.signature.members
        self.core_ports = master_ports(cfg)
        """The kernel's master ports (prog, hbm00.., host): each brings out the core's port of the same name."""
        members = {"ap_clk": In(1), "ap_rst_n": In(1), "interrupt": Out(1)}
        members.update(flat_members("s_axi_control", CONTROL_PORT))
        for port in self.core_ports:
            members.update(flat_members(f"m_axi_{port}", core_members[port]))
        for port, core_port in RING_PORTS.items():
            members.update(flat_members(port, core_members[core_port]))
        super().__init__(members)

    @classmethod
    def signature_of(cls, cfg: ArchConfig) -> wiring.Signature:
        """The kernel's signature, without elaborating one (for a top that instantiates its Verilog)."""
        kernel = cls(cfg)
        core = kernel.core
        for part in (kernel, core, core.controller, core.fetch, *core.units.values()):
            part._MustUse__silence = True
        return kernel.signature

    @staticmethod
    def instance(ports) -> Instance:
        """An instance of module `ringgpt_kernel` (KernelTop.verilog's) whose ports are the members of `ports`, an
        interface with the kernel's signature (e.g. `KernelTop.signature_of(cfg).create()`, or a component's)."""
        return Instance(KERNEL_MODULE, **{("i_" if member.flow == In else "o_") + name: getattr(ports, name)
                                          for name, member in ports.signature.members.items()})

    @staticmethod
    @functools.cache
    def verilog(cfg: ArchConfig) -> str:
        """Verilog of the whole kernel for `cfg`: module `ringgpt_kernel` and its submodules."""
        from ringgpt.hw.verilog import convert

        return convert(KernelTop(cfg), name=KERNEL_MODULE)

    def _flat(self, prefix: str, member: wiring.Member) -> SimpleNamespace:
        return SimpleNamespace(**{name[len(prefix) + 1:]: getattr(self, name) for name in flat_members(prefix, member)})

    def _bring_out(self, m: Module, prefix: str, interface) -> None:
        """Connects the core's interface `interface` to this kernel's flat ports `<prefix>_<name>`."""
        for path, member, value in interface.signature.flatten(interface):
            port = getattr(self, flat_name(prefix, path))
            m.d.comb += port.eq(value) if member.flow == Out else value.eq(port)

    def _core_input(self, register: registers.Register) -> Value:
        """The core's host-interface input that argument `register` drives."""
        core = self.core
        if register.kind == "scalar":
            return getattr(core, register.name)
        port = register.port
        if port == "prog":
            return core.program_base
        if port == "host":
            return core.host_base
        return core.hbm_base[core.units["dma"].ports.index(port)]  # the DMA's ports: its channels, then host

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = sync = ClockDomain("sync", local=True)
        reset = Signal(init=1, reset_less=True)  # Vitis asks for ap_rst_n pipelined: it fans out to the whole core
        m.d.sync += reset.eq(~self.ap_rst_n)
        m.d.comb += [sync.clk.eq(self.ap_clk), sync.rst.eq(reset)]

        m.submodules.core = core = self.core
        for port in self.core_ports:
            self._bring_out(m, f"m_axi_{port}", getattr(core, port))
        for port, core_port in RING_PORTS.items():
            self._bring_out(m, port, getattr(core, core_port))

        bus = self._flat("s_axi_control", CONTROL_PORT)

        def word_of(address: Value) -> Value:
            """The 32-bit word a byte address falls in."""
            return address[WORD_SHIFT:]

        # --- AXI4-Lite write: address, then data, then response (outputs are registers or single expressions:
        # Icarus in SystemVerilog mode never evaluates a Yosys `always @*` block whose inputs keep their initial
        # values, so a ready decoded from an FSM state would read X until the state first changed) ----------------
        write_address, have_address = Signal.like(bus.awaddr), Signal()
        write = Signal()
        m.d.comb += [bus.awready.eq(~have_address & ~bus.bvalid), bus.wready.eq(have_address),
                     write.eq(have_address & bus.wvalid)]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [write_address.eq(bus.awaddr), have_address.eq(1)]
        with m.If(write):
            m.d.sync += [have_address.eq(0), bus.bvalid.eq(1)]
        with m.If(bus.bvalid & bus.bready):
            m.d.sync += bus.bvalid.eq(0)

        def written(offset: int) -> Value:
            return write & (word_of(write_address) == offset >> WORD_SHIFT)

        def write_bytes(target: Value) -> None:
            """`target` (up to DATA_BITS bits) takes the written bytes whose strobes are set."""
            for byte in range(0, len(target), 8):
                with m.If(bus.wstrb[byte // 8]):
                    m.d.sync += target[byte:byte + 8].eq(bus.wdata[byte:byte + 8])

        # --- control, interrupts ------------------------------------------------------------------------------
        ap_start, ap_done, ap_ready = Signal(), Signal(), Signal()
        gie, ier, isr = Signal(), Signal(IRQ_BITS), Signal(IRQ_BITS)
        done_seen = Signal()
        m.d.sync += done_seen.eq(core.done)
        finished = core.done & ~done_seen  # the cycle the core's done rises
        take = ap_start & ~core.busy
        idle = ~(ap_start | core.busy)
        m.d.comb += [core.start.eq(take), self.interrupt.eq(gie & (ier & isr).any())]
        control_write = written(CONTROL) & bus.wstrb[0]
        m.d.sync += ap_start.eq((ap_start & ~take) | (control_write & bus.wdata[_bit(AP_START)]))
        with m.If(written(GIE) & bus.wstrb[0]):
            m.d.sync += gie.eq(bus.wdata[0])
        with m.If(written(IER) & bus.wstrb[0]):
            m.d.sync += ier.eq(bus.wdata[:IRQ_BITS])
        for mask, event in ((IRQ_DONE, finished), (IRQ_READY, finished)):
            bit = _bit(mask)
            with m.If(ier[bit] & event):
                m.d.sync += isr[bit].eq(1)
            with m.Elif(written(ISR) & bus.wstrb[0]):
                m.d.sync += isr[bit].eq(isr[bit] ^ bus.wdata[bit])

        # --- arguments and status -----------------------------------------------------------------------------
        control = [C(0, 1)] * DATA_BITS
        for mask, value in ((AP_START, ap_start), (AP_DONE, ap_done | finished), (AP_IDLE, idle),
                            (AP_READY, ap_ready | finished)):
            control[_bit(mask)] = value
        words = {CONTROL: Cat(*control), GIE: gie, IER: ier, ISR: isr}
        for register in register_map(self.cfg):
            if register.kind == "status":
                words[register.offset] = Value.cast(getattr(core, register.name))[:DATA_BITS]
                continue
            argument = Signal(register.bits, name=register.name)
            m.d.comb += self._core_input(register).eq(argument)
            for offset in range(0, register.bits // 8, DATA_BITS // 8):
                words[register.offset + offset] = argument[offset * 8:offset * 8 + DATA_BITS]
                with m.If(written(register.offset + offset)):
                    write_bytes(words[register.offset + offset])

        # --- AXI4-Lite read: address, then data -----------------------------------------------------------------
        read = Signal()
        control_read = Signal()
        m.d.comb += [bus.arready.eq(~bus.rvalid), read.eq(bus.arvalid & bus.arready),
                     control_read.eq(read & (word_of(bus.araddr) == CONTROL >> WORD_SHIFT))]
        with m.If(read):
            m.d.sync += [bus.rvalid.eq(1), bus.rdata.eq(0)]
            with m.Switch(word_of(bus.araddr)):
                for offset, value in words.items():
                    with m.Case(offset >> WORD_SHIFT):
                        m.d.sync += bus.rdata.eq(value)
        with m.Elif(bus.rvalid & bus.rready):
            m.d.sync += bus.rvalid.eq(0)
        m.d.sync += [ap_done.eq((ap_done | finished) & ~control_read),
                     ap_ready.eq((ap_ready | finished) & ~control_read)]
        return m

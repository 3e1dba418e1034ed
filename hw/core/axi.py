"""AXI4 and AXI4-Stream signatures of the core's outside ports, seen from the core (the master).

Members carry the AMBA names without the channel prefix separator (`awaddr`, `wvalid`, `rdata`, ...), so
a port `hbm0` converts to Verilog ports `hbm0__awaddr`, ... and cocotbext-axi binds to it with
`AxiBus.from_prefix(dut, "hbm0_")`. The Vitis kernel renames them to `m_axi_hbm00_awaddr` and so on.
Only the signals the core drives or needs are members: bursts are INCR, unaligned starts are not
issued, `awsize`/`arsize` are always the full data width, no locks, caches, QoS or regions.
"""
from __future__ import annotations

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

AXI_ADDRESS_BITS = 64
"""Byte addresses on every AXI4 port (the U280's HBM and host buffers are above 4 GiB)."""
AXI_ID_BITS = 4
"""Transaction IDs: the DMA keeps up to 2**AXI_ID_BITS requests in flight per port."""
AXI_MAX_BURST = 256
"""Beats of the longest INCR burst (AXI4), which must also stay within one 4 KiB page."""
AXI_PAGE_BYTES = 4096


class Axi4(wiring.Signature):
    """An AXI4 master port of `data_bits` data bits (from the master's side). `read_only` drops the
    write channels (the instruction fetch port)."""

    def __init__(self, data_bits: int, *, read_only: bool = False):
        if data_bits % 8 or data_bits < 32 or data_bits & (data_bits - 1):
            raise ValueError(f"AXI4 data width must be a power of two of at least 32 bits, got {data_bits}")
        self.data_bits, self.read_only = data_bits, read_only
        members = {"arid": Out(AXI_ID_BITS), "araddr": Out(AXI_ADDRESS_BITS), "arlen": Out(8),
                   "arsize": Out(3), "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
                   "rid": In(AXI_ID_BITS), "rdata": In(data_bits), "rresp": In(2), "rlast": In(1),
                   "rvalid": In(1), "rready": Out(1)}
        if not read_only:
            members.update({"awid": Out(AXI_ID_BITS), "awaddr": Out(AXI_ADDRESS_BITS), "awlen": Out(8),
                            "awsize": Out(3), "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
                            "wdata": Out(data_bits), "wstrb": Out(data_bits // 8), "wlast": Out(1),
                            "wvalid": Out(1), "wready": In(1),
                            "bid": In(AXI_ID_BITS), "bresp": In(2), "bvalid": In(1), "bready": Out(1)})
        super().__init__(members)

    @property
    def size_code(self) -> int:
        """AxSIZE of a full-width beat: log2 of the bytes per beat."""
        return (self.data_bits // 8).bit_length() - 1

    def __eq__(self, other):
        return type(other) is Axi4 and (other.data_bits, other.read_only) == (self.data_bits, self.read_only)

    def __repr__(self):
        return f"Axi4({self.data_bits}{', read_only=True' if self.read_only else ''})"


class AxiStream(wiring.Signature):
    """An AXI4-Stream source of `data_bits` (from the source's side): `tdata`, `tlast`, `tvalid`, `tready`.
    `tready` is the flow control: a sink that cannot take a beat holds it low, so nothing is overrun."""

    def __init__(self, data_bits: int):
        if data_bits % 8 or data_bits < 8:
            raise ValueError(f"AXI4-Stream data width must be whole bytes, got {data_bits}")
        self.data_bits = data_bits
        super().__init__({"tdata": Out(data_bits), "tlast": Out(1), "tvalid": Out(1), "tready": In(1)})

    def __eq__(self, other):
        return type(other) is AxiStream and other.data_bits == self.data_bits

    def __repr__(self):
        return f"AxiStream({self.data_bits})"

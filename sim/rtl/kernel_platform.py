"""SimKernelPlatform: the platform protocol of host/alveo/platform.py over the kernels' RTL, so that AlveoDevice's
own code runs on the Vitis kernel through the register map and buffers the boards have:

    AlveoDevice(config, platform=SimKernelPlatform(config, simulator="icarus"))

The kernels (`KernelRing`: one `ringgpt_kernel` per card, ring closed) run as a cocotb test in a simulator
process (sim/rtl/kernel_server.py) that serves register reads and writes (through an AXI4-Lite master on each
kernel's `s_axi_control`), reads and writes of the memories behind the `m_axi` ports, and clock cycles, over a
local socket. Buffers are allocated here: argument `a`'s buffers of a card lie in the bank of the argument's
master port (`program` in prog's, `host` in host's, `hbmNN` in hbmNN's), bank p of the card's master ports
(registers.master_ports) at MEMORY_BASE + p * bank_bytes, above 4 GiB as Alveo's HBM banks are not, so the
pointers' high words matter. The platform's clock is simulated time: the driver's timeout is a cycle limit.
"""
from __future__ import annotations

import json

import numpy as np

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.kernel.registers import master_ports, register_map
from ringgpt.sim.cocotb_support import runner
from ringgpt.sim.cocotb_support.bench import CLOCK_PERIOD_NS

from .device import DEFAULT_CYCLE_LIMIT
from .process import RtlError, SimulationProcess

MEMORY_BASE = 1 << 32
"""Byte address of a card's first bank in the simulation (bank p at MEMORY_BASE + p * bank size)."""
PAGE = 4096
"""Buffers start on page boundaries, as XRT's do."""


def design_of(config: ArchConfig, pause_links: bool = False) -> runner.Design:
    """The simulated ring of kernels for `config` (ring links pausing at random)."""
    return runner.Design.of("ringgpt.sim.rtl.kernel_ring:KernelRing",
                            config=json.dumps(config.to_dict(), sort_keys=True),
                            pause_links=pause_links).with_cxx_opt(runner.LARGE_DESIGN_CXX_OPT)


class SimBuffer:
    """A buffer in one bank of a simulated card: `array` here, its bytes in the port's memory there."""

    def __init__(self, card: SimKernelCard, port: str, offset: int, nbytes: int):
        self._card, self._port, self._offset = card, port, offset
        self.array = np.zeros(nbytes, np.uint8)
        self.device_address = card.bank_base(port) + offset

    def sync_to_device(self, offset: int, nbytes: int) -> None:
        self._card.call("store", self._port, self._offset + offset, self.array[offset:offset + nbytes].tobytes())

    def sync_from_device(self, offset: int, nbytes: int) -> None:
        data = self._card.call("fetch", self._port, self._offset + offset, nbytes)
        self.array[offset:offset + nbytes] = np.frombuffer(data, np.uint8)

    def free(self) -> None:
        self._card.release(self._port, self._offset)


class SimKernelCard:
    """One simulated card's kernel: its registers, and first-fit allocation in the banks of its master ports."""

    def __init__(self, platform: SimKernelPlatform, index: int):
        self._platform, self.index = platform, index
        self._ports = {r.name: r.port for r in register_map(platform.config) if r.kind == "pointer"}
        self._used: dict[str, dict[int, int]] = {port: {} for port in master_ports(platform.config)}
        """Per port, the allocated ranges: {offset in the bank: bytes}."""

    def call(self, command: str, *arguments):
        return self._platform.process.call(command, self.index, *arguments)

    def bank_base(self, port: str) -> int:
        return MEMORY_BASE + master_ports(self._platform.config).index(port) * self._platform.bank_bytes

    def read(self, offset: int) -> int:
        return self.call("read", offset)

    def write(self, offset: int, value: int) -> None:
        self.call("write", offset, value)

    def allocate(self, nbytes: int, argument: str) -> SimBuffer:
        port = self._ports[argument]
        offset = 0
        for start, size in sorted(self._used[port].items()):
            if offset + nbytes <= start:
                break
            offset = -(-(start + size) // PAGE) * PAGE
        if offset + nbytes > self._platform.bank_bytes:
            raise RtlError(f"card {self.index}: {nbytes} more bytes do not fit the {self._platform.bank_bytes} "
                           f"bytes of the simulated bank of {port}")
        self._used[port][offset] = nbytes
        return SimBuffer(self, port, offset, nbytes)

    def release(self, port: str, offset: int) -> None:
        del self._used[port][offset]


class SimKernelPlatform:
    """`config.cards` kernels on a ring in one simulation (`simulator`: verilator or icarus); `pause`: memories
    and ring links pause at random (for tests; slower); `cycle_limit`: the driver's default timeout in cycles."""

    def __init__(self, config: ArchConfig, simulator: str = "verilator", pause: bool = False,
                 cycle_limit: int = DEFAULT_CYCLE_LIMIT):
        self.config = config
        self.bank_bytes = config.hbm_channel_mbytes << 20
        """Each port's memory: one HBM pseudo-channel's size (a power of two dividing MEMORY_BASE)."""
        if self.bank_bytes & (self.bank_bytes - 1) or MEMORY_BASE % self.bank_bytes:
            raise ValueError(f"the simulated banks need a power-of-two size up to 4 GiB, got {self.bank_bytes}")
        self.process = SimulationProcess(design_of(config, pause), "ringgpt.sim.rtl.kernel_server", simulator,
                                         {"pause": pause, "bank_bytes": self.bank_bytes}, "kernel-platform",
                                         "the simulated Alveo platform")
        self.cards = [SimKernelCard(self, index) for index in range(config.cards)]
        self.default_timeout_s = cycle_limit * CLOCK_PERIOD_NS * 1e-9
        self.description = f"the kernel RTL of {config.cards} card(s) ({simulator})"

    def now(self) -> float:
        """Simulated seconds."""
        return self.process.cycles * CLOCK_PERIOD_NS * 1e-9

    def sleep(self, seconds: float) -> None:
        self.process.call("sleep", max(1, round(seconds / (CLOCK_PERIOD_NS * 1e-9))))

    def close(self) -> None:
        self.process.close()

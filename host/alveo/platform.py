"""The platform the Alveo driver speaks to: the smallest layer under AlveoDevice, and its PYNQ implementation.

A platform is a ring of kernels, one per card, each reached by:
  - `read(offset) -> int` and `write(offset, value)`: one 32-bit word of the kernel's `s_axi_control` register
    map (hw/kernel/registers.py);
  - `allocate(nbytes, argument) -> Buffer`: a buffer in the memory that the kernel's pointer argument `argument`
    (`program`, `host`, `hbm00` ...) reaches through its AXI4 master port, at an address the kernel can use;
and, for the whole ring, `now()` and `sleep(seconds)` (the platform's clock, which bounds a run: wall time on
boards, simulated time in a simulation), `default_timeout_s`, `description` and `close()`.

A Buffer is `device_address` (the byte address the kernel's pointer register takes), `array` (a uint8 numpy
array of its bytes on the host side), `sync_to_device(offset, nbytes)` / `sync_from_device(offset, nbytes)`
(copy that byte range of `array` to or from the card's memory) and `free()`.

`PynqPlatform` opens the boards with PYNQ 3.0.1 on XRT: one `pynq.Overlay` per card, in the order of
`pynq.Device.devices` (cable card i's ring port to card i+1's). The kernel's compute unit is found by the
kernel's name in the xclbin; its registers are read and written through PYNQ's `DefaultIP.read` / `write`
(MMIO on the PCIe BAR through XRT's xclRead / xclWrite), the compute unit being opened in PYNQ's (shared)
context; runs are started by writing ap_start, not through XRT's scheduler. Buffers come from
`pynq.allocate(..., target=<memory bank>)` in the bank that the xclbin connects the argument to (the v++
`sp=` option: `hbmNN` in HBM[NN]).
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Protocol

import numpy as np

from ringgpt.host.device import DeviceError
from ringgpt.hw.config import ArchConfig, ConfigMismatchError
from ringgpt.hw.kernel.kernel import KERNEL_MODULE
from ringgpt.hw.kernel.registers import register_map
from ringgpt.hw.kernel.vitis import DEFAULT_PLATFORM, PLATFORMS

PYNQ_VERSION = "3.0.1"
REQUIREMENTS = (f"the alveo backend needs PYNQ {PYNQ_VERSION} (pip install 'ringgpt[alveo]'), XRT "
                f"{PLATFORMS[DEFAULT_PLATFORM].vitis} (source /opt/xilinx/xrt/setup.sh) and one Alveo U280 per card "
                f"with the {DEFAULT_PLATFORM} platform installed")
"""What the boards' back end needs, for the one-line message when something is missing."""
BOARD_TIMEOUT_S = 10.0
"""How long one run may take on the boards before the driver gives up on it."""


def build_command(cfg: ArchConfig) -> str:
    """The command that builds `cfg`'s bitstream into its default folder."""
    return f"python scripts/build_bitstream.py --config {cfg.name.rsplit('-x', 1)[0]} --cards {cfg.cards}"


class AlveoUnavailableError(DeviceError):
    """The boards' back end cannot start here: PYNQ, XRT, boards or the bitstream missing."""


class Buffer(Protocol):
    device_address: int
    array: np.ndarray

    def sync_to_device(self, offset: int, nbytes: int) -> None: ...

    def sync_from_device(self, offset: int, nbytes: int) -> None: ...

    def free(self) -> None: ...


class KernelCard(Protocol):
    """One card's kernel: its register map and the memories its master ports reach."""

    def read(self, offset: int) -> int: ...

    def write(self, offset: int, value: int) -> None: ...

    def allocate(self, nbytes: int, argument: str) -> Buffer: ...


class Platform(Protocol):
    cards: list
    """One KernelCard per card, in ring order."""
    description: str
    default_timeout_s: float

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def close(self) -> None: ...


def import_pynq():
    """The pynq module, or AlveoUnavailableError saying what is missing."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pynqutils' deprecation warnings on import
            import pynq
    except ImportError as exc:
        hint = (" (PYNQ's pynqutils needs setuptools < 81: pip install 'setuptools<81')"
                if exc.name == "pkg_resources" else "")
        raise AlveoUnavailableError(f"PYNQ cannot be imported: {exc}{hint}; {REQUIREMENTS}") from None
    if pynq.__version__ != PYNQ_VERSION:
        raise AlveoUnavailableError(f"PYNQ {pynq.__version__} is installed, not {PYNQ_VERSION}; {REQUIREMENTS}")
    return pynq


def boards(cards: int) -> list:
    """The first `cards` XRT devices PYNQ finds, or AlveoUnavailableError naming how many there are."""
    pynq = import_pynq()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PYNQ's "is the XRT environment sourced?": the error below says it
        found = list(pynq.Device.devices)
    if len(found) < cards:
        names = ", ".join(f"{device.tag} ({device.name})" for device in found) or "none"
        raise AlveoUnavailableError(f"the ring needs {cards} Alveo board(s), one per card, and XRT finds "
                                    f"{len(found)} ({names}); {REQUIREMENTS}")
    return found[:cards]


class PynqBufferView:
    """A Buffer over a `pynq.allocate`d array (uint8)."""

    def __init__(self, array):
        self._array = array
        self.array = array
        self.device_address = int(array.device_address)

    def sync_to_device(self, offset: int, nbytes: int) -> None:
        self._array[offset:offset + nbytes].sync_to_device()

    def sync_from_device(self, offset: int, nbytes: int) -> None:
        self._array[offset:offset + nbytes].sync_from_device()

    def free(self) -> None:
        self._array.freebuffer()


class PynqCard:
    """One board with the xclbin loaded: the kernel's compute unit and the memory banks of its arguments."""

    def __init__(self, pynq, device, xclbin: Path, cfg: ArchConfig, kernel: str):
        self._pynq, self._build = pynq, build_command(cfg)
        self.overlay = pynq.Overlay(str(xclbin), device=device)
        try:
            self._find_kernel(device, xclbin, cfg, kernel)
        except BaseException:
            self.overlay.free()
            raise

    def _find_kernel(self, device, xclbin: Path, cfg: ArchConfig, kernel: str) -> None:
        """The kernel's compute unit, its argument offsets checked against the register map."""
        units = [name for name, ip in self.overlay.ip_dict.items()
                 if ip.get("cu_name", "").partition(":")[0] == kernel]
        if len(units) != 1:
            raise AlveoUnavailableError(f"{device.tag}: {xclbin} has {len(units)} compute units of kernel {kernel!r} "
                                        f"({', '.join(units) or 'none'}); the ring needs exactly one per card: "
                                        f"rebuild it with {self._build}")
        self.name = units[0]
        arguments = self.overlay.ip_dict[self.name]["registers"]
        for register in register_map(cfg):
            if register.kind == "status":
                continue
            found = arguments.get(register.name, {}).get("address_offset")
            if found != register.offset:
                raise ConfigMismatchError(f"{device.tag}: the xclbin's kernel has argument {register.name!r} at "
                                          f"{found if found is None else hex(found)}, this driver's register map at "
                                          f"{register.offset:#x}; rebuild it from this checkout with "
                                          f"{self._build}")
        self._arguments = arguments
        self.unit = getattr(self.overlay, self.name)

    def read(self, offset: int) -> int:
        return int(self.unit.read(offset))

    def write(self, offset: int, value: int) -> None:
        self.unit.write(offset, int(value))

    def allocate(self, nbytes: int, argument: str) -> PynqBufferView:
        bank = self._arguments[argument].get("memory")
        if bank is None:
            raise AlveoUnavailableError(f"the xclbin connects the kernel's argument {argument!r} to no memory bank; "
                                        f"rebuild it with {self._build}")
        target = self.overlay.device.get_memory_by_name(bank)
        return PynqBufferView(self._pynq.allocate((nbytes,), np.uint8, target=target))

    def close(self) -> None:
        self.overlay.free()


class PynqPlatform:
    """`cfg.cards` Alveo boards, each with `xclbin` loaded (see the module docstring)."""

    default_timeout_s = BOARD_TIMEOUT_S

    def __init__(self, xclbin: str | Path, cfg: ArchConfig, kernel: str = KERNEL_MODULE):
        xclbin = Path(xclbin)
        if not xclbin.is_file():
            raise AlveoUnavailableError(f"the xclbin {xclbin} does not exist: build it with {build_command(cfg)}")
        pynq = import_pynq()
        self.cards = []
        try:
            for device in boards(cfg.cards):
                self.cards.append(PynqCard(pynq, device, xclbin, cfg, kernel))
        except BaseException:
            self.close()
            raise
        self.description = f"{len(self.cards)} Alveo board(s) with {xclbin.name}"

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        for card in self.cards:
            card.close()
        self.cards = []

"""The one device interface in front of the functional simulator, the RTL simulation and the Alveo
boards: load an appliance image, write inputs into the host buffers, run every card's program from
a token position, read results back, ask for status. Every back end raises DeviceError (or a
subclass) with the card, pc and instruction when a run fails."""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.isa import Program, Space

MemoryReader = Callable[[Space, int, int], np.ndarray]
"""read(space, address, count): a copy of `count` words of one card's memory as it is at that moment."""
WatchCallback = Callable[[int, int, MemoryReader], None]
"""callback(card, pc, read), called right after card `card` has executed the instruction at `pc`."""


class DeviceError(RingGPTError, RuntimeError):
    """A run that stopped on an error: illegal instruction, bad address, deadlock, timeout (the CLI exits 1)."""

    exit_code = 1
    label = "device error"


class WatchUnsupportedError(DeviceError):
    """Device.run_watched on a back end that cannot stop after a given instruction."""


class ProgramsUnsupportedError(DeviceError):
    """Device.load_programs on a back end that cannot replace the loaded programs."""


@dataclass
class RunStats:
    """What one run (all cards, one call of Device.run) cost, as far as the back end can tell."""
    cycles: int = 0
    """Modeled or measured cycles from start to the last card's HALT."""
    seconds: float = 0.0
    """cycles at the config clock plus the host launch overhead."""
    hbm_bytes: int = 0
    """Bytes moved to or from HBM on all cards."""
    breakdown: dict = field(default_factory=dict)
    """Busy cycles by instruction class (the slowest card)."""
    wall_seconds: float = 0.0
    """Host wall-clock time the back end took (simulation speed)."""
    variants: dict = field(default_factory=dict)
    """{label: seconds} of the same run under other timing assumptions (another clock, a conservative set),
    for back ends that model time (SimulatorDevice(timing=...)); launch overhead included as in `seconds`."""


@dataclass
class DeviceStatus:
    name: str
    config_name: str
    cards: int
    loaded: bool
    runs: int = 0
    last_error: str | None = None


class Device(ABC):
    """A ring of `config.cards` cards, each running one program of a loaded ApplianceImage."""

    config: ArchConfig

    @abstractmethod
    def load(self, image) -> None:
        """Loads programs and HBM contents; raises ConfigMismatchError for an image of another config."""

    @abstractmethod
    def write_host(self, card: int, offset: int, words: np.ndarray) -> None:
        """Writes FP16 words (or uint16 bit patterns) into card `card`'s host buffer at `offset`."""

    @abstractmethod
    def read_host(self, card: int, offset: int, count: int) -> np.ndarray:
        """Reads `count` FP16 words from card `card`'s host buffer."""

    @abstractmethod
    def run(self, pos: int, rows: int) -> RunStats:
        """Runs every card's program with R1 = pos, R2 = rows until all HALT."""

    supports_watch: bool = False
    """Whether run_watched works on this back end (the optional hook of `ringgpt check`)."""

    def run_watched(self, pos: int, rows: int, watch: Mapping[tuple[int, int], WatchCallback]) -> RunStats:
        """Optional: `run`, calling watch[(card, pc)](card, pc, read) right after card `card` has executed the
        instruction at `pc` (cards run their programs in order and have no branches, so once per run), with
        `read(space, address, count)` returning a copy of that card's memory words as they are then. What a
        callback does must not change the run. Back ends that cannot stop there raise WatchUnsupportedError."""
        raise WatchUnsupportedError(f"{type(self).__name__} cannot watch instructions (no run_watched): "
                                    "layer-by-layer checks use layer dispatch (load_programs) there")

    supports_load_programs: bool = False
    """Whether load_programs works on this back end (layer dispatch: host/runtime/layers.py)."""

    def load_programs(self, programs: Sequence[Program]) -> None:
        """Optional: replaces every card's program of the loaded image by programs[card] (a Program built for
        that card of this config, as in ApplianceImage.cards[card].program), leaving HBM, ABUF, WBUF and the
        host buffers as they are; the next run starts it at pc 0. Raises ImageError or IllegalInstructionFault
        for a wrong card count or a malformed program, NotLoadedError before load. Back ends that cannot swap
        programs raise ProgramsUnsupportedError."""
        raise ProgramsUnsupportedError(f"{type(self).__name__} cannot load programs into a loaded image (no "
                                       "load_programs): layer dispatch needs a back end that can")

    @abstractmethod
    def status(self) -> DeviceStatus:
        ...

    def close(self) -> None:
        """Releases the back end's resources (boards, simulator processes)."""


BACKENDS = {"sim": "ringgpt.sim.functional.device:SimulatorDevice", "rtl": "ringgpt.sim.rtl.device:RtlDevice",
            "alveo": "ringgpt.host.alveo.driver:AlveoDevice"}
"""The Device back ends by name: the functional simulator, the RTL simulation and the Alveo boards' driver (whose
`platform` option runs it on the kernel's RTL instead: sim/rtl/kernel_platform.py). The runtime opens them
through `open_device` and speaks to `Device` alone."""


def open_device(backend: str, config: ArchConfig, **options) -> Device:
    """A `backend` device for `config`; `options` go to its constructor (e.g. timing for sim, simulator for rtl)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown device back end {backend!r}; known: {', '.join(BACKENDS)}")
    module, _, name = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), name)(config, **options)

"""The one device interface in front of the functional simulator, the RTL simulation and the Alveo
boards: load an appliance image, write inputs into the host buffers, run every card's program from
a token position, read results back, ask for status. Every back end raises DeviceError (or a
subclass) with the card, pc and instruction when a run fails."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from ringgpt.hw.config import ArchConfig


class DeviceError(RuntimeError):
    """A run that stopped on an error: illegal instruction, bad address, deadlock, timeout."""


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

    @abstractmethod
    def status(self) -> DeviceStatus:
        ...

    def close(self) -> None:
        """Releases the back end's resources (boards, simulator processes)."""

"""What the schedule reports: each card's cycles, busy cycles by unit, class and opcode, bytes moved, and its
timeline."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CardReport:
    """One card's share of a run."""
    card: int
    cycles: int = 0
    """Cycle at which the card's HALT completed."""
    instructions: int = 0
    busy: dict = field(default_factory=dict)
    """Unit name -> cycles the unit was busy."""
    classes: dict = field(default_factory=dict)
    """Instruction class (see instruction_class) -> busy cycles."""
    opcodes: dict = field(default_factory=dict)
    """Opcode name -> busy cycles."""
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    ring_bytes: int = 0
    host_bytes: int = 0
    timeline: list = field(default_factory=list)
    """(opcode name, issue, start, done) cycles of every executed instruction, in program order."""


@dataclass
class CycleReport:
    """The modeled schedule of one run on every card."""
    clock_mhz: float
    hbm_peak_gbps: float
    cards: list
    cycles: int = 0
    """Cycles from the start until the last card's HALT completed."""

    @property
    def ms(self) -> float:
        return self.cycles / (self.clock_mhz * 1e3)

    @property
    def hbm_bytes(self) -> int:
        return sum(c.hbm_read_bytes + c.hbm_write_bytes for c in self.cards)

    @property
    def slowest(self) -> CardReport:
        return max(self.cards, key=lambda c: c.cycles)

    @property
    def hbm_bound_ms(self) -> float:
        """The HBM bytes read by the busiest card at the physical HBM peak."""
        return max(c.hbm_read_bytes for c in self.cards) / (self.hbm_peak_gbps * 1e6)

    @property
    def hbm_bound_pct(self) -> float:
        """hbm_bound_ms as a percentage of the modeled time (100% = running at the HBM bound)."""
        return 100.0 * self.hbm_bound_ms / self.ms if self.cycles else 0.0

    def summary(self) -> dict:
        slowest = self.slowest
        return {"cycles": self.cycles, "ms": self.ms, "hbm_bytes": self.hbm_bytes,
                "hbm_bound_ms": self.hbm_bound_ms, "hbm_bound_pct": self.hbm_bound_pct,
                "slowest_card": slowest.card, "busy": dict(slowest.busy), "classes": dict(slowest.classes)}

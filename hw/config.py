"""The architecture configuration: one validated object from which the RTL, the simulator, the cycle
model, the compiler and the docs derive every size, width and rate.

Presets: `sim-small` (sized for RTL simulation) and `u280` (one compute core per Alveo U280).
`config.with_cards(n)` gives the same core on an n-card ring. A built artifact carries
`config.name` and `config.hash`; loading it under another config fails (ConfigMismatchError).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from ringgpt.hw.errors import RingGPTError

MAX_CARDS = 4


class ConfigError(RingGPTError, ValueError):
    """An architecture configuration that cannot be built, or a preset name or card count that contradicts itself."""


class ConfigMismatchError(RingGPTError, RuntimeError):
    """An artifact built for one configuration was loaded under another."""


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class ArchConfig:
    """One compute core per card, and the ring of `cards` cards around them.

    Sizes of on-chip buffers are in FP16 words; bandwidths in GB/s (1e9 bytes per second).
    """
    name: str
    cards: int
    mpu_lanes: int
    """Matrix-unit lanes: output columns produced per cycle (DFX: l = 16)."""
    mac_width: int
    """Multipliers per lane, reduced by the folding adder tree (DFX: d = 64)."""
    vector_width: int
    """Vector-unit lanes: FP16 elements per cycle."""
    clock_mhz: float
    abuf_words: int
    """Activation buffer (activations, scores, row statistics)."""
    wbuf_words: int
    """Weight buffer, two banks, filled by DMA while the matrix unit reads the other bank."""
    hbm_channels: int
    hbm_port_bits: int
    hbm_channel_mbytes: int
    hbm_peak_gbps: float
    """Physical HBM peak of one card (the bound that decode is measured against)."""
    hbm_efficiency: float
    """Fraction of the AXI port bandwidth sustained on long sequential bursts."""
    hbm_latency_cycles: int
    host_link_gbps: float
    """Host <-> card (PCIe) bandwidth."""
    launch_overhead_us: float
    """Host time to start one program run on every card and see it finish."""
    ring_link_gbps: float
    """One ring link's payload bandwidth, after framing overhead."""
    ring_latency_ns: float
    queue_depth: int
    """Instructions waiting per unit queue before the decoder stalls."""
    mpu_pipeline_cycles: int
    vpu_pipeline_cycles: int

    def __post_init__(self):
        def require(cond: bool, message: str):
            if not cond:
                raise ConfigError(f"config {self.name!r}: {message}")

        require(1 <= self.cards <= MAX_CARDS, f"cards must be 1..{MAX_CARDS}, got {self.cards}")
        for field in ("mpu_lanes", "mac_width", "vector_width"):
            require(_power_of_two(getattr(self, field)), f"{field} must be a power of two, got {getattr(self, field)}")
        require(self.clock_mhz > 0, f"clock_mhz must be positive, got {self.clock_mhz}")
        require(self.hbm_port_bits % 16 == 0 and self.hbm_port_bits > 0,
                f"hbm_port_bits must be a positive multiple of 16, got {self.hbm_port_bits}")
        require(0 < self.hbm_efficiency <= 1, f"hbm_efficiency must be in (0, 1], got {self.hbm_efficiency}")
        require(self.hbm_channels > 0 and self.hbm_channel_mbytes > 0, "HBM channels and their size must be positive")
        require(self.wbuf_words % 2 == 0 and self.wbuf_words >= 2 * self.mac_width * self.mpu_lanes,
                f"wbuf_words must be even and hold two banks of at least one {self.mac_width}x{self.mpu_lanes} "
                f"weight tile, got {self.wbuf_words}")
        require(self.abuf_words >= 4 * self.vector_width, f"abuf_words too small: {self.abuf_words}")
        require(self.abuf_words < 2 ** 32 and self.wbuf_words < 2 ** 32, "on-chip buffers must be addressable in 32 bits")
        require(self.hbm_words <= 2 ** 32, "HBM must be addressable in 32-bit word addresses")
        require(self.ring_link_gbps > 0 and self.host_link_gbps > 0, "link bandwidths must be positive")
        require(self.queue_depth >= 1, "queue_depth must be at least 1")

    # --- derived values -------------------------------------------------------------------
    @property
    def macs_per_cycle(self) -> int:
        return self.mpu_lanes * self.mac_width

    @property
    def wbuf_bank_words(self) -> int:
        return self.wbuf_words // 2

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_channels * self.hbm_channel_mbytes * 2 ** 20

    @property
    def hbm_words(self) -> int:
        return self.hbm_bytes // 2

    @property
    def hbm_port_gbps(self) -> float:
        """Bandwidth of all AXI ports at the kernel clock (may exceed the physical peak)."""
        return self.hbm_channels * self.hbm_port_bits / 8 * self.clock_mhz * 1e6 / 1e9

    @property
    def hbm_sustained_gbps(self) -> float:
        """What long weight streams get: the lesser of port and physical peak, times efficiency."""
        return min(self.hbm_port_gbps, self.hbm_peak_gbps) * self.hbm_efficiency

    @property
    def hbm_bytes_per_cycle(self) -> float:
        return self.hbm_sustained_gbps * 1e9 / (self.clock_mhz * 1e6)

    @property
    def ring_bytes_per_cycle(self) -> float:
        return self.ring_link_gbps * 1e9 / (self.clock_mhz * 1e6)

    @property
    def ring_latency_cycles(self) -> int:
        return round(self.ring_latency_ns * self.clock_mhz / 1e3)

    @property
    def peak_gflops(self) -> float:
        return 2 * self.macs_per_cycle * self.clock_mhz / 1e3

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def hash(self) -> str:
        """Short hash over every field: artifacts built for this config carry it."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_cards(self, cards: int) -> "ArchConfig":
        base = self.name.split("-x")[0]
        return dataclasses.replace(self, name=f"{base}-x{cards}", cards=cards)

    def check_artifact(self, what: str, name: str, config_hash: str) -> None:
        """Raises ConfigMismatchError unless an artifact's (name, hash) is this config's."""
        if config_hash != self.hash:
            raise ConfigMismatchError(
                f"{what} was built for config {name!r} (hash {config_hash}) but this device runs "
                f"{self.name!r} (hash {self.hash}); rebuild it for {self.name!r}")


PRESETS: dict[str, ArchConfig] = {
    # Small enough that RTL simulation of a whole layer takes seconds.
    "sim-small": ArchConfig(
        name="sim-small-x1", cards=1, mpu_lanes=4, mac_width=8, vector_width=8, clock_mhz=100.0,
        abuf_words=1 << 18, wbuf_words=1 << 16, hbm_channels=4, hbm_port_bits=128,
        hbm_channel_mbytes=64, hbm_peak_gbps=6.4, hbm_efficiency=0.9, hbm_latency_cycles=32,
        host_link_gbps=12.0, launch_overhead_us=10.0, ring_link_gbps=12.1, ring_latency_ns=500.0,
        queue_depth=8, mpu_pipeline_cycles=12, vpu_pipeline_cycles=10),
    # One core per Alveo U280 (docs/architecture.md justifies each figure): 16 lanes x 64 = 1,024
    # FP16 MACs per cycle, DFX's count: Yosys puts one 64-wide MAC tree (64 multipliers, 63 FP32
    # adders) at 41.8K LUTs, so 16 lanes take 51% of the U280's 1,304K LUTs (32 would not fit);
    # 250 MHz (32 x 512-bit ports then offer 512 GB/s, above the 460 GB/s physical peak, so weight
    # streams are bound by HBM itself); 90% sustained HBM efficiency; a 4 MiB activation buffer and
    # an 8 MiB weight buffer (URAM; the U280 has about 41 MB on chip: two 4 MiB weight slots keep
    # the weight stream going through attention, where 2 MiB slots stall it); QSFP28 ring links at
    # 100 Gb/s less 3% Aurora framing.
    "u280": ArchConfig(
        name="u280-x1", cards=1, mpu_lanes=16, mac_width=64, vector_width=64, clock_mhz=250.0,
        abuf_words=1 << 21, wbuf_words=1 << 22, hbm_channels=32, hbm_port_bits=512,
        hbm_channel_mbytes=256, hbm_peak_gbps=460.0, hbm_efficiency=0.9, hbm_latency_cycles=64,
        host_link_gbps=12.0, launch_overhead_us=10.0, ring_link_gbps=12.1, ring_latency_ns=500.0,
        queue_depth=16, mpu_pipeline_cycles=16, vpu_pipeline_cycles=12),
}


def get_config(name: str, cards: int | None = None) -> ArchConfig:
    """A preset by name ('u280', 'sim-small'); a '-xN' suffix or `cards` sets the card count (default 1). Both may
    be given only when they agree: 'u280-x4' with cards=1 is a ConfigError, as is a count outside 1..MAX_CARDS."""
    if not isinstance(name, str):
        raise ConfigError(f"an architecture config name is a string, not {type(name).__name__}")
    base, sep, suffix = name.partition("-x")
    if base not in PRESETS:
        raise ConfigError(f"unknown architecture config {name!r}; presets: {', '.join(sorted(PRESETS))}")
    if cards is not None and (isinstance(cards, bool) or not isinstance(cards, int) or not 1 <= cards <= MAX_CARDS):
        raise ConfigError(f"cards must be 1..{MAX_CARDS}, got {cards!r}")
    if sep:
        if not (suffix.isascii() and suffix.isdigit() and 1 <= int(suffix) <= MAX_CARDS):
            raise ConfigError(f"bad card-count suffix in {name!r}: expected '-x1' ... '-x{MAX_CARDS}'")
        if cards is not None and cards != int(suffix):
            raise ConfigError(f"config {name!r} names {int(suffix)} card(s) but {cards} were asked for: give the "
                              f"count once ('{base}' with --cards {cards}, or '{base}-x{cards}')")
        cards = int(suffix)
    return PRESETS[base].with_cards(1 if cards is None else cards)

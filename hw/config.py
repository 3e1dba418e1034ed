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
CONSERVATIVE_CLOCK_MHZ = 200.0
"""The clock every modeled figure is also given at (and headlined at) until place-and-route of the core says
otherwise: the clock DFX closed on the same card (MICRO 2022). Presets may state a higher target clock."""


class ConfigError(RingGPTError, ValueError):
    """An architecture configuration that cannot be built, or a preset name or card count that contradicts itself."""


class ConfigMismatchError(RingGPTError, RuntimeError):
    """An artifact built for one configuration was loaded under another."""


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _pow2_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


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
    """Multipliers per lane, summed by the block-aligned MAC tree (numerics.tile_sums; DFX: d = 64)."""
    vector_width: int
    """Vector-unit lanes: FP16 elements per cycle."""
    special_lanes: int
    """Vector-unit lanes with the special functions (exp, recip, rsqrt, GELU; numerics.special): a special-function
    instruction takes special_lanes elements per cycle (hw/core/timing.py, `VectorTiming.step_words`). A power of
    two dividing vector_width: one 345M layer applies them to a few thousand values a token, against 12.6 million
    MACs (docs/architecture.md, "Special-function lanes")."""
    clock_mhz: float
    abuf_words: int
    """Activation buffer (activations, scores, row statistics)."""
    wbuf_words: int
    """Weight buffer: the compiler's weight slots (the DMA fills one while the matrix unit reads another) and
    attention's KV areas (host/compiler/layout.py, KVPlan)."""
    hbm_channels: int
    hbm_port_bits: int
    hbm_channel_mbytes: int
    hbm_peak_gbps: float
    """Physical HBM peak of one card (the bound that decode is measured against)."""
    hbm_efficiency: float
    """Fraction of the AXI port bandwidth sustained on long sequential bursts."""
    hbm_latency_cycles: int
    """Kernel cycles from an AXI read request (a DMA burst, an instruction fetch) to its first data, and from a
    write burst's last beat to its response; it also sizes fetch's FIFO (hw/core/fetch.py)."""
    host_link_gbps: float
    """Host <-> card (PCIe) bandwidth."""
    launch_overhead_us: float
    """Host time to start one program run on every card and see it finish."""
    ring_link_gbps: float
    """One ring link's payload bandwidth, after framing overhead."""
    queue_depth: int
    """Instructions waiting per unit queue before the decoder stalls. The scoreboard holds queue_depth + 1
    footprints per unit and compares each new instruction with all of them, so its logic grows with it; at u280
    the modeled decode and prompt times of 345M (1 card) and 1.5B (4 cards) are the same at 4 as at 16, and 2 costs
    3 % (docs/architecture.md)."""
    # --- HBM pseudo-channels (docs/cycle-model.md "HBM", with the sources of each figure) -----------------
    hbm_interleave_words: int = 128
    """Interleave granule of the ISA's HBM address map: granule g = a // hbm_interleave_words of word address a
    lies in pseudo-channel (g mod C) XOR ((g div C) mod C) of the C = hbm_channels, at channel-local word
    (g div C) * granule + a mod granule (hw/hbm.py)."""
    hbm_access_bytes: int = 32
    """Smallest access of a pseudo-channel (64-bit bus, burst of 4): partial accesses are rounded up to it."""
    hbm_page_miss_ns: float = 10.0
    """Time a pseudo-channel loses per burst that does not continue the previous one (a row activation not
    hidden behind the stream): strided rows, transposed reads, gathers."""
    hbm_outstanding: int = 16
    """Requests (bursts) one AXI port keeps in flight (hw/core/port_engine.py, PortEngine): a port's throughput is
    at most hbm_outstanding bursts per hbm_latency_cycles + 1."""
    hbm_ports: int = 0
    """DMA AXI ports (0: one per pseudo-channel). Port p serves channels c with c mod ports == p; traffic to a
    channel outside the port's switch group crosses the HBM switch's lateral links."""
    hbm_switch_group: int = 4
    """Pseudo-channels per mini-switch of the HBM subsystem (U280: 8 switches of 4 ports and 4 channels)."""
    hbm_crossing_efficiency: float = 0.5
    """Throughput of traffic that crosses the switch, relative to local traffic."""
    # --- ring hop, built from its parts (docs/cycle-model.md "Ring") ---------------------------------------
    ring_phy_ns: float = 400.0
    """Aurora 64B/66B TX and RX cores and the transceivers of one hop, both ends."""
    ring_cable_ns: float = 5.0
    """One metre of QSFP28 direct-attach cable."""
    ring_cdc_cycles: int = 8
    """Kernel cycles of the two clock-domain crossings (kernel -> user_clk, user_clk -> kernel)."""
    ring_rx_buffer_bytes: int = 65536
    """Receive buffer per link (credit-based flow control): a step longer than it waits for credits."""
    # --- the host path (host/runtime/hostpath.py) -----------------------------------------------------------
    host_transfer_latency_us: float = 5.0
    """Fixed cost of one host <-> card DMA transfer (XRT buffer sync), beside bytes / host_link_gbps."""

    def __post_init__(self):
        def require(cond: bool, message: str):
            if not cond:
                raise ConfigError(f"config {self.name!r}: {message}")

        require(1 <= self.cards <= MAX_CARDS, f"cards must be 1..{MAX_CARDS}, got {self.cards}")
        for field in ("mpu_lanes", "mac_width", "vector_width", "special_lanes"):
            require(_power_of_two(getattr(self, field)), f"{field} must be a power of two, got {getattr(self, field)}")
        require(self.special_lanes <= self.vector_width,
                f"special_lanes must be at most vector_width ({self.vector_width}), got {self.special_lanes}")
        require(self.clock_mhz > 0, f"clock_mhz must be positive, got {self.clock_mhz}")
        require(self.hbm_port_bits % 16 == 0 and self.hbm_port_bits > 0,
                f"hbm_port_bits must be a positive multiple of 16, got {self.hbm_port_bits}")
        require(0 < self.hbm_efficiency <= 1, f"hbm_efficiency must be in (0, 1], got {self.hbm_efficiency}")
        require(self.hbm_channels > 0 and self.hbm_channel_mbytes > 0, "HBM channels and their size must be positive")
        require(self.wbuf_words % 2 == 0 and self.wbuf_words >= 2 * self.mac_width * self.mpu_lanes,
                f"wbuf_words must be even and hold two slots of at least one {self.mac_width}x{self.mpu_lanes} "
                f"weight tile, got {self.wbuf_words}")
        require(self.abuf_words >= 4 * self.vector_width, f"abuf_words too small: {self.abuf_words}")
        require(self.abuf_words < 2 ** 32 and self.wbuf_words < 2 ** 32, "on-chip buffers must be addressable in 32 bits")
        require(self.abuf_words % self.buffer_chunk_words == 0 and self.wbuf_words % self.buffer_chunk_words == 0,
                f"abuf_words and wbuf_words must be multiples of the buffers' {self.buffer_chunk_words}-word rows")
        require(self.hbm_words <= 2 ** 32, "HBM must be addressable in 32-bit word addresses")
        require(self.ring_link_gbps > 0 and self.host_link_gbps > 0, "link bandwidths must be positive")
        require(self.queue_depth >= 1, "queue_depth must be at least 1")
        require(self.hbm_interleave_words > 0 and self.hbm_access_bytes > 0 and self.hbm_outstanding >= 1,
                "hbm_interleave_words, hbm_access_bytes and hbm_outstanding must be positive")
        require(self.hbm_ports >= 0 and self.hbm_channels % self.dma_ports == 0,
                f"hbm_ports must divide hbm_channels ({self.hbm_channels}), got {self.hbm_ports}")
        require(0 < self.hbm_crossing_efficiency <= 1,
                f"hbm_crossing_efficiency must be in (0, 1], got {self.hbm_crossing_efficiency}")
        require(self.hbm_switch_group >= 1, "hbm_switch_group must be at least 1")
        require(min(self.ring_phy_ns, self.ring_cable_ns, self.ring_cdc_cycles,
                    self.host_transfer_latency_us, self.launch_overhead_us, self.hbm_page_miss_ns) >= 0,
                "latencies must not be negative")

    # --- derived values -------------------------------------------------------------------
    @property
    def macs_per_cycle(self) -> int:
        return self.mpu_lanes * self.mac_width

    @property
    def beat_words(self) -> int:
        """Words of one beat of an HBM or host AXI port (hbm_port_bits / 16). An off-chip LOAD's or GATHER's words
        keep their offsets within it in the buffer (hw/resolved.misaligned_transfer), so the DMA engines write
        beats into buffer rows unshifted (hw/core/port_engine.py)."""
        return self.hbm_port_bits // 16

    @property
    def buffer_chunk_words(self) -> int:
        """Words in one row of the on-chip buffers' memories: the widest port of any unit (mac_width,
        vector_width, an HBM beat), a power of two (hw/core/buffers.py)."""
        return max(self.mac_width, self.vector_width, _pow2_at_least(self.beat_words))

    @property
    def weight_align(self) -> int:
        """Words on whose multiples a MATMUL's or MASKED_QK's weights (src2, in WBUF) start, and of which
        their column stride (src2_stride) is a multiple: mac_width, so each lane's weight tile is one memory row
        of its buffer (hw/core/buffers.py, an aligned TileReadPort lane); the compiler pads weight columns and the
        attention's key slots and V^T rows to it (host/compiler/layout.py, weight_stride and KVArea)."""
        return self.mac_width

    @property
    def vector_align(self) -> int:
        """Words on whose multiples a vector instruction's ABUF operands (src1; src2 and aux but as row scalars)
        start, and of which their row strides are multiples (with more than one row): vector_width, so that each
        step of the unit reads its operands from one memory row each, picking its words without shifting them
        across two rows (hw/core/buffers.py, a stepped TileReadPort lane; hw/resolved.misaligned_vector)."""
        return self.vector_width

    @property
    def buffer_banks(self) -> int:
        """Memories of each on-chip buffer, chunk c in memory c mod buffer_banks: the smallest prime above
        mpu_lanes, so the matrix unit's lanes read weight rows at most strides from distinct memories
        (hw/core/buffers.py)."""
        banks = max(2, self.mpu_lanes + 1)
        while any(banks % d == 0 for d in range(2, int(banks ** 0.5) + 1)):
            banks += 1
        return banks

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
    def dma_ports(self) -> int:
        return self.hbm_ports or self.hbm_channels

    @property
    def hbm_channel_gbps(self) -> float:
        """What one pseudo-channel sustains on a long sequential stream: the lesser of its share of the
        physical peak and its port, times hbm_efficiency."""
        port = self.hbm_port_bits / 8 * self.clock_mhz * 1e6 / 1e9 * self.dma_ports / self.hbm_channels
        return min(self.hbm_peak_gbps / self.hbm_channels, port) * self.hbm_efficiency

    @property
    def ring_latency_ns(self) -> float:
        """What one ring hop adds to the router's own cycles (hw/core/router.py, Router.cycles on direct links):
        transceivers and Aurora cores, cable, clock-domain crossings."""
        return self.ring_phy_ns + self.ring_cable_ns + self.ring_cdc_cycles * 1e3 / self.clock_mhz

    @property
    def ring_latency_cycles(self) -> int:
        return round(self.ring_latency_ns * self.clock_mhz / 1e3)

    def at_clock(self, clock_mhz: float) -> "ArchConfig":
        """The same core at another kernel clock (the programs are the same; timing differs)."""
        return dataclasses.replace(self, clock_mhz=float(clock_mhz))

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
        name="sim-small-x1", cards=1, mpu_lanes=4, mac_width=8, vector_width=8, special_lanes=2, clock_mhz=100.0,
        abuf_words=1 << 18, wbuf_words=1 << 19, hbm_channels=4, hbm_port_bits=128,
        hbm_channel_mbytes=64, hbm_peak_gbps=6.4, hbm_efficiency=0.9, hbm_latency_cycles=32,
        host_link_gbps=12.0, launch_overhead_us=10.0, ring_link_gbps=12.1, ring_phy_ns=260.0, ring_cdc_cycles=8,
        queue_depth=8),
    # One core per Alveo U280 (docs/architecture.md justifies each figure): 16 lanes x 64 = 1,024
    # FP16 MACs per cycle, DFX's count (docs/rtl-core.md "Resources" counts the whole core);
    # 250 MHz (32 x 512-bit ports then offer 512 GB/s, above the 460 GB/s physical peak, so weight
    # streams are bound by HBM itself); 90% sustained HBM efficiency; a 4 MiB activation buffer and
    # an 8.5 MiB weight buffer (URAM; the U280 has about 41 MB on chip; 17 memories of 4,096 rows of
    # 64 words, one URAM deep): attention's keys and V^T, which the matrix unit reads from WBUF like
    # every weight, take up to a third (2 MiB for 345M's groups of 8 heads at 1,024 positions), and
    # two weight slots of the rest (3.25 MiB each) keep the weight stream going through attention,
    # where 2 MiB slots stall it; QSFP28 ring links at 100 Gb/s less 3% Aurora framing.
    "u280": ArchConfig(
        name="u280-x1", cards=1, mpu_lanes=16, mac_width=64, vector_width=64, special_lanes=16, clock_mhz=250.0,
        abuf_words=1 << 21, wbuf_words=17 << 18, hbm_channels=32, hbm_port_bits=512,
        hbm_channel_mbytes=256, hbm_peak_gbps=460.0, hbm_efficiency=0.9, hbm_latency_cycles=64,
        host_link_gbps=12.0, launch_overhead_us=30.0, ring_link_gbps=12.1, queue_depth=4),
}


CONSERVATIVE_ASSUMPTIONS = {"clock_mhz": CONSERVATIVE_CLOCK_MHZ, "hbm_efficiency": 0.8, "hbm_page_miss_ns": 20.0,
                            "ring_hop_ns": 1000.0, "launch_overhead_us": 100.0, "host_transfer_latency_us": 20.0}
"""The conservative set every benchmark also reports (docs/cycle-model.md "Assumption sets"): DFX's clock, 80%
sustained HBM efficiency, twice the page-miss cost, a 1 us ring hop, a 100 us launch (the top of the published
XRT range) and 20 us per PCIe transfer batch."""


def conservative(cfg: ArchConfig) -> ArchConfig:
    """`cfg` under CONSERVATIVE_ASSUMPTIONS, never more optimistic than `cfg` itself on any of them."""
    a = CONSERVATIVE_ASSUMPTIONS
    slow = dataclasses.replace(
        cfg, clock_mhz=min(cfg.clock_mhz, a["clock_mhz"]), hbm_efficiency=min(cfg.hbm_efficiency, a["hbm_efficiency"]),
        hbm_page_miss_ns=max(cfg.hbm_page_miss_ns, a["hbm_page_miss_ns"]),
        launch_overhead_us=max(cfg.launch_overhead_us, a["launch_overhead_us"]),
        host_transfer_latency_us=max(cfg.host_transfer_latency_us, a["host_transfer_latency_us"]))
    extra = a["ring_hop_ns"] - slow.ring_latency_ns
    return dataclasses.replace(slow, ring_phy_ns=slow.ring_phy_ns + extra) if extra > 0 else slow


def timing_variants(cfg: ArchConfig, with_conservative: bool = True) -> dict[str, ArchConfig]:
    """{label: config} every modeled figure is reported under: the preset's own clock ('250 MHz'), DFX's
    ('200 MHz', CONSERVATIVE_CLOCK_MHZ, the headline) and the conservative set ('conservative'). Same programs,
    other timing: a device schedules one run's traces under each (SimulatorDevice(timing=...))."""
    variants = {clock_label(cfg): cfg, clock_label(cfg.at_clock(CONSERVATIVE_CLOCK_MHZ)): cfg.at_clock(CONSERVATIVE_CLOCK_MHZ)}
    if with_conservative:
        variants["conservative"] = conservative(cfg)
    return variants


def clock_label(cfg: ArchConfig) -> str:
    return f"{cfg.clock_mhz:g} MHz"


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

"""The cycle model against the RTL: the same programs run on the cores' RTL (RtlDevice) and on the functional
simulator with the cycle model (SimulatorDevice), both under one configuration whose timing figures are those of
the simulated memories and links (`calibration_config`). The short programs per instruction class (`SHORT`, one
instruction of the class between fixed ones; `short_programs`, `run_on_model`), the per-card counters of either side
(`Recording`, `model_cards`, `rtl_cards`) and the table rows beside each other (`row`, `HEADER`); single DMA transfers
on the whole u280 core (`U280_TRANSFERS`, `u280_transfers`).
scripts/calibrate_rtl.py runs them, with whole runs of compiled GPT-2 programs, into docs/rtl-calibration.md.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.hw.assembly import assemble
from ringgpt.hw.config import ArchConfig, get_config
from ringgpt.hw.core.units import UNIT_NAMES
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.program import Program
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.rtl.device import RtlDevice

AXIRAM_LATENCY = 2
"""Cycles from an AR handshake to a cocotbext-axi AxiRam's first R beat, and from the last W beat to its B
response (sim/tb/tb_dma.py measured it)."""
TESTBENCH = {"hbm_latency_cycles": AXIRAM_LATENCY, "hbm_efficiency": 1.0, "hbm_page_miss_ns": 0.0,
             "ring_phy_ns": 0.0, "ring_cable_ns": 0.0, "ring_cdc_cycles": 0}
"""What the simulated memories and links are, where sim-small assumes a board: every AXI port (HBM channel, host
buffer, program) an AxiRam answering in AXIRAM_LATENCY cycles and then serving one beat per cycle (sim-small's
peak is already its ports' rate; at efficiency 1 a channel serves a beat per cycle), no page misses, accesses of
one beat (hbm_access_bytes = hbm_port_bits / 8), and the ring's cores wired directly (no transceiver, cable or
clock crossing)."""

TAIL = "VADD dst=ABUF[3000] src1=ABUF[2048] src2=IMM[0x3c00] rows=2 n=256\nHALT"
"""Ends every short program: its fetch FIFO is full when the HALT passes, so nothing of one run's fetch is still
in flight when the next starts."""
MATMUL = "MATMUL dst=ABUF[500] src1=ABUF[100] src2=WBUF[0] rows=1 n=16 k=64 src2_stride=64"
SHORT = {
    # the controller: fetch (one 512-bit word per 4 beats of 128 bits), unit queues, hazards, BARRIER
    "16 NOPs (fetch rate)": ["NOP"] * 16,
    "a long VADD, then 12 short ones (queue full)": [
        "VADD dst=ABUF[1000] src1=ABUF[0] src2=IMM[0x3c00] rows=4 n=256",
        *[f"VADD dst=ABUF[{100 + 10 * i}] src1=ABUF[0] src2=IMM[0x3c00] rows=1 n=8" for i in range(12)]],
    "VADD, then a MATMUL reading its result (RAW across units)": [
        "VADD dst=ABUF[100] src1=ABUF[0] src2=IMM[0x3c00] rows=1 n=64", MATMUL],
    "a long VADD, BARRIER, NOP": ["VADD dst=ABUF[1000] src1=ABUF[0] src2=IMM[0x3c00] rows=4 n=256", "BARRIER", "NOP"],
    "a long VADD, BARRIER, 40 NOPs (fetch's FIFO runs dry)": [
        "VADD dst=ABUF[1000] src1=ABUF[0] src2=IMM[0x3c00] rows=4 n=256", "BARRIER", *["NOP"] * 40],
    # the DMA unit, one instruction of each kind
    "LOAD HBM -> WBUF, 1 x 1024": ["LOAD dst=WBUF[0] src1=HBM[0] rows=1 n=1024"],
    "LOAD HBM -> WBUF, then a MATMUL reading it": ["LOAD dst=WBUF[0] src1=HBM[0] rows=1 n=1024", MATMUL],
    "3 LOADs HBM -> WBUF, 1 x 256 each": [f"LOAD dst=WBUF[{256 * i}] src1=HBM[{256 * i}] rows=1 n=256"
                                          for i in range(3)],
    "LOAD HBM -> ABUF, 16 x 24, stride 96": ["LOAD dst=ABUF[0] src1=HBM[0] rows=16 n=24 dst_stride=24 "
                                             "src1_stride=96"],
    "LOAD HBM -> ABUF transposed, 16 x 20": ["LOAD dst=ABUF[0] src1=HBM[0] rows=16 n=20 dst_stride=16 "
                                             "src1_stride=64 +transpose"],
    "STORE ABUF -> HBM, 1 x 512": ["STORE dst=HBM[4096] src1=ABUF[0] rows=1 n=512"],
    "STORE ABUF -> HBM transposed, 4 x 16": ["STORE dst=HBM[4096] src1=ABUF[0] rows=4 n=16 dst_stride=64 "
                                             "src1_stride=16 +transpose"],
    "LOAD HOST -> ABUF, 1 x 100": ["LOAD dst=ABUF[504] src1=HOST[0] rows=1 n=100"],
    "STORE ABUF -> HOST, 1 x 64": ["STORE dst=HOST[0] src1=ABUF[0] rows=1 n=64"],
    "GATHER 3 rows of 32 from HBM, indices 0, 1, 2 from HOST": [
        "GATHER dst=ABUF[1000] src1=HBM[0] src2=HOST[0] rows=3 n=32 src1_stride=32"],
    # the router on 2 cards (slices of 24 and 16 words, 3 rows)
    "ALLGATHER, 2 cards": ["ALLGATHER dst=ABUF[100] src1=ABUF[{src}] rows=3 n={n} k={k} dst_stride=40 "
                           "src1_stride=40"],
}
GATHER_SLICES = ((24, 0), (16, 24))
SHORT_HBM_WORDS, SHORT_HOST_WORDS = 8192, 256
GATHER_INDICES = np.arange(3, dtype=np.uint16)
"""The host words the GATHER reads as its indices (uint16 bit patterns): table rows 0, 1, 2, the rows the model
takes for any GATHER."""


def as_testbench(config: ArchConfig) -> ArchConfig:
    """`config` with the timing figures of the simulated memories and links: TESTBENCH's, accesses of one beat,
    and the AxiRams' peak (one beat per cycle on every port) for HBM's."""
    return dataclasses.replace(config, hbm_access_bytes=config.hbm_port_bits // 8, hbm_peak_gbps=config.hbm_port_gbps,
                               **TESTBENCH)


def calibration_config(cards: int) -> ArchConfig:
    """sim-small with the buffers of the whole-core tests (4,096 + 2,048 words) and the testbench's timing figures."""
    return as_testbench(small_config("sim-small", abuf_words=4096, wbuf_words=2048)).with_cards(cards)


class Recording:
    """Wraps a device: keeps, per run, the cycles and per-unit busy cycles of every card."""

    def __init__(self, device, busy):
        self.device, self.busy, self.runs = device, busy, []

    def __getattr__(self, name):
        return getattr(self.device, name)

    def run(self, pos, rows):
        stats = self.device.run(pos, rows)
        self.runs.append((pos, rows, self.busy(self.device)))
        return stats


def model_cards(device: SimulatorDevice, timing: str | None = None) -> list:
    """Per card of the last run, the cycle model's (cycles, busy cycles per unit); under the device's timing
    variant `timing` where given."""
    report = device.last_variant_reports[timing] if timing else device.last_report
    return [(card.cycles, {unit.lower(): cycles for unit, cycles in card.busy.items()}) for card in report.cards]


def rtl_cards(device: RtlDevice) -> list:
    return [(card["cycles"], dict(card["busy"])) for card in device.last_counters]


def pct(rtl: int, model: int) -> str:
    return f"{100 * (model - rtl) / rtl:+.1f} %" if rtl else "n/a"


def row(label: str, rtl: list, model: list) -> str:
    """One table row: the slowest card's cycles on each side, and per unit the busy cycles of the RTL's slowest
    card on both sides."""
    card = max(range(len(rtl)), key=lambda c: rtl[c][0])
    rtl_cycles, model_cycles = max(c for c, _ in rtl), max(c for c, _ in model)
    pairs = [(rtl[card][1].get(u, 0), model[card][1].get(u, 0)) for u in UNIT_NAMES]
    units = " | ".join(f"{a} / {b} ({pct(a, b)})" for a, b in pairs)
    return f"| {label} | {rtl_cycles} | {model_cycles} | {pct(rtl_cycles, model_cycles)} | {units} |"


HEADER = ("| {} | RTL cycles | model cycles | model error | " +
          " | ".join(f"{u} busy RTL / model" for u in UNIT_NAMES) + " |\n|---|---:|---:|---:|" + "---:|" * len(UNIT_NAMES))


def card_programs(config: ArchConfig, lines: list) -> list:
    """One SHORT program's `lines` and TAIL, a Program per card (ALLGATHER's slice fields filled per card)."""
    texts = []
    for card, (n, k) in enumerate(GATHER_SLICES[:config.cards]):
        text = "\n".join(lines + [TAIL]).format(n=n, k=k, src=100 + k)
        texts.append(Program(assemble(text), config.name, config.hash, card, config.cards))
    return texts


def run_on_model(config: ArchConfig, lines: list) -> list:
    """The cycle model's (cycles, busy per unit) per card for one SHORT program."""
    model = SimulatorDevice(config)
    model.load(ApplianceImage(config, [CardImage(p, [], SHORT_HBM_WORDS, SHORT_HOST_WORDS)
                                       for p in card_programs(config, lines)]))
    model.write_host(0, 0, GATHER_INDICES)
    model.run(0, 1)
    return model_cards(model)


def short_programs(config: ArchConfig, simulator: str) -> list:
    """Table rows of the SHORT programs on `config.cards` cards (the ALLGATHER on 2, every other on 1)."""
    chosen = {name: lines for name, lines in SHORT.items() if name.startswith("ALLGATHER") == (config.cards > 1)}
    image = ApplianceImage(config, [CardImage(p, [], SHORT_HBM_WORDS, SHORT_HOST_WORDS)
                                    for p in card_programs(config, [])])
    rtl = RtlDevice(config, simulator=simulator)
    rows = []
    try:
        rtl.load(image)
        for card in range(config.cards):
            rtl.write_host(card, 0, GATHER_INDICES)
        for name, lines in chosen.items():
            rtl.load_programs(card_programs(config, lines))
            rtl.run(0, 1)
            rows.append(row(name, rtl_cards(rtl), run_on_model(config, lines)))
            print(rows[-1], flush=True)
    finally:
        rtl.close()
    return rows


U280_TRANSFERS = {
    # the 1-layer real-width decode program's weight LOADs (host/compiler), on an HBM stripe as the compiler places
    # them now and mid-stripe as it did before stream_align
    "weight piece, 1,574,400 words, on a stripe": "LOAD dst=WBUF[0] src1=HBM[2170880] rows=1 n=1574400",
    "the same into the other slot": "LOAD dst=WBUF[2097152] src1=HBM[3747840] rows=1 n=1574400",
    "the same from granule 16 of its stripe": "LOAD dst=WBUF[0] src1=HBM[2168832] rows=1 n=1574400",
    "the same from granule 28": "LOAD dst=WBUF[2097152] src1=HBM[3743232] rows=1 n=1574400",
    "1,049,600 words from granule 8": "LOAD dst=WBUF[0] src1=HBM[5317632] rows=1 n=1049600",
    "1,410,400 words from granule 16": "LOAD dst=WBUF[2097152] src1=HBM[6367232] rows=1 n=1410400",
    "1,394,000 words from granule 27": "LOAD dst=WBUF[0] src1=HBM[7777664] rows=1 n=1394000",
    # a head group's keys (1,024 rows of 8 words) and a K row written back
    "1,024 rows of 8 words, 64 apart": "LOAD dst=WBUF[4259840] src1=HBM[14826752] rows=1024 n=8 dst_stride=64 "
                                       "src1_stride=64",
    "STORE of 1,024 words": "STORE dst=HBM[14769408] src1=ABUF[276096] rows=1 n=1024",
}
"""Single DMA transfers on the u280 core (`u280_transfers`): each alone, then TAIL."""
U280_HBM_WORDS = 16 << 20


def u280_transfers(simulator: str) -> list:
    """Table rows of U280_TRANSFERS on the whole u280 core's RTL (one card) and on the model under the
    testbench's timing."""
    config = get_config("u280", 1)
    testbench = as_testbench(config)

    def image(cfg: ArchConfig, line: str) -> ApplianceImage:
        program = Program(assemble(line + "\n" + TAIL), cfg.name, cfg.hash, 0, 1)
        return ApplianceImage(cfg, [CardImage(program, [], U280_HBM_WORDS, SHORT_HOST_WORDS)])

    rtl, rows = RtlDevice(config, simulator=simulator), []
    try:
        for name, line in U280_TRANSFERS.items():
            model = SimulatorDevice(testbench)
            model.load(image(testbench, line))
            model.run(0, 1)
            rtl.load(image(config, line))
            rtl.run(0, 1)
            rows.append(row(name, rtl_cards(rtl), model_cards(model)))
            print(rows[-1], flush=True)
    finally:
        rtl.close()
    return rows

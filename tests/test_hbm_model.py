"""The cycle model's DMA and HBM (docs/cycle-model.md "DMA and HBM"): the physical effects of the pseudo-channels,
one hand-computed figure each (`hbm_service`), and the DMA instruction's cycles (`dma_cycles`: the RTL unit's own
count, DMATiming.transfer_cycles, with each port served no faster than the memory behind it). sim-small: 4
channels, interleave granule 128 words (256 B), 32-byte accesses, 1.6 GB/s x 0.9 = 14.4 B per 100 MHz cycle per
channel, 10 ns (1 cycle) per page miss, one 16-byte port (a beat of 8 words) per channel, 16 requests in flight,
32 cycles of latency."""
import dataclasses

import numpy as np
import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.core.timing import PortTiming, transfer_cycles
from ringgpt.hw.hbm import hbm_channel_of
from ringgpt.hw.isa import Flags, Opcode, Space
from ringgpt.hw.resolved import Resolved
from ringgpt.sim.cycle_model.grants import grant_stall_cycles
from ringgpt.sim.cycle_model.hbm import dma_cycles, hbm_service

CFG = get_config("sim-small")
U280 = get_config("u280")
HBM, ABUF, WBUF, HOST = ((s, 0) for s in (Space.HBM, Space.ABUF, Space.WBUF, Space.HOST))
FIXED_LOAD = 4 + 1 + 3 + 32 + 1
"""A LOAD's fixed cycles at sim-small: accept, check, drain-detect and done (4), the first job (1), the request
(3), the latency (32), the write register (1); the transfer adds first beat to last."""


def load(rows, n, stride=0, cfg=CFG, **kw):
    return Resolved(Opcode.LOAD, rows=rows, n=n, src1_stride=stride, dst=ABUF, src1=HBM, **kw)


def test_the_figures_the_hand_computations_use():
    assert (CFG.hbm_channels, CFG.hbm_interleave_words, CFG.hbm_access_bytes) == (4, 128, 32)
    assert CFG.hbm_peak_gbps / CFG.hbm_channels * CFG.hbm_efficiency * 1e3 / CFG.clock_mhz == pytest.approx(14.4)
    assert CFG.hbm_page_miss_ns * CFG.clock_mhz / 1e3 == 1.0
    assert (CFG.hbm_outstanding, CFG.hbm_latency_cycles, CFG.dma_ports, CFG.hbm_port_bits // 8) == (16, 32, 4, 16)
    assert PortTiming.read_cycles(32) == 3 + 32 + 1 and PortTiming.write_cycles(32) == 3 + 2 + 32


def test_the_interleave_permutes_each_stripe():
    for channels in (4, 32):
        g = np.arange(8 * channels)
        for stripe in range(8):
            assert sorted(hbm_channel_of(g[stripe * channels:(stripe + 1) * channels], channels)) == list(range(channels))
    assert list(hbm_channel_of(np.arange(0, 32, 4), 4)) == [0, 1, 2, 3, 0, 1, 2, 3]  # stride of one stripe


def test_sequential_stream_is_one_burst_per_channel():
    t = hbm_service([0], 2048, CFG)  # 4,096 B = 16 granules: 4 a channel, 1,024 B each, consecutive there
    assert list(t.bytes) == [1024] * 4 and list(t.bursts) == [1] * 4
    assert t.cycles == pytest.approx(1024 / 14.4)


def test_strided_rows_pay_a_page_miss_per_burst_and_spread_by_the_interleave():
    t = hbm_service(np.arange(8) * 512, 64, CFG)  # 8 rows of 128 B, one stripe apart: channels 0,1,2,3,0,1,2,3
    assert list(t.bytes) == [256] * 4 and list(t.bursts) == [2] * 4
    assert t.cycles == pytest.approx(256 / 14.4 + 1)
    # the same words read contiguously: 1,024 B over 4 granules, 256 B a channel, one burst each
    assert hbm_service([0], 512, CFG).cycles == pytest.approx(256 / 14.4)


def test_partial_accesses_round_out_to_32_bytes():
    t = hbm_service([0], 1, CFG)  # one word (2 B) still moves one 32-byte access
    assert t.bytes.sum() == 32 and t.cycles == pytest.approx(32 / 14.4)


def test_switch_crossing_costs_port_time():
    two_ports = dataclasses.replace(CFG, hbm_ports=2, hbm_switch_group=2)  # port 0: channels 0 and 2 (crossing)
    assert hbm_service([0], 2048, two_ports).cycles == pytest.approx(192)  # (1,024 + 1,024 / 0.5) B / 16 B
    local = dataclasses.replace(CFG, hbm_ports=2, hbm_switch_group=4)  # one switch: nothing crosses
    assert hbm_service([0], 2048, local).cycles == pytest.approx(128)  # 2,048 B / 16


def test_a_long_load_is_the_rtl_count_with_the_channels_rate():
    # 2,048 words: 64 beats a port, but 1,024 B at 14.4 B a cycle is 71.1 -> 72 cycles on each channel: the
    # channels set the transfer (first beat to last: 71), then the fixed cycles. The RTL alone (one beat a cycle
    # from every port) counts 63; the old model charged 72 with the 32 cycles of latency overlapped.
    r = Resolved(Opcode.LOAD, rows=1, n=2048, dst=WBUF, src1=HBM)
    assert dma_cycles(r, CFG) == FIXED_LOAD + 71 == 112
    assert transfer_cycles(CFG, r) == FIXED_LOAD + 63


def test_rows_at_one_address_are_bursts_of_their_own():
    # 4 rows of 100 words all at word 0 (stride 0): 4 jobs of 13 beats on channel 0 (52, the RTL), 4 bursts of
    # 224 B (200 rounded to 32-byte accesses) there: 896 / 14.4 + 3 page misses = 65.2 -> 66
    assert dma_cycles(load(4, 100), CFG) == FIXED_LOAD + 65


def test_short_rows_are_bound_by_jobs_or_by_requests_in_flight():
    # 64 rows of 16 words, a stripe (512 words) apart: 16 one-beat bursts a channel; one job a cycle: 64 - 1; then
    # the engines' waits for the buffer memory every row writes (ABUF 0..15; tests/test_cycle_model_grants.py)
    r = load(64, 16, stride=512)
    assert dma_cycles(r, CFG) == FIXED_LOAD + 63 + grant_stall_cycles(r, CFG)
    # 2 requests in flight: 16 bursts x (32 + 1) cycles / 2 = 264 cycles a port
    narrow = dataclasses.replace(CFG, hbm_outstanding=2)
    assert dma_cycles(r, narrow) == FIXED_LOAD + 263 + grant_stall_cycles(r, narrow)


def test_a_transposed_load_pays_the_latency_per_tile():
    # 64 x 64 words through the 8 x 8 tile: 64 tiles, each: its first job (1), 8 jobs (8 - 1: the rows fall on
    # 2 granules a channel, 2 bursts), the request latency (3 + 32 + 1) and 8 drain steps; plus accept, check,
    # drain-detect, done (4) and the drain latency (1)
    r = load(64, 64, stride=64, flags=Flags(transpose=1))
    assert dma_cycles(r, CFG) == 4 + 1 + 64 * (1 + 7 + 36 + 8) == 3333


def test_gather_rows_are_consecutive_table_rows():
    # the host index read first (3 + 32 + 1, then 1), then 2 jobs of 8 beats on channel 0; the memory: one burst
    # of 256 B, 17.8 -> 18 cycles
    r = Resolved(Opcode.GATHER, rows=2, n=64, src1_stride=64, dst=ABUF, src1=HBM, src2=HOST)
    assert dma_cycles(r, CFG) == 4 + 1 + 37 + 17 + 36 == 95


def test_host_transfers_are_bound_by_the_host_link_when_it_is_narrower_than_the_port():
    r = Resolved(Opcode.STORE, rows=1, n=600, dst=HOST, src1=ABUF)
    # 75 beats of 16 B (the link: 1,200 B at 120 B a cycle, 10); a store ends with the response: 3 + 2 + 32
    assert dma_cycles(r, CFG) == 4 + 1 + 74 + 37 == 116
    slow = dataclasses.replace(CFG, host_link_gbps=0.8)  # 8 B a cycle: 150 cycles for 1,200 B
    assert dma_cycles(r, slow) == 4 + 1 + 149 + 37


def test_at_250_mhz_the_channels_bound_a_u280_stream_at_200_the_ports():
    # 65,536 words over 32 channels: 4,096 B a channel, 64 beats of 64 B; a channel sustains 460 / 32 x 0.9 GB/s:
    # 51.75 B a cycle at 250 MHz (79.2 -> 80 cycles), 64.7 at 200 MHz (63.3 -> 64: the port's 64 beats)
    r = Resolved(Opcode.LOAD, rows=1, n=65536, dst=WBUF, src1=HBM)
    fixed = 4 + 1 + 3 + 64 + 1
    assert dma_cycles(r, U280) - grant_stall_cycles(r, U280) == fixed + 79    # (the engines' waits: grants.py)
    slower = U280.at_clock(200)
    assert dma_cycles(r, slower) - grant_stall_cycles(r, slower) == fixed + 63 == transfer_cycles(U280, r)


def test_transfers_alike_modulo_the_map_period_cost_the_same():
    # the map repeats every C x C granules; sim-small moves each channel's local addresses by whole 4 KiB pages
    # every 8,192 words: a transfer moved by that costs the same (the model remembers it by the moved rows)
    for rows, n, stride in ((1, 3000, 0), (7, 100, 333), (16, 20, 64)):
        for flags in (Flags(), Flags(transpose=1)):
            r = load(rows, n, stride, flags=flags)
            moved = r._replace(src1=(Space.HBM, 8192 * 5))
            assert transfer_cycles(CFG, r) == transfer_cycles(CFG, moved)
        starts = np.arange(rows) * stride
        assert hbm_service(starts, n, CFG).cycles == hbm_service(starts + 8192 * 5, n, CFG).cycles

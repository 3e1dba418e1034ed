"""The cycle model's HBM pseudo-channels (docs/cycle-model.md "HBM"): one hand-computed figure per effect, on the
sim-small preset: 4 channels, interleave granule 128 words (256 B), 32-byte accesses, 1.6 GB/s x 0.9 = 14.4 B per
100 MHz cycle per channel, 10 ns (1 cycle) per page miss, 16 requests in flight, 32 cycles of latency, one 16-byte
port per channel."""
import dataclasses

import numpy as np
import pytest

from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Flags, Opcode, Space
from ringgpt.hw.resolved import Resolved
from ringgpt.hw.hbm import hbm_channel_of
from ringgpt.sim.cycle_model import hbm_transfer, instruction_cost

CFG = get_config("sim-small")
HBM, ABUF, WBUF, HOST = ((s, 0) for s in (Space.HBM, Space.ABUF, Space.WBUF, Space.HOST))


def load(rows, n, stride=0, cfg=CFG, **kw):
    return hbm_transfer(Resolved(Opcode.LOAD, rows=rows, n=n, src1_stride=stride, dst=ABUF, src1=HBM, **kw), cfg)


def test_the_figures_the_hand_computations_use():
    assert (CFG.hbm_channels, CFG.hbm_interleave_words, CFG.hbm_access_bytes) == (4, 128, 32)
    assert CFG.hbm_peak_gbps / CFG.hbm_channels * CFG.hbm_efficiency * 1e3 / CFG.clock_mhz == pytest.approx(14.4)
    assert CFG.hbm_page_miss_ns * CFG.clock_mhz / 1e3 == 1.0
    assert (CFG.hbm_outstanding, CFG.hbm_latency_cycles, CFG.dma_ports, CFG.hbm_port_bits // 8) == (16, 32, 4, 16)


def test_the_interleave_permutes_each_stripe():
    for channels in (4, 32):
        g = np.arange(8 * channels)
        for stripe in range(8):
            assert sorted(hbm_channel_of(g[stripe * channels:(stripe + 1) * channels], channels)) == list(range(channels))
    assert list(hbm_channel_of(np.arange(0, 32, 4), 4)) == [0, 1, 2, 3, 0, 1, 2, 3]  # stride of one stripe


def test_sequential_stream_is_one_burst_per_channel():
    t = load(1, 2048)  # 4,096 B = 16 granules: 4 a channel, 1,024 B each, consecutive there
    assert list(t.bytes) == [1024] * 4 and list(t.bursts) == [1] * 4
    assert t.cycles == 72  # 1024 / 14.4 = 71.1
    assert instruction_cost(Resolved(Opcode.LOAD, rows=1, n=2048, dst=WBUF, src1=HBM), CFG).latency == 32


def test_strided_rows_pay_a_page_miss_per_burst_and_spread_by_the_interleave():
    t = load(8, 64, stride=512)  # 8 rows of 128 B, one stripe apart: channels 0,1,2,3,0,1,2,3
    assert list(t.bytes) == [256] * 4 and list(t.bursts) == [2] * 4
    assert t.cycles == 19  # 256 / 14.4 + 1 miss = 18.8
    # the same rows read contiguously: 1,024 B over 4 granules, 256 B a channel, one burst each
    assert load(1, 512).cycles == 18  # 256 / 14.4 = 17.8


def test_partial_accesses_round_out_to_32_bytes():
    t = load(1, 1)  # one word (2 B) still moves one 32-byte access
    assert t.bytes.sum() == 32 and t.cycles == 3  # 32 / 14.4 = 2.2, the port: 2, the request window: 2


def test_requests_in_flight_bound_short_bursts():
    # 64 rows of 32 B, a stripe apart: 16 one-access bursts a channel
    assert load(64, 16, stride=512).cycles == 51  # 512 / 14.4 + 15 misses = 50.6; window 16 x 32 / 16 = 32
    narrow = dataclasses.replace(CFG, hbm_outstanding=2)
    assert load(64, 16, stride=512, cfg=narrow).cycles == 256  # 16 requests x 32 cycles / 2 in flight


def test_transposed_write_is_bound_by_the_transposer_when_narrow():
    assert load(64, 64, stride=64, flags=Flags(transpose=1)).cycles == 143  # HBM: 2,048 B a channel / 14.4
    slow = dataclasses.replace(CFG, dma_transpose_words=8)
    assert load(64, 64, stride=64, cfg=slow, flags=Flags(transpose=1)).cycles == 512  # 4,096 words / 8


def test_gather_rows_are_bursts_of_their_own():
    r = Resolved(Opcode.GATHER, rows=4, n=64, src1_stride=64, dst=ABUF, src1=HBM, src2=HOST)
    t = hbm_transfer(r, CFG)  # rows 0, 1 in granule 0 (channel 0), rows 2, 3 in granule 1 (channel 1)
    assert list(t.bursts) == [2, 2, 0, 0] and t.cycles == 19  # 256 / 14.4 + 1 miss = 18.8
    assert load(1, 256).cycles == 18  # the same words as one contiguous LOAD: one burst a channel


def test_switch_crossing_costs_port_time():
    two_ports = dataclasses.replace(CFG, hbm_ports=2, hbm_switch_group=2)  # port 0: channels 0 and 2 (crossing)
    assert load(1, 2048, cfg=two_ports).cycles == 192  # (1,024 + 1,024 / 0.5) B / 16 B per cycle
    local = dataclasses.replace(CFG, hbm_ports=2, hbm_switch_group=4)  # one switch: nothing crosses
    assert load(1, 2048, cfg=local).cycles == 128  # 2,048 B / 16

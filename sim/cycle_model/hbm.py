"""The DMA model: the RTL unit's transfer (hw/core/timing.DMATiming), served by HBM's pseudo-channels and the host
link (docs/cycle-model.md "DMA and HBM")."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.axi import AXI_PAGE_BYTES
from ringgpt.hw.core.timing import DMATiming
from ringgpt.hw.hbm import hbm_channel_of
from ringgpt.hw.resolved import Resolved

from .grants import grant_stall_cycles


def dma_cycles(r: Resolved, cfg: ArchConfig) -> int:
    """Busy cycles of an off-chip LOAD, STORE or GATHER: the RTL unit's own count (hw/core/dma.py,
    DMATiming.transfer_cycles: job generation, bursts and requests in flight per AXI port, hbm_latency_cycles
    per request) on memories that serve each port no faster than the physical HBM (`hbm_service`) or the host
    link (host_link_gbps) do, plus the waits of a LOAD's engines for the buffers' shared write ports
    (grants.grant_stall_cycles). GATHER's table rows are taken as consecutive (the indices are data)."""
    return _modeled_dma(cfg).transfer_cycles(r, latency=cfg.hbm_latency_cycles)


_SERVED_LIMIT = 1 << 14
"""Port services one configuration remembers (the keys of long strided transfers are long tuples)."""


@functools.cache
def _modeled_dma(cfg: ArchConfig):
    """DMATiming of `cfg` whose per-port service (DMATiming._serve: one beat per cycle, a STORE's one beat per cycle in
    all, hbm_outstanding requests per latency + 1 cycles, one job per cycle) is bounded below by the memory's own time for the same rows:
    `hbm_service`, or the host buffer's bytes at host_link_gbps. Remembered by the rows' addresses modulo a
    period of the HBM map that keeps every channel's beats, 4 KiB pages and bursts (C x C granules, enough of them
    to move each channel's local addresses by whole pages), so the tiles of transposed LOADs and the layers'
    alike transfers cost one computation."""
    c, g = cfg.hbm_channels, cfg.hbm_interleave_words
    periods = {False: c * c * g * (AXI_PAGE_BYTES // math.gcd(2 * c * g, AXI_PAGE_BYTES)), True: AXI_PAGE_BYTES // 2}
    host_rate = cfg.host_link_gbps * 1e3 / cfg.clock_mhz    # bytes per cycle
    served: dict = {}

    class ModeledDMA(DMATiming):
        def transfer_cycles(self, r, *, latency: int, indices=None) -> int:
            return super().transfer_cycles(r, latency=latency, indices=indices) + grant_stall_cycles(r, cfg)

        def _serve(self, starts, length: int, latency: int, host: bool, *, jobs: int, serial: bool = False) -> int:
            starts = np.asarray(starts, dtype=np.int64)
            period = periods[host]
            key = (tuple((starts - starts.min() // period * period).tolist()), length, latency, host, jobs, serial)
            if key not in served:
                if len(served) >= _SERVED_LIMIT:
                    served.clear()
                engine = super()._serve(np.array(key[0]), length, latency, host, jobs=jobs, serial=serial)
                memory = 2 * starts.size * length / host_rate if host else hbm_service(key[0], length, cfg).cycles
                served[key] = max(engine, math.ceil(memory) - 1)
            return served[key]

    return ModeledDMA(cfg)


class HbmService(NamedTuple):
    """What the pseudo-channels do for a set of rows (arrays indexed by channel)."""
    cycles: float
    """Kernel cycles the slowest channel or port needs."""
    bytes: object
    """Bytes each channel moves, every burst rounded out to whole hbm_access_bytes."""
    bursts: object
    """Bursts each channel serves (a burst: a run of consecutive channel-local addresses)."""
    channel_cycles: object
    port_cycles: object


def hbm_segments(starts, length: int, cfg: ArchConfig):
    """(bytes, bursts) per channel of rows of `length` words starting at word addresses `starts`, in issue order,
    through the ISA's HBM map (hw/hbm.py). Pieces that continue the channel's previous piece merge into one
    burst."""
    g, c = cfg.hbm_interleave_words, cfg.hbm_channels
    starts = np.asarray(starts, dtype=np.int64).ravel()
    zeros = np.zeros(c, dtype=np.int64)
    if length <= 0 or starts.size == 0:
        return zeros, zeros.copy()
    first = starts // g
    count = (starts + length - 1) // g - first + 1
    row = np.repeat(np.arange(starts.size), count)
    granule = np.repeat(first, count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count))
    lo = np.maximum(starts[row], granule * g)
    hi = np.minimum(starts[row] + length, (granule + 1) * g)
    channel = hbm_channel_of(granule, c)
    local_lo = (granule // c) * g + (lo - granule * g)
    local_hi = local_lo + (hi - lo)
    order = np.argsort(channel, kind="stable")
    channel, local_lo, local_hi = channel[order], local_lo[order], local_hi[order]
    new = np.ones(channel.size, dtype=bool)
    new[1:] = (channel[1:] != channel[:-1]) | (local_lo[1:] != local_hi[:-1])
    begin = np.flatnonzero(new)
    end = np.append(begin[1:], channel.size) - 1
    a = cfg.hbm_access_bytes
    rounded = (-(-2 * local_hi[end] // a) - (2 * local_lo[begin]) // a) * a
    burst_channel = channel[begin]
    nbytes = np.bincount(burst_channel, weights=rounded, minlength=c).astype(np.int64)
    bursts = np.bincount(burst_channel, minlength=c).astype(np.int64)
    return nbytes, bursts


def hbm_service(starts, length: int, cfg: ArchConfig) -> HbmService:
    """The cycles HBM itself needs for rows of `length` words at word addresses `starts`: per channel, its bytes
    at the channel's sustained rate (hbm_peak_gbps / hbm_channels x hbm_efficiency) plus hbm_page_miss_ns for
    every burst after its first; per AXI port (hbm_ports), its channels' bytes at the port's width, traffic to a
    channel outside the port's switch group at hbm_crossing_efficiency. The slowest of these."""
    nbytes, bursts = hbm_segments(starts, length, cfg)
    clock = cfg.clock_mhz
    channel_rate = cfg.hbm_peak_gbps / cfg.hbm_channels * cfg.hbm_efficiency * 1e3 / clock  # bytes per cycle
    miss = cfg.hbm_page_miss_ns * clock / 1e3
    channel_cycles = nbytes / channel_rate + np.maximum(bursts - 1, 0) * miss
    ports = cfg.dma_ports
    channels = np.arange(cfg.hbm_channels)
    port = channels % ports
    crossing = (port // cfg.hbm_switch_group) != (channels // cfg.hbm_switch_group)
    weighted = np.where(crossing, nbytes / cfg.hbm_crossing_efficiency, nbytes)
    port_cycles = np.bincount(port, weights=weighted, minlength=ports) / (cfg.hbm_port_bits / 8)
    return HbmService(float(max(channel_cycles.max(), port_cycles.max())), nbytes, bursts, channel_cycles, port_cycles)

"""The ISA's HBM address map, defined once: which pseudo-channel holds a word address, and where in it.

HBM word addresses are interleaved over the C = `hbm_channels` pseudo-channels in granules of
G = `hbm_interleave_words` words. Granule g = a // G lies in stripe s = g // C at position p = g mod C, and
goes to channel p XOR (s mod C) (C a power of two; otherwise (p + s) mod C), so that rows whose stride
is a multiple of a stripe still spread over every channel. Inside its channel the granule is the s-th:
word a sits at channel-local word s * G + a mod G. A channel therefore sees any contiguous range of
word addresses as one contiguous range of local words (`local_range`), which is what lets the DMA
stream it as long bursts.

Plain Python (ints or numpy arrays) for the simulator, the cycle model and the testbenches; `word_of`
and `local_range_of` build the same map in Amaranth for the DMA unit's port engines (hw/core/port_engine.py),
which needs C and G to be powers of two.
"""
from __future__ import annotations

import numpy as np
from amaranth.hdl import Module, Mux, Signal

from ringgpt.hw.intmath import log2
from ringgpt.hw.config import ArchConfig


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def hbm_port(channel: int) -> str:
    """The AXI4 master port of HBM pseudo-channel `channel`: hbm00, hbm01, ... (the core DMA's port and, as
    `m_axi_hbmNN`, the Vitis kernel's of the same name)."""
    return f"hbm{channel:02d}"


def hbm_channel_of(granule, channels: int):
    """The pseudo-channel of interleave granule `granule` (an int or a numpy array)."""
    if _power_of_two(channels):
        return (granule % channels) ^ ((granule // channels) % channels)
    return (granule + granule // channels) % channels


def hbm_location(word, cfg: ArchConfig):
    """(channel, channel-local word) of HBM word address `word` (ints or numpy arrays)."""
    g, c = cfg.hbm_interleave_words, cfg.hbm_channels
    granule = word // g
    return hbm_channel_of(granule, c), (granule // c) * g + word % g


def hbm_word(channel, local, cfg: ArchConfig):
    """The HBM word address of channel-local word `local` of `channel` (the inverse of hbm_location)."""
    g, c = cfg.hbm_interleave_words, cfg.hbm_channels
    stripe = local // g
    position = (channel ^ (stripe % c)) if _power_of_two(c) else (channel - stripe) % c
    return (stripe * c + position) * g + local % g


def local_range(channel: int, lo, hi, cfg: ArchConfig):
    """The channel-local words [llo, lhi) of `channel` that hold the HBM words [lo, hi) (ints or numpy arrays;
    llo >= lhi: none)."""
    g, c = cfg.hbm_interleave_words, cfg.hbm_channels

    def edge(word, after: int):
        # the local address of the channel's first word at or after HBM word `word` (after=0), or one past its
        # last word at or before `word` (after=1)
        stripe, position = word // (g * c), (word // g) % c
        own = channel ^ (stripe % c) if _power_of_two(c) else (channel - stripe) % c
        return np.where(own == position, stripe * g + word % g + after, (stripe + (own < position)) * g)

    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    llo, lhi = edge(lo, 0), edge(np.maximum(hi, lo + 1) - 1, 1)
    empty = hi <= lo
    llo, lhi = np.where(empty, 0, llo), np.where(empty, 0, lhi)
    return (int(llo), int(lhi)) if llo.ndim == 0 else (llo, lhi)


# --- the same map in Amaranth (C and G powers of two) ------------------------------------------------------


def check_rtl_map(channels: int, granule: int) -> None:
    if not (_power_of_two(channels) and _power_of_two(granule)):
        raise ValueError(f"the RTL HBM map needs power-of-two hbm_channels and hbm_interleave_words, "
                         f"got {channels} and {granule}")


def word_of(channel: int, local, channels: int, granule: int):
    """Amaranth: the HBM word address of channel-local word `local` (a Value) of the constant `channel`."""
    lg, lc = log2(granule), log2(channels)
    stripe = local >> lg
    position = stripe[:lc] ^ channel if lc else 0
    return (((stripe << lc) | position) << lg) | local[:lg]


def local_range_of(m: Module, channel: int, lo, hi, channels: int, granule: int, *, name: str):
    """Amaranth: Signals (llo, lhi) as `local_range` for the constant `channel`, from the Values lo < hi (hi up
    to 2**32: give it 33 bits). The range is empty when llo >= lhi."""
    lg, lc = log2(granule), log2(channels)
    out = []
    for word, after, tag in ((lo, False, "lo"), (hi - 1, True, "hi")):
        w = Signal(len(hi), name=f"{name}_{tag}_word")
        m.d.comb += w.eq(word)
        stripe = w >> (lg + lc)
        position = w[lg:lg + lc]
        own = (stripe[:lc] ^ channel) if lc else 0
        edge = Signal(len(hi), name=f"{name}_{tag}")
        inside = (stripe << lg) + w[:lg] + (1 if after else 0)
        m.d.comb += edge.eq(Mux(own == position, inside, (stripe + (own < position)) << lg))
        out.append(edge)
    return tuple(out)

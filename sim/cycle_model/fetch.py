"""When each program word reaches the controller: the RTL's fetch unit (hw/core/fetch.py) and its FIFO."""
from __future__ import annotations

import functools

from ringgpt.hw.config import ArchConfig
from ringgpt.hw.core.timing import FetchTiming

FETCH_REQUEST = 2
"""Cycles from the run's start to fetch's first read request (Fetch: start -> pending -> running, then the
request register); the handshake is the cycle after a request."""
FETCH_TO_DECISION = 3
"""Cycles from a word's last R beat to the controller deciding it: fetch's FIFO (SyncFIFOBuffered, 2) and the
controller's head register (1)."""


@functools.cache
def _fetch_shape(cfg: ArchConfig) -> tuple:
    """(beats_per_word, FIFO depth in words, words per burst) of the RTL's fetch unit for `cfg`."""
    fetch = FetchTiming(cfg)
    return fetch.beats_per_word, fetch.depth, fetch.burst_words


class _FetchTimes:
    """When each program word is at the output of fetch's FIFO (hw/core/fetch.py): bursts of `burst` words, each
    requested once the FIFO has room for all of it (a word leaves the FIFO when it moves into the controller's
    head) and at most one request every 2 cycles, answered hbm_latency_cycles after the handshake, one beat per
    cycle on the R channel, beats_per_word beats a word."""

    def __init__(self, cfg: ArchConfig):
        self.beats, self.depth, self.burst = _fetch_shape(cfg)
        self.latency = cfg.hbm_latency_cycles
        self.taken: list = []        # cycle each word moved into the head
        self.request = FETCH_REQUEST  # earliest cycle of the next request
        self.beat_free = 0           # first cycle the R channel is free
        self.first_beat = 0          # first beat of the current burst

    def out(self, word: int) -> int:
        """The cycle word `word` (asked in order) is at the FIFO's output."""
        burst, index = divmod(word, self.burst)
        if index == 0:
            room = (burst + 1) * self.burst - self.depth - 1   # the word whose leaving makes room for this burst
            request = max(self.request, self.taken[room] + 1 if room >= 0 else 0)
            self.request = request + 2
            self.first_beat = max(request + 1 + self.latency, self.beat_free)
            self.beat_free = self.first_beat + self.burst * self.beats
        return self.first_beat + (index + 1) * self.beats - 1 + FETCH_TO_DECISION - 1

    def take(self, cycle: int) -> None:
        self.taken.append(cycle)

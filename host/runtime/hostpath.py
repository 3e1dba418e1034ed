"""The host's share of every generated token, counted end to end (docs/cycle-model.md "The host path").

Per generated token: device time (the cards' run, from the cycle model) + launch (the host starting the run on
every card and seeing it finish: the config's launch_overhead_us, a published XRT figure, configurable) + token
upload (the chosen id into every card's host buffer) + logits read-back (every card's vocabulary slice) +
conversion (joining the cards' FP16 slices into one row) + sampling (TokenSampler). Launch, upload and read-back
are modeled from the config (PCIe: one fixed cost per transfer batch, host_transfer_latency_us, plus bytes /
host_link_gbps; the cards' transfers run in parallel, each card on its own link); conversion and sampling are
measured on this machine as CPU time of the calling thread (time.thread_time: load from other processes does
not inflate it, unlike wall time).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ringgpt.hw.config import ArchConfig

STAGES = ("device", "launch", "upload", "read-back", "conversion", "sampling")
HOST_STAGES = STAGES[1:]


def transfer_seconds(cfg: ArchConfig, card_bytes) -> float:
    """One batch of host <-> card transfers, one per card, issued together: the fixed cost once, then the
    largest card's bytes over its PCIe link."""
    card_bytes = list(card_bytes)
    if not card_bytes:
        return 0.0
    return cfg.host_transfer_latency_us * 1e-6 + max(card_bytes) / (cfg.host_link_gbps * 1e9)


@dataclass
class TokenHostCost:
    """What choosing one token cost on the host side: measured conversion and sampling (CPU seconds of the host
    thread), and the bytes that crossed PCIe (modeled by `breakdown`)."""
    conversion_s: float
    sampling_s: float
    readback_bytes: tuple
    """Bytes read back from each card (its logits slice)."""
    upload_bytes: tuple = ()
    """Bytes written to each card for the run that follows (the token id); empty after the last token."""


def breakdown(cfg: ArchConfig, device_s: float, host: TokenHostCost | list) -> dict:
    """{stage: seconds} of one generated token (medians over a list of TokenHostCost: the first token's lazy
    set-up and a busy machine's outliers do not count), with 'host' (all but device), 'total' and 'host_share'
    (host / device)."""
    costs = host if isinstance(host, list) else [host]
    if not costs:
        raise ValueError("no token costs to break down")
    mean = lambda values: float(np.median(values))  # noqa: E731
    parts = {"device": device_s,
             "launch": cfg.launch_overhead_us * 1e-6,
             "upload": mean([transfer_seconds(cfg, c.upload_bytes or (2,) * cfg.cards) for c in costs]),
             "read-back": mean([transfer_seconds(cfg, c.readback_bytes) for c in costs]),
             "conversion": mean([c.conversion_s for c in costs]),
             "sampling": mean([c.sampling_s for c in costs])}
    parts["host"] = sum(parts[s] for s in HOST_STAGES)
    parts["total"] = parts["host"] + device_s
    parts["host_share"] = parts["host"] / device_s if device_s else float("inf")
    return parts


def choose(parts: list, sampler) -> tuple[int, np.ndarray, float, float]:
    """(token, the joined FP16 row, conversion seconds, sampling seconds): what the runtime does with the cards'
    logits slices once they are read back, timed as CPU time of this thread."""
    started = time.thread_time()
    row = np.concatenate(parts)
    joined = time.thread_time()
    token = sampler.next_token(row)
    return token, row, joined - started, time.thread_time() - joined


def measure_host_stages(rows: np.ndarray, sampling, cards: int, repeats: int = 5) -> TokenHostCost:
    """Conversion and sampling of `rows` (FP16 logits, one row per token, the vocabulary split over `cards` as
    the compiler splits it) with `sampling`, the median over rows x repeats: for figures where the device run is
    timing-only (its logits are zeros) and representative logits come from elsewhere."""
    from ringgpt.host.compiler.partition import split
    from ringgpt.host.reference.sampling import TokenSampler

    rows = np.asarray(rows, np.float16)
    bounds = [start for start, _ in split(rows.shape[1], cards, 32)] + [rows.shape[1]]
    conversion, sampling_s = [], []
    sampler = TokenSampler(sampling)
    for _ in range(repeats):
        for row in rows:
            parts = [row[bounds[c]:bounds[c + 1]].copy() for c in range(cards)]
            _, _, conv, samp = choose(parts, sampler)
            conversion.append(conv)
            sampling_s.append(samp)
    return TokenHostCost(float(np.median(conversion)), float(np.median(sampling_s)),
                         tuple(2 * int(bounds[c + 1] - bounds[c]) for c in range(cards)), (2,) * cards)

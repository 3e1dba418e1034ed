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


def choose(parts: list, chunks, sampler) -> tuple[int, np.ndarray, float, float]:
    """(token, the joined FP16 row, conversion seconds, sampling seconds): what the runtime does with what the
    cards left for it, (logits slice, its chunk maxima) per card (`chunks`: the sampling.LogitChunks they cut),
    timed as CPU time of this thread."""
    started = time.thread_time()
    if len(parts) == 1:  # one card: its slice is the row
        row, maxima = parts[0][0], chunks.maxima(parts[0][1])
    else:
        row = np.concatenate([logits for logits, _ in parts])
        maxima = chunks.maxima(np.concatenate([m for _, m in parts]))
    joined = time.thread_time()
    token = sampler.next_token(row, maxima)
    return token, row, joined - started, time.thread_time() - joined


def host_slices(entries: list) -> list:
    """Per card, from an image's meta["host"]["logits"]: (card, offset, logits count, where its chunk maxima
    start counted from offset, their count); the host reads offset .. offset + start + count in one transfer."""
    slices = []
    for e in entries:
        count = int(e["vocab"][1]) - int(e["vocab"][0])
        slices.append((int(e["card"]), int(e["offset"]), count, int(e["chunk_max_offset"]) - int(e["offset"]),
                       -(-count // int(e["chunk"]))))
    return slices


def logit_chunks(entries: list, vocab: int):
    """The sampling.LogitChunks the cards of an image cut their logits into (meta["host"]["logits"])."""
    from ringgpt.host.reference.sampling import LogitChunks
    return LogitChunks([s for e in entries for s in range(int(e["vocab"][0]), int(e["vocab"][1]), int(e["chunk"]))],
                       vocab)


def measure_host_stages(rows: np.ndarray, sampling, entries: list, repeats: int = 7) -> TokenHostCost:
    """Conversion and sampling of `rows` (FP16 logits, one row per token) with `sampling`, the vocabulary split
    and chunk maxima as an image's cards leave them (`entries`: its meta["host"]["logits"]; the maxima computed
    as the cards' VMAX computes them): each pass's median over the rows, the least over `repeats` passes after
    one to warm up (this shared machine's other load only ever adds time), each row handed over as a fresh copy
    (as the back ends' read_host returns it): for figures where the device run is timing-only (its logits are zeros)
    and representative logits come from elsewhere."""
    from ringgpt.hw import numerics
    from ringgpt.host.reference.sampling import TokenSampler

    rows = np.asarray(rows, np.float16)
    slices, chunks = host_slices(entries), logit_chunks(entries, rows.shape[1])
    ends = np.append(chunks.starts[1:], rows.shape[1])
    read_back = []
    for row in rows:
        maxima = np.array([numerics.reduce_max(row[a:b][None, :], axis=1)[0] for a, b in zip(chunks.starts, ends)],
                          np.float16)
        parts, first, start = [], 0, 0
        for _, _, count, _, n in slices:
            parts.append((row[start:start + count].copy(), maxima[first:first + n].copy()))
            first, start = first + n, start + count
        read_back.append(parts)
    conversion, sampling_s = np.zeros((repeats + 1, len(read_back))), np.zeros((repeats + 1, len(read_back)))
    sampler = TokenSampler(sampling)
    for repeat in range(repeats + 1):  # the first pass warms up, untimed
        for i, parts in enumerate(read_back):
            # fresh copies, as read_host leaves them: the read-back (modeled) has just written them
            _, _, conversion[repeat, i], sampling_s[repeat, i] = choose(
                [(logits.copy(), maxima.copy()) for logits, maxima in parts], chunks, sampler)
    return TokenHostCost(float(np.median(conversion[1:], axis=1).min()), float(np.median(sampling_s[1:], axis=1).min()),
                         tuple(2 * (at + n) for _, _, _, at, n in slices), (2,) * len(slices))

"""The runtime: drives a Device that holds a compiled appliance image. Prompt processing in runs of up to
max_rows tokens (matrix-matrix work over the run's tokens), then one run per generated token (rows = 1)
with the KV cache the programs keep in HBM; sampling with the reference path's TokenSampler."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ringgpt.host.device import Device, RunStats
from ringgpt.host.errors import RingGPTError
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.generate import validate_prompt
from ringgpt.host.reference.sampling import SamplingConfig, TokenSampler
from ringgpt.host.runtime import hostpath


class ApplianceError(RingGPTError):
    """An appliance image that this runtime cannot drive."""


@dataclass
class ApplianceResult:
    """Tokens, logits and what they cost. logits[i] (float32, the full vocabulary) chose generated_ids[i].
    Modeled times come from the device's RunStats; wall_s is the host time the whole generation took."""
    prompt_ids: list
    generated_ids: list
    logits: np.ndarray
    prompt_runs: list = field(default_factory=list)
    """RunStats of the prompt-processing runs (chunks of at most max_rows tokens)."""
    decode_runs: list = field(default_factory=list)
    """RunStats of the one-token runs that produced generated tokens 2, 3, ..."""
    wall_s: float = 0.0
    stop_reason: str = ""
    """'eos' or 'max_new_tokens'."""
    host: list = field(default_factory=list)
    """hostpath.TokenHostCost of every generated token: measured conversion and sampling, PCIe bytes."""

    @property
    def runs(self) -> list:
        return self.prompt_runs + self.decode_runs

    @property
    def ttft_s(self) -> float:
        """Modeled time to first token: the prompt runs' modeled seconds."""
        return sum(r.seconds for r in self.prompt_runs)

    @property
    def decode_ms_per_token(self) -> float | None:
        """Modeled mean decode time per token in ms (None when only one token was generated)."""
        return 1e3 * sum(r.seconds for r in self.decode_runs) / len(self.decode_runs) if self.decode_runs else None

    def ttft_under(self, label: str | None = None) -> float:
        """ttft_s under the timing variant `label` of the device's `timing` (None: the device's own config)."""
        return sum(r.seconds if label is None else r.variants[label] for r in self.prompt_runs)

    def decode_ms_under(self, label: str | None = None) -> float | None:
        """decode_ms_per_token under the timing variant `label` (None: the device's own config)."""
        if not self.decode_runs:
            return None
        return 1e3 * sum(r.seconds if label is None else r.variants[label] for r in self.decode_runs) / len(self.decode_runs)

    def per_token(self, cfg, label: str | None = None) -> dict | None:
        """The end-to-end cost of one generated token (hostpath.breakdown, seconds): device + launch + upload +
        read-back + conversion + sampling, means over the decode runs; `cfg` is the config (or timing variant)
        whose launch and PCIe figures apply, `label` the variant whose device time is taken."""
        if not self.decode_runs:
            return None
        device = self.decode_ms_under(label) / 1e3 - cfg.launch_overhead_us * 1e-6
        return hostpath.breakdown(cfg, device, self.host[:len(self.decode_runs)])

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of host (simulation) time."""
        return len(self.generated_ids) / self.wall_s if self.wall_s > 0 else 0.0


class Appliance:
    """An appliance image loaded on a device: token ids in, logits and tokens out."""

    def __init__(self, device: Device, image: ApplianceImage):
        meta = image.meta
        try:
            self.max_rows = int(meta["max_rows"])
            self.max_context = int(meta["max_context"])
            self.vocab_size = int(meta["model"]["vocab_size"])
            self._ids_offset = int(meta["host"]["ids_offset"])
            self._logits = hostpath.host_slices(meta["host"]["logits"])
            self.chunks = hostpath.logit_chunks(meta["host"]["logits"], self.vocab_size)
        except (KeyError, TypeError, ValueError, RingGPTError) as exc:
            raise ApplianceError(f"the appliance image lacks its host layout ({exc!r} in its meta): "
                                 "rebuild it with ringgpt.host.compiler") from None
        if self.max_rows < 1 or self.max_context < 1 or self.vocab_size < 1 or any(n < 1 for _, _, n, _, _ in self._logits):
            raise ApplianceError(f"the appliance image's meta is damaged (max_rows {self.max_rows}, max_context "
                                 f"{self.max_context}, vocab_size {self.vocab_size}, logits slices "
                                 f"{[n for _, _, n, _, _ in self._logits]} must be positive): rebuild it with "
                                 "ringgpt.host.compiler")
        self.eos_id = meta.get("eos_token_id")
        self.device, self.image = device, image
        device.load(image)
        self.cards = image.config.cards

    def run(self, pos: int, ids) -> RunStats:
        """One run: the tokens `ids` at positions pos, pos + 1, ... (at most max_rows of them)."""
        words = np.asarray(ids, dtype=np.uint16)
        if not 1 <= words.size <= self.max_rows:
            raise ApplianceError(f"a run takes 1..{self.max_rows} tokens, got {words.size}")
        for card in range(self.cards):
            self.device.write_host(card, self._ids_offset, words)
        return self.device.run(pos, int(words.size))

    def logits(self) -> np.ndarray:
        """The last run's logits for its last token (float32, the full vocabulary, in card order)."""
        return np.concatenate([logits for logits, _ in self.read_back()]).astype(np.float32)

    def read_back(self) -> list:
        """What the last run left for the host, one transfer per card: (its FP16 vocabulary slice of the last
        token's logits, that slice's chunk maxima), in card order."""
        parts = []
        for card, offset, count, maxima_at, chunks in self._logits:
            words = self.device.read_host(card, offset, maxima_at + chunks)
            parts.append((words[:count], words[maxima_at:]))
        return parts

    def prefill(self, prompt_ids, pos: int = 0) -> list:
        """Processes prompt tokens from position `pos` in runs of up to max_rows; returns their RunStats."""
        ids = list(prompt_ids)
        return [self.run(pos + start, ids[start:start + self.max_rows]) for start in range(0, len(ids), self.max_rows)]

    def teacher_forced(self, prompt_ids, fed_ids) -> np.ndarray:
        """The logits (float32, one row a step) after the prompt and after each of `fed_ids` in turn, one decode run
        each: what a generation that chose `fed_ids` saw, to compare with a reference's teacher-forced logits."""
        self.prefill(prompt_ids)
        rows = [self.logits()]
        for pos, token in enumerate(fed_ids, start=len(prompt_ids)):
            self.run(pos, [token])
            rows.append(self.logits())
        return np.stack(rows)

    def check_request(self, prompt_ids, cfg: SamplingConfig) -> None:
        """Raises PromptError / SamplingConfigError for requests this image cannot serve."""
        validate_prompt(prompt_ids, cfg, vocab_size=self.vocab_size, context=self.max_context,
                        context_name="the appliance's context", hint=" (or compile with a larger max_context)")

    def generate(self, prompt_ids, sampling_cfg: SamplingConfig,
                 on_token: Callable[[int], None] | None = None) -> ApplianceResult:
        """Generates up to max_new_tokens tokens after `prompt_ids` (stopping after EOS if stop_at_eos),
        calling on_token(id) as each token is chosen."""
        prompt_ids = [int(t) for t in prompt_ids]
        self.check_request(prompt_ids, sampling_cfg)
        sampler = TokenSampler(sampling_cfg)
        started = time.perf_counter()
        result = ApplianceResult(prompt_ids, [], np.empty((0, self.vocab_size), np.float32))
        result.prompt_runs = self.prefill(prompt_ids)
        rows, pos = [], len(prompt_ids)
        while True:
            parts = self.read_back()
            token, row, conversion_s, sampling_s = hostpath.choose(parts, self.chunks, sampler)
            result.host.append(hostpath.TokenHostCost(conversion_s, sampling_s,
                                                      tuple(2 * (m + n) for _, _, _, m, n in self._logits)))
            rows.append(row)
            result.generated_ids.append(token)
            if on_token is not None:
                on_token(token)
            if sampling_cfg.stop_at_eos and token == self.eos_id:
                result.stop_reason = "eos"
                break
            if len(result.generated_ids) == sampling_cfg.max_new_tokens:
                result.stop_reason = "max_new_tokens"
                break
            result.host[-1].upload_bytes = (2,) * self.cards
            result.decode_runs.append(self.run(pos, [token]))
            pos += 1
        result.logits = np.stack(rows).astype(np.float32)
        result.wall_s = time.perf_counter() - started
        return result

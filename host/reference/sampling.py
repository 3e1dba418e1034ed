"""Token selection from logits (greedy, temperature, top-k, top-p), in numpy, deterministic under a seed.

The one implementation of sampling: the reference path and the appliance runtime both call TokenSampler with their
own logits, so the same seed picks the same tokens from the same logits.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from ringgpt.host.errors import PromptError, RequestError, SamplingConfigError


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen. top_k=0 and top_p=1.0 turn those filters off; temperature, top_k and top_p only act
    when greedy is False. Generation stops after max_new_tokens, or at EOS (included in the output) if stop_at_eos."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 32
    stop_at_eos: bool = True

    def validate(self, vocab_size: int | None = None) -> None:
        """Raises SamplingConfigError naming the first parameter out of range (top_k is checked against vocab_size
        when given)."""
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SamplingConfigError(f"max_new_tokens={self.max_new_tokens!r} must be an integer >= 1")
        if not _is_int(self.seed) or self.seed < 0:
            raise SamplingConfigError(f"seed={self.seed!r} must be an integer >= 0")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise SamplingConfigError(f"top_k={self.top_k!r} must be an integer >= 0 (0 turns top-k off)")
        if vocab_size is not None and self.top_k > vocab_size:
            raise SamplingConfigError(f"top_k={self.top_k} exceeds the vocabulary size {vocab_size}: "
                                      f"use 0 (off) or at most {vocab_size}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise SamplingConfigError(f"top_p={self.top_p!r} must be in (0, 1] (1 turns top-p off)")
        if not self.greedy and (not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature)
                                or self.temperature <= 0.0):
            raise SamplingConfigError(f"temperature={self.temperature!r} must be a finite number > 0 when sampling "
                                      "(use greedy decoding for temperature 0)")

    def to_json(self) -> str:
        """Canonical JSON (sorted keys)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SamplingConfig:
        """The config that to_json wrote."""
        data = json.loads(text)
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise SamplingConfigError(f"unknown sampling parameters {sorted(unknown)}: the record comes from another "
                                      "version of ringgpt")
        return cls(**data)


class TokenSampler:
    """Chooses the next token from one row of logits; holds the seeded random generator of one generation."""

    def __init__(self, cfg: SamplingConfig):
        cfg.validate()
        self.cfg = cfg
        self._rng = np.random.default_rng(cfg.seed)

    def next_token(self, logits: np.ndarray) -> int:
        """Token id chosen from `logits` (shape (vocab,)): argmax when greedy, else a draw from the softmax of
        logits/temperature restricted to the top_k largest and then to the smallest top_p probability mass."""
        logits = np.asarray(logits)
        if logits.ndim != 1 or logits.size == 0:
            raise RequestError(f"logits must be a non-empty 1-D array (vocab,), got shape {logits.shape}")
        if np.isnan(logits).any():
            raise RequestError("logits contain NaN: the model produced invalid values (check the weights and dtype)")
        cfg = self.cfg
        if cfg.greedy:
            return int(np.argmax(logits))
        if cfg.top_k > logits.size:
            raise SamplingConfigError(f"top_k={cfg.top_k} exceeds the vocabulary size {logits.size}")
        x = logits.astype(np.float64) / cfg.temperature
        if 0 < cfg.top_k < x.size:
            kth = np.partition(x, -cfg.top_k)[-cfg.top_k]
            x = np.where(x >= kth, x, -np.inf)
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        if cfg.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            keep = order[: int(np.searchsorted(np.cumsum(probs[order]), cfg.top_p)) + 1]
            nucleus = np.zeros_like(probs)
            nucleus[keep] = probs[keep]
            probs = nucleus
        cdf = np.cumsum(probs)
        last_possible = np.searchsorted(cdf, cdf[-1])  # guards against u * total rounding up to total
        return int(min(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"), last_possible))


def validate_prompt(prompt_ids: list[int], cfg: SamplingConfig, *, vocab_size: int, context: int,
                    context_name: str = "the model's context", hint: str = "") -> None:
    """Raises PromptError / SamplingConfigError unless `prompt_ids` plus cfg.max_new_tokens new tokens fit a
    model of `vocab_size` tokens and `context` positions (shared by the reference path and the appliance)."""
    if not prompt_ids:
        raise PromptError("the prompt is empty: give at least one token")
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise PromptError(f"prompt token ids {bad[:5]} are outside the model's vocabulary [0, {vocab_size})")
    cfg.validate(vocab_size)
    total = len(prompt_ids) + cfg.max_new_tokens
    if total > context:
        raise PromptError(f"prompt of {len(prompt_ids)} tokens + {cfg.max_new_tokens} new tokens = {total} exceeds "
                          f"{context_name} of {context} positions: shorten the prompt or lower max_new_tokens{hint}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

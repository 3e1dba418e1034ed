"""Token selection from logits (greedy, temperature, top-k, top-p), in numpy, deterministic under a seed.

The one implementation of sampling: the reference path and the appliance runtime both call TokenSampler with their
own logits, so the same seed picks the same tokens from the same logits. The draw among the kept logits (weights,
top-p nucleus, one draw) is defined in draw.py.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from ringgpt.host.errors import PromptError, RequestError, SamplingConfigError
from ringgpt.host.reference.draw import NOT_FINITE, draw, exp_weights, lane_sum


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

    def next_token(self, logits: np.ndarray, chunk_maxima: ChunkMaxima | None = None) -> int:
        """Token id chosen from `logits` (shape (vocab,), FP16, FP32 or FP64): argmax when greedy, else a draw from
        the softmax of logits/temperature restricted to the top_k largest and then to the smallest top_p
        probability mass.

        The result is the one the plain definition gives (float32 weights over the whole vocabulary, a stable
        descending sort, cumulative sums: `reference_next_token`, which the tests compare with), computed without
        touching the whole vocabulary where the filters allow: selection runs on integer keys of the bit patterns
        (their order is the values' order), and the draw among the kept logits is draw.py's compiled kernel (its
        weights, total, nucleus and draw are the definition's bit for bit). The weights are float32, as a float32
        softmax (transformers' top-p) computes them.

        `chunk_maxima` (what the cards compute beside their logits) lets greedy and top-k read only the chunks that
        can hold the argmax or the top-k candidates; the token is the same. NaN is then detected through the
        maxima: +NaN is the largest value of their total order, and the appliance only produces the canonical
        (positive) NaN."""
        logits = np.asarray(logits)
        if logits.ndim != 1 or logits.size == 0:
            raise RequestError(f"logits must be a non-empty 1-D array (vocab,), got shape {logits.shape}")
        if logits.dtype not in _KEY_TYPES:
            logits = logits.astype(np.float64)
        cfg = self.cfg
        if not cfg.greedy and cfg.top_k > logits.size:
            raise SamplingConfigError(f"top_k={cfg.top_k} exceeds the vocabulary size {logits.size}")
        k = 1 if cfg.greedy else cfg.top_k
        candidates = None
        if chunk_maxima is not None and 0 < k < logits.size:
            candidates = chunk_maxima.top_k_candidates(logits, k)
            if candidates is not None and cfg.greedy:
                return int(candidates[0])
        elif chunk_maxima is not None and not cfg.greedy:  # no top-k: the draw itself refuses NaN
            chunk_maxima.check(logits, nan=False)
            return self._draw(logits, None)
        if candidates is None:
            candidates = self._whole_row_candidates(logits)
            if cfg.greedy:
                return candidates
        return self._draw(logits, candidates)

    def _whole_row_candidates(self, logits: np.ndarray):
        """Greedy: the token. Otherwise the top-k candidates (ascending positions), None without top-k."""
        keys = _sortable_keys(logits)
        if _has_nan(logits, keys):
            raise RequestError("logits contain NaN: the model produced invalid values (check the weights and dtype)")
        cfg = self.cfg
        if cfg.greedy:
            best = int(np.argmax(keys))
            # -0 and +0 are equal values but distinct keys: the first index of a zero maximum needs the values.
            return best if logits[best] != 0 else int(np.argmax(_as_float64(logits) == 0))
        if not 0 < cfg.top_k < logits.size:
            return None
        kth, candidates = _top_k_candidates(keys, cfg.top_k)
        if logits[candidates[int(np.argmax(keys[candidates] == kth))]] == 0:
            # a zero k-th value: -0 ties +0 as values but not as keys, so decide on the values
            x = _as_float64(logits)
            candidates = np.flatnonzero(x >= np.partition(x, -cfg.top_k)[-cfg.top_k])
        return candidates

    def _draw(self, logits: np.ndarray, candidates: np.ndarray | None) -> int:
        """The sampled token among the candidates (the whole row when None): draw.draw with this token's one random
        number."""
        cfg = self.cfg
        chosen = draw(logits if candidates is None else logits[candidates], cfg.temperature, cfg.top_p,
                      self._rng.random())
        if chosen == NOT_FINITE:
            raise RequestError("logits contain NaN or +Inf, or are all -Inf: the softmax that sampling draws from is "
                               "undefined (check the weights and dtype; greedy decoding takes the first largest)")
        return int(chosen if candidates is None else candidates[chosen])


class LogitChunks:
    """How the cards cut a logits row into chunks for their maxima (VMAX over LOGIT_CHUNK logits of each card's
    vocabulary slice): chunk i covers [starts[i], starts[i + 1]), the last one up to the row's end. Checked once;
    `maxima(values)` pairs it with one row's maxima."""

    def __init__(self, starts, vocab: int):
        starts = np.asarray(starts, np.int64)
        if starts.ndim != 1 or starts.size == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0) \
                or starts[-1] >= vocab:
            raise RequestError(f"chunk starts {starts[:4].tolist()}... do not cut a row of {vocab} logits")
        self.starts, self.vocab = starts, vocab
        self.ends = np.append(starts[1:], vocab)
        lengths = self.ends - starts
        columns = np.arange(lengths.max())
        self.positions = np.where(columns < lengths[:, None], starts[:, None] + columns, -1)
        """Row i: the positions of chunk i, then -1 past its end (a short chunk)."""

    def maxima(self, values) -> ChunkMaxima:
        """One row's chunk maxima (as read back from the cards)."""
        values = np.asarray(values)
        if values.shape != self.starts.shape:
            raise RequestError(f"{values.size} chunk maxima for {self.starts.size} chunks")
        return ChunkMaxima(self, values)


@dataclass(frozen=True)
class ChunkMaxima:
    """The maxima of one logits row's chunks (values[i] of chunk i of `chunks`), in the row's dtype."""

    chunks: LogitChunks
    values: np.ndarray

    def top_k_candidates(self, logits: np.ndarray, k: int) -> np.ndarray | None:
        """The positions (ascending) of every logit >= the k-th largest, found among the logits >= the k-th largest
        chunk maximum in the chunks whose maximum reaches it (each of k chunks holds a logit >= it, so the k-th
        largest logit is too, and a chunk below it holds none of them); None where that saves nothing (k chunks or more) or the k-th
        value is zero (-0 and +0 are equal values but distinct keys: the whole row decides)."""
        chunks = self.chunks
        keys = self.check(logits)
        if k == 1:
            chosen = np.argmax(keys)
            start = chunks.starts[chosen]
            first = start + int(np.argmax(_sortable_keys(logits[start:chunks.ends[chosen]])))
            return None if logits[first] == 0 else np.array([first])
        if k >= keys.size:
            return None
        threshold = np.partition(keys, keys.size - k)[keys.size - k]
        positions = chunks.positions[keys >= threshold].ravel()
        positions = positions[positions >= 0]
        row_keys = _sortable_keys(logits[positions])
        above = row_keys >= threshold  # the k-th largest logit is >= threshold: nothing below it is kept
        positions, row_keys = positions[above], row_keys[above]
        kth = np.partition(row_keys, row_keys.size - k)[row_keys.size - k]
        kept = positions[row_keys >= kth]
        return None if logits[positions[int(np.argmax(row_keys == kth))]] == 0 else kept

    def check(self, logits: np.ndarray, nan: bool = True):
        """The maxima's sortable keys, once they are known to belong to `logits` and (with `nan`) hold no NaN."""
        if logits.size != self.chunks.vocab or self.values.dtype != logits.dtype:
            raise RequestError(f"chunk maxima ({self.values.dtype}) of a row of {self.chunks.vocab} logits given "
                               f"with a row of {logits.size} ({logits.dtype})")
        if not nan:
            return None
        keys = _sortable_keys(self.values)
        if keys.max() > _INF_KEY[self.values.dtype]:
            raise RequestError("logits contain NaN: the model produced invalid values (check the weights and dtype)")
        return keys


def reference_next_token(cfg: SamplingConfig, rng: np.random.Generator, logits: np.ndarray) -> int:
    """The plain definition of TokenSampler.next_token over the whole vocabulary (draw.py's weights, nucleus and
    draw, with the logits top-k drops weighing 0): what the fast path must equal, kept for the tests and for
    reading."""
    logits = np.asarray(logits)
    if cfg.greedy:
        return int(np.argmax(logits.astype(np.float64)))
    kept = np.ones(logits.size, bool)
    if 0 < cfg.top_k < logits.size:
        kept = logits >= np.partition(logits, -cfg.top_k)[-cfg.top_k]
    x = logits.astype(np.float32)
    if cfg.temperature != 1.0:
        x = x / np.float32(cfg.temperature)
    weights = exp_weights(np.where(kept, x - x[kept].max(), -np.inf))
    if cfg.top_p < 1.0:
        target = np.float32(cfg.top_p) * lane_sum(weights[kept])  # the kept terms, in vocabulary order
        order = np.argsort(-weights, kind="stable")
        keep = order[: int(np.searchsorted(np.cumsum(weights[order]), target)) + 1]
        weights = np.where(np.isin(np.arange(logits.size), keep), weights, np.float32(0))
    cdf = np.cumsum(weights)
    last_possible = np.searchsorted(cdf, cdf[-1])  # guards against u * total rounding up to total
    threshold = rng.random() * float(cdf[-1])  # in float64, as are the comparisons
    return int(min(np.searchsorted(cdf.astype(np.float64), threshold, side="right"), last_possible))


_KEY_TYPES = {np.dtype(np.float16): np.int16, np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_KEY_FORMS = {dtype: (kind, 8 * np.dtype(kind).itemsize - 1, kind(np.iinfo(kind).max)) for dtype, kind in _KEY_TYPES.items()}
"""Per float dtype: the key's integer type, its sign-bit shift, its magnitude mask."""
_INF_KEY = {np.dtype(np.float16): 0x7C00, np.dtype(np.float32): 0x7F800000, np.dtype(np.float64): 0x7FF0000000000000}
"""The key of +Inf: +NaN keys lie above it (and -NaN keys below the key of -Inf, ~_INF_KEY)."""


def _sortable_keys(values: np.ndarray) -> np.ndarray:
    """Signed integers whose order is the values' order (NaN aside; -0 sorts just below +0): the bit pattern,
    with the magnitude bits of negative numbers inverted."""
    kind, shift, magnitude = _KEY_FORMS[values.dtype]
    bits = values.view(kind)
    return bits ^ ((bits >> shift) & magnitude)


def _has_nan(values: np.ndarray, keys: np.ndarray) -> bool:
    if values.dtype != np.float16:
        return bool(np.isnan(values).any())
    inf = _INF_KEY[values.dtype]
    return bool(keys.max() > inf or keys.min() < ~inf)


def _as_float64(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float64)


def _top_k_candidates(keys: np.ndarray, k: int) -> tuple:
    """(the k-th largest key, the positions of every key >= it, ascending): a threshold below the maximum,
    widened until at least k keys pass, then a partition of those few."""
    top = int(keys.max())
    low = int(np.iinfo(keys.dtype).min)
    step = 1 << (8 if keys.dtype == np.int16 else 20 if keys.dtype == np.int32 else 49)
    while True:
        threshold = max(top - step, low)
        passing = np.flatnonzero(keys >= threshold)
        if passing.size >= k or threshold == low:
            values = keys[passing]
            kth = np.partition(values, values.size - k)[values.size - k]
            return kth, passing[values >= kth]
        step *= 4


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

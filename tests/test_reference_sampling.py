"""SamplingConfig validation and TokenSampler: greedy, seeded reproducibility, top-k / top-p support, and the
empirical distribution against softmax(logits / temperature)."""
from dataclasses import replace

import numpy as np
import pytest

from ringgpt.host.errors import RequestError, SamplingConfigError
from ringgpt.host.reference.sampling import SamplingConfig, TokenSampler

SAMPLE = SamplingConfig(greedy=False, temperature=0.8, seed=5)


def random_logits(n, vocab=1000, seed=0):
    return [row.astype(np.float32) for row in np.random.default_rng(seed).normal(0, 3, (n, vocab))]


def draws(cfg, logits, n):
    sampler = TokenSampler(cfg)
    return np.array([sampler.next_token(logits) for _ in range(n)])


@pytest.mark.parametrize("changes, phrase", [
    (dict(temperature=0.0), "temperature=0.0 must be a finite number > 0"),
    (dict(temperature=-1.0), "temperature=-1.0"),
    (dict(temperature=float("nan")), "temperature=nan"),
    (dict(top_k=-1), "top_k=-1 must be an integer >= 0"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(max_new_tokens=0), "max_new_tokens=0 must be an integer >= 1"),
    (dict(seed=-3), "seed=-3 must be an integer >= 0"),
])
def test_out_of_range_parameters(changes, phrase):
    with pytest.raises(SamplingConfigError, match=phrase):
        replace(SAMPLE, **changes).validate()


def test_top_k_above_vocabulary():
    with pytest.raises(SamplingConfigError, match="top_k=51 exceeds the vocabulary size 50"):
        replace(SAMPLE, top_k=51).validate(vocab_size=50)
    with pytest.raises(SamplingConfigError, match="exceeds the vocabulary size 50"):
        TokenSampler(replace(SAMPLE, top_k=51)).next_token(np.zeros(50, np.float32))


def test_greedy_ignores_temperature():
    SamplingConfig(greedy=True, temperature=0.0).validate()


def test_greedy_is_argmax():
    sampler = TokenSampler(SamplingConfig())
    assert [sampler.next_token(x) for x in random_logits(20)] == [int(np.argmax(x)) for x in random_logits(20)]


def test_top_k_1_is_greedy():
    sampler = TokenSampler(replace(SAMPLE, top_k=1, temperature=2.0))
    assert [sampler.next_token(x) for x in random_logits(50)] == [int(np.argmax(x)) for x in random_logits(50)]


def test_reproducible_under_a_seed_and_different_under_another():
    def run(seed):
        sampler = TokenSampler(replace(SAMPLE, seed=seed))
        return [sampler.next_token(x) for x in random_logits(50)]
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_distribution_matches_softmax_with_temperature():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0], np.float32)
    expected = np.exp(logits / 0.8) / np.exp(logits / 0.8).sum()
    counts = np.bincount(draws(SAMPLE, logits, 20000), minlength=logits.size)
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.015)


def test_top_k_keeps_only_the_k_largest():
    logits = random_logits(1)[0]
    chosen = set(draws(replace(SAMPLE, top_k=5, temperature=5.0), logits, 2000).tolist())
    assert chosen == set(np.argsort(logits)[-5:].tolist())


def test_top_p_keeps_the_smallest_nucleus():
    probs = np.array([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5, 0.3 (cumulative 0.8 >= 0.7), then 0.15, 0.05
    logits = np.log(probs).astype(np.float32)
    counts = np.bincount(draws(replace(SAMPLE, temperature=1.0, top_p=0.7), logits, 10000), minlength=4)
    assert counts[0] == counts[2] == 0
    assert counts[1] / counts.sum() == pytest.approx(0.5 / 0.8, abs=0.02)


@pytest.mark.parametrize("logits, phrase", [
    (np.zeros((2, 5), np.float32), "1-D array"),
    (np.zeros(0, np.float32), "1-D array"),
    (np.array([0.0, np.nan], np.float32), "NaN"),
])
def test_bad_logits(logits, phrase):
    with pytest.raises(RequestError, match=phrase):
        TokenSampler(SAMPLE).next_token(logits)


def test_json_round_trip():
    cfg = SamplingConfig(greedy=False, temperature=0.7, top_k=40, top_p=0.9, seed=3, max_new_tokens=9,
                         stop_at_eos=False)
    assert SamplingConfig.from_json(cfg.to_json()) == cfg


def test_json_with_unknown_parameter():
    with pytest.raises(SamplingConfigError, match="unknown sampling parameters"):
        SamplingConfig.from_json('{"greedy": true, "beam_width": 4}')


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_fast_sampler_equals_the_plain_definition(dtype):
    """TokenSampler's candidate-only path picks exactly the tokens of reference_next_token (whole-vocabulary
    float32 weights, full stable sort), ties, zeros of both signs and -Inf included."""
    from ringgpt.host.reference.sampling import reference_next_token
    rng = np.random.default_rng(5)
    configs = [SamplingConfig(), SamplingConfig(greedy=False), SamplingConfig(greedy=False, top_k=50),
               SamplingConfig(greedy=False, top_p=0.9), SamplingConfig(greedy=False, top_k=40, top_p=0.9, temperature=0.7),
               SamplingConfig(greedy=False, top_k=1), SamplingConfig(greedy=False, top_p=0.5, temperature=2.0)]
    for trial in range(24):
        vocab = (50257, 50, 7, 1000)[trial % 4]
        logits = (rng.standard_normal(vocab) * (0.1, 3.0, 30.0)[trial % 3]).astype(dtype)
        if trial % 5 == 0:
            logits[rng.integers(0, vocab, vocab // 3)] = logits[0]  # many ties
        if trial % 7 == 0:
            logits[:] = 0
            logits[3] = -0.0
        if trial % 6 == 1:
            logits[2], logits[4] = -np.inf, -np.inf  # masked tokens (+Inf logits make the softmax NaN either way)
        for cfg in configs:
            if cfg.top_k > vocab:
                continue
            fast, rng_ref = TokenSampler(cfg), np.random.default_rng(cfg.seed)
            for _ in range(3):
                assert fast.next_token(logits) == reference_next_token(cfg, rng_ref, logits), (trial, cfg)


def card_chunk_maxima(logits, slices, chunk):
    """What the cards compute: per vocabulary slice, VMAX over chunks of `chunk` logits (numerics.reduce_max)."""
    from ringgpt.hw import numerics
    from ringgpt.host.reference.sampling import LogitChunks
    chunks = LogitChunks([s for a, b in slices for s in range(a, b, chunk)], logits.size)
    return chunks.maxima(np.array([numerics.reduce_max(logits[a:b][None, :], axis=1)[0]
                                   for a, b in zip(chunks.starts, chunks.ends)], logits.dtype))


@pytest.mark.parametrize("cards", [1, 3])
def test_chunk_maxima_give_the_plain_definitions_tokens(cards):
    """Greedy, top-k and top-k + top-p read only the chunks the cards' maxima single out, and pick exactly the
    tokens of reference_next_token: ties across chunks, a zero k-th value, -Inf, short last chunks, k at and
    above the chunk count."""
    from ringgpt.host.compiler.partition import split
    from ringgpt.host.reference.sampling import reference_next_token
    rng = np.random.default_rng(11)
    configs = [SamplingConfig(), SamplingConfig(greedy=False, top_k=50), SamplingConfig(greedy=False, top_k=3),
               SamplingConfig(greedy=False, top_k=40, top_p=0.9, temperature=0.7), SamplingConfig(greedy=False, top_p=0.8)]
    for trial in range(30):
        vocab = (50257, 200, 1000, 70)[trial % 4]
        logits = (rng.standard_normal(vocab) * (0.1, 3.0, 30.0)[trial % 3]).astype(np.float16)
        if trial % 5 == 0:
            logits[rng.integers(0, vocab, vocab // 3)] = logits.max()  # the maximum tied across many chunks
        if trial % 7 == 0:
            logits[:] = 0
            logits[rng.integers(0, vocab, 5)] = -0.0
        if trial % 6 == 1:
            logits[2], logits[4] = -np.inf, -np.inf
        hint = card_chunk_maxima(logits, split(vocab, cards, 1), 64)
        for cfg in configs:
            if cfg.top_k > vocab:
                continue
            fast, rng_ref = TokenSampler(cfg), np.random.default_rng(cfg.seed)
            for _ in range(3):
                assert fast.next_token(logits, hint) == reference_next_token(cfg, rng_ref, logits), (trial, cfg)


def test_chunk_maxima_report_nan_and_bad_chunks():
    from ringgpt.host.reference.sampling import LogitChunks
    logits = np.random.default_rng(0).standard_normal(300).astype(np.float16)
    logits[200] = np.nan
    hint = card_chunk_maxima(logits, [(0, 300)], 64)
    for cfg in (SamplingConfig(), SamplingConfig(greedy=False, top_k=2), SamplingConfig(greedy=False, top_p=0.9)):
        with pytest.raises(RequestError, match="NaN"):
            TokenSampler(cfg).next_token(logits, hint)
    with pytest.raises(RequestError, match="a row of 300 logits given with a row of 100"):
        TokenSampler(SamplingConfig()).next_token(logits[:100], hint)
    with pytest.raises(RequestError, match="do not cut a row of 300 logits"):
        LogitChunks([0, 64, 64], 300)
    with pytest.raises(RequestError, match="2 chunk maxima for 5 chunks"):
        LogitChunks(range(0, 300, 64), 300).maxima(np.zeros(2, np.float16))

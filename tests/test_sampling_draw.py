"""host/reference/draw.py: the sampler's weights, nucleus and draw; the compiled kernel against the numpy
definition, bit for bit."""
import numpy as np
import pytest

from ringgpt.host.reference import draw as D


def test_exp_weights_within_one_float32_step():
    d = np.concatenate([np.linspace(-87, 0, 200_001, dtype=np.float32),
                        -np.abs(np.random.default_rng(0).standard_normal(200_000).astype(np.float32)) * 3,
                        np.float32([0.0, -0.0, -87.0, -1e-30, -1e-8, -0.5, -0.34657359])])
    w = D.exp_weights(d)
    exact = np.exp(d.astype(np.float64))
    steps = np.abs(w - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert steps.max() <= 1.0
    assert D.exp_weights(np.float32([0.0]))[0] == 1.0  # the largest weight is exactly 1


def test_exp_weights_below_the_flush_are_zero():
    d = np.float32([-87.00001, -88, -1000, -np.inf])
    assert not D.exp_weights(d).any()


def test_lane_sum_order():
    """Lane j adds positions j, j + 16, ... in order; the lanes fold in halves: an explicit loop gives the same bits
    (and a plain sequential sum differs for some of these rows, so the order is what is tested)."""
    rng = np.random.default_rng(1)
    differs = 0
    for n in list(range(1, 70)) + [1000, 50257]:
        terms = (rng.random(n) * 10.0 ** rng.integers(-6, 2, n)).astype(np.float32)
        lanes = [np.float32(0)] * 16
        for i, t in enumerate(terms):
            lanes[i % 16] = np.float32(lanes[i % 16] + t)
        half = 8
        while half:
            lanes = [np.float32(lanes[j] + lanes[j + half]) for j in range(half)]
            half //= 2
        assert D.lane_sum(terms).view(np.int32) == lanes[0].view(np.int32), n
        sequential = np.float32(0)
        for t in terms:
            sequential = np.float32(sequential + t)
        differs += sequential != lanes[0]
    assert differs > 0


def random_cases(count: int, seed: int):
    """(values, temperature, top_p, u): FP16 and float32 rows of 1 to 50,257 values, ties, zeros, -Inf, sharp and
    flat rows, nuclei from one value to the whole row."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        n = int(rng.choice([1, 2, 3, 7, 15, 16, 17, 33, 100, 1000, 5000, 50257]))
        values = rng.standard_normal(n) * (0.01, 1.0, 5.0, 30.0, 200.0)[trial % 5]
        if trial % 7 == 0 and n > 3:
            values[rng.integers(0, n, n // 3)] = values[0]
        if trial % 11 == 0 and n > 3:
            values[1] = -np.inf
        if trial % 13 == 0:
            values[:] = 0.0
        yield (values.astype((np.float16, np.float32)[trial % 2]), (1.0, 0.7, 2.0, 0.05)[trial % 4],
               (1.0, 0.9, 0.5, 0.999, 0.01)[trial % 5 if trial % 3 else 0], float(rng.random()))


def flat_row(dtype):
    """One dominant logit and 50,000 equal ones 12 below it (weights e^-12 < NEAR): a nucleus of 0.99 reaches
    into the weights below NEAR, which the kernel heaps last, in position order."""
    values = np.full(50_001, -12.0)
    values[777] = 0.0
    return values.astype(dtype)


@pytest.fixture(scope="module")
def kernel():
    if D.compiled() is None:
        pytest.skip("no C compiler: the sampler runs the numpy definition (tested through test_reference_sampling)")
    return D.compiled()


def test_compiled_weights_equal_the_definition(kernel):
    for values, temperature, _, _ in random_cases(300, 4):
        w, total = D.weights(values, temperature)
        x = values.astype(np.float32)
        x = x if temperature == 1.0 else x / np.float32(temperature)
        if np.isfinite(x.max()):
            expected = D.exp_weights(x - x.max())
            assert np.array_equal(w.view(np.int32), expected.view(np.int32))
            assert total.view(np.int32) == D.lane_sum(expected).view(np.int32)


def test_compiled_draw_equals_the_definition(kernel):
    for values, temperature, top_p, u in random_cases(600, 2):
        assert D.draw(values, temperature, top_p, u) == D.draw_plain(values, temperature, top_p, u), \
            (values.dtype, values.size, temperature, top_p, u)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_nucleus_reaching_below_near(kernel, dtype):
    values = flat_row(dtype)
    for u in np.linspace(0, 0.999, 9):
        for top_p in (0.5, 0.99, 0.999999):
            assert D.draw(values, 1.0, top_p, u) == D.draw_plain(values, 1.0, top_p, u)
    assert D.draw(values, 1.0, 0.99, 0.999) > 777  # drawn from the flat ones, deep into the nucleus


def test_undefined_weights(kernel):
    for values in (np.float32([1.0, np.inf, 0.0]), np.full(40, -np.inf, np.float16), np.float32([0.0, np.nan, 1.0]),
                   np.append(np.zeros(40, np.float16), np.float16(np.nan))):
        assert D.draw(values, 1.0, 0.9, 0.5) == D.NOT_FINITE == D.draw_plain(values, 1.0, 0.9, 0.5)


def test_strided_and_other_dtypes_take_the_definition(kernel):
    values = np.random.default_rng(3).standard_normal(2000)
    for row in (values.astype(np.float16)[::2], values, values.astype(np.float32)[::3]):
        assert D.draw(row, 0.8, 0.9, 0.3) == D.draw_plain(row, 0.8, 0.9, 0.3)


def test_sampler_without_the_kernel(monkeypatch):
    """Where no C compiler is there the numpy definition draws: the same tokens as the whole-vocabulary one."""
    from ringgpt.host.reference.sampling import SamplingConfig, TokenSampler, reference_next_token
    monkeypatch.setattr(D, "_tried", True)
    monkeypatch.setattr(D, "_kernel", None)
    logits = (np.random.default_rng(6).standard_normal(3000) * 3).astype(np.float16)
    for cfg in (SamplingConfig(greedy=False, top_p=0.9), SamplingConfig(greedy=False, top_k=40, temperature=0.7)):
        sampler, rng = TokenSampler(cfg), np.random.default_rng(cfg.seed)
        assert [sampler.next_token(logits) for _ in range(5)] == [reference_next_token(cfg, rng, logits)
                                                                  for _ in range(5)]

"""Latency measurement method: warm-up runs are discarded, medians are taken, and the static-cache + compile variant
decodes the same tokens as the reference loop."""
from pathlib import Path

import pytest
import torch
from test_reference_support import varied_model

from ringgpt.host.errors import DeviceUnavailableError, RequestError
from ringgpt.host.reference import timing
from ringgpt.host.reference.generate import GenerationResult, Timings, generate
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.reference.timing import DYNAMIC, STATIC_COMPILED, StaticCompiledDecoder, device_name, measure


@pytest.fixture(scope="module")
def model():
    return varied_model()


def test_medians_over_timed_runs_after_warmup(model, monkeypatch):
    runs = iter([Timings(9.0, (9.0, 9.0)),                       # warm-up, discarded
                 Timings(0.003, (0.001, 0.010)), Timings(0.001, (0.002,)), Timings(0.002, (0.004, 0.005))])
    calls = []

    def fake_generate(model, prompt, cfg, *, return_logits):
        calls.append((len(prompt), cfg.max_new_tokens, cfg.greedy, cfg.stop_at_eos, return_logits))
        return GenerationResult(prompt, [], None, next(runs))
    monkeypatch.setattr(timing, "generate", fake_generate)
    m = measure(model, prompt_len=7, new_tokens=3, repeats=3, warmup=1)
    assert calls == [(7, 3, True, False, False)] * 4
    assert (m.variant, m.prompt_len, m.new_tokens, m.repeats) == (DYNAMIC, 7, 3, 3)
    assert m.ttft_ms == pytest.approx(2.0)
    assert m.decode_ms_per_token == pytest.approx(4.0)   # median of 1, 10, 2, 4, 5 ms


def test_measures_the_reference_loop(model):
    m = measure(model, prompt_len=4, new_tokens=3, repeats=2, warmup=1)
    assert m.ttft_ms > 0 and m.decode_ms_per_token > 0


def test_static_compiled_variant_needs_cuda(model):
    if torch.cuda.is_available():
        pytest.skip("checks the error raised without a GPU")
    with pytest.raises(DeviceUnavailableError, match="needs a CUDA device"):
        measure(model, 4, 3, variant=STATIC_COMPILED)


@pytest.mark.parametrize("kwargs, phrase", [
    (dict(variant="fastest"), "unknown timing variant 'fastest'"),
    (dict(repeats=0), "repeats=0 must be >= 1"),
    (dict(new_tokens=1), "new_tokens=1 >= 2"),
])
def test_bad_measurement_requests(model, kwargs, phrase):
    with pytest.raises(RequestError, match=phrase):
        measure(model, **{"prompt_len": 4, "new_tokens": 3, **kwargs})


def test_device_name_of_cpu_is_the_cpuinfo_model():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo")
    names = {line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")}
    assert device_name(torch.device("cpu")) in names


def static_matches_reference(model):
    prompt = [15496, 995, 11, 314]
    reference = generate(model, prompt, SamplingConfig(max_new_tokens=8, stop_at_eos=False)).generated_ids
    decoder = StaticCompiledDecoder(model, len(prompt) + 8)
    for _ in range(2):  # the second run reuses the reset cache
        tokens, timings = decoder.generate(prompt, 8)
        assert tokens == reference and len(timings.decode_s) == 7


@pytest.mark.slow
def test_static_compiled_decoder_on_cpu(model):
    static_matches_reference(model)


@pytest.mark.gpu
def test_static_compiled_decoder_on_cuda():
    model = varied_model().to("cuda")
    static_matches_reference(model)
    m = measure(model, 8, 4, repeats=2, warmup=1, variant=STATIC_COMPILED)
    assert m.variant == STATIC_COMPILED and m.decode_ms_per_token > 0

"""The runtime's generation loop on a tiny synthetic model: streaming order, EOS, context limits, seeded
sampling, prompt chunking, modeled timings, run_generation and its image cache."""
import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from ringgpt.host.compiler import compile_model
from ringgpt.host.errors import PromptError, SamplingConfigError
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.models import load_model, synthetic_config
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance, ApplianceError, check_against_reference, run_generation
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice

SPEC = "synthetic:n_layer=2,n_embd=128,n_head=2,vocab_size=300"
PROMPT = [11, 42, 7, 199, 3, 250, 64, 5, 17, 90]


@pytest.fixture(scope="module")
def model():
    return load_model(SPEC, seed=3)


@pytest.fixture(scope="module")
def image(model):
    return compile_model(model, get_config("u280", 2), max_context=32)


class CountingDevice(SimulatorDevice):
    """A simulator that counts its runs."""

    def __init__(self, config):
        super().__init__(config)
        self.calls = []

    def run(self, pos, rows):
        self.calls.append((pos, rows))
        return super().run(pos, rows)


def appliance(image, device=None) -> Appliance:
    return Appliance(device or SimulatorDevice(image.config), image)


def test_tokens_stream_in_order_as_each_run_completes(image):
    device = CountingDevice(image.config)
    seen = []
    result = Appliance(device, image).generate(PROMPT, SamplingConfig(max_new_tokens=6, stop_at_eos=False),
                                               on_token=lambda t: seen.append((t, len(device.calls))))
    assert [t for t, _ in seen] == result.generated_ids and len(seen) == 6
    # Token i is reported after the prompt run and i decode runs, before the next run starts.
    assert [runs for _, runs in seen] == [1, 2, 3, 4, 5, 6]
    assert device.calls == [(0, len(PROMPT))] + [(len(PROMPT) + i, 1) for i in range(5)]
    assert result.logits.shape == (6, 300) and result.logits.dtype == np.float32
    assert result.stop_reason == "max_new_tokens"


def test_greedy_generation_matches_the_reference(model, image):
    result = appliance(image).generate(PROMPT, SamplingConfig(max_new_tokens=8, stop_at_eos=False))
    check = check_against_reference(model, result, SamplingConfig(max_new_tokens=8, stop_at_eos=False))
    assert check.tokens_match and check.steps_compared == 8
    assert check.logits_rel_rms < 1e-2


def test_teacher_forced_logits_are_a_generations_own(image):
    """Feeding a greedy generation's tokens back gives the logits it chose them from, bit for bit."""
    result = appliance(image).generate(PROMPT, SamplingConfig(max_new_tokens=5, stop_at_eos=False))
    rows = appliance(image).teacher_forced(PROMPT, result.generated_ids[:-1])
    assert rows.shape == result.logits.shape and np.array_equal(rows, result.logits)


def test_eos_stops_generation(model):
    free = appliance(compile_model(model, get_config("u280", 1), 32)).generate(
        PROMPT, SamplingConfig(max_new_tokens=8, stop_at_eos=False)).generated_ids
    eos = free[2]
    stopped_model = load_model(SPEC, seed=3)
    stopped_model.config.eos_token_id = eos
    stop_image = compile_model(stopped_model, get_config("u280", 1), 32)
    result = appliance(stop_image).generate(PROMPT, SamplingConfig(max_new_tokens=8))
    assert result.stop_reason == "eos"
    assert result.generated_ids == free[:free.index(eos) + 1]
    assert len(result.decode_runs) == len(result.generated_ids) - 1
    assert appliance(stop_image).generate(PROMPT, SamplingConfig(max_new_tokens=8, stop_at_eos=False)
                                          ).generated_ids == free


def test_context_limit_and_bad_prompts_are_clear_errors(model, image):
    app = appliance(image)
    full = SamplingConfig(max_new_tokens=22, stop_at_eos=False)  # 10 + 22 = 32 fits exactly
    result = app.generate(PROMPT, full)
    assert len(result.generated_ids) == 22 and result.decode_runs
    assert check_against_reference(model, result, full).logits_rel_rms < 1e-2
    with pytest.raises(PromptError, match="10 tokens \\+ 23 new tokens = 33 exceeds the appliance's context of 32"):
        app.generate(PROMPT, SamplingConfig(max_new_tokens=23))
    with pytest.raises(PromptError, match="empty"):
        app.generate([], SamplingConfig())
    with pytest.raises(PromptError, match=r"\[300\] are outside the model's vocabulary \[0, 300\)"):
        app.generate([1, 300], SamplingConfig())
    with pytest.raises(SamplingConfigError, match="top_k=301"):
        app.generate(PROMPT, SamplingConfig(greedy=False, top_k=301))


def test_sampling_is_reproducible_under_a_seed(model, image):
    cfg = SamplingConfig(greedy=False, temperature=0.8, top_k=50, top_p=0.95, seed=7, max_new_tokens=8,
                         stop_at_eos=False)
    app = appliance(image)
    first = app.generate(PROMPT, cfg)
    again = app.generate(PROMPT, cfg)
    assert first.generated_ids == again.generated_ids
    np.testing.assert_array_equal(first.logits, again.logits)
    assert check_against_reference(model, first, cfg).tokens_match
    other = app.generate(PROMPT, SamplingConfig(greedy=False, seed=8, max_new_tokens=8, stop_at_eos=False))
    assert other.generated_ids != first.generated_ids


def test_long_prompts_run_in_chunks_with_identical_results(model, image):
    """Chunked prompt processing gives bit-identical logits: masked keys add exact zeros."""
    chunked_image = compile_model(model, get_config("u280", 2), max_context=32, max_rows=3)
    device = CountingDevice(chunked_image.config)
    cfg = SamplingConfig(max_new_tokens=4, stop_at_eos=False)
    chunked = Appliance(device, chunked_image).generate(PROMPT, cfg)
    whole = appliance(image).generate(PROMPT, cfg)
    assert device.calls[:4] == [(0, 3), (3, 3), (6, 3), (9, 1)] and len(chunked.prompt_runs) == 4
    np.testing.assert_array_equal(chunked.logits, whole.logits)


def test_modeled_times_come_from_the_runs(image):
    result = appliance(image).generate(PROMPT, SamplingConfig(max_new_tokens=5, stop_at_eos=False))
    assert len(result.prompt_runs) == 1 and len(result.decode_runs) == 4
    assert result.ttft_s == pytest.approx(result.prompt_runs[0].seconds) and result.ttft_s > 0
    assert result.decode_ms_per_token == pytest.approx(1e3 * np.mean([r.seconds for r in result.decode_runs]))
    assert result.runs == result.prompt_runs + result.decode_runs
    assert result.wall_s > 0 and result.tokens_per_s == pytest.approx(5 / result.wall_s)
    assert all(r.cycles > 0 and r.hbm_bytes > 0 for r in result.runs)


def test_timing_only_runs_model_the_same_cycles(image):
    """A weightless image (meta model) on a timing-only device costs what the real one does."""
    with torch.device("meta"):
        empty = GPT2LMHeadModel(synthetic_config(SPEC.split(":", 1)[1]))
    timing = Appliance(SimulatorDevice(image.config, compute=False), compile_model(empty, image.config, 32))
    real = appliance(image)
    for pos, ids in ((0, PROMPT), (10, [5])):
        assert timing.run(pos, ids).cycles == real.run(pos, ids).cycles


def test_an_image_without_host_layout_is_refused(image):
    broken = ApplianceImage(image.config, image.cards, {"max_rows": 4})
    with pytest.raises(ApplianceError, match="lacks its host layout"):
        Appliance(SimulatorDevice(image.config), broken)


def test_run_generation_checks_the_reference_and_caches_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path))
    streamed = []
    kwargs = dict(model="synthetic:n_layer=1,n_embd=64,n_head=1", config="u280", cards=2, max_context=64,
                  sampling=SamplingConfig(max_new_tokens=4, stop_at_eos=False))
    report = run_generation("The quick brown fox", on_token=streamed.append, **kwargs)
    assert streamed == report.generated_ids and len(streamed) == 4
    assert report.config == "u280-x2" and not report.image_cached
    assert report.reference.tokens_match and report.reference.logits_rel_rms < 1e-2
    assert isinstance(report.text, str)
    assert list((tmp_path / "images").iterdir())
    again = run_generation("The quick brown fox", check_reference=False, **kwargs)
    assert again.image_cached and again.reference is None
    assert again.generated_ids == report.generated_ids

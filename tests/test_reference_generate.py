"""The reference generation loop against transformers: greedy tokens equal model.generate, per-step logits and
hidden states equal a full no-cache forward pass; EOS, streaming, FP16 and bad requests."""
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_reference_support import TINY, varied_model

from ringgpt.host.errors import PromptError, RequestError, SamplingConfigError
from ringgpt.host.reference.generate import generate
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig

PROMPT = [15496, 995, 11, 314, 716]
GREEDY = SamplingConfig(greedy=True, max_new_tokens=12, stop_at_eos=False)


@pytest.fixture(scope="module")
def model():
    return varied_model()


def hf_greedy(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


def full_forward(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids]), use_cache=False, output_hidden_states=True)


def test_greedy_equals_transformers_generate(model):
    result = generate(model, PROMPT, GREEDY)
    assert result.generated_ids == hf_greedy(model, PROMPT, GREEDY.max_new_tokens)
    assert len(set(result.generated_ids)) > 3  # the model does not just repeat one token


def test_step_logits_equal_a_full_forward_pass(model):
    result = generate(model, PROMPT, GREEDY)
    full = full_forward(model, PROMPT + result.generated_ids[:-1]).logits[0, len(PROMPT) - 1:].numpy()
    assert result.logits.dtype == np.float32 and result.logits.shape == (GREEDY.max_new_tokens, model.config.vocab_size)
    np.testing.assert_allclose(result.logits, full, rtol=0, atol=1e-5)


def test_hidden_states_equal_a_full_forward_pass(model):
    result = generate(model, PROMPT, GREEDY, hidden_layers=(0, 1))
    full = full_forward(model, PROMPT + result.generated_ids[:-1])
    positions = len(PROMPT) + GREEDY.max_new_tokens - 1
    assert result.hidden_states[0].shape == (positions, model.config.n_embd)
    np.testing.assert_allclose(result.hidden_states[0], full.hidden_states[1][0].numpy(), rtol=0, atol=1e-5)
    # transformers applies the final LayerNorm to its last hidden state; ours is the raw output of the last block
    with torch.inference_mode():
        last = model.transformer.ln_f(torch.from_numpy(result.hidden_states[1])).numpy()
    np.testing.assert_allclose(last, full.hidden_states[2][0].numpy(), rtol=0, atol=1e-5)


def test_on_token_streams_every_token_in_order(model):
    seen = []
    result = generate(model, PROMPT, GREEDY, on_token=seen.append, return_logits=False)
    assert seen == result.generated_ids
    assert result.logits is None
    assert len(result.timings.decode_s) == GREEDY.max_new_tokens - 1


def test_stops_after_eos():
    model = load_model("synthetic:n_layer=1,n_embd=32,n_head=2,vocab_size=8")
    eos = model.config.eos_token_id
    cfg = SamplingConfig(greedy=False, seed=2, max_new_tokens=40)
    result = generate(model, [1, 2, 3], cfg)
    assert result.generated_ids[-1] == eos and eos not in result.generated_ids[:-1]
    assert len(result.generated_ids) < cfg.max_new_tokens and len(result.logits) == len(result.generated_ids)
    longer = generate(model, [1, 2, 3], replace(cfg, stop_at_eos=False))
    assert len(longer.generated_ids) == cfg.max_new_tokens
    assert longer.generated_ids[:len(result.generated_ids)] == result.generated_ids


def test_sampling_is_reproducible(model):
    cfg = SamplingConfig(greedy=False, temperature=1.5, seed=4, max_new_tokens=10, stop_at_eos=False)
    first = generate(model, PROMPT, cfg).generated_ids
    assert generate(model, PROMPT, cfg).generated_ids == first
    assert generate(model, PROMPT, replace(cfg, seed=5)).generated_ids != first


def test_fp16_greedy_equals_transformers_generate():
    half = varied_model(dtype=torch.float16)
    result = generate(half, PROMPT, GREEDY)
    assert result.logits.dtype == np.float32
    assert result.generated_ids == hf_greedy(half, PROMPT, GREEDY.max_new_tokens)


def test_empty_prompt(model):
    with pytest.raises(PromptError, match="prompt is empty"):
        generate(model, [], GREEDY)


def test_prompt_plus_output_longer_than_context(model):
    with pytest.raises(PromptError, match="1000 tokens \\+ 25 new tokens = 1025 exceeds the model's context of 1024"):
        generate(model, [1] * 1000, replace(GREEDY, max_new_tokens=25))


def test_prompt_ids_outside_vocabulary(model):
    with pytest.raises(PromptError, match=r"\[50257, -1\] are outside the model's vocabulary \[0, 50257\)"):
        generate(model, [1, 50257, -1], GREEDY)


def test_hidden_layer_that_does_not_exist(model):
    with pytest.raises(RequestError, match=r"hidden layers \[2\] do not exist: the model has layers 0..1"):
        generate(model, PROMPT, GREEDY, hidden_layers=(0, 2))


def test_sampling_config_checked_against_the_vocabulary():
    model = load_model(f"{TINY},vocab_size=100")
    with pytest.raises(SamplingConfigError, match="top_k=101 exceeds the vocabulary size 100"):
        generate(model, [1], SamplingConfig(greedy=False, top_k=101))

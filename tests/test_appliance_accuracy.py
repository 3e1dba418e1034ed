"""Acceptance: the appliance (compiler + runtime + functional simulator) against the PyTorch FP32 reference.

Stated bound: the relative RMS error of the appliance's per-step logits (all FP16 storage, FP32 accumulation)
against the FP32 reference stays at or below LOGITS_BOUND = 1e-2 (about 1e-3 is typical), defined once in
host/runtime/generation.py (the CLI's verdict and `ringgpt check` use it too). Logits do not depend
on the card count: every output element's reduction runs whole on one card, so 1, 2 and 4 cards agree bit for bit.
"""
import numpy as np
import pytest
import torch

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.generate import generate as reference_generate
from ringgpt.host.reference.models import BUNDLED_MODEL_DIR, load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import LOGITS_BOUND, Appliance, check_against_reference, relative_rms
from ringgpt.host.tokenizer import load_tokenizer
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice

BUNDLED_PROMPTS = [  # the bundled model's corpus is indented with tabs
    'def fibonacci(n):\n\t"""Return the n-th Fibonacci number."""\n\t',
    "import os\n",
    "import os\nimport sys\n\n\ndef main():\n\t",
    "class Queue:\n\tdef __init__(self):\n\t\tself.",
    "\tfor i in range(len(items)):\n",
    "def read_lines(path):\n\twith open(path) as f:\n",
    "\tif not isinstance(value, str):\n\t\traise TypeError(",
    "# Copyright 2001 Python Software Foundation\n",
    "\t\treturn self._data[key]\n\n\tdef ",
    "try:\n\timport threading\nexcept ImportError:\n",
]


@pytest.mark.skipif(not (BUNDLED_MODEL_DIR / "config.json").is_file(),
                    reason=f"the bundled model is not installed in {BUNDLED_MODEL_DIR}")
def test_bundled_model_greedy_tokens_match_the_reference_exactly():
    """Greedy generation of 32 tokens from each prompt: the same tokens as PyTorch FP32, logits within bound."""
    model = load_model("bundled", dtype=torch.float32)
    config = get_config("u280", 4)
    image = compile_model(model, config, max_context=128)
    tokenizer = load_tokenizer()
    sampling = SamplingConfig(max_new_tokens=32, stop_at_eos=False)
    appliance = Appliance(SimulatorDevice(config), image)
    for prompt in BUNDLED_PROMPTS:
        result = appliance.generate(tokenizer.encode(prompt), sampling)
        check = check_against_reference(model, result, sampling)
        assert check.tokens_match, (f"prompt {prompt!r}: token {check.first_mismatch} differs: "
                                    f"{result.generated_ids} vs {check.reference_ids}")
        assert check.logits_rel_rms <= LOGITS_BOUND, f"prompt {prompt!r}: logits error {check.logits_rel_rms:.2e}"


def _synthetic_case(heads: int, layers: int, cards_list=(1, 2, 4), vocab: int = 512, steps: int = 4,
                    arch: str = "u280"):
    """Per-step logits of a synthetic GPT-2 (n_embd = 64 x heads) on each card count of architecture `arch`,
    teacher-forced on the reference's greedy tokens: within LOGITS_BOUND of the reference, and bit-identical
    across card counts."""
    model = load_model(f"synthetic:n_layer={layers},n_embd={64 * heads},n_head={heads},vocab_size={vocab}",
                       seed=heads)
    prompt = [int(t) for t in np.random.default_rng(heads).integers(0, vocab, 9)]
    ref = reference_generate(model, prompt, SamplingConfig(max_new_tokens=steps + 1, stop_at_eos=False))
    results = {}
    for cards in cards_list:
        config = get_config(arch, cards)
        appliance = Appliance(SimulatorDevice(config), compile_model(model, config, max_context=32, max_rows=5))
        results[cards] = appliance.teacher_forced(prompt, ref.generated_ids[:steps])
        error = relative_rms(results[cards], ref.logits)
        assert error <= LOGITS_BOUND, f"{heads} heads on {cards} cards: logits error {error:.2e}"
    first = results[cards_list[0]]
    for cards in cards_list[1:]:
        assert np.array_equal(results[cards], first), f"{heads} heads: {cards} cards differ from {cards_list[0]}"


@pytest.mark.parametrize("heads,layers", [(3, 2), (4, 1), (7, 1), (12, 1), (25, 1)])
def test_synthetic_models_within_bound_and_identical_across_cards(heads, layers):
    _synthetic_case(heads, layers)


def test_sim_small_architecture_within_bound_and_identical_across_cards():
    """The RTL-sized preset (8-wide trees, small buffers): other rounding order, same guarantees."""
    _synthetic_case(5, 2, arch="sim-small")


@pytest.mark.slow
@pytest.mark.parametrize("heads", range(3, 26))
def test_synthetic_head_sweep(heads):
    _synthetic_case(heads, 2, steps=6)


@pytest.mark.slow
def test_gpt2_124m_on_four_cards_within_bound():
    """Full-size GPT-2 124M (synthetic weights, 50,257-token vocabulary) on 4 cards against 1 card."""
    model = load_model("synthetic:gpt2-124m", seed=0)
    prompt = list(range(1000, 1016))
    ref = reference_generate(model, prompt, SamplingConfig(max_new_tokens=4, stop_at_eos=False))
    results = {}
    for cards in (1, 4):
        config = get_config("u280", cards)
        appliance = Appliance(SimulatorDevice(config), compile_model(model, config, max_context=64))
        results[cards] = appliance.teacher_forced(prompt, ref.generated_ids[:3])
        assert relative_rms(results[cards], ref.logits) <= LOGITS_BOUND
    assert np.array_equal(results[1], results[4])

"""Accuracy at GPT-2's own widths (124M: 768/12, 345M: 1024/16, 774M: 1280/20, 1.5B: 1600/25 heads) on the u280
preset, 1 to 4 cards, with max_context 1024 as in the benchmarks (the activation-buffer plan, KV groups and areas
and max_rows are those the published figures time), fewer layers and a smaller vocabulary.

Each case: greedy generation on the appliance from prompts of 1 token up to past max_rows (so the prompt runs
in several chunks), several decode steps, against the PyTorch FP32 reference: the same greedy tokens, and
teacher-forced logits within LOGITS_BOUND relative RMS error; logits bit-identical across card counts.
The default suite runs every width on one card (where the KV areas are shared by several head groups) and on
the card count that splits its heads unevenly; the full matrix is behind `slow`.
"""
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.generate import generate as reference_generate
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import LOGITS_BOUND, Appliance, relative_rms
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice

WIDTHS = {"124m": (768, 12), "345m": (1024, 16), "774m": (1280, 20), "1.5b": (1600, 25)}
VOCAB = 2048
DECODE_STEPS = 3


@cache
def synthetic(width: str, layers: int):
    d, heads = WIDTHS[width]
    return load_model(f"synthetic:n_layer={layers},n_embd={d},n_head={heads},vocab_size={VOCAB}", seed=d + layers)


@cache
def image(width: str, layers: int, cards: int, max_context: int = 1024):
    return compile_model(synthetic(width, layers), get_config("u280", cards), max_context=max_context)


def prompt_of(length: int, seed: int, vocab: int = VOCAB) -> list:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]


def appliance_logits(img, prompt: list, continuation: list) -> tuple[np.ndarray, list]:
    """Teacher-forced logits after the prompt (run in chunks of max_rows) and after each continuation token,
    and the appliance's own greedy tokens for the same steps."""
    app = Appliance(SimulatorDevice(img.config), img)
    runs = app.prefill(prompt)
    rows = [app.logits()]
    for pos, token in enumerate(continuation[:-1], start=len(prompt)):
        app.run(pos, [token])
        rows.append(app.logits())
    return np.stack(rows), len(runs)


def check_case(width: str, layers: int, cards_list: tuple, prompt_len) -> dict:
    """Runs one (width, layers) on each card count; returns {cards: (error, runs)}; asserts the guarantees."""
    model = synthetic(width, layers)
    first = image(width, layers, cards_list[0])
    max_rows = first.meta["max_rows"]
    length = max_rows + 3 if prompt_len == "past_max_rows" else prompt_len
    prompt = prompt_of(length, seed=length)
    ref = reference_generate(model, prompt, SamplingConfig(max_new_tokens=DECODE_STEPS + 1, stop_at_eos=False))
    results, report = {}, {}
    for cards in cards_list:
        img = image(width, layers, cards)
        logits, runs = appliance_logits(img, prompt, ref.generated_ids)
        error = relative_rms(logits, ref.logits)
        greedy = [int(np.argmax(row)) for row in logits]
        report[cards] = (error, runs)
        assert error <= LOGITS_BOUND, f"{width} x{layers} on {cards} cards, prompt {length}: logits error {error:.2e}"
        assert greedy == ref.generated_ids, (f"{width} x{layers} on {cards} cards, prompt {length}: greedy tokens "
                                             f"{greedy} vs reference {ref.generated_ids}")
        results[cards] = logits
    for cards in cards_list[1:]:
        assert np.array_equal(results[cards], results[cards_list[0]]), \
            f"{width}: {cards} cards differ from {cards_list[0]}"
    print(f"\n{width} x{layers} layers, prompt {length} ({report[cards_list[0]][1]} runs of up to {max_rows}): "
          + ", ".join(f"{cards} cards {error:.2e}" for cards, (error, _) in report.items()))
    if prompt_len == "past_max_rows":
        assert report[cards_list[0]][1] >= 2, "the prompt should have run in several chunks"
    return report


@pytest.mark.parametrize("width,cards_list,prompt_len", [
    ("124m", (1,), 1),
    ("345m", (1, 3), "past_max_rows"),
    ("774m", (1,), 6),
    ("1.5b", (1, 2), 6),
])
def test_real_widths_within_bound(width, cards_list, prompt_len):
    check_case(width, 1, cards_list, prompt_len)


@pytest.mark.slow
@pytest.mark.parametrize("prompt_len", [1, 7, "past_max_rows"])
@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_real_widths_full_matrix(width, prompt_len):
    """Every real width on 1, 2, 3 and 4 cards, two layers, short and chunked prompts."""
    check_case(width, 2, (1, 2, 3, 4), prompt_len)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(heads=st.integers(1, 12), cards=st.integers(1, 4), prompt_len=st.integers(1, 12),
       max_rows=st.integers(1, 6))
def test_random_shapes_within_bound_and_identical_to_one_card(heads, cards, prompt_len, max_rows):
    """Random (heads of 64, cards, prompt length, rows per run) on the sim-small preset (small buffers, so
    the planner shares KV areas and score areas): within bound, and one card's logits bit for bit."""
    d = 64 * heads
    model = load_model(f"synthetic:n_layer=1,n_embd={d},n_head={heads},vocab_size=256", seed=heads)
    prompt = prompt_of(prompt_len, seed=heads, vocab=256)
    ref = reference_generate(model, prompt, SamplingConfig(max_new_tokens=3, stop_at_eos=False))
    results = []
    for n in sorted({1, cards}):
        img = compile_model(model, get_config("sim-small", n), max_context=32, max_rows=max_rows)
        logits, _ = appliance_logits(img, prompt, ref.generated_ids)
        assert relative_rms(logits, ref.logits) <= LOGITS_BOUND
        results.append(logits)
    assert np.array_equal(results[0], results[-1])

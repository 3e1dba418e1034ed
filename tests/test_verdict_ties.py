"""The accuracy verdict's tie rule (host/runtime/generation.py: tie_error, compare_tokens): at a step where the
appliance chose another token than the reference after the same tokens, the reference's own margin between the two
is compared with the step's measured logits error; within it the step is a near tie (PASS, named in the verdict),
beyond it a real divergence (FAIL). Constructed logits, then a tiny synthetic model whose LM head holds two tokens that
FP16 cannot tell apart, through `ringgpt generate` and `check_layers`."""
import math
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_reference_support import TINY, varied_model

from ringgpt.host import cli
from ringgpt.host.check import check_layers
from ringgpt.host.compiler import compile_model
from ringgpt.host.runtime import generation
from ringgpt.host.runtime.generation import ReferenceCheck, compare_tokens, relative_rms, tie_error
from ringgpt.host.tokenizer import load_tokenizer
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice

VOCAB = 1024
REFERENCE = np.linspace(-1.0, 1.0, VOCAB)
REFERENCE[[2, 3, 4]] = 2.0, 0.5, 1.9995
"""Token 2 leads token 4 by 5e-4 and token 3 by 1.5."""
SIGMA = 1e-3
ERROR = 4 * math.sqrt(2) * SIGMA  # 5.66e-3: the tie rule's error for logits off by about SIGMA everywhere


def appliance_row(lower: int, raised: int) -> np.ndarray:
    """REFERENCE off by SIGMA at every logit (RMS error SIGMA): `raised` up, `lower` and every other logit alternately
    down and up."""
    signs = np.resize([1.0, -1.0], VOCAB)
    signs[raised], signs[lower] = 1.0, -1.0
    return REFERENCE + SIGMA * signs


def test_tie_error_is_four_sigmas_of_a_difference_of_two_logits():
    """sigma is the errors' standard deviation: an error common to every logit moves no margin."""
    row = appliance_row(2, 4)
    rms = np.sqrt(np.mean(REFERENCE ** 2))
    assert tie_error(row, REFERENCE) == pytest.approx(ERROR, rel=1e-5)
    assert tie_error(row + 0.5, REFERENCE) == pytest.approx(tie_error(row, REFERENCE), rel=1e-9)
    assert tie_error(row, REFERENCE) <= 4 * math.sqrt(2) * relative_rms(row, REFERENCE) * rms


def test_a_near_tie_passes_named_with_its_margin():
    row = appliance_row(2, 4)
    assert int(np.argmax(row)) == 4
    tokens = compare_tokens([4], [2], [row], [REFERENCE])
    (step,) = tokens.differing
    assert (step.step, step.token, step.reference_token) == (0, 4, 2)
    assert step.margin == pytest.approx(5e-4) and step.error == pytest.approx(ERROR, rel=1e-5) and step.near_tie
    assert tokens.passed
    assert tokens.phrase() == "tokens match except 1 near-tie (step 0, margin 5.0e-04 <= error 5.7e-03)"
    check = ReferenceCheck([2], tokens, 1, relative_rms(row, REFERENCE), 0.0)
    assert check.passed and not check.tokens_match and check.first_mismatch == 0
    assert check.verdict() == ("PyTorch FP32 reference: PASS (tokens match except 1 near-tie (step 0, margin 5.0e-04 "
                               "<= error 5.7e-03), logits relative RMS error 1.7e-03 <= 1e-02 bound, over 1 steps)")


def test_a_real_divergence_fails():
    """The appliance takes token 3, which the reference puts 1.5 below its token: a margin far above the error."""
    row = appliance_row(2, 3)
    row[3] += 1.6  # one logit raised far: over the vocabulary it adds 1.6 / sqrt(1024) = 0.05 to the RMS error
    tokens = compare_tokens([3], [2], [row], [REFERENCE])
    (step,) = tokens.differing
    assert step.margin == pytest.approx(1.5) and step.margin > step.error and not step.near_tie
    assert not tokens.passed
    assert tokens.phrase() == f"tokens differ at 1 step (step 0, margin 1.5e+00 > error {step.error:.1e})"
    assert not ReferenceCheck([2], tokens, 1, 1e-3, 0.0).passed


def test_the_comparison_continues_after_a_tie_and_a_later_divergence_fails():
    rows = [appliance_row(2, 4), appliance_row(4, 2), appliance_row(2, 3) + 1.6 * (np.arange(VOCAB) == 3)]
    tokens = compare_tokens([4, 2, 3], [2, 2, 2], rows, [REFERENCE] * 3)
    assert [s.step for s in tokens.differing] == [0, 2] and [s.near_tie for s in tokens.differing] == [True, False]
    assert not tokens.passed
    assert tokens.phrase() == (f"tokens differ at 2 steps (step 0, margin 5.0e-04 <= error 5.7e-03; step 2, margin "
                               f"1.5e+00 > error {tokens.differing[1].error:.1e})")
    only_ties = compare_tokens([4, 2, 4], [2, 2, 2], rows[:2] + rows[:1], [REFERENCE] * 3)
    assert only_ties.passed and only_ties.phrase().startswith("tokens match except 2 near-ties (step 0, margin")


def test_a_sampled_token_that_differs_is_no_tie():
    """Sampled steps have no margin in logits (the draw's order is not the logits' order): another token fails."""
    tokens = compare_tokens([4], [2], [appliance_row(2, 4)], [REFERENCE], greedy=False)
    assert not tokens.passed and tokens.phrase() == "tokens differ at 1 step (step 0, sampled)"


# --- a forced tie on the simulated appliance -------------------------------------------------------------------
PROMPT = "Hello world"


def tied_model(scale: float = 1 - 2 ** -14):
    """varied_model with token y < x (x: the reference's greedy token after PROMPT) given x's LM-head row times
    `scale`, x's row being FP16 values. With the default, FP16 rounds y's row back to x's, so the appliance sees two
    equal logits and takes y (the first), while the reference puts y 2^-14 of x's logit below x. Returns (model, x,
    y)."""
    model = varied_model()
    ids = load_tokenizer().encode(PROMPT)
    with torch.inference_mode():
        x = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    y = next(t for t in range(x) if t not in ids)
    wte = model.transformer.wte.weight
    with torch.no_grad():
        wte[x] = wte[x].half().float()
        wte[y] = wte[x] * scale
    return model, x, y


@pytest.fixture(scope="module")
def tied():
    return tied_model()


def generate(monkeypatch, tmp_path, model, reference=None, tokens=4):
    """`ringgpt generate` of `tokens` tokens after PROMPT on one simulated card with `model` (checked against
    `reference`, default the same model)."""
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(generation, "load_model", lambda *args, **kwargs: model)
    real = generation.check_against_reference
    monkeypatch.setattr(generation, "check_against_reference",
                        lambda net, result, sampling: real(net if reference is None else reference, result, sampling))
    return CliRunner().invoke(cli.main, ["generate", "--model", TINY, "--cards", "1", "--max-new-tokens",
                                         str(tokens), PROMPT])


def test_generate_passes_a_forced_tie_and_scores_the_appliances_tokens(tied, monkeypatch, tmp_path):
    """Step 0: the appliance takes y, a near tie; the reference is then fed y, and the later steps are compared."""
    model, x, y = tied
    result = generate(monkeypatch, tmp_path, model)
    assert result.exit_code == 0, result.output
    assert "PyTorch FP32 reference: PASS (tokens match except 1 near-tie (step 0, margin " in result.stderr
    assert "over 4 steps)" in result.stderr
    line = next(s for s in result.stderr.splitlines() if "near-tie" in s)
    margin, error = map(float, re.search(r"margin (\S+) <= error (\S+)\)", line).groups())
    assert 0 < margin < error < 1e-2


def test_generate_fails_a_real_divergence(tied, monkeypatch, tmp_path):
    """The same appliance checked against a model whose y row is x's times 0.95 (y's logit 5 % of x's below it): as
    if the appliance's LM head had that column wrong. One token, so that y's embedding plays no part."""
    model, x, y = tied
    result = generate(monkeypatch, tmp_path, model, reference=tied_model(0.95)[0], tokens=1)
    assert result.exit_code == cli.EXIT_CHECK_FAILED, result.output
    line = next(s for s in result.stderr.splitlines() if s.startswith("PyTorch FP32 reference"))
    assert re.fullmatch(r"PyTorch FP32 reference: FAIL \(tokens differ at 1 step \(step 0, margin \S+ > error \S+\), "
                        r"logits relative RMS error \S+ <= 1e-02 bound, over 1 steps\)", line), line


def test_check_layers_passes_a_forced_tie(tied):
    model, x, y = tied
    config = get_config("u280", 1)
    image = compile_model(model, config, max_context=16)
    report = check_layers(model, image, SimulatorDevice(config), load_tokenizer().encode(PROMPT), decode_steps=2)
    assert report.tokens[0] == y and report.reference_tokens[0] == x
    assert report.passed, report.verdict()
    assert report.verdict().startswith("PyTorch FP32 reference: PASS (tokens match except 1 near-tie (step 0, margin ")

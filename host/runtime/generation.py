"""run_generation: text in, text out on the simulated appliance, checked against the PyTorch reference.
What `ringgpt generate --backend sim` (and `--backend rtl`) calls."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ringgpt.host.reference.models import int8_model, load_model
from ringgpt.host.reference.sampling import SamplingConfig, TokenSampler, validate_prompt
from ringgpt.host.reference.spec import source_fields
from ringgpt.host.compiler.dims import preflight
from ringgpt.host.runtime.appliance import Appliance, ApplianceResult
from ringgpt.host.runtime.images import cached_image
from ringgpt.host.tokenizer import load_tokenizer
from ringgpt.hw.config import get_config, timing_variants
from ringgpt.host.device import open_device


LOGITS_BOUND = 1e-2
"""The stated end-to-end accuracy bound of the appliance: the relative RMS error of its logits against the PyTorch
FP32 reference (FP16 storage, FP32 accumulation; about 1e-3 is typical). Defined here once: the CLI's verdict,
`ringgpt check` and the accuracy tests use it."""


INT8_LOGITS_BOUND = 5e-2
"""The bound of the appliance's logits with INT8 weights (W8A16, numerics.quantize_int8) against the FP32 model itself:
the quantisation's own error (about 1e-2 on GPT-2-initialised weights, 7e-3 on the bundled model). Against the same
model quantised in PyTorch (host.reference.models.int8_model) the bound is LOGITS_BOUND, as for FP16 weights."""


def relative_rms(values: np.ndarray, reference: np.ndarray) -> float:
    """sqrt(mean((values - reference)^2)) / sqrt(mean(reference^2))."""
    values, reference = np.asarray(values, np.float64), np.asarray(reference, np.float64)
    return float(np.sqrt(np.mean((values - reference) ** 2)) / np.sqrt(np.mean(reference ** 2)))


TIE_SIGMAS = 4.0
"""The tie rule's width, in standard deviations sigma of one logit's error (see tie_error)."""


def tie_error(logits: np.ndarray, reference: np.ndarray) -> float:
    """The measured error on a difference of two logits of one step: TIE_SIGMAS x sqrt(2) x sigma, sigma being the
    standard deviation over the vocabulary of appliance minus reference (at most the step's relative RMS error x the
    reference's RMS; an error common to every logit leaves their differences alone, so its mean is not counted).
    Two logits' errors of deviation sigma give their difference a deviation of sqrt(2) x sigma."""
    error = np.asarray(logits, np.float64) - np.asarray(reference, np.float64)
    return TIE_SIGMAS * math.sqrt(2.0) * float(np.std(error))


@dataclass(frozen=True)
class TokenStep:
    """A step where the appliance chose another token than the reference, after the same tokens."""
    step: int
    token: int
    reference_token: int
    margin: float | None
    """The reference's logit of its token minus its logit of the appliance's (None for a sampled token)."""
    error: float
    """tie_error of the step's logits."""

    @property
    def near_tie(self) -> bool:
        """The tie rule: a greedy step whose margin is at most the measured error."""
        return self.margin is not None and self.margin <= self.error

    def describe(self) -> str:
        """"step 0, margin 7.6e-04 <= error 3.1e-03" (a sampled step: "step 3, sampled")."""
        if self.margin is None:
            return f"step {self.step}, sampled"
        return f"step {self.step}, margin {self.margin:.1e} {'<=' if self.near_tie else '>'} error {self.error:.1e}"


@dataclass(frozen=True)
class TokenVerdict:
    """The tokens of every compared step: those that differ from the reference's, judged by the tie rule."""
    differing: tuple
    """TokenStep of every step whose tokens differ, in step order."""

    @property
    def passed(self) -> bool:
        """Every differing step is a near tie."""
        return all(step.near_tie for step in self.differing)

    def phrase(self) -> str:
        """"tokens match", "tokens match except 1 near-tie (step 0, ...)" or "tokens differ at 2 steps (...)"."""
        count = len(self.differing)
        if not count:
            return "tokens match"
        steps = "; ".join(step.describe() for step in self.differing[:3]) + ("; ..." if count > 3 else "")
        if self.passed:
            return f"tokens match except {count} near-tie{'s' if count > 1 else ''} ({steps})"
        return f"tokens differ at {count} step{'s' if count > 1 else ''} ({steps})"


def compare_tokens(tokens, reference_tokens, logits, reference_logits, greedy: bool = True) -> TokenVerdict:
    """Step i's token (chosen from logits[i]) against the reference's (from reference_logits[i]), both chosen after
    the same tokens; a greedy step's margin is in the reference's logits (sampled steps have none)."""
    return TokenVerdict(tuple(
        TokenStep(i, int(ours), int(theirs), float(ref[theirs]) - float(ref[ours]) if greedy else None,
                  tie_error(row, ref))
        for i, (ours, theirs, row, ref) in enumerate(zip(tokens, reference_tokens, logits, reference_logits))
        if ours != theirs))


@dataclass
class ReferenceCheck:
    """The appliance's tokens scored by the PyTorch FP32 reference (teacher forcing, same sampling config and seed)."""
    reference_ids: list
    """The reference's token at each step, chosen after the prompt and the appliance's tokens before that step."""
    tokens: TokenVerdict
    steps_compared: int
    logits_rel_rms: float
    """Relative RMS error of the appliance's logits over every step."""
    wall_s: float
    bound: float = LOGITS_BOUND
    reference: str = "PyTorch FP32 reference"
    """What the logits were compared with (the verdict's first words)."""

    @property
    def tokens_match(self) -> bool:
        """Every token equals the reference's (no near ties either)."""
        return not self.tokens.differing

    @property
    def first_mismatch(self) -> int | None:
        """The first step whose tokens differ (None when they all match)."""
        return self.tokens.differing[0].step if self.tokens.differing else None

    @property
    def passed(self) -> bool:
        """The one verdict: tokens equal but for near ties, and logits within the stated bound."""
        return self.tokens.passed and self.logits_rel_rms <= self.bound

    def verdict(self) -> str:
        """"PyTorch FP32 reference: PASS (tokens match, logits relative RMS error 1.3e-03 <= 1e-02 bound ...)"."""
        relation = "<=" if self.logits_rel_rms <= self.bound else ">"
        return (f"{self.reference}: {'PASS' if self.passed else 'FAIL'} ({self.tokens.phrase()}, logits relative "
                f"RMS error {self.logits_rel_rms:.1e} {relation} {self.bound:.0e} bound, over {self.steps_compared} "
                "steps)")


def teacher_forced_logits(model, prompt_ids, generated_ids) -> np.ndarray:
    """The reference's float32 logits at every step of a generation, fed the prompt and the generated tokens before
    that step: one forward pass."""
    ids = torch.tensor([list(prompt_ids) + list(generated_ids[:-1])], device=model.device)
    with torch.inference_mode():
        return model(ids, logits_to_keep=len(generated_ids)).logits[0].float().cpu().numpy()


def check_against_reference(model, result: ApplianceResult, sampling: SamplingConfig,
                            reference: str = "PyTorch FP32 reference") -> ReferenceCheck:
    """Scores the appliance's tokens with the PyTorch reference (`model` as given: FP32 for the reference path, named
    `reference` in the verdict): its logits after the appliance's own tokens, the token the same sampler (same seed)
    chooses from them at each step, the tokens judged by the tie rule (compare_tokens) and the logits against the
    bound."""
    started = time.perf_counter()
    logits = teacher_forced_logits(model, result.prompt_ids, result.generated_ids)
    sampler = TokenSampler(sampling)
    reference_ids = [sampler.next_token(row) for row in logits]
    wall_s = time.perf_counter() - started
    tokens = compare_tokens(result.generated_ids, reference_ids, result.logits, logits, sampling.greedy)
    return ReferenceCheck(reference_ids, tokens, len(reference_ids), relative_rms(result.logits, logits), wall_s,
                          reference=reference)


@dataclass
class GenerationReport:
    """Everything one appliance generation produced and cost."""
    prompt: str
    text: str
    """The generated text (EOS, if generated, included as <|endoftext|>)."""
    result: ApplianceResult
    model: str
    config: str
    weights_hash: str
    image_cached: bool
    compile_s: float
    """Seconds spent compiling (or loading the cached image)."""
    reference: ReferenceCheck | None
    weights: str = "fp16"
    float_rel_rms: float | None = None
    """With INT8 weights: the logits' relative RMS error against the FP32 model itself (not quantised), for the
    record; the verdict is against the same model quantised (host.reference.models.int8_model)."""

    @property
    def generated_ids(self) -> list:
        return self.result.generated_ids


def run_generation(prompt: str, *, model: str = "bundled", config: str = "u280", cards: int = 4,
                   sampling: SamplingConfig | None = None, on_token: Callable[[int], None] | None = None,
                   check_reference: bool = True, max_context: int = 1024, backend: str = "sim",
                   device_options: dict | None = None, weights: str = "fp16") -> GenerationReport:
    """Generates text after `prompt` on `cards` cards of architecture `config`, simulated by `backend` ("sim":
    the functional simulator with the cycle model's timing at every clock of timing_variants; "rtl": the cores'
    RTL, `device_options` naming the simulator):
    loads the model (FP32; the appliance takes it as FP16) and the GPT-2 tokenizer, compiles the model
    (cached under ~/.cache/ringgpt), generates, calling on_token(id) as each token is chosen, and with
    check_reference compares tokens and logits with the PyTorch FP32 reference (same sampling and seed). `weights`:
    the matrix weights' format on the appliance (compiler.WEIGHT_FORMATS); with "int8" the reference is the same
    model quantised alike in PyTorch (FP32 arithmetic), and the error against the unquantised model is reported
    beside it."""
    sampling = sampling or SamplingConfig()
    tokenizer = load_tokenizer()
    prompt_ids = tokenizer.encode(prompt)
    arch = get_config(config, cards)
    fields = source_fields(model)  # everything checkable from the model's config, before its weights load
    context = min(max_context, fields["n_positions"])
    validate_prompt(prompt_ids, sampling, vocab_size=fields["vocab_size"], context=context,
                    context_name="the appliance's context")
    preflight(fields, arch, context, int8=weights == "int8")
    net = load_model(model, dtype=torch.float32)
    started = time.perf_counter()
    image, cached = cached_image(net, arch, context, weights=weights)
    compile_s = time.perf_counter() - started
    options = dict(device_options or {})
    if backend == "sim":
        options["timing"] = {label: cfg for label, cfg in timing_variants(arch, with_conservative=False).items()
                             if cfg != arch}
    device = open_device(backend, arch, **options)
    try:
        result = Appliance(device, image).generate(prompt_ids, sampling, on_token)
    finally:
        device.close()
    reference = float_rel_rms = None
    if check_reference and weights == "int8":
        reference = check_against_reference(int8_model(net), result, sampling, "PyTorch FP32 reference, INT8 weights")
        float_rel_rms = relative_rms(result.logits, teacher_forced_logits(net, result.prompt_ids,
                                                                          result.generated_ids))
    elif check_reference:
        reference = check_against_reference(net, result, sampling)
    return GenerationReport(prompt=prompt, text=tokenizer.decode(result.generated_ids), result=result, model=model,
                            config=arch.name, weights_hash=image.meta["weights_hash"], image_cached=cached,
                            compile_s=compile_s, reference=reference, weights=weights, float_rel_rms=float_rel_rms)

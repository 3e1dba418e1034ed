"""run_generation: text in, text out on the simulated appliance, checked against the PyTorch reference.
What `ringgpt generate --backend sim` (and `--backend rtl`) calls."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ringgpt.host.reference.generate import generate as reference_generate
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig, validate_prompt
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


def relative_rms(values: np.ndarray, reference: np.ndarray) -> float:
    """sqrt(mean((values - reference)^2)) / sqrt(mean(reference^2))."""
    values, reference = np.asarray(values, np.float64), np.asarray(reference, np.float64)
    return float(np.sqrt(np.mean((values - reference) ** 2)) / np.sqrt(np.mean(reference ** 2)))


@dataclass
class ReferenceCheck:
    """The appliance against the PyTorch FP32 reference with the same sampling config and seed."""
    reference_ids: list
    tokens_match: bool
    first_mismatch: int | None
    """Index of the first generated token that differs (None when they all match)."""
    steps_compared: int
    """Steps whose logits were compared: up to and including the first mismatch (same context before it)."""
    logits_rel_rms: float
    """Relative RMS error of the appliance's logits over those steps."""
    wall_s: float
    mismatch_margin: float | None = None
    """At the first mismatch: the reference's logit of its token minus its logit of the appliance's token (a
    margin near zero is a near tie that FP16 rounding can flip; a large one is a wrong result)."""
    bound: float = LOGITS_BOUND

    @property
    def passed(self) -> bool:
        """The one verdict: the same tokens and logits within the stated bound."""
        return self.tokens_match and self.logits_rel_rms <= self.bound

    def verdict(self) -> str:
        """"PyTorch FP32 reference: PASS (tokens match, logits relative RMS error 1.3e-03 <= 1e-02 bound ...)"."""
        if self.tokens_match:
            tokens = "tokens match"
        else:
            tokens = f"tokens differ from generated token {self.first_mismatch}"
            if self.mismatch_margin is not None:
                tokens += f" (reference logit margin {self.mismatch_margin:.3g})"
        relation = "<=" if self.logits_rel_rms <= self.bound else ">"
        return (f"PyTorch FP32 reference: {'PASS' if self.passed else 'FAIL'} ({tokens}, logits relative RMS error "
                f"{self.logits_rel_rms:.1e} {relation} {self.bound:.0e} bound, over {self.steps_compared} steps)")


def check_against_reference(model, result: ApplianceResult, sampling: SamplingConfig) -> ReferenceCheck:
    """Runs the PyTorch reference (`model` as given: FP32 for the reference path) on the same prompt and
    compares tokens and logits."""
    started = time.perf_counter()
    ref = reference_generate(model, result.prompt_ids, sampling, return_logits=True)
    wall_s = time.perf_counter() - started
    ours, theirs = result.generated_ids, ref.generated_ids
    common = min(len(ours), len(theirs))
    first = next((i for i in range(common) if ours[i] != theirs[i]), None)
    if first is None and len(ours) != len(theirs):
        first = common
    steps = common if first is None else min(first + 1, common)
    error = relative_rms(result.logits[:steps], ref.logits[:steps])
    margin = (float(ref.logits[first][theirs[first]] - ref.logits[first][ours[first]])
              if first is not None and first < common else None)
    return ReferenceCheck(list(theirs), first is None, first, steps, error, wall_s, margin)


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

    @property
    def generated_ids(self) -> list:
        return self.result.generated_ids


def run_generation(prompt: str, *, model: str = "bundled", config: str = "u280", cards: int = 4,
                   sampling: SamplingConfig | None = None, on_token: Callable[[int], None] | None = None,
                   check_reference: bool = True, max_context: int = 1024, backend: str = "sim",
                   device_options: dict | None = None) -> GenerationReport:
    """Generates text after `prompt` on `cards` cards of architecture `config`, simulated by `backend` ("sim":
    the functional simulator with the cycle model's timing at every clock of timing_variants; "rtl": the cores'
    RTL, `device_options` naming the simulator):
    loads the model (FP32; the appliance takes it as FP16) and the GPT-2 tokenizer, compiles the model
    (cached under ~/.cache/ringgpt), generates, calling on_token(id) as each token is chosen, and with
    check_reference compares tokens and logits with the PyTorch FP32 reference (same sampling and seed)."""
    sampling = sampling or SamplingConfig()
    tokenizer = load_tokenizer()
    prompt_ids = tokenizer.encode(prompt)
    arch = get_config(config, cards)
    fields = source_fields(model)  # everything checkable from the model's config, before its weights load
    context = min(max_context, fields["n_positions"])
    validate_prompt(prompt_ids, sampling, vocab_size=fields["vocab_size"], context=context,
                    context_name="the appliance's context")
    preflight(fields, arch, context)
    net = load_model(model, dtype=torch.float32)
    started = time.perf_counter()
    image, cached = cached_image(net, arch, context)
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
    reference = check_against_reference(net, result, sampling) if check_reference else None
    return GenerationReport(prompt=prompt, text=tokenizer.decode(result.generated_ids), result=result, model=model,
                            config=arch.name, weights_hash=image.meta["weights_hash"], image_cached=cached,
                            compile_s=compile_s, reference=reference)

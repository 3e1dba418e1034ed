"""Latency of the reference path: time to first token and per-token decode time, as medians over repeated runs
after warm-up runs, with the GPU synchronised around every run."""
from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import numpy as np
import torch
from transformers import GPT2LMHeadModel, StaticCache

from ringgpt.host.errors import DeviceUnavailableError, RequestError
from ringgpt.host.reference.generate import Timings, check_request, generate
from ringgpt.host.reference.sampling import SamplingConfig

DYNAMIC = "dynamic-cache"
STATIC_COMPILED = "static-cache+compile"
VARIANTS = (DYNAMIC, STATIC_COMPILED)


@dataclass(frozen=True)
class Measurement:
    """Medians over `repeats` greedy runs of prompt_len prompt tokens and new_tokens generated tokens."""

    variant: str
    prompt_len: int
    new_tokens: int
    repeats: int
    ttft_ms: float
    decode_ms_per_token: float


def measure(model: GPT2LMHeadModel, prompt_len: int, new_tokens: int, *, repeats: int = 5, warmup: int = 1,
            variant: str = DYNAMIC, seed: int = 0) -> Measurement:
    """Times `variant` on a seeded random prompt: DYNAMIC is the reference loop (generate); STATIC_COMPILED (CUDA
    only) is what a user would pick for speed: a static KV cache and torch.compile(mode="reduce-overhead")."""
    if variant not in VARIANTS:
        raise RequestError(f"unknown timing variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if repeats < 1 or warmup < 0 or new_tokens < 2:
        raise RequestError(f"repeats={repeats} must be >= 1, warmup={warmup} >= 0 and new_tokens={new_tokens} >= 2 "
                           "(decode time needs a second token)")
    cfg = SamplingConfig(greedy=True, max_new_tokens=new_tokens, stop_at_eos=False)
    prompt = np.random.default_rng(seed).integers(0, model.config.vocab_size, prompt_len).tolist()
    check_request(model, prompt, cfg)
    if variant == DYNAMIC:
        def run() -> Timings:
            return generate(model, prompt, cfg, return_logits=False).timings
    elif model.device.type != "cuda":
        raise DeviceUnavailableError(f"the {STATIC_COMPILED} variant needs a CUDA device (CUDA graphs), the model "
                                     f"is on {model.device}: time the {DYNAMIC} variant instead")
    else:
        decoder = StaticCompiledDecoder(model, prompt_len + new_tokens)

        def run() -> Timings:
            return decoder.generate(prompt, new_tokens)[1]
    samples = []
    for i in range(warmup + repeats):
        _synchronize(model.device)
        timings = run()
        _synchronize(model.device)
        if i >= warmup:
            samples.append(timings)
    return Measurement(variant=variant, prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                       ttft_ms=1e3 * statistics.median(t.ttft_s for t in samples),
                       decode_ms_per_token=1e3 * statistics.median(s for t in samples for s in t.decode_s))


class StaticCompiledDecoder:
    """Greedy decoding with a StaticCache of max_len positions: the prompt runs eagerly, every decode step through
    torch.compile(mode="reduce-overhead") (CUDA graphs); one cache is reused (reset) across runs."""

    def __init__(self, model: GPT2LMHeadModel, max_len: int):
        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.step = torch.compile(model, mode="reduce-overhead", fullgraph=True)

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[list[int], Timings]:
        """Greedy tokens after `prompt` and their timings."""
        tokens, decode_s = [], []
        with torch.inference_mode():
            self.cache.reset()
            start = perf_counter()
            logits = self.model(torch.tensor([prompt], device=self.model.device), past_key_values=self.cache,
                                use_cache=True, logits_to_keep=1).logits
            token = logits[0, -1].argmax()
            tokens.append(int(token))
            ttft_s = perf_counter() - start
            for _ in range(new_tokens - 1):
                start = perf_counter()
                torch.compiler.cudagraph_mark_step_begin()
                logits = self.step(token.view(1, 1), past_key_values=self.cache, use_cache=True).logits
                token = logits[0, -1].argmax()
                tokens.append(int(token))
                decode_s.append(perf_counter() - start)
        return tokens, Timings(ttft_s=ttft_s, decode_s=tuple(decode_s))


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)

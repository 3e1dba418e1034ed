"""The reference generation loop: the prompt in one forward pass, then one token per step with the KV cache."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np
import torch
from transformers import DynamicCache, GPT2LMHeadModel

from ringgpt.host.errors import RequestError
from ringgpt.host.reference.sampling import SamplingConfig, TokenSampler, validate_prompt  # noqa: F401


@dataclass(frozen=True)
class Timings:
    """ttft_s: from the call to the first token chosen; decode_s[i]: seconds to choose generated token i+1
    (the on_token callback's own time is excluded)."""

    ttft_s: float
    decode_s: tuple[float, ...]

    @property
    def decode_ms_per_token(self) -> float | None:
        """Mean decode time per token in ms (None when only one token was generated)."""
        return 1e3 * sum(self.decode_s) / len(self.decode_s) if self.decode_s else None


@dataclass
class GenerationResult:
    """Tokens and what produced them. logits[i] (float32) chose generated_ids[i]; hidden_states[layer][p] is the
    output of transformer block `layer` at position p, for every position fed to the model
    (len(prompt_ids) + len(generated_ids) - 1 rows: the last token is never fed back)."""

    prompt_ids: list[int]
    generated_ids: list[int]
    logits: np.ndarray | None
    timings: Timings
    hidden_states: dict[int, np.ndarray] = field(default_factory=dict)


def check_request(model: GPT2LMHeadModel, prompt_ids: list[int], cfg: SamplingConfig,
                  hidden_layers: tuple[int, ...] = ()) -> None:
    """Raises PromptError / SamplingConfigError / RequestError when the model cannot serve this request."""
    c = model.config
    validate_prompt(prompt_ids, cfg, vocab_size=c.vocab_size, context=c.n_positions)
    bad = [layer for layer in hidden_layers if not 0 <= layer < c.n_layer]
    if bad:
        raise RequestError(f"hidden layers {bad} do not exist: the model has layers 0..{c.n_layer - 1}")


def generate(model: GPT2LMHeadModel, prompt_ids: list[int], cfg: SamplingConfig, *, return_logits: bool = True,
             hidden_layers: tuple[int, ...] = (), on_token: Callable[[int], None] | None = None) -> GenerationResult:
    """Generates up to cfg.max_new_tokens tokens after `prompt_ids` (stopping after EOS if cfg.stop_at_eos),
    calling on_token(id) as each token is chosen."""
    check_request(model, prompt_ids, cfg, hidden_layers)
    sampler = TokenSampler(cfg)
    captured: dict[int, list[np.ndarray]] = {layer: [] for layer in hidden_layers}
    hooks = [model.transformer.h[layer].register_forward_hook(_capture_into(rows)) for layer, rows in captured.items()]
    generated: list[int] = []
    rows: list[np.ndarray] = []
    decode_s: list[float] = []
    try:
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            start = perf_counter()
            inputs = torch.tensor([prompt_ids], device=model.device)
            while True:
                out = model(inputs, past_key_values=cache, use_cache=True, logits_to_keep=1)
                row = out.logits[0, -1].float().cpu().numpy()
                token = sampler.next_token(row)
                elapsed = perf_counter() - start
                if generated:
                    decode_s.append(elapsed)
                else:
                    ttft_s = elapsed
                generated.append(token)
                if return_logits:
                    rows.append(row)
                if on_token is not None:
                    on_token(token)
                if len(generated) == cfg.max_new_tokens or (cfg.stop_at_eos and token == model.config.eos_token_id):
                    break
                start = perf_counter()
                inputs = torch.tensor([[token]], device=model.device)
    finally:
        for hook in hooks:
            hook.remove()
    return GenerationResult(
        prompt_ids=list(prompt_ids), generated_ids=generated,
        logits=np.stack(rows) if return_logits else None,
        timings=Timings(ttft_s=ttft_s, decode_s=tuple(decode_s)),
        hidden_states={layer: np.concatenate(parts) for layer, parts in captured.items()})


def _capture_into(rows: list[np.ndarray]):
    def hook(module, args, output):
        rows.append(output[0].float().cpu().numpy())
    return hook

"""The `ringgpt` command line. `ringgpt generate` streams generated text to stdout; status lines go to stderr.

A backend is one entry of BACKENDS: a function that loads what it needs, generates (calling on_token for each
token as it is chosen) and returns the summary lines to print after the text.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import click
from rich.console import Console
from rich.text import Text

from ringgpt.host.device import DeviceError
from ringgpt.host.errors import RingGPTError
from ringgpt.host.image import ImageError
from ringgpt.host.reference.generate import generate
from ringgpt.host.reference.models import DTYPES, load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.tokenizer import TextStream, load_tokenizer
from ringgpt.hw.config import ConfigError, ConfigMismatchError

DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef main():\n\t"
"""In the bundled model's style (the standard library, indented with tabs)."""
EXIT_USER_ERROR = 2


@dataclass(frozen=True)
class Request:
    """What `ringgpt generate` asks a backend for."""

    prompt: str
    prompt_ids: list[int]
    sampling: SamplingConfig
    model: str
    dtype: str
    device: str
    config: str = "u280"
    cards: int = 4
    check_reference: bool = True


Backend = Callable[[Request, Callable[[int], None], Console], list[str]]


def reference_backend(request: Request, on_token: Callable[[int], None], status: Console) -> list[str]:
    """The PyTorch reference path (transformers' GPT-2 with a KV cache), on the GPU when asked or present."""
    with status.status(Text(f"loading {request.model} ({request.dtype}, {request.device})")):
        model = load_model(request.model, dtype=DTYPES[request.dtype], device=request.device)
    status.print(Text(f"reference backend: {request.model} on {model.device}, {request.dtype}", style="dim"))
    result = generate(model, request.prompt_ids, request.sampling, return_logits=False, on_token=on_token)
    t = result.timings
    per_token = "n/a (one token)" if t.decode_ms_per_token is None else f"{t.decode_ms_per_token:.1f} ms/token"
    return [f"{len(result.generated_ids)} tokens; time to first token {1e3 * t.ttft_s:.1f} ms; decode {per_token}"]


def sim_backend(request: Request, on_token: Callable[[int], None], status: Console) -> list[str]:
    """The appliance: the model compiled for `cards` cards of `config`, run on the functional simulator;
    reports the simulation speed, the modeled time on the cards, and the check against the FP32 reference."""
    from ringgpt.host.runtime.generation import run_generation  # imports the simulator only when used

    status.print(Text(f"simulated appliance: {request.model} on {request.cards} x {request.config} "
                      "(compiling on first use, then cached)", style="dim"))
    report = run_generation(request.prompt, model=request.model, config=request.config, cards=request.cards,
                            sampling=request.sampling, on_token=on_token, check_reference=request.check_reference)
    result = report.result
    per_token = ("n/a (one token)" if result.decode_ms_per_token is None
                 else f"{result.decode_ms_per_token:.3f} ms/token")
    lines = [f"{len(result.generated_ids)} tokens on {report.config}; simulation {result.wall_s:.1f} s "
             f"({result.tokens_per_s:.2f} tokens/s); image {'cached' if report.image_cached else 'compiled'} "
             f"in {report.compile_s:.1f} s",
             f"modeled {report.config}: time to first token {1e3 * result.ttft_s:.2f} ms; decode {per_token}"]
    check = report.reference
    if check is not None:
        verdict = ("tokens match" if check.tokens_match
                   else f"tokens differ from generated token {check.first_mismatch}")
        lines.append(f"PyTorch FP32 reference: {verdict}; logits relative RMS error {check.logits_rel_rms:.1e} "
                     f"over {check.steps_compared} steps")
    return lines


BACKENDS: dict[str, Backend] = {"sim": sim_backend, "reference": reference_backend}


USER_ERRORS = (RingGPTError, ConfigError, ConfigMismatchError, ImageError)
"""Bad input: a one-line message and exit 2."""
EXIT_DEVICE_ERROR = 1


class _Main(click.Group):
    """Prints bad input (USER_ERRORS) as one line and exits 2, a failed device run as one line and
    exits 1, without a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            sys.exit(EXIT_USER_ERROR)
        except DeviceError as exc:
            click.echo(f"device error: {' '.join(str(exc).split())}", err=True)
            sys.exit(EXIT_DEVICE_ERROR)


@click.group(cls=_Main)
def main() -> None:
    """ringgpt: GPT-2 text generation on a DFX-style FPGA appliance and its references."""


@main.command("generate")
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--model", default="bundled", show_default=True,
              help="bundled | PATH (Hugging Face GPT-2 checkpoint directory) | synthetic:SIZE | synthetic:n_layer=..,n_embd=..,n_head=..")
@click.option("--backend", type=click.Choice(sorted(BACKENDS)), default="sim", show_default=True,
              help="sim: the appliance on the functional simulator; reference: PyTorch")
@click.option("--config", "config_name", default="u280", show_default=True, help="architecture preset (sim backend)")
@click.option("--cards", type=click.IntRange(1, 4), default=4, show_default=True, help="cards on the ring (sim backend)")
@click.option("--check-reference/--no-check-reference", default=True, show_default=True,
              help="compare the appliance's tokens and logits with the PyTorch FP32 reference (sim backend)")
@click.option("--max-new-tokens", type=int, default=SamplingConfig.max_new_tokens, show_default=True)
@click.option("--greedy/--sample", default=SamplingConfig.greedy, show_default=True,
              help="argmax decoding, or sampling with --temperature/--top-k/--top-p")
@click.option("--temperature", type=float, default=SamplingConfig.temperature, show_default=True)
@click.option("--top-k", type=int, default=SamplingConfig.top_k, show_default=True, help="0 = off")
@click.option("--top-p", type=float, default=SamplingConfig.top_p, show_default=True, help="1.0 = off")
@click.option("--seed", type=int, default=SamplingConfig.seed, show_default=True, help="sampling seed")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="fp32", show_default=True,
              help="reference backend (the appliance computes in FP16)")
@click.option("--device", default="auto", show_default=True, help="cpu | cuda | cuda:N | auto (reference backend)")
def generate_command(prompt: str, model: str, backend: str, config_name: str, cards: int, check_reference: bool,
                     max_new_tokens: int, greedy: bool, temperature: float, top_k: int, top_p: float, seed: int,
                     dtype: str, device: str) -> None:
    """Generate text after PROMPT, streaming tokens to stdout as they are chosen."""
    status = Console(stderr=True)
    tokenizer = load_tokenizer()
    sampling = SamplingConfig(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              max_new_tokens=max_new_tokens)
    sampling.validate()
    request = Request(prompt=prompt, prompt_ids=tokenizer.encode(prompt), sampling=sampling, model=model, dtype=dtype,
                      device=device, config=config_name, cards=cards, check_reference=check_reference)
    stream = TextStream(tokenizer)
    prompt_shown = False

    def on_token(token_id: int) -> None:
        nonlocal prompt_shown
        if not prompt_shown:
            click.echo(prompt, nl=False)
            prompt_shown = True
        if token_id != tokenizer.eos_id:
            click.echo(stream.push(token_id), nl=False)

    summary = BACKENDS[backend](request, on_token, status)
    click.echo(stream.flush())
    for line in summary:
        status.print(Text(line))

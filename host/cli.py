"""The `ringgpt` command line. `ringgpt generate` streams generated text to stdout; status lines go to stderr.

A backend is one entry of BACKENDS: a function that loads what it needs, generates and returns a GenerationResult.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import click
from rich.console import Console
from rich.text import Text

from ringgpt.host.errors import RingGPTError
from ringgpt.host.reference.generate import GenerationResult, generate
from ringgpt.host.reference.models import DTYPES, load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.tokenizer import TextStream, load_tokenizer

DEFAULT_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
EXIT_USER_ERROR = 2


@dataclass(frozen=True)
class Request:
    """What `ringgpt generate` asks a backend for."""

    prompt_ids: list[int]
    sampling: SamplingConfig
    model: str
    dtype: str
    device: str


Backend = Callable[[Request, Callable[[int], None], Console], GenerationResult]


def reference_backend(request: Request, on_token: Callable[[int], None], status: Console) -> GenerationResult:
    """The PyTorch reference path (transformers' GPT-2 with a KV cache)."""
    with status.status(Text(f"loading {request.model} ({request.dtype}, {request.device})")):
        model = load_model(request.model, dtype=DTYPES[request.dtype], device=request.device)
    status.print(Text(f"reference backend: {request.model} on {model.device}, {request.dtype}", style="dim"))
    return generate(model, request.prompt_ids, request.sampling, return_logits=False, on_token=on_token)


BACKENDS: dict[str, Backend] = {"reference": reference_backend}


class _Main(click.Group):
    """Prints a RingGPTError as one line and exits 2, without a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except RingGPTError as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            sys.exit(EXIT_USER_ERROR)


@click.group(cls=_Main)
def main() -> None:
    """ringgpt: GPT-2 text generation on a DFX-style FPGA appliance and its references."""


@main.command("generate")
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--model", default="bundled", show_default=True,
              help="bundled | PATH (Hugging Face GPT-2 checkpoint directory) | synthetic:SIZE | synthetic:n_layer=..,n_embd=..,n_head=..")
@click.option("--backend", type=click.Choice(sorted(BACKENDS)), default="reference", show_default=True)
@click.option("--max-new-tokens", type=int, default=SamplingConfig.max_new_tokens, show_default=True)
@click.option("--greedy/--sample", default=SamplingConfig.greedy, show_default=True,
              help="argmax decoding, or sampling with --temperature/--top-k/--top-p")
@click.option("--temperature", type=float, default=SamplingConfig.temperature, show_default=True)
@click.option("--top-k", type=int, default=SamplingConfig.top_k, show_default=True, help="0 = off")
@click.option("--top-p", type=float, default=SamplingConfig.top_p, show_default=True, help="1.0 = off")
@click.option("--seed", type=int, default=SamplingConfig.seed, show_default=True, help="sampling seed")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="fp32", show_default=True)
@click.option("--device", default="auto", show_default=True, help="cpu | cuda | cuda:N | auto")
def generate_command(prompt: str, model: str, backend: str, max_new_tokens: int, greedy: bool, temperature: float,
                     top_k: int, top_p: float, seed: int, dtype: str, device: str) -> None:
    """Generate text after PROMPT, streaming tokens to stdout as they are chosen."""
    status = Console(stderr=True)
    tokenizer = load_tokenizer()
    sampling = SamplingConfig(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              max_new_tokens=max_new_tokens)
    sampling.validate()
    request = Request(prompt_ids=tokenizer.encode(prompt), sampling=sampling, model=model, dtype=dtype, device=device)
    stream = TextStream(tokenizer)
    prompt_shown = False

    def on_token(token_id: int) -> None:
        nonlocal prompt_shown
        if not prompt_shown:
            click.echo(prompt, nl=False)
            prompt_shown = True
        if token_id != tokenizer.eos_id:
            click.echo(stream.push(token_id), nl=False)

    result = BACKENDS[backend](request, on_token, status)
    click.echo(stream.flush())
    t = result.timings
    per_token = "n/a (one token)" if t.decode_ms_per_token is None else f"{t.decode_ms_per_token:.1f} ms/token"
    status.print(Text(f"{len(result.generated_ids)} tokens; time to first token {1e3 * t.ttft_s:.1f} ms; "
                      f"decode {per_token}"))

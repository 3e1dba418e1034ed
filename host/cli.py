"""The `ringgpt` command line. `ringgpt generate` streams generated text to stdout; status lines go to stderr.

A backend is one entry of BACKENDS: a function that loads what it needs, generates (calling on_token for each
token as it is chosen) and returns the summary lines to print after the text.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

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
EXIT_CHECK_FAILED = 3
"""The appliance disagrees with the PyTorch FP32 reference beyond the stated bound (`generate`'s check, `check`)."""


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


@dataclass
class Summary:
    """What a backend reports after the text: status lines, and whether the reference check failed."""
    lines: list[str] = field(default_factory=list)
    check_failed: bool = False


Backend = Callable[[Request, Callable[[int], None], Console], "Summary | list[str]"]


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
    if check is None:
        return Summary(lines)
    lines.append(check.verdict())
    if not check.passed:
        lines.append(f"the layer-by-layer comparison: ringgpt check --model {request.model} --config "
                     f"{request.config} --cards {request.cards}")
    return Summary(lines, check_failed=not check.passed)


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


@main.command("generate", epilog=f"Exit status: 0; {EXIT_CHECK_FAILED} when the appliance's tokens or logits fail the "
              f"check against the PyTorch FP32 reference (the same tokens, logits within the stated bound); {EXIT_USER_ERROR} "
              f"for bad input; {EXIT_DEVICE_ERROR} when a device run fails.")
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
    """Generate text after PROMPT, streaming tokens to stdout as they are chosen.

    The sim backend then checks the tokens and logits against the PyTorch FP32 reference and prints one
    verdict, PASS or FAIL, against the stated bound; FAIL exits 3."""
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
    if not isinstance(summary, Summary):
        summary = Summary(list(summary))
    click.echo(stream.flush())
    for line in summary.lines:
        status.print(Text(line), soft_wrap=True)  # one line each, whatever the width (logs grep the verdict)
    if summary.check_failed:
        sys.exit(EXIT_CHECK_FAILED)


@main.command("check", epilog=f"Exit status: 0 when every value is within its bound and the tokens match; "
              f"{EXIT_CHECK_FAILED} when something leaves its bound (the first place is named); {EXIT_USER_ERROR} "
              f"for bad input; {EXIT_DEVICE_ERROR} when a device run fails.")
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--model", default="bundled", show_default=True,
              help="bundled | PATH (Hugging Face GPT-2 checkpoint directory) | synthetic:SIZE | synthetic:n_layer=..,n_embd=..,n_head=..")
@click.option("--config", "config_name", default="u280", show_default=True, help="architecture preset")
@click.option("--cards", type=click.IntRange(1, 4), default=4, show_default=True, help="cards on the ring")
@click.option("--steps", "--max-new-tokens", "steps", type=click.IntRange(0, None), default=4, show_default=True,
              help="teacher-forced decode steps after the prompt (the reference's greedy tokens)")
@click.option("--max-context", type=click.IntRange(1, None), default=1024, show_default=True,
              help="context the image is compiled for (at most the model's positions)")
@click.option("--max-rows", type=click.IntRange(1, None), default=None,
              help="tokens per prompt run (default: as many as the activation buffer holds)")
@click.option("--all-runs", is_flag=True, help="one table row per run and probe instead of the worst over runs")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="also write the full report (every probe, card and run) as JSON")
def check_command(prompt: str, model: str, config_name: str, cards: int, steps: int, max_context: int,
                  max_rows: int | None, all_runs: bool, json_path: str | None) -> None:
    """Compare the compiled programs on the functional simulator with the PyTorch FP32 reference, layer by layer.

    Runs PROMPT and then STEPS teacher-forced decode steps, snapshots every probed value (embedding, LN1, QKV,
    attention, projection, residual, LN2, MLP hidden, MLP out, residual, final LN, logits) on every card after
    the instruction that wrote it, and reports each one's relative RMS error against the reference, its bound,
    and the first place where an error leaves its bound: the card, the pc and the instruction."""
    import torch

    from ringgpt.host import check
    from ringgpt.host.compiler import compile_model
    from ringgpt.host.runtime import cached_image
    from ringgpt.hw.config import get_config
    from ringgpt.sim.functional import SimulatorDevice

    status = Console(stderr=True)
    out = Console(width=max(Console().width, 120))
    prompt_ids = load_tokenizer().encode(prompt)
    net = load_model(model, dtype=torch.float32)
    arch = get_config(config_name, cards)
    context = min(max_context, net.config.n_positions)
    with status.status(Text(f"compiling {model} for {arch.name}")):
        if max_rows is None:
            image, _ = cached_image(net, arch, context)
        else:
            image = compile_model(net, arch, context, max_rows=max_rows)
    status.print(Text(f"checking {model} on {arch.name} (functional simulator) against PyTorch FP32: "
                      f"{len(prompt_ids)} prompt tokens, {steps} decode steps", style="dim"))
    report = check.check_layers(net, image, SimulatorDevice(arch), prompt_ids, decode_steps=steps)
    out.print(check.report_table(report, all_runs=all_runs, title=f"ringgpt check: {model} on {arch.name}"))
    if report.missing:
        out.print(Text(f"not probed by this image: {', '.join(report.missing)}", style="yellow"))
    verdict = report.verdict()
    out.print(Text(verdict, style="bold green" if report.passed else "bold red"), soft_wrap=True)
    if json_path:
        check.write_json(report, json_path)
    if not report.passed:
        sys.exit(EXIT_CHECK_FAILED)

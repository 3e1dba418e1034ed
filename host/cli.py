"""The `ringgpt` command line. `ringgpt generate` streams generated text to stdout; status lines go to stderr.

A backend is one entry of BACKENDS: a function that loads what it needs, generates (calling on_token for each
token as it is chosen) and returns the summary lines to print after the text.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import click

from ringgpt.host.cli_support import (EXIT_CHECK_FAILED, EXIT_OK, EXIT_STATUS_HELP, Group, arch_config,
                                      check_report_target, config_options, debug_option, exit_status_help,
                                      model_option, reject_unused)
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.hw.numerics import WEIGHT_FORMATS

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_PROMPT = "import os\nimport sys\n\n\ndef main():\n\t"
"""In the bundled model's style (the standard library, indented with tabs)."""
DTYPE_NAMES = ("fp16", "fp32")
"""The reference backend's dtypes (ringgpt.host.reference.models.DTYPES, named here so --help needs no torch)."""
MAX_CONTEXT = 1024
"""The context the appliance image is compiled for (at most the model's positions)."""
SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "seed")


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
    simulator: str = "verilator"
    """The RTL simulator of the rtl backend."""
    weights: str = "fp16"
    """The appliance's matrix weights: fp16, or int8 (W8A16)."""


@dataclass
class Summary:
    """What a backend reports after the text: status lines, and whether the reference check failed."""
    lines: list[str] = field(default_factory=list)
    check_failed: bool = False


Backend = Callable[[Request, Callable[[int], None], "Console"], "Summary | list[str]"]


def reference_backend(request: Request, on_token: Callable[[int], None], status: Console) -> list[str]:
    """The PyTorch reference path (transformers' GPT-2 with a KV cache), on the GPU when asked or present."""
    from rich.text import Text

    from ringgpt.host.reference.generate import generate
    from ringgpt.host.reference.models import DTYPES, load_model

    with status.status(Text(f"loading {request.model} ({request.dtype}, {request.device})")):
        model = load_model(request.model, dtype=DTYPES[request.dtype], device=request.device)
    status.print(Text(f"reference backend: {request.model} on {model.device}, {request.dtype}", style="dim"))
    result = generate(model, request.prompt_ids, request.sampling, return_logits=False, on_token=on_token)
    t = result.timings
    per_token = "n/a (one token)" if t.decode_ms_per_token is None else f"{t.decode_ms_per_token:.1f} ms/token"
    return [f"{len(result.generated_ids)} tokens; time to first token {1e3 * t.ttft_s:.1f} ms; decode {per_token}"]


def appliance_backend(backend: str) -> Backend:
    """The appliance: the model compiled for `cards` cards of `config`, run on the functional simulator (`sim`), on
    the cores' RTL (`rtl`) or on Alveo boards (`alveo`); reports the speed, the time on the cards (modeled by the
    cycle model, or counted by the RTL or the boards' kernels), and the check against the FP32 reference."""
    def run(request: Request, on_token: Callable[[int], None], status: Console) -> Summary:
        from rich.text import Text

        what = {"sim": "simulated appliance", "rtl": f"RTL of the appliance ({request.simulator})",
                "alveo": "the appliance on Alveo boards"}[backend]
        if status.is_terminal:  # a progress note for a person; a script's stderr holds only what went wrong
            status.print(Text(f"{what}: {request.model} on {request.cards} x {request.config} "
                              "(compiling on first use, then cached)", style="dim"))
        from ringgpt.host.runtime.generation import run_generation  # imports torch and the simulator only when used

        options = {"simulator": request.simulator} if backend == "rtl" else None
        report = run_generation(request.prompt, model=request.model, config=request.config, cards=request.cards,
                                sampling=request.sampling, on_token=on_token, check_reference=request.check_reference,
                                backend=backend, device_options=options, weights=request.weights)
        result = report.result
        lines = [f"{len(result.generated_ids)} tokens on {report.config}; "
                 f"{'boards' if backend == 'alveo' else 'simulation'} {result.wall_s:.1f} s "
                 f"({result.tokens_per_s:.2f} tokens/s); image {'cached' if report.image_cached else 'compiled'} "
                 f"in {report.compile_s:.1f} s",
                 *(modeled_lines(report) if backend == "sim" else rtl_lines(report, counted_by=backend))]
        if report.float_rel_rms is not None:
            lines.append(f"INT8 weights: logits relative RMS error {report.float_rel_rms:.1e} against the FP32 model "
                         "itself, unquantised (for the record; the verdict below is against the same model quantised)")
        return verdict_summary(request, report, lines)
    return run


def rtl_lines(report, counted_by: str = "rtl") -> list[str]:
    """The cycles the RTL (or the boards' kernels: counted_by="alveo") counted in a generation, and what they come
    to at the config's clock."""
    result = report.result
    decode = result.decode_ms_under(None)
    per_token = "n/a (one token)" if decode is None else f"{decode:.3f} ms/token"
    counter = "kernel cycles on the boards" if counted_by == "alveo" else "RTL cycles"
    return [f"{counter} at the config's clock: time to first token {1e3 * result.ttft_under(None):.2f} ms; "
            f"decode {per_token} (device + launch)"]


def verdict_summary(request: Request, report, lines: list[str]) -> Summary:
    """`lines` and the reference check's verdict."""
    check = report.reference
    if check is None:
        return Summary(lines)
    lines.append(check.verdict())
    if not check.passed:
        lines.append(f"the layer-by-layer comparison: ringgpt check --model {request.model} --config "
                     f"{request.config} --cards {request.cards}")
    return Summary(lines, check_failed=not check.passed)


def modeled_lines(report) -> list[str]:
    """The modeled figures of a simulated generation: at the conservative clock first (the headline), then at the
    preset's; the host's per-token costs at the headline clock."""
    from ringgpt.hw.config import CONSERVATIVE_CLOCK_MHZ, get_config, timing_variants

    result = report.result
    arch = get_config(report.config)
    variants = timing_variants(arch, with_conservative=False)
    order = sorted(variants, key=lambda label: variants[label].clock_mhz != CONSERVATIVE_CLOCK_MHZ)
    lines = []
    for label in order:
        own = None if variants[label] == arch else label
        decode = result.decode_ms_under(own)
        per_token = "n/a (one token)" if decode is None else f"{decode:.3f} ms/token"
        lines.append(f"modeled {report.config} at {label}: time to first token {1e3 * result.ttft_under(own):.2f} ms; "
                     f"decode {per_token} (device + launch)")
    head = order[0]
    parts = result.per_token(variants[head], None if variants[head] == arch else head)
    if parts:
        shown = " + ".join(f"{stage} {1e6 * parts[stage]:.0f}" for stage in ("device", "launch", "upload", "read-back",
                                                                              "conversion", "sampling"))
        lines.append(f"per token at {head}, us: {shown} = {1e3 * parts['total']:.3f} ms "
                     f"(host {100 * parts['host_share']:.1f}% of device; conversion and sampling measured here)")
    return lines


BACKENDS: dict[str, Backend] = {"sim": appliance_backend("sim"), "rtl": appliance_backend("rtl"),
                                "alveo": appliance_backend("alveo"), "reference": reference_backend}
APPLIANCE_BACKENDS = ("sim", "rtl", "alveo")


@click.group(cls=Group, epilog=EXIT_STATUS_HELP)
@debug_option
def main() -> None:
    """ringgpt: GPT-2 text generation on a DFX-style FPGA appliance and its references.

    Errors are printed as one line (what, where, what to do); --debug shows the Python traceback."""


def _status_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def _preflight(prompt: str, model: str, sampling: SamplingConfig, steps: tuple[str, int, int], *,
               max_context: int | None, arch=None, max_rows: int | None = None, weights: str = "fp16"):
    """Everything that can be checked before a weight is read: the model's config, the prompt (UTF-8, not empty,
    in the vocabulary, fitting the context with the new tokens: `steps` is (the option, its value, its least value))
    and, for the appliance, the compiler's plan. Returns (tokenizer, prompt ids, the model's fields, the context)."""
    from ringgpt.host.reference.sampling import validate_prompt
    from ringgpt.host.reference.spec import source_fields
    from ringgpt.host.tokenizer import load_tokenizer

    fields = source_fields(model)
    if max_context is not None and max_context > fields["n_positions"]:
        raise click.UsageError(f"--max-context {max_context} exceeds the model's {fields['n_positions']} positions")
    context = min(max_context or MAX_CONTEXT, fields["n_positions"]) if arch is not None else fields["n_positions"]
    tokenizer = load_tokenizer()
    prompt_ids = tokenizer.encode(prompt)
    where = "the appliance's context" if arch is not None else "the model's context"
    hint = " (or compile with a larger --max-context)" if max_context is not None else ""
    _check_steps(len(prompt_ids), *steps, context=context, where=where, hint=hint)
    validate_prompt(prompt_ids, sampling, vocab_size=fields["vocab_size"], context=context, context_name=where,
                    hint=hint)
    if arch is not None:
        from ringgpt.host.compiler.dims import preflight
        preflight(fields, arch, context, max_rows=max_rows, int8=weights == "int8")
    return tokenizer, prompt_ids, fields, context


def _check_steps(prompt_tokens: int, option: str, value: int, lowest: int, *, context: int, where: str,
                 hint: str) -> None:
    """UsageError naming `option` and the values it may take when the prompt and `value` new positions exceed the
    context."""
    room = context - prompt_tokens
    if prompt_tokens and value > room:
        fix = f"give {option} in {lowest}..{room}" if room >= lowest else "shorten the prompt"
        raise click.UsageError(f"the prompt's {prompt_tokens} tokens + {option} {value} = {prompt_tokens + value} "
                               f"exceeds {where} of {context} positions: {fix}{hint}")


@main.command("generate", epilog=exit_status_help({
    EXIT_CHECK_FAILED: "when the appliance's tokens or logits fail the check against the PyTorch FP32 reference (the "
                       "same tokens but for near ties, logits within the stated bound)"}))
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@model_option
@click.option("--backend", type=click.Choice(sorted(BACKENDS)), default="sim", show_default=True,
              help="sim: the appliance on the functional simulator; rtl: on the cores' RTL (slow: --config "
                   "sim-small and a small model for quick runs; at u280 a core builds once in about 35 minutes and "
                   "a 1-layer 345M-width model's 3 tokens take 8 minutes); alveo: on Alveo U280 boards (PYNQ, a "
                   "bitstream from scripts/build_bitstream.py); reference: PyTorch")
@config_options(" (sim, rtl and alveo backends)")
@click.option("--simulator", type=click.Choice(["verilator", "icarus"]), default="verilator", show_default=True,
              help="the RTL simulator (rtl backend)")
@click.option("--check-reference/--no-check-reference", default=True, show_default=True,
              help="compare the appliance's tokens and logits with the PyTorch FP32 reference (sim, rtl and alveo "
                   "backends)")
@click.option("--weights", type=click.Choice(WEIGHT_FORMATS), default="fp16", show_default=True,
              help="the appliance's matrix weights: int8 = INT8 with an FP16 scale per output column (W8A16), "
                   "checked against the same model quantised in PyTorch")
@click.option("--max-new-tokens", type=int, default=SamplingConfig.max_new_tokens, show_default=True)
@click.option("--greedy", is_flag=True, help="argmax decoding (the default)")
@click.option("--sample", is_flag=True, help="sampling with --temperature/--top-k/--top-p")
@click.option("--temperature", type=float, default=SamplingConfig.temperature, show_default=True,
              help="with --sample")
@click.option("--top-k", type=int, default=SamplingConfig.top_k, show_default=True, help="with --sample; 0 = off")
@click.option("--top-p", type=float, default=SamplingConfig.top_p, show_default=True, help="with --sample; 1.0 = off")
@click.option("--seed", type=int, default=SamplingConfig.seed, show_default=True, help="sampling seed (with --sample)")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
              help="reference backend (the appliance computes in FP16)")
@click.option("--device", default="auto", show_default=True, help="cpu | cuda | cuda:N | auto (reference backend)")
@debug_option
@click.pass_context
def generate_command(ctx: click.Context, prompt: str, model: str, backend: str, config_name: str, cards: int | None,
                     simulator: str, check_reference: bool, weights: str, max_new_tokens: int, greedy: bool,
                     sample: bool, temperature: float, top_k: int, top_p: float, seed: int, dtype: str,
                     device: str) -> None:
    """Generate text after PROMPT, streaming tokens to stdout as they are chosen.

    The sim backend then checks the tokens and logits against the PyTorch FP32 reference and prints one
    verdict, PASS or FAIL, against the stated bound; FAIL exits 3. Options are checked against each other, the
    prompt against the model's config, before any weight is loaded."""
    if greedy and sample:
        raise click.UsageError("--greedy and --sample contradict each other: give one (greedy is the default)", ctx)
    greedy = not sample
    if greedy:
        reject_unused(ctx, SAMPLING_OPTIONS, "with greedy decoding", "sampling (add --sample)")
    if backend in APPLIANCE_BACKENDS:
        reject_unused(ctx, ("dtype", "device"), f"with the {backend} backend (the appliance computes in FP16)",
                      "--backend reference")
        if backend != "rtl":
            reject_unused(ctx, ("simulator",), f"with the {backend} backend", "--backend rtl")
        arch = arch_config(config_name, cards)
        config_name, cards = arch.name.rsplit("-x", 1)[0], arch.cards
        if backend == "alveo":  # PYNQ, the boards and the bitstream, before a weight is read
            from ringgpt.host.alveo import check_boards
            check_boards(arch)
    else:
        reject_unused(ctx, ("config_name", "cards", "check_reference", "simulator", "weights"), "with --backend reference",
                      "the sim, rtl or alveo backend (the appliance)")
        arch = None
        if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
            raise click.BadParameter(f"{device!r}: use cpu, cuda, cuda:N or auto", ctx, param_hint="'--device'")
    sampling = SamplingConfig(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              max_new_tokens=max_new_tokens)
    sampling.validate()
    tokenizer, prompt_ids, _, _ = _preflight(prompt, model, sampling, ("--max-new-tokens", max_new_tokens, 1),
                                             max_context=None, arch=arch, weights=weights)
    request = Request(prompt=prompt, prompt_ids=prompt_ids, sampling=sampling, model=model, dtype=dtype,
                      device=device, config=config_name, cards=cards or 4, check_reference=check_reference,
                      simulator=simulator, weights=weights)
    from rich.text import Text

    from ringgpt.host.tokenizer import TextStream

    status = _status_console()
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


@main.command("check", epilog=exit_status_help({
    EXIT_OK: "when every value is within its bound and the tokens match",
    EXIT_CHECK_FAILED: "when something leaves its bound (the first place is named)"}))
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@model_option
@click.option("--backend", type=click.Choice(APPLIANCE_BACKENDS), default="sim", show_default=True,
              help="sim: the functional simulator, every probed value; the others (rtl: the cores' RTL, slow: "
                   "--config sim-small and a small model for quick runs, minutes a run at u280; alveo: the boards) "
                   "run one layer at a time and compare the embedding, each layer's output and the logits")
@config_options()
@click.option("--simulator", type=click.Choice(["verilator", "icarus"]), default="verilator", show_default=True,
              help="the RTL simulator (rtl backend)")
@click.option("--steps", "--max-new-tokens", "steps", type=click.IntRange(0, None), default=4, show_default=True,
              help="teacher-forced decode steps after the prompt (the reference's greedy tokens)")
@click.option("--max-context", type=click.IntRange(1, None), default=None,
              help=f"context the image is compiled for  [default: {MAX_CONTEXT}, or the model's positions if fewer]")
@click.option("--max-rows", type=click.IntRange(1, None), default=None,
              help="tokens per prompt run (default: as many as the activation buffer holds)")
@click.option("--weights", type=click.Choice(WEIGHT_FORMATS), default="fp16", show_default=True,
              help="the appliance's matrix weights: int8 = W8A16, compared with the same model quantised "
                   "in PyTorch")
@click.option("--all-runs", is_flag=True, help="one table row per run and probe instead of the worst over runs")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="also write the full report (every probe, card and run) as JSON: a new file, or one that an "
                   "earlier --json wrote")
@debug_option
@click.pass_context
def check_command(ctx: click.Context, prompt: str, model: str, backend: str, config_name: str, cards: int | None,
                  simulator: str, steps: int, max_context: int | None, max_rows: int | None, weights: str,
                  all_runs: bool, json_path: str | None) -> None:
    """Compare the compiled programs on a device with the PyTorch FP32 reference, layer by layer.

    Runs PROMPT and then STEPS teacher-forced decode steps, snapshots every probed value (embedding, LN1, QKV,
    attention, projection, residual, LN2, MLP hidden, MLP out, residual, final LN, logits) on every card after
    the instruction that wrote it (on the functional simulator; other backends run one layer at a time and
    read back the embedding, each layer's output and the logits), and reports each one's relative RMS error
    against the reference, its bound, and the first place where an error leaves its bound: the card, the pc and
    the instruction."""
    if backend != "rtl":
        reject_unused(ctx, ("simulator",), f"with the {backend} backend", "--backend rtl")
    arch = arch_config(config_name, cards)
    if backend == "alveo":  # PYNQ, the boards and the bitstream, before a weight is read
        from ringgpt.host.alveo import check_boards
        check_boards(arch)
    if json_path:
        check_report_target(json_path)
    _, prompt_ids, _, context = _preflight(prompt, model, SamplingConfig(max_new_tokens=max(steps, 1)),
                                           ("--steps", steps, 0), max_context=max_context, arch=arch,
                                           max_rows=max_rows, weights=weights)
    import torch
    from rich.console import Console
    from rich.text import Text

    from ringgpt.host import check, check_report
    from ringgpt.host.compiler import compile_model
    from ringgpt.host.device import open_device
    from ringgpt.host.reference.models import int8_model, load_model
    from ringgpt.host.runtime import cached_image

    status = _status_console()
    out = Console(width=max(Console().width, 120))
    net = load_model(model, dtype=torch.float32)
    with status.status(Text(f"compiling {model} for {arch.name}")):
        if max_rows is None:
            image, _ = cached_image(net, arch, context, weights=weights)
        else:
            image = compile_model(net, arch, context, max_rows=max_rows, weights=weights)
    device = open_device(backend, arch, **({"simulator": simulator} if backend == "rtl" else {}))
    reference, against = (int8_model(net), "PyTorch FP32, the model quantised alike") if weights == "int8" else \
        (net, "PyTorch FP32")
    try:
        status.print(Text(f"checking {model} on {arch.name} ({device.status().name}) against {against}: "
                          f"{len(prompt_ids)} prompt tokens, {steps} decode steps", style="dim"))
        report = check.check_layers(reference, image, device, prompt_ids, decode_steps=steps)
    finally:
        device.close()
    out.print(check_report.report_table(report, all_runs=all_runs, title=f"ringgpt check: {model} on {arch.name}"))
    if report.missing:
        what = ("not probed by this image" if report.method == "run_watched"
                else "not compared (layer dispatch reads the embedding, each layer's output and the logits)")
        out.print(Text(f"{what}: {', '.join(report.missing)}", style="yellow"))
    verdict = report.verdict()
    out.print(Text(verdict, style="bold green" if report.passed else "bold red"), soft_wrap=True)
    if json_path:
        _write_atomically(json_path, lambda tmp: check_report.write_json(report, tmp))
    if not report.passed:
        sys.exit(EXIT_CHECK_FAILED)


def _write_atomically(path: str, write: Callable[[str], None]) -> None:
    """write(temporary sibling of path), then renames it onto path: a kill never leaves half a file at path. The
    target is checked again first (check_report_target): something may have appeared there during the run."""
    from ringgpt.host.image import _temporary_name

    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), _temporary_name(os.path.basename(path)))
    try:
        write(tmp)
        check_report_target(path)
        os.replace(tmp, path)
    except OSError as exc:  # named by the path asked for, not the temporary's
        raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    main(prog_name="ringgpt")

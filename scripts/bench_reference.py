"""Latency table of the PyTorch reference path on synthetic GPT-2 weights: time to first token and ms/token for
each size and prompt:output length; on CUDA also the static-KV-cache + torch.compile variant.

Example: python scripts/bench_reference.py --sizes gpt2-124m,gpt2-355m --lengths 32:32,64:64 --dtype fp32 --device cpu
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click
import torch
import transformers
from rich.console import Console
from rich.table import Table

from ringgpt.host.errors import RingGPTError
from ringgpt.host.reference.files import atomic_path
from ringgpt.host.reference.models import DTYPES, GPT2_SIZES, SYNTHETIC_PREFIX, load_model, resolve_device, size_config
from ringgpt.host.reference.timing import DYNAMIC, STATIC_COMPILED, device_name, measure


def _lengths(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(n) for n in item.split(":")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise click.BadParameter(f"{text!r}: give prompt:output pairs of positive integers, e.g. 32:32,64:64")
    return pairs


@click.command()
@click.option("--sizes", default="gpt2-124m,gpt2-355m", show_default=True, help=f"of {', '.join(GPT2_SIZES)}")
@click.option("--lengths", default="32:32,64:64,128:128,256:256", show_default=True, help="prompt:output pairs")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default="fp32", show_default=True)
@click.option("--device", default="auto", show_default=True, help="cpu | cuda | cuda:N | auto")
@click.option("--repeats", type=int, default=3, show_default=True, help="timed runs per cell (medians reported)")
@click.option("--warmup", type=int, default=1, show_default=True, help="untimed runs per cell")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads (default: torch's choice); 1 avoids OpenMP stalls on a shared machine")
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=Path("out/bench_reference.json"),
              show_default=True)
def main(sizes: str, lengths: str, dtype: str, device: str, repeats: int, warmup: int, threads: int | None,
         out_path: Path) -> None:
    """Measure, print a table and save the medians as JSON."""
    console = Console()
    if threads is not None:
        torch.set_num_threads(threads)
    pairs = _lengths(lengths)
    try:
        names = sizes.split(",")
        for name in names:
            size_config(name)
        target = resolve_device(device)
        variants = [DYNAMIC, STATIC_COMPILED] if target.type == "cuda" else [DYNAMIC]
        cells = []
        for size in names:
            model = load_model(f"{SYNTHETIC_PREFIX}{size}", dtype=DTYPES[dtype], device=str(target))
            for prompt_len, new_tokens in pairs:
                for variant in variants:
                    console.print(f"[dim]{size} {prompt_len}:{new_tokens} {variant}[/dim]")
                    m = measure(model, prompt_len, new_tokens, repeats=repeats, warmup=warmup, variant=variant)
                    cells.append({"size": size, **asdict(m)})
            del model
    except RingGPTError as exc:
        raise click.ClickException(str(exc)) from None
    report = {"device": device_name(target), "device_type": target.type, "torch": torch.__version__,
              "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(), "dtype": dtype,
              "repeats": repeats, "warmup": warmup, "cells": cells}
    _print_table(console, report, variants)
    if target.type != "cuda":
        console.print(f"[yellow]{STATIC_COMPILED} skipped: it needs CUDA (CUDA graphs)[/yellow]")
    with atomic_path(out_path) as tmp:
        tmp.write_text(json.dumps(report, indent=2))
    console.print(f"saved {out_path}")


def _print_table(console: Console, report: dict, variants: list[str]) -> None:
    table = Table(title=f"reference path, {report['dtype']}, {report['device']}, {report['torch_threads']} thread(s)")
    for column in ("size", "prompt:output"):
        table.add_column(column)
    for variant in variants:
        table.add_column(f"TTFT ms\n{variant}", justify="right")
        table.add_column(f"ms/token\n{variant}", justify="right")
    rows: dict[tuple, dict] = {}
    for cell in report["cells"]:
        rows.setdefault((cell["size"], cell["prompt_len"], cell["new_tokens"]), {})[cell["variant"]] = cell
    for (size, prompt_len, new_tokens), by_variant in rows.items():
        figures = [f"{by_variant[v][k]:.1f}" for v in variants for k in ("ttft_ms", "decode_ms_per_token")]
        table.add_row(size, f"{prompt_len}:{new_tokens}", *figures)
    console.print(table)


if __name__ == "__main__":
    main()

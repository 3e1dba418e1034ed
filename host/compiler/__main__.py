"""`python -m ringgpt.host.compiler --model bundled --config u280 --cards 4 --out DIR`: compiles a GPT-2 model
into an appliance image directory and prints a summary (instructions per card, HBM map, activation plan)."""
from __future__ import annotations

import signal
from collections import Counter
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ringgpt.host.cli_support import (EXIT_CHECK_FAILED, EXIT_FAULT, EXIT_INTERRUPTED, EXIT_USER_ERROR, Command,
                                      arch_config, config_options, debug_option, exit_status_help, model_option)
from ringgpt.hw.numerics import WEIGHT_FORMATS

if TYPE_CHECKING:
    from ringgpt.host.image import ApplianceImage

MB = 2 ** 20
DEFAULT_WBUF_SLOTS = 2
"""ringgpt.host.compiler.build.DEFAULT_WBUF_SLOTS, named here so that --help needs no torch (a test keeps them equal)."""


def summary_tables(image: ApplianceImage) -> list:
    """Rich tables: per card instruction counts by unit and HBM use; the HBM map of card 0 (KV regions folded)."""
    from rich.table import Table

    from ringgpt.hw.isa import Unit

    cfg, meta = image.config, image.meta
    cards = Table(title=f"{meta['source'] or 'model'} on {cfg.name}: max_rows {meta['max_rows']}, "
                        f"max_context {meta['max_context']}, KV group {meta['abuf'][0]['kv_group']} heads")
    units = [u for u in Unit if u is not Unit.CONTROL]
    for column in ["card", "heads", "instructions", *(u.name.lower() for u in units), "weights MiB", "KV MiB",
                   "HBM used"]:
        cards.add_column(column, justify="right")
    part = meta["partition"]
    for index, card in enumerate(image.cards):
        by_unit = Counter(inst.unit for inst in card.program.instructions)
        regions = meta["hbm_map"][index]
        weights = sum(r["words"] for r in regions if r["kind"] == "weights") * 2
        kv = sum(r["words"] for r in regions if r["kind"] == "kv") * 2
        h0, h1 = part["heads"][index]
        heads = "-" if h1 == h0 else str(h0) if h1 == h0 + 1 else f"{h0}..{h1 - 1}"
        cards.add_row(str(index), heads, f"{len(card.program.instructions):,}",
                      *(f"{by_unit[u]:,}" for u in units), f"{weights / MB:,.1f}", f"{kv / MB:,.1f}",
                      f"{100 * card.hbm_words / cfg.hbm_words:.1f}%")
    hbm = Table(title="HBM map of card 0 (word addresses)")
    for column in ("region", "kind", "start", "words", "MiB"):
        hbm.add_column(column, justify="right" if column != "region" else "left")
    regions = meta["hbm_map"][0]
    kv = [r for r in regions if r["kind"] == "kv"]
    for r in regions:
        if r["kind"] != "kv":
            hbm.add_row(r["name"], r["kind"], f"{r['start']:,}", f"{r['words']:,}", f"{2 * r['words'] / MB:,.1f}")
    if kv:
        words = sum(r["words"] for r in kv)
        hbm.add_row(f"KV cache x{len(kv)} layers", "kv", f"{kv[0]['start']:,}", f"{words:,}", f"{2 * words / MB:,.1f}")
    return [cards, hbm]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def _sigterm_as_interrupt():
    """Within it SIGTERM is handled as Ctrl-C: an image being written removes its temporaries and the exit status
    is 130."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command(cls=Command, epilog=exit_status_help({
    EXIT_FAULT: "an internal fault", EXIT_CHECK_FAILED: None,
    EXIT_USER_ERROR: "bad input or an environment you can fix (nothing is written)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGTERM, the image's temporaries removed)"}))
@model_option
@config_options()
@click.option("--max-context", type=click.IntRange(1, None), default=None,
              help="[default: 1024, or the model's positions if fewer]")
@click.option("--wbuf-slots", type=click.IntRange(2, None), default=DEFAULT_WBUF_SLOTS, show_default=True)
@click.option("--weights", type=click.Choice(WEIGHT_FORMATS), default="fp16", show_default=True,
              help="the matrix weights in HBM: int8 = INT8 with an FP16 scale per output column (W8A16)")
@click.option("--out", type=click.Path(), required=True,
              help="image folder to write: a new or empty one, or one that holds only an earlier image (a "
                   "manifest.json of ringgpt's and the files it lists)")
@click.option("--force", is_flag=True,
              help="write into a folder that holds other files too (only the image's own files are written, and "
                   "never over a file no ringgpt manifest lists)")
@debug_option
def main(model: str, config_name: str, cards: int | None, max_context: int | None, wbuf_slots: int, weights: str,
         out: str, force: bool) -> None:
    """Compile a GPT-2 model into an appliance image folder.

    Everything is checked before the model is loaded: the options, the model's config against the architecture,
    and --out (never a file; an existing folder only if it is empty or holds only an image, unless --force)."""
    with _sigterm_as_interrupt():
        _compile(model, config_name, cards, max_context, wbuf_slots, weights, out, force)


def _compile(model: str, config_name: str, cards: int | None, max_context: int | None, wbuf_slots: int,
             weights: str, out: str, force: bool) -> None:
    """main's work: the checks, then the compile, the image written and its summary printed."""
    from ringgpt.host.compiler.dims import preflight
    from ringgpt.host.image import check_output_dir
    from ringgpt.host.reference.spec import source_fields

    config = arch_config(config_name, cards)
    check_output_dir(out, force=force, cards=config.cards)
    fields = source_fields(model)
    if max_context is not None and max_context > fields["n_positions"]:
        raise click.BadParameter(f"{max_context} exceeds the model's {fields['n_positions']} positions",
                                 param_hint="'--max-context'")
    max_context = max_context or min(1024, fields["n_positions"])
    preflight(fields, config, max_context, wbuf_slots=wbuf_slots, int8=weights == "int8")

    import torch
    from rich.console import Console

    from ringgpt.host.compiler.build import compile_model
    from ringgpt.host.reference.models import load_model

    console = Console(width=120)
    image = compile_model(load_model(model, dtype=torch.float16), config, max_context, wbuf_slots=wbuf_slots,
                          weights=weights)
    image.save(out, force=force)
    for table in summary_tables(image):
        console.print(table)
    console.print(f"image written to {out}")


if __name__ == "__main__":
    main(prog_name="python -m ringgpt.host.compiler")

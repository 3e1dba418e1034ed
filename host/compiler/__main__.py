"""`python -m ringgpt.host.compiler --model bundled --config u280 --cards 4 --out DIR`: compiles a GPT-2 model
into an appliance image directory and prints a summary (instructions per card, HBM map, activation plan)."""
from __future__ import annotations

import sys
from collections import Counter

import click
import torch
from rich.console import Console
from rich.table import Table

from ringgpt.host.compiler.build import DEFAULT_WBUF_SLOTS, compile_model
from ringgpt.host.errors import RingGPTError
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.models import load_model
from ringgpt.hw.config import ConfigError, get_config
from ringgpt.hw.isa import Unit

MB = 2 ** 20


def summary_tables(image: ApplianceImage) -> list:
    """Rich tables: per card instruction counts by unit and HBM use; the HBM map of card 0 (KV regions folded)."""
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


@click.command()
@click.option("--model", default="bundled", show_default=True,
              help="bundled | PATH (Hugging Face GPT-2 checkpoint directory) | synthetic:SIZE | synthetic:n_layer=..")
@click.option("--config", "config_name", default="u280", show_default=True, help="architecture preset")
@click.option("--cards", type=click.IntRange(1, 4), default=4, show_default=True)
@click.option("--max-context", type=int, default=1024, show_default=True)
@click.option("--wbuf-slots", type=int, default=DEFAULT_WBUF_SLOTS, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="image directory to write")
def main(model: str, config_name: str, cards: int, max_context: int, wbuf_slots: int, out: str) -> None:
    """Compile a GPT-2 model into an appliance image."""
    console = Console(width=120)
    try:
        config = get_config(config_name, cards)
        image = compile_model(load_model(model, dtype=torch.float16), config, max_context, wbuf_slots=wbuf_slots)
    except (RingGPTError, ConfigError) as exc:
        click.echo(f"error: {' '.join(str(exc).split())}", err=True)
        sys.exit(2)
    image.save(out)
    for table in summary_tables(image):
        console.print(table)
    console.print(f"image written to {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The whole u280 core in RTL simulation: the compiler's programs for a GPT-2 of real width on the cores' RTL
(RtlDevice: Verilator or Icarus, one core per card on a ring) and on the functional simulator, a prompt run and
decode runs, every logit compared bit for bit, each run's cycles beside the cycle model's (sim/rtl_comparison.py).

    python scripts/rtl_u280.py --cards 1            # GPT-2 345M's width: n_embd 1,024, 16 heads, one layer

The build is cached (sim_build/, by the Verilog's digest and by the digest of the sources that make it), so only
the first run of a design pays for its conversion and the simulator's build; its `build.json` keeps what that took.
Records one entry per (config, cards, model, weights, simulator) under `runs` in docs/bench/rtl_u280.json. The model by
default: `rtl_comparison.REAL_WIDTH_MODEL` (its vocabulary reduced to 2,048 tokens, see there). Exit status 1 when a
logit differs.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import click

from ringgpt.host.reference.files import atomic_path
from ringgpt.hw.config import get_config
from ringgpt.hw.numerics import WEIGHT_FORMATS
from ringgpt.sim.cocotb_support.runner import SIMULATORS
from ringgpt.sim.rtl_comparison import REAL_WIDTH_MODEL, compare_with_simulator

ROOT = Path(__file__).resolve().parents[1]
SAME_CASE = ("config", "cards", "model", "weights", "simulator")


@click.command()
@click.option("--config", "preset", default="u280", show_default=True)
@click.option("--cards", type=click.IntRange(1, 4), default=1, show_default=True)
@click.option("--model", default=REAL_WIDTH_MODEL, show_default=True)
@click.option("--simulator", type=click.Choice(SIMULATORS), default="verilator", show_default=True)
@click.option("--weights", type=click.Choice(WEIGHT_FORMATS), default="fp16", show_default=True)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--decode-runs", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--max-context", type=int, default=64, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=ROOT / "docs" / "bench" / "rtl_u280.json",
              show_default=True)
def main(preset: str, cards: int, model: str, simulator: str, weights: str, prompt_tokens: int, decode_runs: int,
         max_context: int, out: Path) -> None:
    """Run the model on the RTL and on the functional simulator; print and record the comparison."""
    commit = _commit()      # the sources the run starts from
    entry = compare_with_simulator(get_config(preset, cards), model, simulator=simulator, prompt_tokens=prompt_tokens,
                                   decode_runs=decode_runs, max_context=max_context, weights=weights)
    entry["commit"] = commit
    click.echo(json.dumps(entry, indent=1))
    try:
        runs = json.loads(out.read_text())["runs"]
    except (OSError, ValueError, KeyError):
        runs = []
    runs = [r for r in runs if any(r.get(k) != entry[k] for k in SAME_CASE)] + [entry]
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps({"generated_by": "python scripts/rtl_u280.py", "runs": runs}, indent=1) + "\n")
    identical = entry["bit_identical"]
    click.echo(f"{'PASS' if identical else 'FAIL'}: logits {'bit-identical' if identical else 'differ'}; wrote {out}")
    raise SystemExit(0 if identical else 1)


def _commit() -> str:
    """The checkout's commit, "-dirty" when its tracked files differ from it ("unknown" outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


if __name__ == "__main__":
    main()

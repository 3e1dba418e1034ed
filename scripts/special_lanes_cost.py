#!/usr/bin/env python3
"""What time-sharing the vector unit's special functions costs: the modeled u280 appliance (bench_appliance.py's
cases, timing-only runs, the headline clock) with `special_lanes` set to each value given, against one set of
special-function cores per vector lane.

    python scripts/special_lanes_cost.py --lanes 32 --lanes 16 --lanes 8

Prints decode ms/token at bench_appliance's positions and the first token's ms for its prompt lengths, and each
one's change against special_lanes = vector_width (docs/architecture.md, "Special-function lanes").
"""
from __future__ import annotations

import dataclasses

import click
from rich.console import Console
from rich.table import Table

import bench_appliance
from ringgpt.hw.config import get_config


def modeled(lanes: int) -> dict:
    """bench_appliance's figures for every case with special_lanes = `lanes`: label -> {metric: ms}."""
    results = [bench_appliance.modeled_case(case, 1024, dataclasses.replace(get_config("u280", case["cards"]),
                                                                            special_lanes=lanes))
               for case in bench_appliance.CASES]
    return {r["label"]: {**{f"decode at pos {p}": d["ms"] for p, d in r["decode"].items()},
                         **{f"first token, {n}-token prompt": t["ms"] for n, t in r["ttft"].items()}}
            for r in results}


@click.command()
@click.option("--lanes", "lanes", type=int, multiple=True, default=(16,), show_default=True,
              help="special_lanes values to model (powers of two up to vector_width)")
def main(lanes: tuple) -> None:
    every = get_config("u280").vector_width
    base = modeled(every)
    others = {n: modeled(n) for n in lanes}
    table = Table(title=f"u280 appliance, modeled at {bench_appliance.HEADLINE}: special_lanes against {every}")
    for column in ("case", "metric", f"{every} lanes, ms", *(f"{n} lanes, ms (change)" for n in lanes)):
        table.add_column(column, justify="left" if column in ("case", "metric") else "right")
    for label, metrics in base.items():
        for metric, ms in metrics.items():
            table.add_row(label, metric, f"{ms:.3f}",
                          *(f"{others[n][label][metric]:.3f} ({100 * (others[n][label][metric] / ms - 1):+.2f} %)"
                            for n in lanes))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()

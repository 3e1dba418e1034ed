"""What `ringgpt check` shows of a CheckReport (host/check.py): a rich table for the terminal, and the same as plain
data for --json."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from rich.table import Table
from rich.text import Text

from ringgpt.host.check import BOUNDS, CheckReport, ProbeResult, layer_of
from ringgpt.host.runtime.generation import LOGITS_BOUND


def _cell(result: ProbeResult | None) -> Text:
    if result is None:
        return Text("-", style="dim")
    return Text(f"{result.rel_rms:.2e}", style="" if result.passed else "bold red")


def report_table(report: CheckReport, all_runs: bool = False, title: str = "ringgpt check") -> Table:
    """A rich table: one row per probed value (the worst over cards, over the prompt runs and over the decode runs),
    or with all_runs one row per run and value (the worst over cards)."""
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption="relative RMS error ||a - r|| / ||r|| against PyTorch FP32, the worst over cards and runs "
                          "(prompt runs, decode runs); the largest |a - r| and where: card/run/row/reference column")
    table.add_column("value")
    if all_runs:
        table.add_column("run (pos, rows)")
        table.add_column("rel. error", justify="right")
    else:
        table.add_column("prompt", justify="right")
        table.add_column("decode", justify="right")
    table.add_column("bound", justify="right")
    table.add_column("max abs err", justify="right")
    table.add_column("worst at")
    table.add_column("")
    previous = None
    for name in report.names():
        layer = layer_of(name)
        if previous is not None and layer != previous:
            table.add_section()
        previous = layer
        mine = [r for r in report.results if r.name == name]
        groups = [[r for r in mine if r.run == run] for run in range(len(report.runs))] if all_runs else [mine]
        for group in filter(None, groups):
            worst = max(group, key=lambda r: r.rel_rms)
            row = [name]
            if all_runs:
                row += [f"{worst.run} ({worst.pos}, {worst.rows})", _cell(worst)]
            else:
                row += [_cell(report.worst(name, decode=False)), _cell(report.worst(name, decode=True))]
            largest = max(group, key=lambda r: r.max_abs)
            row += [f"{worst.bound:.0e}", f"{largest.max_abs:.2e}",
                    f"{largest.card}/{largest.run}/{largest.worst_row}/{largest.worst_col}",
                    Text("ok", style="green") if all(r.passed for r in group) else Text("FAIL", style="bold red")]
            table.add_row(*row)
    return table


def report_dict(report: CheckReport) -> dict:
    """The report as plain data (JSON)."""
    def number(x):
        return x if math.isfinite(x) else str(x)
    return {"passed": report.passed, "verdict": report.verdict(), "runs": [list(r) for r in report.runs],
            "prompt_runs": report.prompt_runs, "tokens": report.tokens, "reference_tokens": report.reference_tokens,
            "logits_rel_rms": number(report.logits_rel_rms), "logits_bound": LOGITS_BOUND, "bounds": BOUNDS,
            "missing": report.missing, "method": report.method,
            "differing_tokens": [{**{k: (number(v) if isinstance(v, float) else v) for k, v in asdict(step).items()},
                                  "near_tie": step.near_tie} for step in report.token_verdict.differing],
            "first_failure": None if report.first_failure is None else report.first_failure.describe(),
            "results": [{**{k: (number(v) if isinstance(v, float) else v) for k, v in asdict(r).items()
                            if k != "writer"}, "passed": r.passed,
                         "writer": None if r.writer is None else asdict(r.writer)} for r in report.results]}


def write_json(report: CheckReport, path) -> None:
    """Writes the report as JSON with cli_support.CHECK_REPORT_MARK (what lets a later `check --json` replace it)."""
    from ringgpt.host.cli_support import CHECK_REPORT_MARK

    Path(path).write_text(json.dumps({**CHECK_REPORT_MARK, **report_dict(report)}, indent=1))

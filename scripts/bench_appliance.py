#!/usr/bin/env python3
"""Modeled U280 appliance figures beside DFX's published ones and measured GPUs, and the functional simulator's speed.

    python scripts/bench_appliance.py --out out/
    python scripts/bench_appliance.py --sim-tokens 0 --keep docs/bench/bench_appliance.json --out docs/bench

For GPT-2 124M, 345M, 774M and 1.5B on 1, 2 and 4 cards (config u280; FP16 weights, and INT8 weights with FP16
column scales, W8A16, the matrix unit's INT8 path): decode ms/token at several
positions, time to first token for 32/64/128-token prompts, and the HBM bound (weight bytes / (cards x 460 GB/s))
with the share of it reached, under every timing variant (the preset's 250 MHz, 200 MHz, the conservative set).
Per decode run and card, where its cycles went (`occupancy`: HBM streaming, compute with HBM idle, waits on the
ring, on the host link, the controller alone, after its HALT) and its own HBM bound. These are timing-only runs
(SimulatorDevice(compute=False): the cycle model over the compiled programs, no arithmetic); the programs do not
depend on weight values, so they are compiled from the models' architecture alone. Simulation speed: the
bit-exact functional simulator generating with GPT-2 124M (synthetic weights) on 4 cards, per second of wall time
and of this process's CPU time (the latter is steadier on a shared machine). The GPU: the reference path measured
on an H100 (--gpu-baseline) and the H200 figures quoted in issue 34 (--gpu-quoted), read from docs/bench/, never
measured here. Writes bench_appliance.json and bench_appliance.png to --out and prints tables. --keep takes the
host measurements (host_path's host stages, simulation) from an earlier JSON instead of measuring them again, with
this run's device times.

Accuracy is not checked here, and the output says so (ACCURACY_NOTE): the modeled figures come from runs without
arithmetic, and the simulation-speed run does not compare with the reference. The accuracy of the same programs at
these widths is checked by `ringgpt check` and the tests named in the note.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import click
import matplotlib
import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from transformers import GPT2LMHeadModel

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ringgpt.host.compiler import compile_model  # noqa: E402
from ringgpt.host.reference.models import load_model, synthetic_config  # noqa: E402
from ringgpt.host.reference.sampling import SamplingConfig  # noqa: E402
from ringgpt.host.runtime import Appliance  # noqa: E402
from ringgpt.host.runtime import hostpath  # noqa: E402
from ringgpt.hw.config import (CONSERVATIVE_CLOCK_MHZ, ArchConfig, clock_label, get_config,  # noqa: E402
                               timing_variants)
from ringgpt.hw.numerics import WEIGHT_FORMATS  # noqa: E402
from ringgpt.sim.cycle_model import instruction_class, instruction_cost, occupancy  # noqa: E402
from ringgpt.sim.cycle_model.occupancy import COMPUTE_PARTS, TERMS  # noqa: E402
from ringgpt.sim.functional import SimulatorDevice  # noqa: E402

SIZES = {"gpt2-124m": "124M", "gpt2-355m": "345M", "gpt2-774m": "774M", "gpt2-1.5b": "1.5B"}
CARD_COUNTS = (1, 2, 4)
DFX = {("gpt2-355m", 1): {"decode_ms": 5.4, "ttft_ms": {32: 177, 64: 349, 128: 693}},
       ("gpt2-1.5b", 4): {"decode_ms": 6.9, "ttft_ms": {32: 227, 64: 447, 128: 887}}}
"""DFX's published figures (MICRO 2022, 200 MHz), for the two cases it reports."""
CASES = [{"model": model, "label": f"GPT-2 {name}, {cards} card{'s' if cards > 1 else ''}"
                                    + (", INT8" if weights == "int8" else ""),
          "cards": cards, "weights": weights, "dfx": DFX.get((model, cards)) if weights == "fp16" else None}
         for weights in WEIGHT_FORMATS for model, name in SIZES.items() for cards in CARD_COUNTS]
"""Every size on every card count (all fit the u280's HBM at max_context 1024: the compiler raises CapacityError
where one would not); cases without a DFX figure have dfx None."""
DECODE_POSITIONS = (32, 128, 512)
PROMPT_LENGTHS = (32, 64, 128)
TOKEN = 464
"""The id fed at every position in timing runs ("The"; values do not affect timing)."""
ACCURACY_NOTE = (
    "accuracy: NOT checked by this benchmark. The modeled figures come from timing-only runs (no arithmetic) and "
    "the simulation-speed run is not compared with the reference. The same programs (the u280 preset, "
    "max_context 1024, the same activation-buffer plans) are checked against PyTorch FP32 at GPT-2's real widths "
    "by tests/test_real_sizes.py (345M's width on 1 and 3 cards and 1.5B's on 1 and 2 by default; every width on "
    "1-4 cards with -m slow: tokens equal, logits within 1e-2, measured 1.1e-3 to 1.4e-3), and on demand by "
    "`ringgpt check --model synthetic:n_layer=2,n_embd=1024,n_head=16 --cards 1` (or n_embd=1600,n_head=25 "
    "--cards 4). INT8 weights: the same programs' functional simulation against the model quantised in PyTorch at "
    "the four widths on 1-4 cards by tests/test_int8_weights.py (logits within 1e-2, measured 1.0e-3 to 1.1e-3), "
    "and the RTL's INT8 MATMULs bit-exact with the functional simulator at sim-small (tests/test_rtl_matrix.py, "
    "tests/test_rtl_core.py)")


MATRIX_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight", "wte.weight")
"""The parameters the matrix unit streams as INT8 with INT8 weights (wte: the LM head's copy)."""


def weight_bytes_of(model: GPT2LMHeadModel, weights: str) -> int:
    """The bytes of the model's weights (the HBM bound's numerator): two a parameter with FP16 weights (wte counted
    once, as the tied LM head); with INT8 weights one a matrix weight and two an output column's scale."""
    if weights == "fp16":
        return 2 * sum(p.numel() for p in model.parameters())
    total = 0
    for name, p in model.named_parameters():
        if name.endswith(MATRIX_WEIGHTS):
            total += p.numel() + 2 * (p.shape[0] if name.endswith("wte.weight") else p.shape[1])
        else:
            total += 2 * p.numel()
    return total


def architecture_only(size: str) -> GPT2LMHeadModel:
    with torch.device("meta"):
        return GPT2LMHeadModel(synthetic_config(size))


HEADLINE = clock_label(get_config("u280").at_clock(CONSERVATIVE_CLOCK_MHZ))
"""The assumption set the headline figures are given under: the preset at DFX's 200 MHz."""
SAMPLING_MODES = {"greedy": SamplingConfig(),
                  "top-k 50": SamplingConfig(greedy=False, top_k=50, seed=1),
                  "top-p 0.9": SamplingConfig(greedy=False, top_p=0.9, seed=1),
                  "top-k 50 + top-p 0.9": SamplingConfig(greedy=False, top_k=50, top_p=0.9, seed=1)}


LARGE_TRANSFER = 64 * 1024
"""Bytes from which an HBM transfer counts as large in `hbm_transfers`: the weight stream's LOADs are hundreds of
KiB to MiB, a decode step's KV-cache reads and writes and small vectors (biases, LayerNorm's) a few KiB."""


def hbm_transfers(card, trace: list, cfg: ArchConfig) -> dict:
    """One card's HBM transfers of a scheduled run, large (at least LARGE_TRANSFER bytes) and small: how many, the
    cycles the DMA unit held them (start to done), their bytes and those bytes at the HBM peak."""
    out = {size: {"transfers": 0, "cycles": 0, "bytes": 0} for size in ("large", "small")}
    for (_, _, start, done), r in zip(card.timeline, trace):
        if instruction_class(r) == "dma-hbm":
            nbytes = instruction_cost(r, cfg).hbm_bytes
            part = out["large" if nbytes >= LARGE_TRANSFER else "small"]
            part["transfers"] += 1
            part["cycles"] += done - start
            part["bytes"] += nbytes
    for part in out.values():
        part["bound_cycles"] = part["bytes"] / (cfg.hbm_peak_gbps * 1e3 / cfg.clock_mhz)
    return out


def modeled_case(case: dict, max_context: int, config: ArchConfig | None = None) -> dict:
    """Decode and time-to-first-token figures of one model/card count from timing-only runs, under every timing
    variant (the preset's clock, 200 MHz, the conservative set); `config`: the u280 preset on the case's cards
    unless given."""
    model = architecture_only(case["model"])
    weights = case.get("weights", "fp16")
    weight_bytes = weight_bytes_of(model, weights)
    config = config or get_config("u280", case["cards"])
    variants = timing_variants(config)
    image = compile_model(model, config, max_context, weights=weights)
    device = SimulatorDevice(config, compute=False, timing={k: v for k, v in variants.items() if v != config})
    appliance = Appliance(device, image)
    bound_ms = weight_bytes / (case["cards"] * config.hbm_peak_gbps * 1e9) * 1e3
    own = clock_label(config)

    def seconds(stats, label):
        return stats.seconds if label == own else stats.variants[label]

    decode = {}
    for pos in DECODE_POSITIONS:
        stats = appliance.run(pos, [TOKEN])
        traces = [card.trace for card in device.cards]
        reports = {own: device.last_report, **device.last_variant_reports}
        figures = {label: {"ms": 1e3 * seconds(stats, label), "bound_pct": 100 * bound_ms / (1e3 * seconds(stats, label)),
                           "device_ms": 1e3 * seconds(stats, label) - variants[label].launch_overhead_us / 1e3,
                           "cycles": reports[label].cycles,
                           "launch_cycles": round(variants[label].launch_overhead_us * variants[label].clock_mhz)}
                   for label in variants}
        figures[HEADLINE]["per_card"] = [{**c, "busy": dict(card.busy),
                                          "hbm_by_size": hbm_transfers(card, trace, variants[HEADLINE])}
                                         for c, card, trace in zip(occupancy(reports[HEADLINE], traces),
                                                                   reports[HEADLINE].cards, traces)]
        decode[pos] = {**figures[HEADLINE], "variants": figures,
                       "hbm_gbps_per_card": stats.hbm_bytes / case["cards"] / stats.seconds / 1e9,
                       "breakdown_cycles": stats.breakdown}
    ttft = {}
    for length in PROMPT_LENGTHS:
        runs = appliance.prefill([TOKEN] * length)
        figures = {label: {"ms": 1e3 * sum(seconds(r, label) for r in runs)} for label in variants}
        ttft[length] = {**figures[HEADLINE], "variants": figures, "runs": len(runs)}
    dfx = case.get("dfx")
    return {"label": case["label"], "model": case["model"], "cards": case["cards"], "config": config.name,
            "weights": weights, "weight_bytes": weight_bytes, "hbm_bound_ms": bound_ms,
            "max_rows": image.meta["max_rows"],
            "kv_group": image.meta["abuf"][0]["kv_group"], "host_logits": image.meta["host"]["logits"],
            "headline": HEADLINE, "decode": decode, "ttft": ttft,
            "assumptions": {label: {k: getattr(v, k) for k in ("clock_mhz", "hbm_efficiency", "hbm_page_miss_ns",
                                                                "launch_overhead_us", "host_transfer_latency_us")}
                            | {"ring_hop_ns": v.ring_latency_ns} for label, v in variants.items()},
            "dfx": {"decode_ms": dfx["decode_ms"], "ttft_ms": dfx["ttft_ms"]} if dfx else None,
            "decode_speedup_vs_dfx": {p: dfx["decode_ms"] / d["ms"] for p, d in decode.items()} if dfx else None,
            "ttft_speedup_vs_dfx": {n: dfx["ttft_ms"][n] / t["ms"] for n, t in ttft.items()} if dfx else None}


def representative_logits(steps: int = 24) -> np.ndarray:
    """FP16 logits of a trained model (the bundled one, GPT-2's 50,257-token vocabulary), one row per generated
    token: what sampling is timed on (the timing-only runs return zeros)."""
    from ringgpt.host.reference.generate import generate
    from ringgpt.host.tokenizer import load_tokenizer
    model = load_model("bundled", dtype=torch.float32)
    ids = load_tokenizer().encode("import os\nimport sys\n\ndef main(argv):\n    ")
    result = generate(model, ids, SamplingConfig(max_new_tokens=steps, stop_at_eos=False), return_logits=True)
    return result.logits.astype(np.float16)


def host_path(results: list, logits: np.ndarray) -> dict:
    """Per generated token, for every case, sampling mode and assumption set: device + launch + upload +
    read-back + conversion + sampling (hostpath.breakdown), decode at the first position."""
    out = {}
    for r in results:
        config = get_config("u280", r["cards"])
        variants = timing_variants(config)
        device_by_label = r["decode"][DECODE_POSITIONS[0]]["variants"]
        out[r["label"]] = {}
        for mode, cfg in SAMPLING_MODES.items():
            cost = hostpath.measure_host_stages(logits, cfg, r["host_logits"])
            out[r["label"]][mode] = {label: hostpath.breakdown(variants[label], device_by_label[label]["device_ms"] / 1e3, cost)
                                     for label in (HEADLINE, "conservative")}
    return out


def rebased_host_path(kept: dict, results: list) -> dict:
    """An earlier run's host_path with each entry's device time (and so its total and host share) this run's: the
    host stages (launch, transfers, conversion, sampling) do not depend on the device's figures."""
    out = {}
    for r in results:
        device_by_label = r["decode"][DECODE_POSITIONS[0]]["variants"]
        out[r["label"]] = {}
        for mode, sets in kept.get(r["label"], {}).items():
            out[r["label"]][mode] = {}
            for label, parts in sets.items():
                device = device_by_label[label]["device_ms"] / 1e3
                out[r["label"]][mode][label] = {**parts, "device": device, "total": parts["host"] + device,
                                                "host_share": parts["host"] / device}
    return {label: modes for label, modes in out.items() if modes}


def simulation_speed(tokens: int) -> dict:
    """Tokens per second of the bit-exact functional simulator: GPT-2 124M (synthetic weights) on 4 cards."""
    model = load_model("synthetic:gpt2-124m", dtype=torch.float32)
    config = get_config("u280", 4)
    started = time.perf_counter()
    image = compile_model(model, config, 256)
    compile_s = time.perf_counter() - started
    appliance = Appliance(SimulatorDevice(config), image)
    cpu = time.process_time()
    result = appliance.generate(list(range(1000, 1016)), SamplingConfig(max_new_tokens=tokens, stop_at_eos=False))
    cpu_s = time.process_time() - cpu
    decode_wall = sum(r.wall_seconds for r in result.decode_runs)
    return {"model": "synthetic:gpt2-124m", "config": config.name, "compile_s": compile_s,
            "prompt_tokens": 16, "generated_tokens": len(result.generated_ids), "wall_s": result.wall_s,
            "cpu_s": cpu_s, "tokens_per_s": result.tokens_per_s,
            "tokens_per_cpu_s": len(result.generated_ids) / cpu_s,
            "decode_tokens_per_s": len(result.decode_runs) / decode_wall if decode_wall else None}


GPU_BASELINE = Path(__file__).resolve().parent.parent / "docs" / "bench" / "reference_h100.json"
"""The PyTorch reference path measured on a GPU by scripts/bench_reference.py (docs/reference.md)."""
GPU_QUOTED = Path(__file__).resolve().parent.parent / "docs" / "bench" / "reference_h200_issue34.json"
"""GPU figures measured by an earlier session and quoted in issue 34 (its `source` says so), not measured here."""


def load_gpu_baseline(path: Path | None, results: list) -> dict | None:
    """Per case label, the GPU's fastest variant at the prompt:output length nearest the decode position and
    the 32-token prompt: {"device", "variant", "decode_ms", "ttft_ms"}; None without a file."""
    if path is None or not path.is_file():
        return None
    report = json.loads(path.read_text())
    out = {}
    for r in results:
        cells = [c for c in report["cells"] if c["size"] == r["model"]]
        if not cells:
            continue
        short = min(c["prompt_len"] for c in cells)
        best = min((c for c in cells if c["prompt_len"] == short), key=lambda c: c["decode_ms_per_token"])
        out[r["label"]] = {"device": f"{report['device']}, {report['dtype']}", "variant": best["variant"],
                           "lengths": f"{best['prompt_len']}:{best['new_tokens']}",
                           "decode_ms": best["decode_ms_per_token"], "ttft_ms": best["ttft_ms"]}
    return out


def load_gpu_quoted(path: Path | None) -> dict | None:
    """The quoted GPU figures (GPU_QUOTED's format): {"device", "source", "file", "by_model": {model: [cells]}}, each
    cell {"variant", "decode_ms" (a number, or [low, high] as quoted), "ttft_ms", "ttft_prompt_len"}; None without a
    file."""
    if path is None or not path.is_file():
        return None
    report = json.loads(path.read_text())
    by_model: dict = {}
    for c in report["cells"]:
        decode = c["decode_ms_per_token_range"] if "decode_ms_per_token_range" in c else c["decode_ms_per_token"]
        by_model.setdefault(c["size"], []).append({"variant": c["variant"], "decode_ms": decode,
                                                   "ttft_ms": c["ttft_ms"], "ttft_prompt_len": c["ttft_prompt_len"]})
    return {"device": f"{report['device']}, {report['dtype']}", "source": report["source"], "file": path.name,
            "by_model": by_model}


def _ms(value, digits: int = 2) -> str:
    """A figure or a quoted [low, high] range, in ms."""
    if isinstance(value, (list, tuple)):
        return f"{value[0]:.{digits}f}-{value[1]:.{digits}f} ms"
    return f"{value:.{digits}f} ms"


def _low(value) -> float:
    return value[0] if isinstance(value, (list, tuple)) else value


def table(results: list, sim: dict | None) -> Table:
    labels = list(results[0]["decode"][DECODE_POSITIONS[0]]["variants"])
    t = Table(title=f"ringgpt appliance (modeled, u280, FP16 weights and INT8 ones; headline at {HEADLINE}) vs DFX "
                    "(published, 200 MHz)")
    for column in ("case", "metric", *labels, "DFX", f"DFX / ringgpt ({HEADLINE})", "HBM bound",
                   f"% of bound ({HEADLINE})"):
        t.add_column(column, justify="left" if column in ("case", "metric") else "right")
    for r in results:
        dfx = r["dfx"]
        for pos, d in r["decode"].items():
            t.add_row(r["label"], f"decode at pos {pos}", *(f"{d['variants'][k]['ms']:.3f} ms" for k in labels),
                      f"{dfx['decode_ms']} ms" if dfx else "",
                      f"{r['decode_speedup_vs_dfx'][pos]:.2f}x" if dfx else "",
                      f"{r['hbm_bound_ms']:.3f} ms", f"{d['bound_pct']:.1f}%")
        for n, tt in r["ttft"].items():
            t.add_row(r["label"], f"first token, {n}-token prompt", *(f"{tt['variants'][k]['ms']:.1f} ms" for k in labels),
                      f"{dfx['ttft_ms'][n]} ms" if dfx else "", f"{r['ttft_speedup_vs_dfx'][n]:.2f}x" if dfx else "",
                      "", "")
    if sim:
        t.add_row("GPT-2 124M, 4 cards", "functional simulation",
                  f"{sim['tokens_per_s']:.2f} tok/s wall, {sim['tokens_per_cpu_s']:.2f} tok/CPU-s", *[""] * (len(labels) + 3))
    return t


def breakdown_table(results: list, label: str = HEADLINE, pos: int = DECODE_POSITIONS[0]) -> Table:
    """Per case and card, where a decode run's cycles went (occupancy's terms, thousands of cycles)."""
    t = Table(title=f"decode at position {pos}, {label}: per card, thousands of cycles (occupancy: each cycle in the "
                    f"first term that applies); HBM transfers large from {LARGE_TRANSFER // 1024} KiB")
    for column in ("case", "card", "run", *TERMS, "compute: matrix / vector / on-chip", "launch",
                   "HBM large: n, cycles / bound", "HBM small: n, cycles", "matrix busy", "HBM bound", "% of bound",
                   "bound / (matrix busy + launch)"):
        t.add_column(column, justify="left" if column == "case" else "right")
    for r in results:
        v = r["decode"][pos]["variants"][label]
        for c in v["per_card"]:
            large, small = c["hbm_by_size"]["large"], c["hbm_by_size"]["small"]
            t.add_row(r["label"], str(c["card"]), f"{v['cycles'] / 1e3:.1f}", *(f"{c[k] / 1e3:.1f}" for k in TERMS),
                      " / ".join(f"{c[k] / 1e3:.1f}" for k in COMPUTE_PARTS), f"{v['launch_cycles'] / 1e3:.1f}",
                      f"{large['transfers']}, {large['cycles'] / 1e3:.1f} / {large['bound_cycles'] / 1e3:.1f}",
                      f"{small['transfers']}, {small['cycles'] / 1e3:.1f}", f"{c['busy'].get('MATRIX', 0) / 1e3:.1f}",
                      f"{c['hbm_bound_cycles'] / 1e3:.1f}", f"{c['hbm_bound_pct']:.1f}%",
                      f"{100 * c['hbm_bound_cycles'] / (c['busy'].get('MATRIX', 0) + v['launch_cycles']):.1f}%")
    return t


def gpu_table(results: list, gpu: dict | None, quoted: dict | None) -> Table:
    t = Table(title="GPUs (measured on the named card, never here) beside the modeled appliance, decode at position "
                    f"{DECODE_POSITIONS[0]} and first token of a {PROMPT_LENGTHS[0]}-token prompt")
    for column in ("case", "GPU", "variant", "GPU decode", f"ringgpt decode ({HEADLINE})",
                   "GPU first token (32)", f"ringgpt first token ({HEADLINE})"):
        t.add_column(column, justify="left" if column in ("case", "GPU", "variant") else "right")
    for r in results:
        ours = (f"{r['decode'][DECODE_POSITIONS[0]]['ms']:.3f} ms", f"{r['ttft'][PROMPT_LENGTHS[0]]['ms']:.1f} ms")
        if gpu and r["label"] in gpu:
            g = gpu[r["label"]]
            t.add_row(r["label"], g["device"], f"{g['variant']} ({g['lengths']})", _ms(g["decode_ms"], 3), ours[0],
                      _ms(g["ttft_ms"], 1), ours[1])
        for c in (quoted or {}).get("by_model", {}).get(r["model"], []):
            t.add_row(r["label"], f"{quoted['device']} (quoted, issue 34)", c["variant"], _ms(c["decode_ms"]), ours[0],
                      _ms(c["ttft_ms"], 1), ours[1])
    return t


def host_table(host: dict) -> Table:
    t = Table(title="per generated token, decode at position 32 (us; conversion and sampling measured here, "
                    "CPU time of the host thread, on a trained model's logits)")
    for column in ("case", "sampling", "assumptions", *hostpath.STAGES, "total", "host / device"):
        t.add_column(column, justify="left" if column in ("case", "sampling", "assumptions") else "right")
    for case, modes in host.items():
        for mode, by_label in modes.items():
            for label, parts in by_label.items():
                t.add_row(case, mode, label, *(f"{1e6 * parts[s]:.1f}" for s in hostpath.STAGES),
                          f"{1e6 * parts['total']:.1f}", f"{100 * parts['host_share']:.1f}%")
    return t


BREAKDOWN_PARTS = [
    ("HBM: large transfers, their bytes at the peak", lambda c: c["hbm_by_size"]["large"]["bound_cycles"], "#2ca02c"),
    ("HBM: large transfers beyond that", lambda c: c["hbm_by_size"]["large"]["cycles"]
     - c["hbm_by_size"]["large"]["bound_cycles"], "#98df8a"),
    (f"HBM: transfers under {LARGE_TRANSFER // 1024} KiB (KV cache, vectors)",
     lambda c: c["hbm"] - c["hbm_by_size"]["large"]["cycles"], "#bcbd22"),
    ("matrix unit, HBM idle", lambda c: c["compute_matrix"], "#1f77b4"),
    ("vector unit, HBM idle", lambda c: c["compute_vector"], "#aec7e8"),
    ("on-chip DMA, HBM idle", lambda c: c["compute_onchip"], "#17becf"),
    ("ring only", lambda c: c["ring"], "#ff7f0e"),
    ("host link only", lambda c: c["host"], "#9467bd"),
    ("controller only (issue)", lambda c: c["issue"], "#8c564b"),
    ("halted, waiting", lambda c: c["after_halt"], "#c7c7c7")]
"""The plot's parts of a decode run's cycles: occupancy's terms, the HBM term split by transfer size."""


def _gpu_lines(ax, results: list, x, value, gpu: dict | None, quoted: dict | None) -> None:
    """Horizontal marks over each model's cases: the H100's (by case label) and the quoted GPU's figures."""
    styles = [("#9467bd", "-"), ("#e377c2", "--"), ("#17becf", ":")]
    seen = set()
    for model in dict.fromkeys(r["model"] for r in results):
        idx = [i for i, r in enumerate(results) if r["model"] == model]
        marks = []
        if gpu:
            g = next((gpu[r["label"]] for r in results if r["model"] == model and r["label"] in gpu), None)
            if g:
                marks.append((f"{g['device']}, {g['variant']} (measured)", value(g)))
        for c in (quoted or {}).get("by_model", {}).get(model, []):
            marks.append((f"{quoted['device']}, {c['variant']} (quoted, issue 34)", _low(value(c))))
        for k, (name, y) in enumerate(marks):
            color, style = styles[k % len(styles)]
            ax.hlines(y, x[idx[0]] - 0.45, x[idx[-1]] + 0.45, colors=color, linestyles=style, linewidth=1.6,
                      label=name if name not in seen else None)
            seen.add(name)


def plot(results: list, gpu: dict | None, path: Path, quoted: dict | None = None) -> None:
    fig, axes = plt.subplots(3, 1, figsize=(15, 14))
    labels = list(results[0]["decode"][DECODE_POSITIONS[0]]["variants"])
    pos = DECODE_POSITIONS[0]
    names = [r["label"].replace("GPT-2 ", "").replace(", ", "\n") for r in results]
    x = np.arange(len(results))
    series = [("DFX (published, 200 MHz)", lambda r: r["dfx"]["decode_ms"] if r["dfx"] else 0.0, "#999999")]
    colors = {"conservative": "#d62728"}
    for label in labels:
        series.append((f"ringgpt {label}" if label != "conservative" else "ringgpt, conservative set",
                       lambda r, label=label: r["decode"][pos]["variants"][label]["ms"],
                       colors.get(label, "#1f77b4" if label == HEADLINE else "#aec7e8")))
    series.append(("HBM bound", lambda r: r["hbm_bound_ms"], "#2ca02c"))
    width = 0.8 / len(series)
    ax = axes[0]
    for i, (name, value, color) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, [value(r) for r in results], width, label=name, color=color)
    _gpu_lines(ax, results, x, lambda g: g["decode_ms"], gpu, quoted)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("ms per token (device + launch)")
    ax.set_title(f"Decode latency, position {pos} (FP16 weights, then INT8; GPU: one card, marked over its model's "
                 "cases)")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    bottom = np.zeros(len(results))
    for name, part, color in BREAKDOWN_PARTS:
        values = []
        for r in results:
            v = r["decode"][pos]["variants"][HEADLINE]
            values.append(100 * np.mean([part(c) for c in v["per_card"]]) / v["cycles"])
        ax.bar(x, values, 0.6, bottom=bottom, label=name, color=color)
        bottom += np.array(values)
    ax.plot(x, [np.mean([c["hbm_bound_pct"] for c in r["decode"][pos]["variants"][HEADLINE]["per_card"]])
                for r in results], "k_", markersize=26, markeredgewidth=2,
            label="the card's HBM bound (its bytes at the peak)")
    ax.axhline(75, color="k", linestyle=":", linewidth=0.8)
    ax.set_ylim(0, 132)
    ax.set_yticks(range(0, 101, 20))
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("% of the run's cycles (mean over the cards)")
    ax.set_title(f"Where a decode run's cycles go at {HEADLINE}, position {pos} (each cycle in the first part that "
                 "applies; dotted: 75 %)")
    ax.legend(fontsize=7, ncol=4, loc="upper center")
    ax = axes[2]
    n = PROMPT_LENGTHS[0]
    tt = [("DFX (published, 200 MHz)", lambda r: r["dfx"]["ttft_ms"][n] if r["dfx"] else 0.0, "#999999"),
          (f"ringgpt {HEADLINE}", lambda r: r["ttft"][n]["ms"], "#1f77b4"),
          ("ringgpt, conservative set", lambda r: r["ttft"][n]["variants"]["conservative"]["ms"], "#d62728")]
    width = 0.8 / len(tt)
    for i, (name, value, color) in enumerate(tt):
        ax.bar(x + (i - (len(tt) - 1) / 2) * width, [value(r) for r in results], width, label=name, color=color)
    _gpu_lines(ax, results, x, lambda g: g["ttft_ms"], gpu, quoted)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel("ms to first token")
    ax.set_title(f"Time to first token, {n}-token prompt")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default="out", show_default=True)
@click.option("--sim-tokens", type=int, default=8, show_default=True,
              help="tokens the functional-simulation speed run generates (0 skips it)")
@click.option("--max-context", type=int, default=1024, show_default=True)
@click.option("--gpu-baseline", type=click.Path(dir_okay=False, path_type=Path), default=GPU_BASELINE,
              show_default=True, help="bench_reference.py JSON measured on a GPU, shown beside the modeled figures")
@click.option("--gpu-quoted", type=click.Path(dir_okay=False, path_type=Path), default=GPU_QUOTED,
              show_default=True, help="GPU figures quoted from an earlier measurement (a `source` field says whose)")
@click.option("--keep", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="an earlier bench_appliance.json whose host measurements (host_path, simulation) are kept "
                   "instead of measured again")
def main(out: str, sim_tokens: int, max_context: int, gpu_baseline: Path, gpu_quoted: Path, keep: Path | None) -> None:
    """Benchmark the modeled appliance against DFX and the GPUs' figures, and measure simulation speed."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = [modeled_case(case, max_context) for case in CASES]
    modeled_s = time.perf_counter() - started
    kept = None
    if keep is not None:
        earlier = json.loads(keep.read_text())   # read before anything is written (it may be the output)
        host, sim = rebased_host_path(earlier["host_path"], results), earlier["simulation"]
        kept = earlier.get("kept_from") or {"path": str(keep), "entries": ["host_path", "simulation"]}
    else:
        host = host_path(results, representative_logits())
        sim = simulation_speed(sim_tokens) if sim_tokens else None
    gpu = load_gpu_baseline(gpu_baseline, results)
    quoted = load_gpu_quoted(gpu_quoted)
    report = {"host": platform.node(), "python": platform.python_version(), "max_context": max_context,
              "headline": HEADLINE, "accuracy_checked": False, "accuracy_note": ACCURACY_NOTE, "cases": results,
              "host_path": host, "simulation": sim, "gpu_baseline": gpu, "gpu_quoted": quoted,
              "occupancy_terms": list(TERMS), "modeled_s": modeled_s,
              "kept_from": kept}
    (out_dir / "bench_appliance.json").write_text(json.dumps(report, indent=1))
    plot(results, gpu, out_dir / "bench_appliance.png", quoted)
    console = Console(width=220)
    console.print(table(results, sim))
    console.print(breakdown_table(results))
    if gpu or quoted:
        console.print(gpu_table(results, gpu, quoted))
    console.print(host_table(host))
    for r in results:
        print(f"{r['label']}: assumption sets " + "; ".join(
            f"{label}: " + ", ".join(f"{k} {v:g}" for k, v in a.items()) for label, a in r["assumptions"].items()))
    print(ACCURACY_NOTE)
    print(f"modeled cases: {modeled_s:.0f} s; wrote {out_dir / 'bench_appliance.json'} and "
          f"{out_dir / 'bench_appliance.png'}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Modeled U280 appliance figures beside DFX's published ones, and the functional simulator's speed.

    python scripts/bench_appliance.py --out out/

For GPT-2 345M on 1 card and GPT-2 1.5B on 4 cards (config u280): decode ms/token at several positions,
time to first token for 32/64/128-token prompts, and the HBM bound (weight bytes / (cards x 460 GB/s))
with the share of it reached. These are timing-only runs (SimulatorDevice(compute=False): the cycle model
over the compiled programs, no arithmetic); the programs do not depend on weight values, so they are
compiled from the models' architecture alone. Simulation speed: the bit-exact functional simulator
generating with GPT-2 124M (synthetic weights) on 4 cards, per second of wall time and of this
process's CPU time (the latter is steadier on a shared machine). Writes bench_appliance.json and
bench_appliance.png to --out and prints a table.

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
from ringgpt.sim.functional import SimulatorDevice  # noqa: E402

CASES = [
    {"model": "gpt2-355m", "label": "GPT-2 345M, 1 card", "cards": 1,
     "dfx": {"decode_ms": 5.4, "ttft_ms": {32: 177, 64: 349, 128: 693}}},
    {"model": "gpt2-1.5b", "label": "GPT-2 1.5B, 4 cards", "cards": 4,
     "dfx": {"decode_ms": 6.9, "ttft_ms": {32: 227, 64: 447, 128: 887}}},
]
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
    "--cards 4)")


def architecture_only(size: str) -> GPT2LMHeadModel:
    with torch.device("meta"):
        return GPT2LMHeadModel(synthetic_config(size))


HEADLINE = clock_label(get_config("u280").at_clock(CONSERVATIVE_CLOCK_MHZ))
"""The assumption set the headline figures are given under: the preset at DFX's 200 MHz."""
SAMPLING_MODES = {"greedy": SamplingConfig(),
                  "top-k 50": SamplingConfig(greedy=False, top_k=50, seed=1),
                  "top-p 0.9": SamplingConfig(greedy=False, top_p=0.9, seed=1),
                  "top-k 50 + top-p 0.9": SamplingConfig(greedy=False, top_k=50, top_p=0.9, seed=1)}


def modeled_case(case: dict, max_context: int, config: ArchConfig | None = None) -> dict:
    """Decode and time-to-first-token figures of one model/card count from timing-only runs, under every timing
    variant (the preset's clock, 200 MHz, the conservative set); `config`: the u280 preset on the case's cards
    unless given."""
    model = architecture_only(case["model"])
    weight_bytes = 2 * sum(p.numel() for p in model.parameters())
    config = config or get_config("u280", case["cards"])
    variants = timing_variants(config)
    image = compile_model(model, config, max_context)
    device = SimulatorDevice(config, compute=False, timing={k: v for k, v in variants.items() if v != config})
    appliance = Appliance(device, image)
    bound_ms = weight_bytes / (case["cards"] * config.hbm_peak_gbps * 1e9) * 1e3
    own = clock_label(config)

    def seconds(stats, label):
        return stats.seconds if label == own else stats.variants[label]

    decode = {}
    for pos in DECODE_POSITIONS:
        stats = appliance.run(pos, [TOKEN])
        figures = {label: {"ms": 1e3 * seconds(stats, label), "bound_pct": 100 * bound_ms / (1e3 * seconds(stats, label)),
                           "device_ms": 1e3 * seconds(stats, label) - variants[label].launch_overhead_us / 1e3}
                   for label in variants}
        decode[pos] = {**figures[HEADLINE], "variants": figures,
                       "hbm_gbps_per_card": stats.hbm_bytes / case["cards"] / stats.seconds / 1e9,
                       "breakdown_cycles": stats.breakdown}
    ttft = {}
    for length in PROMPT_LENGTHS:
        runs = appliance.prefill([TOKEN] * length)
        figures = {label: {"ms": 1e3 * sum(seconds(r, label) for r in runs)} for label in variants}
        ttft[length] = {**figures[HEADLINE], "variants": figures, "runs": len(runs)}
    dfx = case["dfx"]
    return {"label": case["label"], "model": case["model"], "cards": case["cards"], "config": config.name,
            "weight_bytes": weight_bytes, "hbm_bound_ms": bound_ms, "max_rows": image.meta["max_rows"],
            "kv_group": image.meta["abuf"][0]["kv_group"], "host_logits": image.meta["host"]["logits"],
            "headline": HEADLINE, "decode": decode, "ttft": ttft,
            "assumptions": {label: {k: getattr(v, k) for k in ("clock_mhz", "hbm_efficiency", "hbm_page_miss_ns",
                                                                "launch_overhead_us", "host_transfer_latency_us")}
                            | {"ring_hop_ns": v.ring_latency_ns} for label, v in variants.items()},
            "dfx": {"decode_ms": dfx["decode_ms"], "ttft_ms": dfx["ttft_ms"]},
            "decode_speedup_vs_dfx": {p: dfx["decode_ms"] / d["ms"] for p, d in decode.items()},
            "ttft_speedup_vs_dfx": {n: dfx["ttft_ms"][n] / t["ms"] for n, t in ttft.items()}}


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


def table(results: list, sim: dict | None) -> Table:
    labels = list(results[0]["decode"][DECODE_POSITIONS[0]]["variants"])
    t = Table(title=f"ringgpt appliance (modeled, u280; headline at {HEADLINE}) vs DFX (published, 200 MHz)")
    for column in ("case", "metric", *labels, "DFX", f"DFX / ringgpt ({HEADLINE})", "HBM bound",
                   f"% of bound ({HEADLINE})"):
        t.add_column(column, justify="left" if column in ("case", "metric") else "right")
    for r in results:
        for pos, d in r["decode"].items():
            t.add_row(r["label"], f"decode at pos {pos}", *(f"{d['variants'][k]['ms']:.3f} ms" for k in labels),
                      f"{r['dfx']['decode_ms']} ms", f"{r['decode_speedup_vs_dfx'][pos]:.2f}x",
                      f"{r['hbm_bound_ms']:.3f} ms", f"{d['bound_pct']:.1f}%")
        for n, tt in r["ttft"].items():
            t.add_row(r["label"], f"first token, {n}-token prompt", *(f"{tt['variants'][k]['ms']:.1f} ms" for k in labels),
                      f"{r['dfx']['ttft_ms'][n]} ms", f"{r['ttft_speedup_vs_dfx'][n]:.2f}x", "", "")
    if sim:
        t.add_row("GPT-2 124M, 4 cards", "functional simulation",
                  f"{sim['tokens_per_s']:.2f} tok/s wall, {sim['tokens_per_cpu_s']:.2f} tok/CPU-s", *[""] * (len(labels) + 3))
    return t


def gpu_table(results: list, gpu: dict) -> Table:
    t = Table(title="GPU baseline (measured, PyTorch reference path) beside the modeled appliance")
    for column in ("case", "GPU", "variant", "prompt:output", "GPU decode", f"ringgpt decode ({HEADLINE})",
                   "GPU first token (32)", f"ringgpt first token ({HEADLINE})"):
        t.add_column(column, justify="left" if column in ("case", "GPU", "variant") else "right")
    for r in results:
        if r["label"] in gpu:
            g = gpu[r["label"]]
            t.add_row(r["label"], g["device"], g["variant"], g["lengths"], f"{g['decode_ms']:.3f} ms",
                      f"{r['decode'][DECODE_POSITIONS[0]]['ms']:.3f} ms", f"{g['ttft_ms']:.1f} ms",
                      f"{r['ttft'][PROMPT_LENGTHS[0]]['ms']:.1f} ms")
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


def plot(results: list, gpu: dict | None, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    labels = list(results[0]["decode"][DECODE_POSITIONS[0]]["variants"])
    series = [("DFX (published, 200 MHz)", lambda r: r["dfx"]["decode_ms"], "#999999")]
    colors = {"conservative": "#d62728"}
    for label in labels:
        series.append((f"ringgpt {label}" if label != "conservative" else "ringgpt, conservative set",
                       lambda r, label=label: r["decode"][DECODE_POSITIONS[0]]["variants"][label]["ms"],
                       colors.get(label, "#1f77b4" if label == HEADLINE else "#aec7e8")))
    if gpu:
        device = next(iter(gpu.values()))["device"]
        series.append((f"PyTorch on {device}, {next(iter(gpu.values()))['variant']}",
                       lambda r: gpu[r["label"]]["decode_ms"] if r["label"] in gpu else 0.0, "#9467bd"))
    series.append(("HBM bound", lambda r, : r["hbm_bound_ms"], "#2ca02c"))
    width = 0.8 / len(series)
    ax = axes[0]
    x = np.arange(len(results))
    for i, (name, value, color) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, [value(r) for r in results], width, label=name, color=color)
    ax.set_xticks(x, [r["label"] for r in results])
    ax.set_ylabel("ms per token (device + launch)")
    ax.set_title(f"Decode latency, position {DECODE_POSITIONS[0]}")
    ax.legend(fontsize=7)
    ax = axes[1]
    for r, color in zip(results, ("#1f77b4", "#d62728")):
        n = list(r["ttft"])
        ax.plot(n, [r["ttft"][k]["ms"] for k in n], "o-", color=color, label=f"ringgpt {HEADLINE}, {r['label']}")
        ax.plot(n, [r["ttft"][k]["variants"]["conservative"]["ms"] for k in n], "^:", color=color,
                label=f"ringgpt conservative, {r['label']}")
        ax.plot(n, [r["dfx"]["ttft_ms"][k] for k in n], "s--", color=color, alpha=0.5, label=f"DFX {r['label']}")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("ms to first token")
    ax.set_title("Time to first token")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default="out", show_default=True)
@click.option("--sim-tokens", type=int, default=8, show_default=True,
              help="tokens the functional-simulation speed run generates (0 skips it)")
@click.option("--max-context", type=int, default=1024, show_default=True)
@click.option("--gpu-baseline", type=click.Path(dir_okay=False, path_type=Path), default=GPU_BASELINE,
              show_default=True, help="bench_reference.py JSON measured on a GPU, shown beside the modeled figures")
def main(out: str, sim_tokens: int, max_context: int, gpu_baseline: Path) -> None:
    """Benchmark the modeled appliance against DFX and measure simulation speed."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [modeled_case(case, max_context) for case in CASES]
    host = host_path(results, representative_logits())
    sim = simulation_speed(sim_tokens) if sim_tokens else None
    gpu = load_gpu_baseline(gpu_baseline, results)
    report = {"host": platform.node(), "python": platform.python_version(), "max_context": max_context,
              "headline": HEADLINE, "accuracy_checked": False, "accuracy_note": ACCURACY_NOTE, "cases": results,
              "host_path": host, "simulation": sim, "gpu_baseline": gpu}
    (out_dir / "bench_appliance.json").write_text(json.dumps(report, indent=1))
    plot(results, gpu, out_dir / "bench_appliance.png")
    console = Console(width=200)
    console.print(table(results, sim))
    if gpu:
        console.print(gpu_table(results, gpu))
    console.print(host_table(host))
    for r in results:
        print(f"{r['label']}: assumption sets " + "; ".join(
            f"{label}: " + ", ".join(f"{k} {v:g}" for k, v in a.items()) for label, a in r["assumptions"].items()))
    print(ACCURACY_NOTE)
    print(f"wrote {out_dir / 'bench_appliance.json'} and {out_dir / 'bench_appliance.png'}")


if __name__ == "__main__":
    main()

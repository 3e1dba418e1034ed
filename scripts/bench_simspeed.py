#!/usr/bin/env python3
"""The bit-exact functional simulator against the PyTorch CPU reference path, side by side in one run: GPT-2 124M
(synthetic weights) on 4 simulated u280 cards and the same model in PyTorch FP32, the same prompt and greedy tokens.

    python scripts/bench_simspeed.py --tokens 16

Decode ms per token of each in wall time (the ratio that counts: PyTorch runs on its default threads, two on a
2-core machine, the simulator on one unless RINGGPT_THREADS says otherwise, its cycle model in a worker process
beside it unless --no-schedule-worker), and beside it in CPU time of this process (time.process_time, which counts
every thread's time, not the worker's). Decode cost = (cost of prompt + N tokens - cost of
prompt + 1 token) / (N - 1), so the prompt is not counted. The two sides are measured in turn, --repeats times, and
each figure is the median. The simulator's wall time is also split into its parts (SimulatorDevice.seconds; each
part's median, so they need not add up to the whole's): executing the cards' programs ("functional": numerics, the
matrix kernel included), the cycle model's schedule ("cycle_model"; with the worker, telling it each run and
waiting for its reports) and the rest ("host": the appliance's host path, read-back, sampling and Python's garbage
collector's pass over each run's new objects).
"""
from __future__ import annotations

import json
import os
import statistics
import time

import click
import torch

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.generate import generate
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice


def _cost(run) -> tuple[float, float]:
    """(wall, CPU) seconds of run()."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def _per_token(one, many, tokens: int) -> tuple[float, float]:
    """(wall, CPU) ms per decoded token from the costs of 1 and of `tokens` generated tokens."""
    return tuple(1e3 * (b - a) / (tokens - 1) for a, b in zip(one, many))


@click.command()
@click.option("--model", default="synthetic:gpt2-124m", show_default=True)
@click.option("--cards", type=int, default=4, show_default=True)
@click.option("--prompt", "prompt_len", type=int, default=16, show_default=True)
@click.option("--tokens", type=click.IntRange(min=2), default=16, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="measurements of each side, in turn (medians reported)")
@click.option("--torch-threads", type=int, default=None, help="PyTorch's CPU threads (default: PyTorch's choice)")
@click.option("--schedule-worker/--no-schedule-worker", default=True, show_default=True,
              help="the cycle model in its worker process from the first run (a device's default starts it once it "
                   "has scheduled for WORKER_AFTER_S in its own process: the steady state of a long generation)")
def main(model: str, cards: int, prompt_len: int, tokens: int, repeats: int, torch_threads: int | None,
         schedule_worker: bool) -> None:
    """Print the simulator's and PyTorch's decode ms/token (wall and CPU) and their ratios."""
    if torch_threads:
        torch.set_num_threads(torch_threads)
    net = load_model(model, dtype=torch.float32)
    config = get_config("u280", cards)
    image = compile_model(net, config, min(256, net.config.n_positions))
    prompt = [(1000 + i) % net.config.vocab_size for i in range(prompt_len)]
    one = SamplingConfig(max_new_tokens=1, stop_at_eos=False)
    many = SamplingConfig(max_new_tokens=tokens, stop_at_eos=False)
    device = SimulatorDevice(config, schedule_worker=schedule_worker)
    appliance = Appliance(device, image)
    appliance.generate(prompt, one)  # warm-up (first-use costs: kernel build, caches)
    generate(net, prompt, one, return_logits=False)
    load_before = os.getloadavg()[0]
    sim, ref, parts = [], [], []
    for _ in range(repeats):
        before = dict(device.seconds)
        cost_one = _cost(lambda: appliance.generate(prompt, one))
        middle = dict(device.seconds)
        sim.append(_per_token(cost_one, _cost(lambda: appliance.generate(prompt, many)), tokens))
        part = {name: 1e3 * (device.seconds[name] - 2 * middle[name] + before[name]) / (tokens - 1)
                for name in before}
        parts.append({**part, "host": sim[-1][0] - sum(part.values())})
        ref.append(_per_token(_cost(lambda: generate(net, prompt, one, return_logits=False)),
                              _cost(lambda: generate(net, prompt, many, return_logits=False)), tokens))
    (sim_wall, sim_cpu), (ref_wall, ref_cpu) = ([statistics.median(x) for x in zip(*side)] for side in (sim, ref))
    by_part = {part: statistics.median(p[part] for p in parts) for part in parts[0]}
    out = {"model": model, "config": config.name, "prompt_tokens": prompt_len, "decode_tokens": tokens - 1,
           "repeats": repeats, "torch_threads": torch.get_num_threads(), "schedule_worker": schedule_worker,
           "simulator_ms_per_token_wall": sim_wall, "pytorch_ms_per_token_wall": ref_wall,
           "ratio_wall": _ratio(sim_wall, ref_wall), "simulator_tokens_per_s": _ratio(1e3, sim_wall),
           "simulator_ms_per_token_cpu": sim_cpu, "pytorch_ms_per_token_cpu": ref_cpu,
           "ratio_cpu": _ratio(sim_cpu, ref_cpu),
           "simulator_ms_per_token_wall_by_part": by_part,
           "simulator_ms_per_token_wall_each": [w for w, _ in sim],
           "pytorch_ms_per_token_wall_each": [w for w, _ in ref],
           "load_average_1min": [load_before, os.getloadavg()[0]]}  # other processes skew both sides
    print(json.dumps(_rounded(out), indent=1))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _rounded(value):
    """Floats (in dicts and lists too) to 3 decimals."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


if __name__ == "__main__":
    main()

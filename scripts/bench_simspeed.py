#!/usr/bin/env python3
"""The bit-exact functional simulator against the PyTorch CPU reference path, side by side in one run: GPT-2 124M
(synthetic weights) on 4 simulated u280 cards and the same model in PyTorch FP32, the same prompt and greedy tokens.

    python scripts/bench_simspeed.py --tokens 16

Decode ms per token of each, as CPU time of this process (time.process_time: steadier than wall time on a shared
machine; both sides run single-threaded unless --torch-threads says otherwise) and as wall time, and their ratio.
Decode cost = (cost of prompt + N tokens - cost of prompt + 1 token) / (N - 1), so the prompt is not counted.
"""
from __future__ import annotations

import json
import os
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
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - cpu, time.perf_counter() - wall


@click.command()
@click.option("--model", default="synthetic:gpt2-124m", show_default=True)
@click.option("--cards", type=int, default=4, show_default=True)
@click.option("--prompt", "prompt_len", type=int, default=16, show_default=True)
@click.option("--tokens", type=int, default=16, show_default=True)
@click.option("--torch-threads", type=int, default=1, show_default=True)
def main(model: str, cards: int, prompt_len: int, tokens: int, torch_threads: int) -> None:
    """Print the simulator's and PyTorch's decode ms/token and their ratio."""
    torch.set_num_threads(torch_threads)
    net = load_model(model, dtype=torch.float32)
    config = get_config("u280", cards)
    image = compile_model(net, config, 256)
    prompt = list(range(1000, 1000 + prompt_len))
    one, many = SamplingConfig(max_new_tokens=1, stop_at_eos=False), SamplingConfig(max_new_tokens=tokens, stop_at_eos=False)
    appliance = Appliance(SimulatorDevice(config), image)
    appliance.generate(prompt, one)  # warm-up (first-use costs: kernel build, caches)
    sim_one, sim_many = _cost(lambda: appliance.generate(prompt, one)), _cost(lambda: appliance.generate(prompt, many))
    generate(net, prompt, one, return_logits=False)
    ref_one, ref_many = (_cost(lambda: generate(net, prompt, one, return_logits=False)),
                         _cost(lambda: generate(net, prompt, many, return_logits=False)))
    per = lambda a, b: 1e3 * (b - a) / (tokens - 1)  # noqa: E731
    out = {"model": model, "config": config.name, "prompt_tokens": prompt_len, "decode_tokens": tokens - 1,
           "torch_threads": torch.get_num_threads(),
           "simulator_ms_per_token_cpu": per(sim_one[0], sim_many[0]),
           "pytorch_ms_per_token_cpu": per(ref_one[0], ref_many[0]),
           "simulator_ms_per_token_wall": per(sim_one[1], sim_many[1]),
           "pytorch_ms_per_token_wall": per(ref_one[1], ref_many[1])}
    out["ratio_cpu"] = out["simulator_ms_per_token_cpu"] / out["pytorch_ms_per_token_cpu"]
    out["ratio_wall"] = out["simulator_ms_per_token_wall"] / out["pytorch_ms_per_token_wall"]
    out["simulator_tokens_per_cpu_s"] = 1e3 / out["simulator_ms_per_token_cpu"]
    out["load_average_1min"] = os.getloadavg()[0]  # other processes on the machine skew both sides
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()

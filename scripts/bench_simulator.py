#!/usr/bin/env python3
"""Simulation-speed benchmark: a GPT-2 model compiled by ringgpt.host.compiler, run on SimulatorDevice
(one prompt run, then one run per decoded token).

    python scripts/bench_simulator.py --model synthetic:gpt2-124m --config u280 --cards 4 --tokens 8

Prints the decode speed (simulated tokens per second, by wall clock and by this process's CPU time)
and the cycle model's summary of the last decode run. Token ids are fixed: the point is the work,
not the text."""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.hw.config import get_config
from ringgpt.sim.functional import SimulatorDevice

TOKEN = 464
"""The id fed at every position ("The")."""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:gpt2-124m")
    parser.add_argument("--config", default="u280")
    parser.add_argument("--cards", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=8, help="tokens in the prompt run")
    parser.add_argument("--tokens", type=int, default=8, help="decode runs to time")
    parser.add_argument("--max-context", type=int, default=1024)
    args = parser.parse_args(argv)
    cfg = get_config(args.config, args.cards)
    image = compile_model(load_model(args.model), cfg, args.max_context)
    device = SimulatorDevice(cfg)
    device.load(image)
    ids_offset = image.meta["host"]["ids_offset"]
    for card in range(cfg.cards):
        device.write_host(card, ids_offset, np.full(args.prompt, TOKEN, np.uint16))
    prompt = device.run(0, args.prompt)
    wall, cpu = time.perf_counter(), time.process_time()
    for token in range(args.tokens):
        device.run(args.prompt + token, 1)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = device.last_report.summary()
    print(json.dumps({
        "model": args.model, "config": cfg.name, "prompt_tokens": args.prompt,
        "prompt_run_wall_s": round(prompt.wall_seconds, 3), "decode_tokens": args.tokens,
        "decode_wall_s": round(wall, 3), "decode_tokens_per_s_wall": round(args.tokens / wall, 2),
        "decode_tokens_per_s_cpu": round(args.tokens / cpu, 2),
        "modeled_decode": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()}}, indent=1))


if __name__ == "__main__":
    main()

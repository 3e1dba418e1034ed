"""A compiled GPT-2 run on the cores' RTL and on the functional simulator side by side: the same image, prompt
and greedy tokens on `RtlDevice` and on `SimulatorDevice`, every logit compared bit for bit, and each run's RTL
cycles beside the cycle model's under the simulated memories' timing (`sim.calibration.TESTBENCH`: AxiRams
answering in 2 cycles, the ring wired directly). scripts/rtl_u280.py records it for the u280 core.
"""
from __future__ import annotations

import functools
import json
import time

import numpy as np

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance
from ringgpt.hw.config import ArchConfig
from ringgpt.sim.calibration import Recording, model_cards, rtl_cards, as_testbench
from ringgpt.sim.cocotb_support import runner
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.rtl.device import RtlDevice, design_of

TESTBENCH_TIMING = "testbench"
REAL_WIDTH_MODEL = "synthetic:n_layer=1,n_embd=1024,n_head=16,vocab_size=2048"
"""GPT-2 345M's width (n_embd 1,024, 16 heads of 64) in one layer, with a vocabulary of 2,048 tokens: the LM head's
50,257 x 1,024 weights would be 103 MB more to load into the simulated memories and about 50K more cycles a run, for
the same MATMUL instructions as the layers' over more columns."""


def compare_with_simulator(config: ArchConfig, model: str, *, simulator: str = "verilator", prompt_tokens: int = 8,
                           decode_runs: int = 2, max_context: int = 64, weights: str = "fp16") -> dict:
    """Generates `decode_runs` + 1 tokens after a prompt of `prompt_tokens` (fixed ids) with `model` (a load_model
    spec, seed 7) compiled for `config` with `weights` ("fp16" or "int8"), on the RTL and on the functional
    simulator. Returns the record of
    scripts/rtl_u280.py's `runs` (bit_identical, per-run cycles of both, the build's figures where this process or
    an earlier one built it, the RTL's cycles per wall second; per run, each card's [cycles, busy cycles per unit]
    on both sides: `rtl_cards`, `model_cards`; the digests of the RTL's sources, runner.sources_digest, and of the
    compiled image, ApplianceImage.digest: the record holds while both are today's)."""
    side = SimulatorSide(config, model, prompt_tokens=prompt_tokens, decode_runs=decode_runs, max_context=max_context,
                         weights=weights)
    golden, model_cycles = side.result, side.cycles
    started = time.perf_counter()
    design = design_of(config)
    build_dir = runner.build(design, simulator)
    build_wall = time.perf_counter() - started
    built = json.loads((build_dir / "build.json").read_text()) if (build_dir / "build.json").exists() else {}

    # a core that hangs stops at twice the model's longest run (a u280 core simulates about 35 cycles a second)
    device = Recording(RtlDevice(config, simulator=simulator, cycle_limit=2 * max(model_cycles) + 10_000), rtl_cards)
    try:
        result = Appliance(device, side.image).generate(side.prompt, side.sampling)
    finally:
        device.close()
    identical = (result.generated_ids == golden.generated_ids and result.logits.shape == golden.logits.shape
                 and np.array_equal(result.logits.view(np.uint32), golden.logits.view(np.uint32)))
    difference = logit_difference(result.logits, golden.logits)
    rtl_cycles = [run.cycles for run in result.runs]
    wall = sum(run.wall_seconds for run in result.runs)
    return {"config": config.name, "cards": config.cards, "model": model, "weights": weights,
            **{key: getattr(side.net.config, key) for key in ("n_layer", "n_embd", "n_head", "vocab_size")},
            "prompt_tokens": prompt_tokens, "decode_runs": len(result.decode_runs), "max_context": max_context,
            "simulator": simulator, "sources_digest": runner.sources_digest(design.component),
            "image_digest": side.image.digest(),
            "bit_identical": bool(identical), **difference, "rtl_cycles": rtl_cycles, "model_cycles": model_cycles,
            "model_error_pct": [round(100 * (m - r) / r, 2) for m, r in zip(model_cycles, rtl_cycles)],
            "rtl_cards": [cards for _, _, cards in device.runs], "model_cards": side.cards,
            "build_dir": str(build_dir), "build_wall_s": round(build_wall, 1), "build_s": built.get("build_s"),
            "verilog_s": built.get("verilog_s"),
            "verilog_mb": round(built["verilog_bytes"] / 1e6, 1) if "verilog_bytes" in built else None,
            "peak_rss_mb": built.get("peak_rss_mb"), "run_wall_s": round(wall, 1),
            "cycles_per_s": round(sum(rtl_cycles) / wall, 1) if wall else None}


class SimulatorSide:
    """The functional simulator's side of a comparison: `model` (a load_model spec, seed 7) compiled for `config`
    with `weights`, a prompt of `prompt_tokens` fixed ids, then `decode_runs` greedy tokens (`result`); per run, the
    cycle model's cycles under the testbench's timing (`cycles`) and each card's [cycles, busy cycles per unit]
    (`cards`)."""

    def __init__(self, config: ArchConfig, model: str, *, prompt_tokens: int = 8, decode_runs: int = 2,
                 max_context: int = 64, weights: str = "fp16"):
        self.net, self.image = compiled(config, model, max_context=max_context, weights=weights)
        vocab = self.net.config.vocab_size
        self.prompt = [(37 * i + 11) % vocab for i in range(prompt_tokens)]
        self.sampling = SamplingConfig(max_new_tokens=decode_runs + 1, stop_at_eos=False)
        testbench = as_testbench(config)
        device = Recording(SimulatorDevice(config, timing={TESTBENCH_TIMING: testbench}),
                           functools.partial(model_cards, timing=TESTBENCH_TIMING))
        self.result = Appliance(device, self.image).generate(self.prompt, self.sampling)
        self.cycles = [round((run.variants[TESTBENCH_TIMING] - testbench.launch_overhead_us * 1e-6)
                             * testbench.clock_mhz * 1e6) for run in self.result.runs]
        self.cards = [cards for _, _, cards in device.runs]


def compiled(config: ArchConfig, model: str, *, max_context: int = 64, weights: str = "fp16") -> tuple:
    """(the model, its image): `model` (a load_model spec, seed 7) compiled for `config` with `weights`, as both
    sides of a comparison run it."""
    net = load_model(model, seed=7)
    return net, compile_model(net, config, max_context, weights=weights)


def stale_because(entry: dict, config: ArchConfig) -> str | None:
    """Why a record of scripts/rtl_u280.py no longer describes today's runs (None while it does): other RTL sources,
    or another compiled image (the programs the RTL ran, the compiler's or the model's change)."""
    if entry.get("sources_digest") != runner.sources_digest(design_of(config).component):
        return "on other RTL sources than today's (or before the record kept per-unit counters)"
    _, image = compiled(config, entry["model"], max_context=entry["max_context"], weights=entry["weights"])
    if entry.get("image_digest") != image.digest():
        return "from another compiled image than today's (or before the record kept its digest)"
    return None


def logit_difference(got: np.ndarray, want: np.ndarray) -> dict:
    """Where the RTL's logits (one row a generated token) leave the simulator's: how many differ in bits, the
    first row that does, the largest absolute difference and the largest relative to the row's largest magnitude
    (NaN where a value is not finite)."""
    if got.shape != want.shape:
        return {"logits_differing": None, "first_differing_token": None, "max_abs_diff": None, "max_rel_diff": None}
    differ = got.view(np.uint32) != want.view(np.uint32)
    rows = np.nonzero(differ.any(axis=-1))[0]
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.abs(got.astype(np.float64) - want.astype(np.float64))
        scale = np.abs(want.astype(np.float64)).max(axis=-1, keepdims=True)
        relative = gap / np.where(scale > 0, scale, 1)
    return {"logits_differing": int(differ.sum()), "first_differing_token": int(rows[0]) if len(rows) else None,
            "max_abs_diff": float(np.nanmax(gap)) if gap.size else 0.0,
            "max_rel_diff": float(np.nanmax(relative)) if relative.size else 0.0}

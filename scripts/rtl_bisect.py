#!/usr/bin/env python3
"""The first instruction of a compiled program whose result on the cores' RTL differs from the functional
simulator's, card 0's program for a prompt run on `RtlDevice` and on `SimulatorDevice` side by side, found one of
two ways:

- **trace** (`--trace START:STOP`, one run): after each instruction in [START, STOP) that writes ABUF, a STORE of
  the ABUF words it wrote (the bounds of its footprint, hw/resolved.access_ranges) to a host slot of its own; the
  first slot that differs names the instruction. The STOREs wait for what they read, so they change the order in
  which the units overlap: a fault that needs a particular overlap may hide (then bisect).
- **bisect** (default): the program cut after instruction i, then every ABUF word the kept instructions write
  stored to the host buffer; i grows 8, 16, 32, ... until the two host buffers differ, then is bisected. Each probe
  after the first keeps the memories of the one before (`load_programs`), as both back ends do alike.

    python scripts/rtl_bisect.py --config u280 --trace 0:178       # GPT-2 345M's width, one layer, a 1-token prompt

Assumes a straight-line program, and (bisect) that a result once wrong stays visible in ABUF or in what is computed
from it (a wrong WBUF or HBM write shows when an instruction reads it). Exit status 1 when a difference is found.
"""
from __future__ import annotations

import dataclasses
import time

import click
import numpy as np

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.models import load_model
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Dim, Instruction, Opcode, Operand, Space
from ringgpt.hw.numerics import WEIGHT_FORMATS
from ringgpt.hw.program import Program
from ringgpt.hw.resolved import access_ranges, resolve_run
from ringgpt.sim.cocotb_support.runner import SIMULATORS
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.rtl.device import RtlDevice
from ringgpt.sim.rtl_comparison import REAL_WIDTH_MODEL


def abuf_written(resolved: list, chunk: int) -> tuple[int, int]:
    """The chunk-aligned bounds [lo, hi) of every ABUF word the instructions in `resolved` write ((0, 0): none)."""
    ranges = [(lo, hi) for r in resolved if r is not None for space, lo, hi in access_ranges(r)[1]
              if space is Space.ABUF]
    if not ranges:
        return 0, 0
    lo, hi = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
    return lo // chunk * chunk, -(-hi // chunk) * chunk


def probe_programs(image, cut: int, lo: int, hi: int, at: int) -> list[Program]:
    """Card 0's program cut after `cut` instructions, then ABUF[lo:hi] stored to host word `at` and HALT (other
    cards: HALT)."""
    card = image.cards[0].program
    store = Instruction.make(Opcode.STORE, dst=Operand(Space.HOST, 0, at), src1=Operand(Space.ABUF, 0, lo),
                             rows=Dim(0, 1), n=Dim(0, hi - lo))
    tail = ([store] if hi > lo else []) + [Instruction.make(Opcode.HALT)]
    return [dataclasses.replace(card, instructions=card.instructions[:cut] + tail)] + \
        [dataclasses.replace(c.program, instructions=[Instruction.make(Opcode.HALT)]) for c in image.cards[1:]]


def trace_programs(image, resolved: list, start: int, stop: int, at: int, chunk: int) -> tuple[list[Program],
                                                                                               list[tuple]]:
    """Card 0's program cut after `stop` instructions, each instruction in [start, stop) that writes ABUF followed by
    a STORE of each chunk-aligned ABUF range it wrote to a host slot of its own, from host word `at` on, then HALT
    (other cards: HALT); and the slots (pc, abuf_lo, abuf_hi, host_offset)."""
    card, kept, slots, offset = image.cards[0].program.instructions, [], [], at
    for pc in range(stop):
        kept.append(card[pc])
        ranges = [] if pc < start or resolved[pc] is None else access_ranges(resolved[pc])[1]
        for lo, hi in sorted({(lo // chunk * chunk, -(-hi // chunk) * chunk)       # each range apart: MASKED_QK's
                              for space, lo, hi in ranges if space is Space.ABUF}):  # two lie far apart
            kept.append(Instruction.make(Opcode.STORE, dst=Operand(Space.HOST, 0, offset),
                                         src1=Operand(Space.ABUF, 0, lo), rows=Dim(0, 1), n=Dim(0, hi - lo)))
            slots.append((pc, lo, hi, offset))
            offset += hi - lo
    programs = [dataclasses.replace(image.cards[0].program, instructions=kept + [Instruction.make(Opcode.HALT)])]
    return programs + [dataclasses.replace(c.program, instructions=[Instruction.make(Opcode.HALT)])
                       for c in image.cards[1:]], slots


def first_difference(differs, length: int, first: int = 8) -> int | None:
    """The smallest cut in 1..length for which `differs(cut)` holds (a prefix of the program shows the difference,
    and every longer one does), or None: cuts first, 2 x first, ... until one differs, then bisection."""
    good, cut = 0, min(first, length)
    while not differs(cut):
        if cut >= length:
            return None
        good, cut = cut, min(2 * cut, length)
    while cut - good > 1:
        middle = (good + cut) // 2
        good, cut = (good, middle) if differs(middle) else (middle, cut)
    return cut


def parse_span(text: str | None) -> tuple[int, int] | None:
    """`START:STOP` as two ints (click's callback form)."""
    if text is None:
        return None
    start, _, stop = text.partition(":")
    if not (start.isdigit() and stop.isdigit() and int(start) < int(stop)):
        raise click.BadParameter(f"{text!r} is not START:STOP with START < STOP, e.g. 32:178")
    return int(start), int(stop)


@click.command()
@click.option("--config", "preset", default="u280", show_default=True)
@click.option("--model", default=REAL_WIDTH_MODEL, show_default=True)
@click.option("--weights", type=click.Choice(WEIGHT_FORMATS), default="fp16", show_default=True)
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--simulator", type=click.Choice(SIMULATORS), default="verilator", show_default=True)
@click.option("--first", type=click.IntRange(min=1), default=8, show_default=True, help="bisect: the first cut")
@click.option("--trace", "span", callback=lambda ctx, param, value: parse_span(value),
              help="START:STOP: one run storing each ABUF result of instructions START to STOP-1 (STOP is capped at "
                   "the program's HALT)")
def main(preset: str, model: str, weights: str, prompt_tokens: int, simulator: str, first: int,
         span: tuple[int, int] | None) -> None:
    """Find the first instruction whose ABUF result differs between the RTL and the functional simulator."""
    config = get_config(preset, 1)
    chunk = config.buffer_chunk_words
    net = load_model(model, seed=7)
    image = compile_model(net, config, 64, weights=weights)
    program = image.cards[0].program.instructions
    length = next(i for i, inst in enumerate(program) if inst.opcode is Opcode.HALT)    # the cuts before its HALT
    resolved = resolve_run(program, 0, 0, prompt_tokens)
    at = -(-image.cards[0].host_words // chunk) * chunk                          # past the program's host area
    ids = np.array([(37 * i + 11) % net.config.vocab_size for i in range(prompt_tokens)])   # rtl_comparison's
    golden, rtl = SimulatorDevice(config), RtlDevice(config, simulator=simulator, cycle_limit=1 << 24)
    loaded = False

    def run_both(programs: list[Program], words: int) -> tuple[list[np.ndarray], int]:
        """Host words [at, at + words) after `programs` ran on the simulator and on the RTL, and the RTL's cycles."""
        nonlocal loaded
        found = []
        for device in (golden, rtl):
            if loaded:
                device.load_programs(programs)
            else:
                device.load(dataclasses.replace(image, cards=[
                    dataclasses.replace(c, program=p, host_words=at + words) for c, p in zip(image.cards, programs)]))
            device.write_host(0, image.meta["host"]["ids_offset"], ids.astype(np.uint16))
            device.write_host(0, at, np.zeros(words, np.uint16))          # no word left from the probe before
            stats = device.run(0, prompt_tokens)
            found.append(device.read_host(0, at, words).view(np.uint16) if words else np.zeros(0, np.uint16))
        loaded = True
        return found, stats.cycles

    def show(base: int, words: list[np.ndarray], bad: np.ndarray) -> None:
        click.echo("  " + ", ".join(f"ABUF[{base + a}] RTL {words[1][a]:#06x} simulator {words[0][a]:#06x}"
                                    for a in bad[:6]), err=True)

    def differs(cut: int) -> bool:
        lo, hi = abuf_written(resolved[:cut], chunk)
        started = time.perf_counter()
        words, cycles = run_both(probe_programs(image, cut, lo, hi, at), hi - lo)
        bad = np.nonzero(words[0] != words[1])[0]
        click.echo(f"cut {cut:5d} (last {program[cut - 1].opcode.name}): ABUF[{lo}:{hi}] "
                   f"{'differs in ' + str(len(bad)) + ' words' if len(bad) else 'equal'}; "
                   f"{cycles} RTL cycles, {time.perf_counter() - started:.0f} s", err=True)
        if len(bad):
            show(lo, words, bad)
        return bool(len(bad))

    def traced(start: int, stop: int) -> int | None:
        programs, slots = trace_programs(image, resolved, start, stop, at, chunk)
        started = time.perf_counter()
        words, cycles = run_both(programs, sum(hi - lo for _, lo, hi, _ in slots))
        click.echo(f"trace of instructions {start} to {stop - 1}: {len(slots)} ABUF results stored; "
                   f"{cycles} RTL cycles, {time.perf_counter() - started:.0f} s", err=True)
        wrong = []
        for pc, lo, hi, offset in slots:
            part = [w[offset - at:offset - at + hi - lo] for w in words]
            bad = np.nonzero(part[0] != part[1])[0]
            if len(bad):
                click.echo(f"#{pc} {program[pc].opcode.name}: ABUF[{lo}:{hi}] differs in {len(bad)} words", err=True)
                show(lo, part, bad)
                wrong.append(pc)
        return wrong[0] + 1 if wrong else None

    try:
        cut = traced(span[0], min(span[1], length)) if span else first_difference(differs, length, first)
    finally:
        rtl.close()
    if cut is None:
        click.echo(f"no difference in ABUF over {'the traced instructions' if span else 'the whole program'} "
                   f"({length} instructions before its HALT)")
        raise SystemExit(0)
    click.echo(f"first difference after instruction {cut - 1}: {program[cut - 1]}")
    raise SystemExit(1)


if __name__ == "__main__":
    main()

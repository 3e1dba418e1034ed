#!/usr/bin/env python3
"""The first instruction of a compiled program whose result on the cores' RTL differs from the functional
simulator's, card 0's program for a prompt run (or with --decode the first decode run after it) on `RtlDevice` and
on `SimulatorDevice` side by side, found one of two ways:

- **trace** (`--trace START:STOP`, one run): after each instruction in [START, STOP) that writes ABUF, a STORE of
  each ABUF range it wrote (its footprint, hw/resolved.access_ranges) to a host slot of its own; the first slot that
  differs names the instruction. The STOREs wait for what they read, so they change the order in
  which the units overlap: a fault that needs a particular overlap may hide (then bisect).
- **bisect** (default): the program cut after instruction i, then each ABUF range the kept instructions wrote
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


def abuf_written(resolved: list, chunk: int) -> list[tuple[int, int]]:
    """The ABUF words the instructions in `resolved` write, as sorted, disjoint, chunk-aligned ranges [lo, hi)."""
    ranges = sorted((lo // chunk * chunk, -(-hi // chunk) * chunk) for r in resolved if r is not None
                    for space, lo, hi in access_ranges(r)[1] if space is Space.ABUF)
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def stores(ranges: list[tuple[int, int]], at: int) -> tuple[list[Instruction], list[tuple[int, int, int]]]:
    """One STORE of each ABUF range to the host, one after the other from host word `at` on; and where each went
    (abuf_lo, abuf_hi, host_offset)."""
    instructions, slots = [], []
    for lo, hi in ranges:
        instructions.append(Instruction.make(Opcode.STORE, dst=Operand(Space.HOST, 0, at),
                                             src1=Operand(Space.ABUF, 0, lo), rows=Dim(0, 1), n=Dim(0, hi - lo)))
        slots.append((lo, hi, at))
        at += hi - lo
    return instructions, slots


def with_card0(image, instructions: list[Instruction]) -> list[Program]:
    """Card 0's program replaced by `instructions` then HALT; the other cards' by HALT."""
    halt = [Instruction.make(Opcode.HALT)]
    return [dataclasses.replace(image.cards[0].program, instructions=instructions + halt)] + \
        [dataclasses.replace(c.program, instructions=halt) for c in image.cards[1:]]


def probe_programs(image, cut: int, ranges: list[tuple[int, int]], at: int) -> tuple[list[Program], list[tuple]]:
    """Card 0's program cut after `cut` instructions, then each ABUF range stored to the host from word `at` on
    (`stores`), and HALT (other cards: HALT); and the slots (abuf_lo, abuf_hi, host_offset)."""
    tail, slots = stores(ranges, at)
    return with_card0(image, image.cards[0].program.instructions[:cut] + tail), slots


def trace_programs(image, resolved: list, start: int, stop: int, at: int, chunk: int) -> tuple[list[Program],
                                                                                               list[tuple]]:
    """Card 0's program cut after `stop` instructions, each instruction in [start, stop) that writes ABUF followed by
    a STORE of each chunk-aligned ABUF range it wrote to a host slot of its own (MASKED_QK's two lie far apart),
    from host word `at` on, then HALT (other cards: HALT); and the slots (pc, abuf_lo, abuf_hi, host_offset)."""
    card, kept, slots = image.cards[0].program.instructions, [], []
    for pc in range(stop):
        kept.append(card[pc])
        tail, placed = stores(abuf_written([resolved[pc]], chunk) if pc >= start else [], at)
        kept += tail
        slots += [(pc, *slot) for slot in placed]
        at += sum(hi - lo for lo, hi, _ in placed)
    return with_card0(image, kept), slots


def first_difference(differs, length: int, first: int = 8, good: int = 0) -> int | None:
    """The smallest cut in good+1..length for which `differs(cut)` holds (a prefix of the program shows the
    difference, and every longer one does; cut `good` is known not to), or None: cuts first, 2 x first, ... until one
    differs, then bisection."""
    cut = min(max(first, good + 1), length)
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
@click.option("--equal-at", "good", type=click.IntRange(min=0), default=0, show_default=True,
              help="bisect: a cut known to show no difference (from an earlier run)")
@click.option("--decode", is_flag=True,
              help="probe the first decode run (after the whole program's prompt run) instead of the prompt run")
@click.option("--trace", "span", callback=lambda ctx, param, value: parse_span(value),
              help="START:STOP: one run storing each ABUF result of instructions START to STOP-1 (STOP is capped at "
                   "the program's HALT)")
def main(preset: str, model: str, weights: str, prompt_tokens: int, simulator: str, first: int, good: int,
         decode: bool, span: tuple[int, int] | None) -> None:
    """Find the first instruction whose ABUF result differs between the RTL and the functional simulator."""
    config = get_config(preset, 1)
    chunk = config.buffer_chunk_words
    net = load_model(model, seed=7)
    image = compile_model(net, config, 64, weights=weights)
    program = image.cards[0].program.instructions
    length = next(i for i, inst in enumerate(program) if inst.opcode is Opcode.HALT)    # the cuts before its HALT
    pos, rows = (prompt_tokens, 1) if decode else (0, prompt_tokens)
    resolved = resolve_run(program, 0, pos, rows)
    at = -(-image.cards[0].host_words // chunk) * chunk                          # past the program's host area
    ids = np.array([(37 * i + 11) % net.config.vocab_size for i in range(prompt_tokens)])   # rtl_comparison's
    traced_programs, slots = trace_programs(image, resolved, span[0], min(span[1], length), at, chunk) if span \
        else (None, [])
    room = max(sum(hi - lo for lo, hi in abuf_written(resolved, chunk)), sum(hi - lo for _, lo, hi, _ in slots))
    golden, rtl = SimulatorDevice(config), RtlDevice(config, simulator=simulator, cycle_limit=1 << 24)
    loaded = False

    def run_both(programs: list[Program], words: int) -> tuple[list[np.ndarray], int]:
        """Host words [at, at + words) after `programs` ran on the simulator and on the RTL (the probed run: the
        prompt, or with --decode a decode run after the whole program's prompt run), and the RTL's cycles."""
        nonlocal loaded
        found = []
        for device in (golden, rtl):
            if not loaded:
                device.load(dataclasses.replace(image, cards=[dataclasses.replace(c, host_words=at + room)
                                                               for c in image.cards]))
            if decode:
                device.load_programs([c.program for c in image.cards])
                device.write_host(0, image.meta["host"]["ids_offset"], ids.astype(np.uint16))
                device.run(0, prompt_tokens)
            device.load_programs(programs)
            device.write_host(0, image.meta["host"]["ids_offset"], (ids[-1:] if decode else ids).astype(np.uint16))
            device.write_host(0, at, np.zeros(words, np.uint16))          # no word left from the probe before
            stats = device.run(pos, rows)
            found.append(device.read_host(0, at, words).view(np.uint16) if words else np.zeros(0, np.uint16))
        loaded = True
        return found, stats.cycles

    def differing(words: list[np.ndarray], slot: tuple) -> bool:
        """Whether the host slot (abuf_lo, abuf_hi, host_offset) differs between the simulator and the RTL; prints
        its first differing words."""
        lo, hi, offset = slot
        part = [w[offset - at:offset - at + hi - lo] for w in words]
        bad = np.nonzero(part[0] != part[1])[0]
        if len(bad):
            click.echo("  " + ", ".join(f"ABUF[{lo + a}] RTL {part[1][a]:#06x} simulator {part[0][a]:#06x}"
                                        for a in bad[:6]), err=True)
        return bool(len(bad))

    def differs(cut: int) -> bool:
        programs, slots = probe_programs(image, cut, abuf_written(resolved[:cut], chunk), at)
        started = time.perf_counter()
        words, cycles = run_both(programs, sum(hi - lo for lo, hi, _ in slots))
        bad = np.nonzero(words[0] != words[1])[0]
        click.echo(f"cut {cut:5d} (last {program[cut - 1].opcode.name}): {len(slots)} ABUF ranges written, "
                   f"{sum(hi - lo for lo, hi, _ in slots)} words, "
                   f"{'differ in ' + str(len(bad)) + ' words' if len(bad) else 'equal'}; "
                   f"{cycles} RTL cycles, {time.perf_counter() - started:.0f} s", err=True)
        for slot in slots:
            differing(words, slot)
        return bool(len(bad))

    def traced(start: int, stop: int) -> int | None:
        started = time.perf_counter()
        words, cycles = run_both(traced_programs, sum(hi - lo for _, lo, hi, _ in slots))
        click.echo(f"trace of instructions {start} to {stop - 1}: {len(slots)} ABUF results stored; "
                   f"{cycles} RTL cycles, {time.perf_counter() - started:.0f} s", err=True)
        wrong = []
        for pc, *slot in slots:
            if differing(words, slot):
                click.echo(f"  (#{pc} {program[pc].opcode.name}: ABUF[{slot[0]}:{slot[1]}])", err=True)
                wrong.append(pc)
        return wrong[0] + 1 if wrong else None

    try:
        cut = traced(span[0], min(span[1], length)) if span else first_difference(differs, length, first, good)
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

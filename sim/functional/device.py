"""SimulatorDevice: the functional simulator behind the Device interface, with the cycle model's
estimate of every run."""
from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ringgpt.host.device import Device, DeviceError, DeviceStatus, RunStats, WatchCallback
from ringgpt.host.image import ApplianceImage, ImageError
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import REG_MASK, IllegalInstructionError, Instruction, Opcode, Program, Space, decode, validate
from ringgpt.hw.resolved import Decoded
from ringgpt.sim.cycle_model import CycleReport, schedule
from ringgpt.sim.functional.errors import HostAccessError, IllegalInstructionFault, NotLoadedError
from ringgpt.sim.functional.machine import Card, run_ring

DEFAULT_MAX_STEPS = 1 << 24
"""Instructions one card may execute in one run before the run is stopped."""


def as_words(values, error: type, what: str) -> np.ndarray:
    """FP16 words from FP16 values, or from integers taken as uint16 bit patterns."""
    array = np.asarray(values).ravel()
    if array.dtype == np.float16:
        return array
    if array.dtype.kind in "iu" and (array.size == 0 or (array.min() >= 0 and array.max() <= 0xFFFF)):
        return array.astype(np.uint16).view(np.float16)
    raise error(f"{what} must be FP16 values or integers 0..65535 (uint16 bit patterns), "
                f"got {array.dtype} values" + (" out of range" if array.dtype.kind in "iu" else ""))


def decode_program(index: int, program: Program, cfg: ArchConfig) -> list:
    """The card's program pre-decoded; raw 512-bit words are decoded here, Instructions validated."""
    cfg.check_artifact(f"card {index}'s program", program.config_name, program.config_hash)
    if (program.card, program.cards) != (index, cfg.cards):
        raise ImageError(f"card {index}'s slot holds the program built for card {program.card} of "
                         f"{program.cards}; expected card {index} of {cfg.cards}")
    decoded = []
    for pc, item in enumerate(program.instructions):
        try:
            if isinstance(item, Instruction):
                validate(item)
                decoded.append(Decoded(item))
            elif isinstance(item, int):
                decoded.append(Decoded(decode(item)))
            else:
                raise IllegalInstructionError(f"not an instruction or a 512-bit word: {type(item).__name__}")
        except IllegalInstructionError as exc:
            text = f"0x{item:x}" if isinstance(item, int) else repr(item)[:80]
            raise IllegalInstructionFault(index, pc, text, str(exc)) from None
    if not any(d.op is Opcode.HALT for d in decoded):
        raise IllegalInstructionFault(index, len(decoded), "past the last instruction",
                                      "the program has no HALT, so the card would run off its end")
    return decoded


def checked_programs(programs, cfg: ArchConfig) -> list[list]:
    """Every card's program decoded (decode_program), one Program per card of `cfg` in card order; raises
    ImageError for another count or something that is not a Program, IllegalInstructionFault naming the card
    and pc of a malformed instruction. Device.load_programs checks through it."""
    programs = list(programs)
    if len(programs) != cfg.cards:
        raise ImageError(f"load_programs got {len(programs)} programs but config {cfg.name!r} has {cfg.cards} cards")
    for index, program in enumerate(programs):
        if not isinstance(program, Program):
            raise ImageError(f"card {index}'s program is a {type(program).__name__}, not a ringgpt.hw.isa.Program")
    return [decode_program(index, program, cfg) for index, program in enumerate(programs)]


@dataclass
class CheckedCard:
    """One card of an image, checked against the config: its program decoded, its HBM segments as FP16
    words inside its memory map."""
    index: int
    program: list
    hbm_segments: list
    hbm_words: int
    host_words: int


def checked_cards(image: ApplianceImage | str | os.PathLike, cfg: ArchConfig) -> list[CheckedCard]:
    """The image's cards checked for `cfg` (config hash, card count, programs, HBM map and segments);
    raises ImageError or IllegalInstructionFault naming what is wrong. Every back end loads through it."""
    if isinstance(image, (str, os.PathLike)):
        image = ApplianceImage.load(image)
    cfg.check_artifact("appliance image", image.config.name, image.config.hash)
    if len(image.cards) != cfg.cards:
        raise ImageError(f"the image has {len(image.cards)} cards but config {cfg.name!r} has {cfg.cards}")
    cards = []
    for index, card_image in enumerate(image.cards):
        program = decode_program(index, card_image.program, cfg)
        if not 0 <= card_image.hbm_words <= cfg.hbm_words:
            raise ImageError(f"card {index}: HBM memory map of {card_image.hbm_words} words does not fit "
                             f"the card's {cfg.hbm_words} words")
        segments = []
        for address, segment in card_image.hbm_segments:
            words = as_words(segment, ImageError, f"card {index} HBM segment at {address}")
            if not 0 <= address <= address + words.size <= card_image.hbm_words:
                raise ImageError(f"card {index}: HBM segment [{address}, {address + words.size}) lies "
                                 f"outside the memory map of {card_image.hbm_words} words")
            segments.append((address, words))
        cards.append(CheckedCard(index, program, segments, card_image.hbm_words, card_image.host_words))
    return cards


class SimulatorDevice(Device):
    """A ring of `config.cards` simulated cards: bit-exact results (numerics.py) and, for every run,
    the cycle model's schedule (`last_report`). Memory persists across runs; registers do not."""

    def __init__(self, config: ArchConfig, max_steps: int = DEFAULT_MAX_STEPS, compute: bool = True,
                 timing: Mapping[str, ArchConfig] | None = None):
        """compute=False runs timing only: registers, control flow, address checks, the ring's
        matching and the cycle model, without moving or computing data (for models whose
        arithmetic is too slow to simulate; results read back are zeros). `timing` names other timing
        assumptions ({label: config}, e.g. `config.at_clock(200)`; same cards and core, other clock, rates or
        latencies): every run is also scheduled under each (RunStats.variants, `last_variant_reports`)."""
        for label, other in (timing or {}).items():
            if other.cards != config.cards:
                raise ValueError(f"timing variant {label!r} has {other.cards} cards, the device {config.cards}")
        self.timing = dict(timing or {})
        self.last_variant_reports: dict = {}
        self.config = config
        self.compute = compute
        self.max_steps = max_steps
        self.cards: list[Card] = []
        self.last_report: CycleReport | None = None
        """The cycle model's report of the last successful run: per card busy cycles by unit,
        instruction class and opcode, HBM/ring/host bytes, the schedule's total."""
        self._runs = 0
        self._last_error: str | None = None

    def load(self, image: ApplianceImage | str | os.PathLike) -> None:
        """Loads an ApplianceImage (or an image directory); programs may hold Instructions or raw
        512-bit words. Resets every memory to zero, then writes the image's HBM segments."""
        cards = []
        for checked in checked_cards(image, self.config):
            card = Card(checked.index, self.config, checked.program, checked.hbm_words, checked.host_words,
                        self.compute)
            if self.compute:
                for address, words in checked.hbm_segments:
                    card.mem[Space.HBM][address:address + words.size] = words
            cards.append(card)
        self.cards = cards
        self.last_report = None

    supports_load_programs = True

    def load_programs(self, programs) -> None:
        """Replaces every card's program (one Program per card, checked as load checks them); memories stay."""
        if not self.cards:
            raise NotLoadedError("no appliance image is loaded; call load() first")
        for card, program in zip(self.cards, checked_programs(programs, self.config)):
            card.program = program

    def _card(self, card: int) -> Card:
        if not self.cards:
            raise NotLoadedError("no appliance image is loaded; call load() first")
        if not (isinstance(card, (int, np.integer)) and 0 <= card < len(self.cards)):
            raise HostAccessError(f"card {card!r} does not exist; cards are 0..{len(self.cards) - 1}")
        return self.cards[card]

    def _host_range(self, card: Card, offset: int, count: int) -> slice:
        size = card.mem[Space.HOST].size
        if not (offset >= 0 and count >= 0 and offset + count <= size):
            raise HostAccessError(f"card {card.index}: host buffer words [{offset}, {offset + count}) lie "
                                  f"outside its {size} words")
        return slice(offset, offset + count)

    def write_host(self, card: int, offset: int, words) -> None:
        target = self._card(card)
        words = as_words(words, HostAccessError, "host buffer words")
        target.mem[Space.HOST][self._host_range(target, offset, words.size)] = words

    def read_host(self, card: int, offset: int, count: int) -> np.ndarray:
        target = self._card(card)
        return target.mem[Space.HOST][self._host_range(target, offset, count)].copy()

    def memory(self, card: int, space: Space) -> np.ndarray:
        """A read-only view of one card's ABUF, WBUF, HBM or host buffer (for inspection)."""
        view = self._card(card).mem[space].view()
        view.flags.writeable = False
        return view

    supports_watch = True

    def run(self, pos: int, rows: int) -> RunStats:
        """Runs every card's program with R1 = pos, R2 = rows; the RunStats come from the cycle model."""
        return self._run(pos, rows, None)

    def run_watched(self, pos: int, rows: int, watch: Mapping[tuple[int, int], WatchCallback]) -> RunStats:
        """`run`, calling watch[(card, pc)](card, pc, read) right after card `card` has executed the instruction
        at `pc` (an ALLGATHER: once every card's block has landed); read(space, address, count) returns a copy
        of that card's memory words. Bit-exact with `run`: the callbacks only read. With compute=False the
        memories hold no data (zeros)."""
        for card, pc in watch:
            target = self._card(card)
            if not (isinstance(pc, (int, np.integer)) and 0 <= pc < len(target.program)):
                raise ValueError(f"watch at card {card} pc {pc!r}: the card's program has pc "
                                 f"0..{len(target.program) - 1}")
        return self._run(pos, rows, watch)

    def _run(self, pos: int, rows: int, watch) -> RunStats:
        if not self.cards:
            raise NotLoadedError("no appliance image is loaded; call load() first")
        for name, value in (("pos", pos), ("rows", rows)):
            if not (isinstance(value, (int, np.integer)) and 0 <= value <= REG_MASK):
                raise ValueError(f"{name} must be an integer in 0..{REG_MASK}, got {value!r}")
        started = time.perf_counter()
        for card in self.cards:
            card.start(int(pos), int(rows))
            card.watch = _card_watch(card, watch) if watch else None
        with _collector_paused():
            try:
                run_ring(self.cards, self.max_steps)
            except DeviceError as exc:
                self._last_error = str(exc)
                raise
            finally:
                for card in self.cards:
                    card.watch = None
            traces = [card.trace for card in self.cards]
            report = schedule(traces, self.config)
            variant_reports = {label: schedule(traces, other) for label, other in self.timing.items()}
        self.last_report = report
        self.last_variant_reports = variant_reports
        self._runs += 1
        self._last_error = None
        cfg = self.config
        return RunStats(cycles=report.cycles,
                        seconds=report.cycles / (cfg.clock_mhz * 1e6) + cfg.launch_overhead_us * 1e-6,
                        hbm_bytes=report.hbm_bytes, breakdown=dict(report.slowest.classes),
                        wall_seconds=time.perf_counter() - started,
                        variants={label: rep.cycles / (self.timing[label].clock_mhz * 1e6)
                                  + self.timing[label].launch_overhead_us * 1e-6
                                  for label, rep in self.last_variant_reports.items()})

    def status(self) -> DeviceStatus:
        return DeviceStatus("functional simulator", self.config.name, self.config.cards, bool(self.cards),
                            self._runs, self._last_error)

    def close(self) -> None:
        self.cards = []
        self.last_report = None


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector paused for one run (and resumed as it was). A run allocates tens of
    thousands of short-lived objects (trace, schedule), whose count would otherwise start full collections that
    traverse every object of the process (the image's programs, the host's model): tens of milliseconds per GPT-2
    124M decode run. Nothing is lost: what the run leaves unreachable is collected after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _card_watch(card: Card, watch: Mapping) -> dict | None:
    """The card's pc -> callback(card, pc) map for Card.watch: each calls the user's callback with a reader."""
    def reader(space: Space, address: int, count: int) -> np.ndarray:
        mem = card.mem[space]
        if not (0 <= address and 0 <= count and address + count <= mem.size):
            raise HostAccessError(f"card {card.index}: watch read of {space.name} words [{address}, "
                                  f"{address + count}) outside its {mem.size} words")
        return mem[address:address + count].copy()

    def bind(callback):
        return lambda index, pc: callback(index, pc, reader)
    mine = {pc: bind(callback) for (index, pc), callback in watch.items() if index == card.index}
    return mine or None

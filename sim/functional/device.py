"""SimulatorDevice: the functional simulator behind the Device interface, with the cycle model's
estimate of every run."""
from __future__ import annotations

import contextlib
import gc
import os
import time
import warnings
from collections.abc import Mapping

import numpy as np

from ringgpt.host.device import (Device, DeviceError, DeviceStatus, HostAccessError, RunStats, WatchCallback, as_words,
                                 check_card, check_host_range, check_loaded, check_run, checked_cards, checked_programs)
from ringgpt.host.image import ApplianceImage
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.isa import Space
from ringgpt.sim.cycle_model import CycleReport, schedule
from ringgpt.sim.cycle_model.worker import ScheduleWorker, WorkerError
from ringgpt.sim.functional.machine import Card, run_ring, stacked_abuf

DEFAULT_MAX_STEPS = 1 << 24
"""Instructions one card may execute in one run before the run is stopped."""

WORKER_AFTER_S = 0.5
"""Seconds of scheduling in its own process after which a device (schedule_worker=None) starts the worker process,
about what starting it costs: a device that runs little never pays for it, one that runs much pays at most twice."""


class SimulatorDevice(Device):
    """A ring of `config.cards` simulated cards: bit-exact results (numerics.py) and, for every run,
    the cycle model's schedule (`last_report`). Memory persists across runs; registers do not."""

    def __init__(self, config: ArchConfig, max_steps: int = DEFAULT_MAX_STEPS, compute: bool = True,
                 timing: Mapping[str, ArchConfig] | None = None, schedule_worker: bool | None = None):
        """compute=False runs timing only: registers, control flow, address checks, the ring's
        matching and the cycle model, without moving or computing data (for models whose
        arithmetic is too slow to simulate; results read back are zeros). `timing` names other timing
        assumptions ({label: config}, e.g. `config.at_clock(200)`; same cards and core, other clock, rates or
        latencies): every run is also scheduled under each (RunStats.variants, `last_variant_reports`).
        `schedule_worker`: whether the cycle model runs in a second process (cycle_model/worker.py), overlapped with
        the cards' execution, with the same reports; None (default): once this device has spent WORKER_AFTER_S
        scheduling in its own process, where this process may use two CPUs, the device computes (compute=False leaves
        nothing to overlap with) and RINGGPT_SCHEDULE_WORKER is not 0 (1 also turns it on from the first run). A
        worker that fails is warned about and not used again."""
        for label, other in (timing or {}).items():
            if other.cards != config.cards:
                raise ValueError(f"timing variant {label!r} has {other.cards} cards, the device {config.cards}")
        self.timing = dict(timing or {})
        self.last_variant_reports: dict = {}
        self.config = config
        self.compute = compute
        self.max_steps = max_steps
        self.cards: list[Card] = []
        self._groups: dict = {}
        """The cards' group plans by pc (machine.run_ring), for the loaded programs and memories."""
        self.last_report: CycleReport | None = None
        """The cycle model's report of the last successful run: per card busy cycles by unit,
        instruction class and opcode, HBM/ring/host bytes, the schedule's total."""
        self._runs = 0
        self._last_error: str | None = None
        self.seconds = {"functional": 0.0, "cycle_model": 0.0}
        """Host wall-clock seconds its runs spent executing the cards' programs and in the cycle model (every timing
        variant's schedule included; with the worker, what this process spends starting it, sending it the programs
        and the runs and waiting for the reports), summed over runs (simulation speed: scripts/bench_simspeed.py)."""
        setting = os.environ.get("RINGGPT_SCHEDULE_WORKER", "")
        if setting not in ("", "0", "1"):
            warnings.warn(f"RINGGPT_SCHEDULE_WORKER={setting!r} is neither 0 nor 1 and is ignored: set 1 to start the "
                          "cycle model's worker at the first run, 0 never to start it, or unset it", RuntimeWarning,
                          stacklevel=2)
        elif schedule_worker is None and setting:
            schedule_worker = setting == "1"
        self.schedule_worker = schedule_worker
        self._worker: ScheduleWorker | None = None
        self._worker_failed = False
        self._scheduled_here = 0.0

    def load(self, image: ApplianceImage | str | os.PathLike) -> None:
        """Loads an ApplianceImage (or an image directory); programs may hold Instructions or raw
        512-bit words. Resets every memory to zero, then writes the image's HBM segments."""
        cards = []
        abufs = stacked_abuf(self.config) if self.compute else None
        for checked in checked_cards(image, self.config):
            card = Card(checked.index, self.config, checked.program, checked.hbm_words, checked.host_words,
                        self.compute, None if abufs is None else abufs[checked.index])
            if self.compute:
                for address, words in checked.hbm_segments:
                    card.mem[Space.HBM][address:address + words.size] = words
            cards.append(card)
        self.cards = cards
        self._groups = {}
        self.last_report = None

    supports_load_programs = True

    def load_programs(self, programs) -> None:
        """Replaces every card's program (one Program per card, checked as load checks them); memories stay."""
        check_loaded(bool(self.cards))
        for card, program in zip(self.cards, checked_programs(programs, self.config)):
            card.program = program
        self._groups = {}

    def _card(self, card: int) -> Card:
        check_card(card, len(self.cards))
        return self.cards[card]

    def _host_range(self, card: Card, offset: int, count: int) -> slice:
        check_host_range(card.index, offset, count, card.mem[Space.HOST].size)
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
        check_loaded(bool(self.cards))
        check_run(pos, rows)
        began = time.perf_counter()
        for card in self.cards:
            card.start(int(pos), int(rows))
            card.watch = _card_watch(card, watch) if watch else None
        worker = self._worker_for_run()
        if worker is not None and not self._worker_step(lambda: self._begin(worker, int(pos), int(rows))):
            worker = None
        started = time.perf_counter()
        with _collector_paused():
            try:
                run_ring(self.cards, self.max_steps, self._groups)
            except BaseException as exc:  # a device error, or an interrupt: the worker's reply is dropped
                if isinstance(exc, DeviceError):
                    self._last_error = str(exc)
                if worker is not None:
                    self._worker_step(worker.abort)
                raise
            finally:
                for card in self.cards:
                    card.watch = None
            executed = time.perf_counter()
            reports = worker and self._worker_step(worker.finish)
            if reports:
                report, variant_reports = reports
            else:
                traces = [card.trace for card in self.cards]
                report = schedule(traces, self.config)
                variant_reports = {label: schedule(traces, other) for label, other in self.timing.items()}
                self._scheduled_here += time.perf_counter() - executed
            scheduled = time.perf_counter()  # (the collector's pass over the run's objects comes after: neither part)
        self.seconds["functional"] += executed - started
        self.seconds["cycle_model"] += scheduled - executed + started - began
        self.last_report = report
        self.last_variant_reports = variant_reports
        self._runs += 1
        self._last_error = None
        cfg = self.config
        return RunStats(cycles=report.cycles,
                        seconds=report.cycles / (cfg.clock_mhz * 1e6) + cfg.launch_overhead_us * 1e-6,
                        hbm_bytes=report.hbm_bytes, breakdown=dict(report.slowest.classes),
                        wall_seconds=time.perf_counter() - began,
                        variants={label: rep.cycles / (self.timing[label].clock_mhz * 1e6)
                                  + self.timing[label].launch_overhead_us * 1e-6
                                  for label, rep in self.last_variant_reports.items()})

    def _worker_for_run(self) -> ScheduleWorker | None:
        """The worker process this run is scheduled in, started here when it is wanted; None: this process."""
        if self._worker is None and not self._worker_failed and (
                self.schedule_worker or (self.schedule_worker is None and self.compute
                                         and self._scheduled_here >= WORKER_AFTER_S and _usable_cpus() >= 2)):
            try:
                self._worker = ScheduleWorker(self.config, self.timing)
            except (OSError, WorkerError) as exc:
                self._give_up_worker(exc)
        return self._worker

    def _begin(self, worker: ScheduleWorker, pos: int, rows: int) -> bool:
        """Starts the worker on this run, giving it the cards' programs first where it holds others (True)."""
        programs = [card.program for card in self.cards]
        held = worker.programs
        if held is None or len(held) != len(programs) or any(a is not b for a, b in zip(held, programs)):
            worker.load(programs)
        return worker.begin(pos, rows)

    def _worker_step(self, step):
        """step()'s result, or None when the worker failed (warned about once; this process schedules from then)."""
        try:
            return step()
        except WorkerError as exc:
            self._give_up_worker(exc)
            return None

    def _give_up_worker(self, exc: Exception) -> None:
        warnings.warn(f"{exc}; the simulator schedules its runs in its own process from now on", RuntimeWarning,
                      stacklevel=3)
        if self._worker is not None:
            self._worker.close()
        self._worker, self._worker_failed = None, True

    def status(self) -> DeviceStatus:
        return DeviceStatus("functional simulator", self.config.name, self.config.cards, bool(self.cards),
                            self._runs, self._last_error)

    def close(self) -> None:
        self.cards = []
        self._groups = {}
        self.last_report = None
        if self._worker is not None:
            self._worker.close()
            self._worker = None


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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

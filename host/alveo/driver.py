"""AlveoDevice: the appliance on Alveo boards (or on anything that speaks the platform protocol of platform.py,
such as the kernel RTL in simulation: sim/rtl/kernel_platform.py), behind the Device interface.

The driver speaks only registers (hw/kernel/registers.py) and buffers. Its sequence:
  open     check the bitstream's manifest against the config (config hash, register-map hash, the xclbin's
           sha256) and open the platform (PYNQ: one overlay per board);
  load     check the image as every back end does (checked_cards); per card, allocate the program buffer, one
           buffer per HBM pseudo-channel NN in the memory of argument `hbmNN` (holding the channel's share of
           the image's HBM words, placed through hw/hbm.py's channel map) and the host buffer; fill them (zeros
           where the image has no segment, as the simulator's memories start) and sync them to the card; write
           the pointer arguments (low word, then high word) and card_id, cards;
  run      refuse when a card is not idle; write pos and rows on every card, then ap_start on every card; poll
           each card's control register for ap_done, sleeping a little between polls on the platform's clock,
           until every card is done, one has stopped on an error, or the timeout has passed; read error,
           error_pc, pc, cycles and the busy counters; raise the DeviceError subclass every back end raises for
           an error (core_fault: card, pc, instruction), RunTimeoutError naming the cards still running and their pc;
  host I/O write_host / read_host: the host buffer's bytes, synced to or from the card for that range only.
`load_programs` rewrites the program buffers (a larger program gets a new buffer and pointer); HBM, ABUF, WBUF
and the host buffers stay as they are (layer dispatch, host/runtime/layers.py).

Whatever PYNQ or XRT raise becomes one DeviceError (AlveoUnavailableError while opening the boards) that names what
the driver was doing and what to do (platform_errors); ringgpt's own errors pass as they are.

A kernel cannot be stopped from the host: after a timeout, or an error on one card while its peers wait on the
ring, the cards still running stay so until reset (on boards: xbutil reset), and the next load or run says so.
"""
from __future__ import annotations

import functools
import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ringgpt.host.device import (Device, DeviceError, DeviceStatus, HostAccessError, RingDeadlockError, RunStats,
                                 as_words, check_card, check_host_range, check_loaded, check_run, checked_cards,
                                 checked_programs, core_fault)
from ringgpt.hw import hbm
from ringgpt.hw.config import ArchConfig, ConfigMismatchError
from ringgpt.hw.core.interfaces import ErrorCode
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.isa import INSTRUCTION_BYTES
from ringgpt.hw.assembly import format_instruction
from ringgpt.hw.kernel import registers
from ringgpt.hw.kernel.kernel import KERNEL_MODULE
from ringgpt.hw.kernel.vitis import DEFAULT_PLATFORM, PLATFORMS
from ringgpt.hw.kernel.registers import AP_DONE, AP_IDLE, AP_START, CONTROL, DATA_BITS, hbm_port

from .platform import AlveoUnavailableError, Buffer, KernelCard, Platform, PynqPlatform, boards, build_command

BITSTREAMS = Path(__file__).resolve().parents[2] / "bitstreams"
"""Where scripts/build_bitstream.py puts its builds by default: bitstreams/<config>-x<cards>/manifest.json."""
POLL_S = 1e-6
"""Platform time between two polls of the control registers (on boards the register reads take longer)."""
BUFFER_ALIGN = 4096
"""Buffers are allocated in whole pages (and never empty)."""
RESET_HINT = "reset the card (on boards: xbutil reset --device <its BDF>) and load the image again"


class RunTimeoutError(RingDeadlockError):
    """Not every card finished within the driver's timeout; `cards` lists (card, pc, instruction, state)."""


@contextmanager
def platform_errors(what: str, error: type[DeviceError] = DeviceError, hint: str = RESET_HINT):
    """Lets ringgpt's own errors through and turns anything else raised while doing `what` (PYNQ's and XRT's
    exceptions: RuntimeError, OSError, ...) into one `error` that names it and says what to do."""
    try:
        yield
    except RingGPTError:
        raise
    except Exception as exc:  # noqa: BLE001 - the platform's exceptions are not ours to know one by one
        raise error(f"{what} failed: {type(exc).__name__}: {' '.join(str(exc).split())}; {hint}") from exc


def default_manifest(cfg: ArchConfig) -> Path:
    return BITSTREAMS / cfg.name / "manifest.json"


def _on_platform(what: str):
    """Method decorator: platform_errors(what) on the device's platform around the method."""
    def decorate(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            with platform_errors(f"{what} on {self.description}"):
                return method(self, *args, **kwargs)
        return guarded
    return decorate


def check_manifest(path: str | Path, cfg: ArchConfig, need_xclbin: bool = True) -> Path | None:
    """The xclbin that the manifest at `path` describes, checked: a kernel of `cfg` (config hash), this
    register map (hash), and the file's sha256 as recorded. Raises ConfigMismatchError for another config,
    register map or xclbin, AlveoUnavailableError for a missing manifest or (with need_xclbin) xclbin."""
    path = Path(path)
    build = build_command(cfg)
    if not path.is_file():
        raise AlveoUnavailableError(f"no bitstream manifest at {path}: build one with {build}")
    try:
        manifest = json.loads(path.read_text())
        kernel, config, cards = manifest["kernel"], manifest["config"], manifest["cards"]
        config_hash, map_hash, xclbin = manifest["config_hash"], manifest["register_map_hash"], manifest["xclbin"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AlveoUnavailableError(f"{path} is not a bitstream manifest ({exc!r}): rebuild it with {build}") from None
    if kernel != KERNEL_MODULE:
        raise ConfigMismatchError(f"{path} describes kernel {kernel!r}, not {KERNEL_MODULE!r}: rebuild it with {build}")
    cfg.check_artifact(f"the bitstream of {path}", f"{config}-x{cards}", config_hash)
    if map_hash != registers.map_hash(cfg):
        raise ConfigMismatchError(f"the bitstream of {path} was built with another register map than this driver's "
                                  f"(hash {map_hash} against {registers.map_hash(cfg)}): rebuild it with {build}")
    if xclbin is None:
        if not need_xclbin:
            return None
        steps = "; ".join(f"{step}: {state}" for step, state in manifest.get("steps", {}).items() if state != "done")
        raise AlveoUnavailableError(f"{path} records no xclbin ({steps or 'the Vitis steps did not run'}): build it "
                                    f"on a machine with Vitis {PLATFORMS[DEFAULT_PLATFORM].vitis} with {build}")
    binary = path.parent / xclbin["path"]
    if not binary.is_file():
        raise AlveoUnavailableError(f"the xclbin {binary} named by {path} is missing: rebuild it with {build}")
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    if digest != xclbin["sha256"]:
        raise ConfigMismatchError(f"the xclbin {binary} has sha256 {digest}, its manifest {path} records "
                                  f"{xclbin['sha256']}: it was replaced or changed; rebuild it with {build}")
    return binary


def check_boards(cfg: ArchConfig, manifest: str | Path | None = None) -> Path:
    """Everything the boards' back end needs before it opens them: PYNQ, one board per card, the manifest and
    its xclbin (default: bitstreams/<config>-x<cards>/manifest.json); returns the xclbin's path."""
    boards(cfg.cards)
    return check_manifest(manifest or default_manifest(cfg), cfg)


def _allocate(kernel: KernelCard, nbytes: int, argument: str) -> Buffer:
    return kernel.allocate(max(BUFFER_ALIGN, -(-nbytes // BUFFER_ALIGN) * BUFFER_ALIGN), argument)


@dataclass
class _Card:
    """What the driver holds for one card: its kernel, its buffers by argument, its decoded program."""
    index: int
    kernel: KernelCard
    program: list
    host_words: int
    buffers: dict = field(default_factory=dict)

    def write_argument(self, register: registers.Register, value: int) -> None:
        mask = (1 << DATA_BITS) - 1
        for word in range(register.bits // DATA_BITS):  # a 64-bit pointer: low word, then high word
            self.kernel.write(register.offset + DATA_BITS // 8 * word, (value >> (DATA_BITS * word)) & mask)

    def free(self) -> None:
        for buffer in self.buffers.values():
            buffer.free()
        self.buffers = {}


class AlveoDevice(Device):
    """`config.cards` kernels on `platform` (default: PynqPlatform on the boards, with the xclbin of `manifest`,
    default bitstreams/<config>-x<cards>/manifest.json). The device owns the platform and closes it.
    `timeout_s`: how long a run may take on the platform's clock (default: the platform's)."""

    supports_load_programs = True

    def __init__(self, config: ArchConfig, platform: Platform | None = None, manifest: str | Path | None = None,
                 timeout_s: float | None = None):
        self.config = config
        self._registers = registers.by_name(config)
        self._status_words = [r.name for r in registers.register_map(config) if r.kind == "status"]
        if platform is None:
            xclbin = check_boards(config, manifest)
            with platform_errors(f"opening {config.cards} Alveo board(s) with {xclbin}", AlveoUnavailableError,
                                 "check the boards and XRT with `xbutil examine`, and that no other process holds "
                                 "them"):
                platform = PynqPlatform(xclbin, config)
        elif manifest is not None:
            check_manifest(manifest, config, need_xclbin=False)
        if len(platform.cards) != config.cards:
            platform.close()
            raise AlveoUnavailableError(f"the platform has {len(platform.cards)} kernels, config {config.name!r} "
                                        f"needs {config.cards}")
        self.platform = platform
        self.description = platform.description
        self.timeout_s = platform.default_timeout_s if timeout_s is None else timeout_s
        self._cards: list[_Card] = []
        self._runs = 0
        self._last_error: str | None = None
        self.last_counters: list = []
        """Per card, the last run's counters from the kernel (cycles, busy cycles per unit)."""

    # --- registers ---------------------------------------------------------------------------------------
    def _read(self, card: int, name: str) -> int:
        return self.platform.cards[card].read(self._registers[name].offset)

    def _describe(self, card: int, pc: int) -> str:
        program = self._cards[card].program
        return format_instruction(program[pc].inst) if 0 <= pc < len(program) else "past the last instruction"

    def _require_idle(self) -> None:
        """Refuses to touch cards that still run (reading the control word also clears a late ap_done)."""
        for card, kernel in enumerate(self.platform.cards):
            if not kernel.read(CONTROL) & AP_IDLE:
                pc = self._read(card, "pc")
                where = f"pc {pc}: {self._describe(card, pc)}" if self._cards else f"pc {pc} of a program loaded before"
                raise DeviceError(f"card {card} is still running an earlier run ({where}); a kernel cannot be "
                                  f"stopped from the host: {RESET_HINT}")

    # --- Device ------------------------------------------------------------------------------------------
    @_on_platform("loading the image")
    def load(self, image) -> None:
        """Checks the image, allocates and fills every card's buffers, writes the pointer arguments."""
        checked = checked_cards(image, self.config)
        self._require_idle()
        self._release()
        cfg = self.config
        for card_image, kernel in zip(checked, self.platform.cards):
            card = _Card(card_image.index, kernel, card_image.program, card_image.host_words)
            self._cards.append(card)
            self._write_program(card, card_image.program)
            host = card.buffers["host"] = _allocate(kernel, 2 * card.host_words, "host")
            host.array[:] = 0
            host.sync_to_device(0, host.array.size)
            for channel in range(cfg.hbm_channels):
                self._fill_channel(card, channel, card_image.hbm_words, card_image.hbm_segments)
            for name, value in (("card_id", card.index), ("cards", cfg.cards)):
                card.write_argument(self._registers[name], value)
            for name, buffer in card.buffers.items():
                card.write_argument(self._registers[name], buffer.device_address)

    def _fill_channel(self, card: _Card, channel: int, hbm_words: int, segments: list) -> None:
        """Pseudo-channel `channel`'s share of the image's HBM words: zeros, then the segments' words it holds."""
        port = hbm_port(channel)
        _, words = hbm.local_range(channel, 0, hbm_words, self.config)
        buffer = card.buffers[port] = _allocate(card.kernel, 2 * words, port)
        buffer.array[:] = 0
        local = buffer.array[:2 * words].view(np.uint16)
        for address, segment in segments:
            lo, hi = hbm.local_range(channel, address, address + segment.size, self.config)
            if lo < hi:
                local[lo:hi] = segment.view(np.uint16)[hbm.hbm_word(channel, np.arange(lo, hi), self.config) - address]
        buffer.sync_to_device(0, buffer.array.size)

    def _write_program(self, card: _Card, program: list) -> None:
        """The program's instruction words from pc 0 on, in its buffer (a new, larger one when it does not fit)."""
        code = b"".join(d.inst.encode().to_bytes(INSTRUCTION_BYTES, "little") for d in program)
        buffer = card.buffers.get("program")
        if buffer is None or buffer.array.size < len(code):
            if buffer is not None:
                buffer.free()
            buffer = card.buffers["program"] = _allocate(card.kernel, len(code), "program")
        buffer.array[:len(code)] = np.frombuffer(code, np.uint8)
        buffer.sync_to_device(0, len(code))
        card.program = program

    @_on_platform("loading the programs")
    def load_programs(self, programs) -> None:
        """Rewrites every card's program buffer (programs checked as load checks them); memories stay."""
        check_loaded(bool(self._cards))
        decoded = checked_programs(programs, self.config)
        self._require_idle()
        for card, program in zip(self._cards, decoded):
            self._write_program(card, program)
            card.write_argument(self._registers["program"], card.buffers["program"].device_address)

    def _host(self, card: int, offset: int, count: int) -> tuple[Buffer, int, int]:
        check_card(card, len(self._cards))
        check_host_range(card, offset, count, self._cards[card].host_words)
        return self._cards[card].buffers["host"], 2 * int(offset), 2 * int(count)

    @_on_platform("writing a host buffer")
    def write_host(self, card: int, offset: int, words) -> None:
        words = as_words(words, HostAccessError, "host buffer words")
        buffer, start, nbytes = self._host(card, offset, words.size)
        if nbytes:
            buffer.array[start:start + nbytes] = words.view(np.uint8)
            buffer.sync_to_device(start, nbytes)

    @_on_platform("reading a host buffer")
    def read_host(self, card: int, offset: int, count: int) -> np.ndarray:
        buffer, start, nbytes = self._host(card, offset, count)
        if nbytes:
            buffer.sync_from_device(start, nbytes)
        return buffer.array[start:start + nbytes].copy().view(np.float16)

    def run(self, pos: int, rows: int) -> RunStats:
        """Starts every card with R1 = pos, R2 = rows and waits until all are done; RunStats.cycles is the
        kernels' own count (the slowest card's)."""
        check_run(pos, rows)
        with platform_errors(f"running on {self.description}"):
            check_loaded(bool(self._cards))
            self._require_idle()
            for card in self._cards:
                card.write_argument(self._registers["pos"], int(pos))
                card.write_argument(self._registers["rows"], int(rows))
            started, begin = time.perf_counter(), self.platform.now()
            for kernel in self.platform.cards:
                kernel.write(CONTROL, AP_START)
            errors = self._wait(begin)
            counters = [{"card": card, "cycles": self._read(card, "cycles"),
                         "busy": {name.removeprefix("busy_"): self._read(card, name)
                                  for name in self._status_words if name.startswith("busy_")}}
                        for card in range(self.config.cards)]
            self.last_counters = counters
            cycles = max(c["cycles"] for c in counters)
            for card, code in sorted(errors.items()):
                if code != ErrorCode.NONE.value:
                    self._fail(self._fault(card, code, cycles))
            self._runs += 1
            self._last_error = None
            cfg = self.config
            return RunStats(cycles=cycles, seconds=cycles / (cfg.clock_mhz * 1e6) + cfg.launch_overhead_us * 1e-6,
                            breakdown=dict(max(counters, key=lambda c: c["cycles"])["busy"]),
                            wall_seconds=time.perf_counter() - started)

    def _wait(self, begin: float) -> dict[int, int]:
        """Polls until every card is done or one has stopped on an error: {card: error code} of the done cards.
        Raises RunTimeoutError when the platform's clock passes the timeout first."""
        done: dict[int, int] = {}
        while True:
            for card, kernel in enumerate(self.platform.cards):
                if card not in done and kernel.read(CONTROL) & AP_DONE:  # ap_done clears on this read
                    done[card] = self._read(card, "error")
            if len(done) == self.config.cards or any(done.values()):
                return done
            if self.platform.now() - begin > self.timeout_s:
                states = [(card, pc, self._describe(card, pc), "done" if card in done else "still running")
                          for card, pc in ((card, self._read(card, "pc")) for card in range(self.config.cards))]
                self._fail(RunTimeoutError(f"the kernels did not all finish within {self.timeout_s:g} s on "
                                           f"{self.description}; {RESET_HINT}", states))
            self.platform.sleep(POLL_S)

    def _fault(self, card: int, code: int, cycles: int) -> DeviceError:
        pc = self._read(card, "error_pc")
        try:
            name = ErrorCode(code).name
        except ValueError:
            return DeviceError(f"card {card} pc {pc} ({self._describe(card, pc)}): the kernel reports error code "
                               f"{code}, which this driver does not know; is the bitstream of this checkout?")
        return core_fault(card, pc, name, self._cards[card].program, cycles)

    def _fail(self, exc: DeviceError):
        self._last_error = str(exc)
        raise exc

    def status(self) -> DeviceStatus:
        return DeviceStatus(f"Alveo driver on {self.description}", self.config.name, self.config.cards,
                            bool(self._cards), self._runs, self._last_error)

    def _release(self) -> None:
        for card in self._cards:
            card.free()
        self._cards = []

    @_on_platform("closing")
    def close(self) -> None:
        """Frees every buffer and closes the platform (the boards' overlays, or the simulation)."""
        if self.platform is not None:
            self._release()
            self.platform.close()
            self.platform = None

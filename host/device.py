"""The one device interface in front of the functional simulator, the RTL simulation and the Alveo
boards: load an appliance image, write inputs into the host buffers, run every card's program from
a token position, read results back, ask for status. Every back end raises DeviceError (or a
subclass) with the card, pc and instruction when a run fails.

Beside `Device`, what the three back ends share, so that each imports this module and no other back end:
the DeviceError family (program faults naming card, pc and instruction; ring failures naming every card;
use before load; host-buffer accesses out of range), the checks every back end makes (`checked_cards` for
an image, `checked_programs` for layer dispatch, `check_card` / `check_host_range` / `check_run` for the
host's calls) and `core_fault`, the error for a core's ErrorCode (the RTL simulation's and the boards')."""
from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ringgpt.host.image import ApplianceImage, ImageError
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.isa import REG_MASK, IllegalInstructionError, Instruction, Opcode, Space, decode, validate
from ringgpt.hw.assembly import format_instruction
from ringgpt.hw.program import Program
from ringgpt.hw.resolved import Decoded

MemoryReader = Callable[[Space, int, int], np.ndarray]
"""read(space, address, count): a copy of `count` words of one card's memory as it is at that moment."""
WatchCallback = Callable[[int, int, MemoryReader], None]
"""callback(card, pc, read), called right after card `card` has executed the instruction at `pc`."""


class DeviceError(RingGPTError, RuntimeError):
    """A run that stopped on an error: illegal instruction, bad address, deadlock, timeout (the CLI exits 1)."""

    exit_code = 1
    label = "device error"


class WatchUnsupportedError(DeviceError):
    """Device.run_watched on a back end that cannot stop after a given instruction."""


class ProgramsUnsupportedError(DeviceError):
    """Device.load_programs on a back end that cannot replace the loaded programs."""


class SimulatorError(DeviceError):
    """A program fault on one card: `card`, `pc` and `instruction` (assembly text, or the raw word)."""

    def __init__(self, card: int, pc: int, instruction: str, problem: str):
        self.card, self.pc, self.instruction, self.problem = card, pc, instruction, problem
        super().__init__(f"card {card} pc {pc} ({instruction}): {problem}")


class IllegalInstructionFault(SimulatorError):
    """A word that does not decode to a legal instruction, or a program without HALT."""


class AddressFault(SimulatorError):
    """An access outside its memory space (or outside the image's HBM map)."""


class AlignmentFault(SimulatorError):
    """A MATMUL's or MASKED_QK's weights (in WBUF) off the matrix unit's boundaries (hw/resolved.misaligned_weights),
    or a LOAD's or GATHER's HBM/host words at other offsets within the beat than their buffer words
    (hw/resolved.misaligned_transfer); the RTL's ErrorCode.MISALIGNED."""


class RingError(DeviceError):
    """A ring protocol failure involving several cards; `cards` lists (card, pc, instruction, state)."""

    def __init__(self, problem: str, cards: list):
        self.problem, self.cards = problem, cards
        lines = [f"  card {c} pc {pc} ({inst}): {state}" for c, pc, inst, state in cards]
        super().__init__("\n".join([problem] + lines))


class RingDeadlockError(RingError):
    """No card can make progress: every card still running waits on a router op that cannot match."""


class CollectiveMismatchError(RingError):
    """Cards met at a collective or a SEND/RECV pair with shapes that do not fit together, or a run
    ended with blocks sent but never received."""


class NotLoadedError(DeviceError):
    """The device was used before an image was loaded."""


class HostAccessError(DeviceError):
    """A host-side read or write outside a card's host buffer, or of data that is not FP16 words."""


def core_fault(card: int, pc: int, code: str, program: list, cycles: int) -> SimulatorError:
    """The DeviceError for a core that stopped with ErrorCode `code` (its name: hw/core/interfaces.py) at `pc` of
    `program` (decoded, as checked_programs gives it) after `cycles` cycles: the RTL simulation's and the boards'."""
    text = format_instruction(program[pc].inst) if 0 <= pc < len(program) else "past the last instruction"
    problem = f"the core stopped with error {code} after {cycles} cycles"
    if code == "ILLEGAL":
        return IllegalInstructionFault(card, pc, text, problem)
    if code == "RING":
        return CollectiveMismatchError(problem, [(card, pc, text, "stopped")])
    if code == "MISALIGNED":
        return AlignmentFault(card, pc, text, problem)
    return AddressFault(card, pc, text, problem) if code in ("OUT_OF_RANGE", "BUS") else SimulatorError(
        card, pc, text, problem)


# --- the checks every back end makes ------------------------------------------------------------------------

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
            raise ImageError(f"card {index}'s program is a {type(program).__name__}, not a ringgpt.hw.program.Program")
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


def check_loaded(loaded: bool) -> None:
    """NotLoadedError unless an image is loaded."""
    if not loaded:
        raise NotLoadedError("no appliance image is loaded; call load() first")


def check_card(card, cards: int) -> None:
    """`card` names one of the `cards` cards of the loaded image: NotLoadedError when none is loaded (`cards` 0),
    HostAccessError for a card that does not exist."""
    check_loaded(cards > 0)
    if not (isinstance(card, (int, np.integer)) and 0 <= card < cards):
        raise HostAccessError(f"card {card!r} does not exist; cards are 0..{cards - 1}")


def check_host_range(card, offset: int, count: int, size: int) -> None:
    """Words [offset, offset + count) lie inside card `card`'s host buffer of `size` words (else HostAccessError)."""
    if not (offset >= 0 and count >= 0 and offset + count <= size):
        raise HostAccessError(f"card {card}: host buffer words [{offset}, {offset + count}) lie "
                              f"outside its {size} words")


def check_run(pos, rows) -> None:
    """Device.run's R1 = pos and R2 = rows fit a register (else ValueError)."""
    for name, value in (("pos", pos), ("rows", rows)):
        if not (isinstance(value, (int, np.integer)) and 0 <= value <= REG_MASK):
            raise ValueError(f"{name} must be an integer in 0..{REG_MASK}, got {value!r}")


@dataclass
class RunStats:
    """What one run (all cards, one call of Device.run) cost, as far as the back end can tell."""
    cycles: int = 0
    """Modeled or measured cycles from start to the last card's HALT."""
    seconds: float = 0.0
    """cycles at the config clock plus the host launch overhead."""
    hbm_bytes: int = 0
    """Bytes moved to or from HBM on all cards."""
    breakdown: dict = field(default_factory=dict)
    """Busy cycles by instruction class (the slowest card)."""
    wall_seconds: float = 0.0
    """Host wall-clock time the back end took (simulation speed)."""
    variants: dict = field(default_factory=dict)
    """{label: seconds} of the same run under other timing assumptions (another clock, a conservative set),
    for back ends that model time (SimulatorDevice(timing=...)); launch overhead included as in `seconds`."""


@dataclass
class DeviceStatus:
    name: str
    config_name: str
    cards: int
    loaded: bool
    runs: int = 0
    last_error: str | None = None


class Device(ABC):
    """A ring of `config.cards` cards, each running one program of a loaded ApplianceImage."""

    config: ArchConfig

    @abstractmethod
    def load(self, image) -> None:
        """Loads programs and HBM contents; raises ConfigMismatchError for an image of another config."""

    @abstractmethod
    def write_host(self, card: int, offset: int, words: np.ndarray) -> None:
        """Writes FP16 words (or uint16 bit patterns) into card `card`'s host buffer at `offset`."""

    @abstractmethod
    def read_host(self, card: int, offset: int, count: int) -> np.ndarray:
        """Reads `count` FP16 words from card `card`'s host buffer."""

    @abstractmethod
    def run(self, pos: int, rows: int) -> RunStats:
        """Runs every card's program with R1 = pos, R2 = rows until all HALT."""

    supports_watch: bool = False
    """Whether run_watched works on this back end (the optional hook of `ringgpt check`)."""

    def run_watched(self, pos: int, rows: int, watch: Mapping[tuple[int, int], WatchCallback]) -> RunStats:
        """Optional: `run`, calling watch[(card, pc)](card, pc, read) right after card `card` has executed the
        instruction at `pc` (cards run their programs in order and have no branches, so once per run), with
        `read(space, address, count)` returning a copy of that card's memory words as they are then. What a
        callback does must not change the run. Back ends that cannot stop there raise WatchUnsupportedError."""
        raise WatchUnsupportedError(f"{type(self).__name__} cannot watch instructions (no run_watched): "
                                    "layer-by-layer checks use layer dispatch (load_programs) there")

    supports_load_programs: bool = False
    """Whether load_programs works on this back end (layer dispatch: host/runtime/layers.py)."""

    def load_programs(self, programs: Sequence[Program]) -> None:
        """Optional: replaces every card's program of the loaded image by programs[card] (a Program built for
        that card of this config, as in ApplianceImage.cards[card].program), leaving HBM, ABUF, WBUF and the
        host buffers as they are; the next run starts it at pc 0. Raises ImageError or IllegalInstructionFault
        for a wrong card count or a malformed program, NotLoadedError before load. Back ends that cannot swap
        programs raise ProgramsUnsupportedError."""
        raise ProgramsUnsupportedError(f"{type(self).__name__} cannot load programs into a loaded image (no "
                                       "load_programs): layer dispatch needs a back end that can")

    @abstractmethod
    def status(self) -> DeviceStatus:
        ...

    def close(self) -> None:
        """Releases the back end's resources (boards, simulator processes)."""


BACKENDS = {"sim": "ringgpt.sim.functional.device:SimulatorDevice", "rtl": "ringgpt.sim.rtl.device:RtlDevice",
            "alveo": "ringgpt.host.alveo.driver:AlveoDevice"}
"""The Device back ends by name: the functional simulator, the RTL simulation and the Alveo boards' driver (whose
`platform` option runs it on the kernel's RTL instead: sim/rtl/kernel_platform.py). The runtime opens them
through `open_device` and speaks to `Device` alone."""


def open_device(backend: str, config: ArchConfig, **options) -> Device:
    """A `backend` device for `config`; `options` go to its constructor (e.g. timing for sim, simulator for rtl)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown device back end {backend!r}; known: {', '.join(BACKENDS)}")
    module, _, name = BACKENDS[backend].partition(":")
    return getattr(importlib.import_module(module), name)(config, **options)

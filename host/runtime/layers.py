"""Layer dispatch: one run of the appliance as a series of shorter runs, one per GPT-2 layer, with the hidden
state read back after each, on any Device that can replace its programs (Device.load_programs): the functional
simulator, the RTL simulation, the boards. `ringgpt check` compares these hidden states with the PyTorch
reference where a back end cannot watch instructions (run_watched).

A card's program has no branches, and its registers change only by SETI, ADDI, MULI and ADD, whose results
depend on R1 = pos, R2 = rows and the control instructions before them. So a program entered at any pc runs as
the whole program does from there once its registers are restored: a segment is the register-writing control
instructions of program[0:start] (the prelude), then program[start:stop + 1], then a STORE of the value the
compiler's probe records at `stop` (image.meta["probes"]) to a host-buffer area of its own, then HALT.

The cuts are the residual stream after the embedding ("embed") and after every layer ("L<n>.res2"), at their
probes' pcs on every card; the last segment runs on to the program's end (final LayerNorm, LM head, logits to
the host buffer). Segments run one after the other on every card are exactly the whole program: ABUF, WBUF, HBM
(the KV cache) and the host buffers persist between runs on every back end, and each card's collectives of a
segment are the ones its peers reach in theirs (checked: the same number of ALLGATHERs on every card, as many
SENDs as the next card's RECVs).

The hidden-state area lies past what the runtime uses of each card's host buffer; `layer_image` grows the host
buffers by it (meta["host"]["hidden"]). Load that image (runs of it are those of the image it came from), then
call `run_layers` for a run."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ringgpt.host.compiler.layout import align_up
from ringgpt.host.device import Device, RingError, SimulatorError
from ringgpt.host.errors import RingGPTError
from ringgpt.host.image import ApplianceImage
from ringgpt.hw.isa import HOST_ROWS_REG, OPCODES, Dim, Instruction, Opcode, Operand, Space, decode
from ringgpt.hw.program import Program

REGISTER_WRITERS = frozenset(op for op, spec in OPCODES.items() if "rd" in spec.control)
"""The opcodes that write a register (SETI, ADDI, MULI, ADD): a segment's prelude is made of them."""


class LayerDispatchError(RingGPTError, ValueError):
    """An image that cannot be run one layer at a time (no probes, cuts whose collectives do not match)."""


@dataclass(frozen=True)
class Segment:
    """One dispatch to every card: the part of each card's program between two cuts."""
    name: str
    """The value it ends with and stores: "embed", "L<n>.res2"; "head" for the last (ln_f, LM head, logits)."""
    spans: tuple
    """Per card, (first pc, last pc) of the whole program that it runs."""
    programs: tuple
    """Per card, the Program: register prelude + the span + STORE of the value + HALT (the last: no STORE)."""
    probes: tuple
    """Per card, the index in image.meta["probes"][card] of the value it stores (empty for "head")."""
    origins: tuple
    """Per card, the whole program's pc of every instruction of the segment's program (the STORE and HALT
    added at the cut: the cut's pc)."""

    def whole_pc(self, card: int, pc: int) -> int:
        """The whole program's pc of instruction `pc` of card `card`'s segment program (pc itself past its end)."""
        origins = self.origins[card]
        return origins[pc] if 0 <= pc < len(origins) else pc


@dataclass
class HiddenState:
    """One card's value at the end of a segment, read back from its host buffer."""
    name: str
    card: int
    pc: int
    """The pc of the whole program after which the value was taken."""
    probe: int
    """Its index in image.meta["probes"][card]."""
    values: np.ndarray
    """(rows, width) FP16: the run's rows of the probe's ABUF columns."""


def cut_names(image: ApplianceImage) -> list:
    """The values the segments end with, in program order."""
    return ["embed"] + [f"L{layer}.res2" for layer in range(int(image.meta["model"]["n_layer"]))]


def _cuts(image: ApplianceImage) -> list:
    """Per card, (probe index, probe) of every cut in order; LayerDispatchError when one is missing."""
    probes = image.meta.get("probes")
    if not isinstance(probes, list) or len(probes) != len(image.cards):
        raise LayerDispatchError("the appliance image records no probes (image.meta['probes'], one list per card), "
                                 "so it cannot be cut into layers: recompile it with ringgpt.host.compiler")
    names = cut_names(image)
    cuts = []
    for card, card_probes in enumerate(probes):
        index = {probe.get("name"): i for i, probe in enumerate(card_probes)}
        missing = [name for name in names if name not in index]
        if missing:
            raise LayerDispatchError(f"card {card} records no probe of {', '.join(missing)}: the image cannot be "
                                     "cut after the embedding and every layer; recompile it")
        mine = [(index[name], card_probes[index[name]]) for name in names]
        pcs = [probe["pc"] for _, probe in mine]
        length = len(image.cards[card].program.instructions)
        in_order = pcs == sorted(set(pcs)) and 0 <= pcs[0] and pcs[-1] < length
        if not in_order or any(probe["rows"] != "run" for _, probe in mine):
            raise LayerDispatchError(f"card {card}: the probes of {', '.join(names)} are not the run's rows at "
                                     f"increasing pcs inside the program (pcs {pcs}): the image is damaged")
        cuts.append(mine)
    return cuts


def layer_image(image: ApplianceImage) -> ApplianceImage:
    """`image` with every card's host buffer grown by the hidden-state area (max_rows rows of the widest cut,
    aligned as the compiler aligns the logits), recorded in meta["host"]["hidden"] as {card, offset, words}.
    Its programs and HBM are `image`'s; an image that has the area already is returned as it is."""
    if "hidden" in image.meta.get("host", {}):
        return image
    rows = int(image.meta["max_rows"])
    align = image.config.beat_words
    cards, hidden = [], []
    for index, (card, cuts) in enumerate(zip(image.cards, _cuts(image))):
        offset = align_up(card.host_words, align)
        words = rows * max(int(probe["width"]) for _, probe in cuts)
        cards.append(dataclasses.replace(card, host_words=offset + words))
        hidden.append({"card": index, "offset": offset, "words": words})
    return ApplianceImage(image.config, cards, {**image.meta, "host": {**image.meta["host"], "hidden": hidden}})


def _hidden_offsets(image: ApplianceImage) -> list:
    hidden = image.meta.get("host", {}).get("hidden")
    if hidden is None:
        raise LayerDispatchError("the image has no hidden-state area in its host buffers: load and pass "
                                 "layer_image(image) for layer dispatch")
    return [int(entry["offset"]) for entry in hidden]


def _instructions(program: Program) -> list:
    return [item if isinstance(item, Instruction) else decode(item) for item in program.instructions]


def prelude_pcs(instructions: list, pc: int) -> list:
    """The pcs of the register-writing control instructions of instructions[0:pc], the register prelude: run from
    R1 = pos, R2 = rows and the other registers zero (as every run starts), they leave the registers as the whole
    program has them at pc."""
    return [at for at, inst in enumerate(instructions[:pc]) if inst.opcode in REGISTER_WRITERS and inst.rd != 0]


def _store(probe: dict, offset: int) -> Instruction:
    """STORE of the run's rows of a probe's value to the host buffer at `offset`, rows dense."""
    width = int(probe["width"])
    return Instruction.make(Opcode.STORE, dst=Operand(Space.HOST, 0, offset),
                            src1=Operand(Space.ABUF, 0, int(probe["addr"])), rows=Dim(HOST_ROWS_REG, 0),
                            n=Dim(0, width), dst_stride=width, src1_stride=int(probe["stride"]))


def layer_programs(image: ApplianceImage) -> list:
    """The image's Segments, in order (a `layer_image`); LayerDispatchError when the cards' collectives of a
    segment would not meet each other."""
    offsets = _hidden_offsets(image)
    cuts = _cuts(image)
    codes = [_instructions(card.program) for card in image.cards]
    names = cut_names(image) + ["head"]
    segments = []
    starts = [0] * len(codes)
    for number, name in enumerate(names):
        spans, programs, probes, origins = [], [], [], []
        for card, code in enumerate(codes):
            start = starts[card]
            if name == "head":
                stop, tail = len(code) - 1, []
            else:
                index, probe = cuts[card][number]
                stop, tail = probe["pc"], [_store(probe, offsets[card]), Instruction.make(Opcode.HALT)]
                probes.append(index)
                if any(inst.opcode is Opcode.HALT for inst in code[start:stop + 1]):
                    raise LayerDispatchError(f"card {card} halts before {name} (pc {stop}): the image is damaged")
            spans.append((start, stop))
            prelude = prelude_pcs(code, start)
            origins.append(tuple(prelude) + tuple(range(start, stop + 1)) + (stop,) * len(tail))
            programs.append(dataclasses.replace(image.cards[card].program, instructions=[code[at] for at in prelude]
                                                + code[start:stop + 1] + tail))
            starts[card] = stop + 1
        _check_collectives(name, [code[a:b + 1] for code, (a, b) in zip(codes, spans)], spans)
        segments.append(Segment(name, tuple(spans), tuple(programs), tuple(probes), tuple(origins)))
    return segments


def _check_collectives(name: str, parts: list, spans: list) -> None:
    """Every card reaches as many ALLGATHERs in the segment, and sends as many blocks as the next card receives."""
    def count(part, opcode):
        return sum(1 for inst in part if inst.opcode is opcode)
    where = ", ".join(f"card {card} pcs {a}..{b}" for card, (a, b) in enumerate(spans))
    gathers = [count(part, Opcode.ALLGATHER) for part in parts]
    if len(set(gathers)) > 1:
        raise LayerDispatchError(f"segment {name} ({where}): the cards reach {gathers} ALLGATHERs; they must meet "
                                 "in the same segment, so the program cannot be cut there")
    for card, part in enumerate(parts):
        after = (card + 1) % len(parts)
        sends, receives = count(part, Opcode.SEND), count(parts[after], Opcode.RECV)
        if sends != receives:
            raise LayerDispatchError(f"segment {name} ({where}): card {card} sends {sends} blocks, card {after} "
                                     f"receives {receives}; the program cannot be cut there")


def _in_whole_program(exc: SimulatorError | RingError, segment: Segment) -> SimulatorError | RingError:
    """The same error with the pcs of the whole program, naming the segment."""
    where = f" (layer dispatch: in the segment that ends with {segment.name})"
    if isinstance(exc, SimulatorError):
        return type(exc)(exc.card, segment.whole_pc(exc.card, exc.pc), exc.instruction, exc.problem + where)
    return type(exc)(exc.problem + where, [(card, segment.whole_pc(card, pc), text, state)
                                           for card, pc, text, state in exc.cards])


def run_layers(device: Device, image: ApplianceImage, pos: int, rows: int) -> list:
    """One run (R1 = pos, R2 = rows, the token ids already in the host buffers) dispatched segment by segment on
    `device`, which holds `image` (a layer_image: device.load(image) or Appliance(device, image)); returns every
    card's HiddenState after the embedding and after each layer, in order. The last segment leaves the logits in
    the host buffers as a whole run does; the whole programs are loaded again afterwards (also after an error).
    A run that fails raises the back end's DeviceError with the whole program's pcs, naming the segment."""
    max_rows = int(image.meta["max_rows"])
    if not (isinstance(rows, (int, np.integer)) and 1 <= rows <= max_rows):
        raise ValueError(f"rows must be an integer in 1..{max_rows} (the image's max_rows), got {rows!r}")
    segments = layer_programs(image)
    offsets = _hidden_offsets(image)
    states = []
    try:
        for segment in segments:
            device.load_programs(segment.programs)
            try:
                device.run(pos, rows)
            except (SimulatorError, RingError) as exc:
                raise _in_whole_program(exc, segment) from None
            for card, (index, (_, stop)) in enumerate(zip(segment.probes, segment.spans)):
                width = int(image.meta["probes"][card][index]["width"])
                values = device.read_host(card, offsets[card], rows * width).reshape(rows, width)
                states.append(HiddenState(segment.name, card, stop, index, values))
    except BaseException:
        try:
            device.load_programs([card.program for card in image.cards])
        except Exception:  # noqa: BLE001 - the run's own error is the one to report
            pass
        raise
    device.load_programs([card.program for card in image.cards])
    return states

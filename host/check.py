"""`ringgpt check`: the compiled programs on a device and the PyTorch FP32 reference side by side, layer by layer.

The compiler records in `image.meta["probes"]` (one list per card, in program order) where each intermediate value
of the model sits in the activation buffer (ABUF) right after a given instruction of that card:

    {"name": "L3.ln1", "pc": 812, "addr": 4096, "rows": "run" | "last", "stride": 768, "width": 768,
     "segments": [[ref_start, ref_stop, col_offset, scale], ...]}

ABUF columns [col_offset, col_offset + ref_stop - ref_start) of each row hold reference columns [ref_start, ref_stop)
times `scale`. `check_layers` runs a prompt (in runs of max_rows tokens, as `Appliance.prefill` does) and then
teacher-forced decode steps on the reference's greedy tokens, snapshots every probe of every card in every run
through `Device.run_watched` (the optional hook of the device interface), computes the same intermediates with
forward hooks on the transformers model in FP32 over the whole sequence, and compares them row for row: relative
RMS error ||a - r|| / ||r|| (float64), the largest absolute error and where it is. The first probe (run, then
program order, then card) whose error leaves its bound is the first failure; it names the card, the pc and the
instruction that wrote the value, and the instruction that last wrote its worst element (followed through
ALLGATHERs to the card that computed it), found by exact block arithmetic over the program resolved for the run.
The tokens (the argmax of the appliance's logits after the prompt and after each step) are judged against the
reference's by the tie rule (generation.compare_tokens): another token is a near tie, not a failure, where the
reference's own margin between the two tokens is within the step's measured logits error.

A device without run_watched (the RTL simulation, the boards) is checked by layer dispatch instead
(host/runtime/layers.py, Device.load_programs): every run is dispatched one layer at a time and the residual stream
read back after the embedding and after each layer; with the logits read from the host buffers, those probes
("embed", "L<n>.res2", "logits") are compared as above, the other kinds are reported as not compared.

Bounds (relative RMS error against FP32; `BOUNDS`, one per sub-block kind). The appliance stores every activation
in FP16 (unit roundoff 2^-11 = 4.9e-4: one rounding gives a relative RMS error of about 2.8e-4) and accumulates in
FP32, so a healthy program's values are a few e-4 to a few e-3 from FP32, growing slowly with depth. Largest errors
measured (any run, card, layer; prompt runs and single-token decode runs) with the u280 preset unless noted:

    case                                        embed   LN, QKV, residual   attn     proj, fc2   fc       logits
    bundled model (5 x 192), 10 prompts x 8     2.5e-4  1.4e-3              2.9e-3   4.2e-3      2.6e-3   1.9e-3
    synthetic 2 x 768/12, 1024/16, 1600/25      3.3e-4  1.4e-3              1.1e-3   1.5e-3      1.4e-3   1.4e-3
    synthetic 2 x 320/5, sim-small preset       3.3e-4  1.1e-3              9.4e-4   1.4e-3      1.3e-3   1.3e-3
    synthetic GPT-2 124M (12 x 768)             3.2e-4  1.7e-3              1.5e-3   1.9e-3      1.8e-3   1.7e-3
    synthetic 24 x 1024/16 (GPT-2 345M's shape) 3.2e-4  2.1e-3              1.7e-3   2.3e-3      2.2e-3   2.1e-3
    synthetic 48 x 256/4 (GPT-2 1.5B's depth)   3.2e-4  2.7e-3              2.1e-3   2.7e-3      2.7e-3   2.9e-3

The bounds are 3 to 5 times the largest of these: 1e-3 for the embedding (one rounding of each addend and of the
sum: it does not grow), 2e-2 for the two projections back into the residual stream (attn.c_proj and mlp.c_proj
outputs: their dot products cancel, most in the trained model), 1e-2 for everything else, the logits' bound
being the appliance's end-to-end accuracy bound LOGITS_BOUND (host/runtime/generation.py). Trained models deeper
than the bundled one were not measured (no real GPT-2 weights here): a large checkpoint may come closer to the
bounds. The faults the check is for give 1e-1 to 1e0 (a corrupted weight piece, a wrong address, a skipped
instruction, the real-width compiler bug this tool was written after: logits 0.4 off).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ringgpt.host.errors import RingGPTError
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.generate import generate as reference_generate
from ringgpt.host.reference.generate import validate_prompt
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime.appliance import Appliance
from ringgpt.host.runtime.generation import LOGITS_BOUND, TokenVerdict, compare_tokens, relative_rms
from ringgpt.host.runtime.layers import LayerDispatchError, layer_image, layer_programs, run_layers
from ringgpt.hw.isa import Instruction, Opcode, Space, decode
from ringgpt.hw.resolved import Resolved, access_blocks, resolve_run, with_gather_slices

SUB_BLOCKS = {
    # kind: (what it is, bound on the relative RMS error against FP32)
    "embed": ("embedding: wte[ids] + wpe[pos]", 1e-3),
    "ln1": ("LayerNorm 1 output", 1e-2),
    "qkv": ("[K | V | Q] = ln1 @ W_attn + b", 1e-2),
    "attn": ("attention heads, merged (input of attn.c_proj)", 1e-2),
    "proj": ("attention projection (attn.c_proj output)", 2e-2),
    "res1": ("hidden state after the attention residual", 1e-2),
    "ln2": ("LayerNorm 2 output", 1e-2),
    "fc": ("MLP hidden: GELU(ln2 @ W_fc + b)", 1e-2),
    "fc2": ("MLP output (mlp.c_proj output)", 2e-2),
    "res2": ("block output (after the MLP residual)", 1e-2),
    "ln_f": ("final LayerNorm output, last token", 1e-2),
    "logits": ("LM head: logits of the last token (the card's vocabulary slice)", LOGITS_BOUND),
}
"""Every sub-block kind a probe names, in program order within a layer, with its bound."""
BOUNDS = {kind: bound for kind, (_, bound) in SUB_BLOCKS.items()}
LAYER_KINDS = ("ln1", "qkv", "attn", "proj", "res1", "ln2", "fc", "fc2", "res2")
_NAME = re.compile(r"^L(\d+)\.(\w+)$")


class CheckError(RingGPTError):
    """An image or request that the layer-by-layer check cannot use (bad input: the CLI exits 2)."""


def probe_kind(name: str) -> str:
    """"L3.ln1" -> "ln1"; "embed", "ln_f", "logits" stay."""
    match = _NAME.match(name)
    return match.group(2) if match else name


def layer_of(name: str) -> str:
    """"L3.ln1" -> "L3"; "embed", "ln_f", "logits" stay."""
    match = _NAME.match(name)
    return name.split(".")[0] if match else name


def probe_rank(name: str) -> tuple:
    """The probe's place in the model's order (embed, L0.ln1 ... L0.res2, L1.ln1 ..., ln_f, logits)."""
    match = _NAME.match(name)
    if match:
        kind = match.group(2)
        return (1, int(match.group(1)), LAYER_KINDS.index(kind) if kind in LAYER_KINDS else len(LAYER_KINDS))
    return {"embed": (0, 0, 0), "ln_f": (2, 0, 0), "logits": (3, 0, 0)}.get(name, (4, 0, 0))


# --- results ---------------------------------------------------------------------------------------------------
@dataclass
class Writer:
    """An instruction of a card's program."""
    card: int
    pc: int
    text: str

    def __str__(self) -> str:
        return f"card {self.card} pc {self.pc}: {self.text}"


@dataclass
class ProbeResult:
    """One probe of one card in one run against the reference."""
    run: int
    pos: int
    rows: int
    name: str
    card: int
    pc: int
    instruction: str
    """The disassembled instruction at pc: the last writer of the whole value."""
    rel_rms: float
    max_abs: float
    worst_row: int
    """Row of the worst element within the run (0 = the token at pos; probes of the last token: rows - 1)."""
    worst_col: int
    """Reference column of the worst element."""
    worst_value: float
    worst_reference: float
    worst_addr: int
    """ABUF word address of the worst element on this card."""
    bound: float
    writer: Writer | None = None
    """The instruction that last wrote the worst element (set for failures), followed through ALLGATHERs."""

    @property
    def kind(self) -> str:
        return probe_kind(self.name)

    @property
    def passed(self) -> bool:
        return self.rel_rms <= self.bound

    @property
    def where(self) -> str:
        return f"card {self.card} pc {self.pc}: {self.instruction}"

    def describe(self) -> str:
        text = (f"{self.name} ({SUB_BLOCKS.get(self.kind, ('?',))[0]}) in run {self.run} (pos {self.pos}, "
                f"{self.rows} rows): relative RMS error {self.rel_rms:.2e} > bound {self.bound:.0e}, max abs error "
                f"{self.max_abs:.3g} at row {self.worst_row} column {self.worst_col} ({self.worst_value:.5g} for "
                f"{self.worst_reference:.5g}); written by {self.where}")
        if self.writer is not None and (self.writer.card, self.writer.pc) != (self.card, self.pc):
            text += f"; that element last written by {self.writer}"
        return text


@dataclass
class CheckReport:
    """What check_layers found. `results` are in check order: run, then the model's order, then card."""
    runs: list
    """(pos, rows) of every run: the prompt runs, then one per decode step."""
    prompt_runs: int
    results: list
    tokens: list
    """The appliance's greedy token after the prompt and after each decode step (argmax of its logits)."""
    reference_tokens: list
    logits_rel_rms: float
    """End to end: the logits read from the host buffers after every run that ends a step, against FP32."""
    token_verdict: TokenVerdict
    """The tokens against the reference's, judged by the tie rule (generation.compare_tokens)."""
    missing: list = field(default_factory=list)
    """Sub-block kinds not compared: the image's probes do not cover them, or layer dispatch does not read them."""
    method: str = "run_watched"
    """How the values were read: "run_watched" (every probe) or "layer dispatch" (embed, L<n>.res2, logits)."""

    @property
    def first_failure(self) -> ProbeResult | None:
        return next((r for r in self.results if not r.passed), None)

    @property
    def logits_passed(self) -> bool:
        return self.logits_rel_rms <= LOGITS_BOUND

    @property
    def passed(self) -> bool:
        return self.first_failure is None and self.token_verdict.passed and self.logits_passed

    def verdict(self) -> str:
        """One line: PASS or FAIL against the stated bounds, tokens and logits, and the first failure."""
        relation = "<=" if self.logits_passed else ">"
        line = (f"PyTorch FP32 reference: {'PASS' if self.passed else 'FAIL'} ({self.token_verdict.phrase()}, "
                f"logits relative RMS error {self.logits_rel_rms:.1e} {relation} {LOGITS_BOUND:.0e} bound; "
                f"{len(self.results)} probe values compared, "
                f"{sum(not r.passed for r in self.results)} out of bound)")
        first = self.first_failure
        if first is not None:
            line += f"\nfirst out of bound: {first.describe()}"
        return line

    def worst(self, name: str, decode: bool | None = None) -> ProbeResult | None:
        """The largest error of probe `name` over cards and runs (decode: only decode runs / only prompt runs)."""
        picked = [r for r in self.results if r.name == name
                  and (decode is None or (r.run >= self.prompt_runs) == decode)]
        return max(picked, key=lambda r: r.rel_rms) if picked else None

    def names(self) -> list:
        return sorted({r.name for r in self.results}, key=probe_rank)


# --- the program, resolved for one run --------------------------------------------------------------------------
def _instructions(program) -> list:
    return [item if isinstance(item, Instruction) else decode(item) for item in program.instructions]


def _abuf_writes(r: Resolved | None) -> list:
    """The ABUF blocks an instruction writes (none for control instructions)."""
    return [] if r is None else [b for b in access_blocks(r)[1] if b.space is Space.ABUF]


def last_writer(programs: list, runs: list, card: int, pc: int, address: int) -> Writer | None:
    """The instruction that last wrote ABUF word `address` of `card` at or before `pc`, followed through ALLGATHERs
    to the card whose block carried the word. `programs`: every card's instructions; `runs`: every card's
    instructions resolved for the run, with ALLGATHER slices (sim.functional.machine.with_gather_slices)."""
    gathered = None
    while True:
        found = next((at for at in range(pc, -1, -1)
                      if any(b.holds(Space.ABUF, address) for b in _abuf_writes(runs[card][at]))), None)
        if found is None:
            return gathered  # the word came in through an ALLGATHER (or was never written this run)
        r = runs[card][found]
        if r.op is not Opcode.ALLGATHER:
            return Writer(card, found, str(programs[card][found]))
        row, col = divmod(address - r.dst[1], r.dst_stride) if r.dst_stride else (0, address - r.dst[1])
        source = next((c for c, (n, k) in enumerate(r.slices) if k <= col < k + n), None)
        if source is None:  # the column lies between this all-gather's slices (the compiler gathers piece by piece)
            pc = found - 1
            continue
        gathered = Writer(card, found, str(programs[card][found]))
        ordinal = sum(1 for x in runs[card][:found] if x is not None and x.op is Opcode.ALLGATHER)
        source_pc = [at for at, x in enumerate(runs[source]) if x is not None and x.op is Opcode.ALLGATHER][ordinal]
        sr = runs[source][source_pc]
        card, pc, address = source, source_pc - 1, sr.src1[1] + row * sr.src1_stride + (col - sr.k)


# --- the reference --------------------------------------------------------------------------------------------
def reference_intermediates(model, ids: Sequence[int]) -> dict:
    """Every probe's reference tensor for the whole sequence `ids` (positions 0 ...) in FP32, as float64 numpy
    arrays of (tokens, columns): forward hooks on the transformers GPT2LMHeadModel."""
    t = model.transformer
    captured: dict = {}
    hooks = []

    def output(name):
        def hook(module, args, out):
            captured[name] = (out[0] if isinstance(out, tuple) else out)[0]
        return hook

    def input_of(name):
        def hook(module, args):
            captured[name] = args[0][0]
        return hook
    for layer, block in enumerate(t.h):
        p = f"L{layer}."
        hooks += [block.ln_1.register_forward_hook(output(p + "ln1")),
                  block.attn.c_attn.register_forward_hook(output(p + "qkv")),
                  block.attn.c_proj.register_forward_pre_hook(input_of(p + "attn")),
                  block.attn.c_proj.register_forward_hook(output(p + "proj")),
                  block.ln_2.register_forward_pre_hook(input_of(p + "res1")),
                  block.ln_2.register_forward_hook(output(p + "ln2")),
                  block.mlp.c_proj.register_forward_pre_hook(input_of(p + "fc")),
                  block.mlp.c_proj.register_forward_hook(output(p + "fc2")),
                  block.register_forward_hook(output(p + "res2"))]
    hooks.append(t.ln_f.register_forward_hook(output("ln_f")))
    try:
        with torch.inference_mode():
            tokens = torch.tensor([list(ids)], device=model.device)
            positions = torch.arange(len(ids), device=model.device)
            captured["embed"] = (t.wte(tokens) + t.wpe(positions)[None])[0]
            captured["logits"] = model(tokens).logits[0]
    finally:
        for hook in hooks:
            hook.remove()
    return {name: value.detach().to("cpu", torch.float64).numpy() for name, value in captured.items()}


# --- the check ------------------------------------------------------------------------------------------------
def _validate_probes(image: ApplianceImage) -> list:
    probes = image.meta.get("probes")
    cards = len(image.cards)
    if not isinstance(probes, list) or len(probes) != cards:
        raise CheckError("the appliance image records no probes (image.meta['probes'], one list per card): it was "
                         "compiled by a compiler without them; recompile it with ringgpt.host.compiler")
    for card, plist in enumerate(probes):
        for probe in plist:
            pc = probe.get("pc")
            if not (isinstance(pc, int) and 0 <= pc < len(image.cards[card].program.instructions)):
                raise CheckError(f"probe {probe.get('name')!r} of card {card} names pc {pc!r} outside the program")
            if probe.get("rows") not in ("run", "last"):
                raise CheckError(f"probe {probe.get('name')!r} of card {card}: rows must be 'run' or 'last'")
    return probes


def _compare(probe: dict, values: np.ndarray, reference: np.ndarray) -> tuple:
    """(rel_rms, max_abs, (row, ref col, abuf col), value, ref) of one probe's ABUF rows against reference rows."""
    ours, theirs, where = [], [], []
    for ref_start, ref_stop, offset, scale in probe["segments"]:
        count = ref_stop - ref_start
        if count <= 0:
            continue
        ours.append(values[:, offset:offset + count].astype(np.float64) / scale)
        theirs.append(reference[:, ref_start:ref_stop])
        where.append((ref_start, offset, count))
    if not ours:
        return None
    a, r = np.concatenate(ours, axis=1), np.concatenate(theirs, axis=1)
    diff = np.abs(a - r)
    bad = ~np.isfinite(diff)
    if bad.any():
        flat = int(np.argmax(bad))
        rel, max_abs = math.inf, math.inf
    else:
        flat = int(np.argmax(diff))
        norm = float(np.sqrt(np.sum(r * r)))
        err = float(np.sqrt(np.sum(diff * diff)))
        rel = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
        max_abs = float(diff.flat[flat])
    row, col = divmod(flat, a.shape[1])
    for ref_start, offset, count in where:
        if col < count:
            ref_col, abuf_col = ref_start + col, offset + col
            break
        col -= count
    return rel, max_abs, (row, ref_col, abuf_col), float(a.flat[flat]), float(r.flat[flat])


def _watched_run(device, probes: list, pos: int, rows: int) -> dict:
    """One run through Device.run_watched: {(card, probe index): (rows, width) values} of every probe."""
    snapshots: dict = {}
    watch: dict = {}
    for card, plist in enumerate(probes):
        for index, probe in enumerate(plist):
            watch.setdefault((card, probe["pc"]), []).append(index)

    def callback(card, pc, read):
        for index in watch[(card, pc)]:
            probe = probes[card][index]
            count = rows if probe["rows"] == "run" else 1
            width, stride = int(probe["width"]), int(probe["stride"])
            words = read(Space.ABUF, int(probe["addr"]), (count - 1) * stride + width if count else 0)
            snapshots[(card, index)] = np.lib.stride_tricks.as_strided(
                words, (count, width), (stride * words.itemsize, words.itemsize)).copy()
    device.run_watched(pos, rows, {key: callback for key in watch})
    return snapshots


def _dispatched_run(device, image: ApplianceImage, appliance: Appliance, logits_probes: dict, pos: int,
                    rows: int) -> dict:
    """One run by layer dispatch: the values at the layer cuts, and the logits read from the host buffers."""
    snapshots = {(state.card, state.probe): state.values for state in run_layers(device, image, pos, rows)}
    for entry, (part, _) in zip(image.meta["host"]["logits"], appliance.read_back()):
        if int(entry["card"]) in logits_probes:
            snapshots[(int(entry["card"]), logits_probes[int(entry["card"])])] = part[None]
    return snapshots


def check_layers(model, image: ApplianceImage, device, prompt_ids: Sequence[int], decode_steps: int = 4,
                 bounds: dict | None = None) -> CheckReport:
    """Runs `prompt_ids` (in runs of max_rows tokens) and then `decode_steps` teacher-forced decode runs (the
    reference's greedy tokens) on `device` with `image`, snapshots every probe of every card after its
    instruction (Device.run_watched; on a device without it, the probes at the layer cuts by layer dispatch), and
    compares each with the FP32 reference (`model`, a transformers GPT2LMHeadModel in FP32). `bounds` overrides
    entries of BOUNDS (by sub-block kind)."""
    bounds = {**BOUNDS, **(bounds or {})}
    probes = _validate_probes(image)
    watching = getattr(device, "supports_watch", False)
    logits_probes: dict = {}
    if watching:
        observed = {(card, index) for card, plist in enumerate(probes) for index in range(len(plist))}
    elif getattr(device, "supports_load_programs", False):
        try:
            image = layer_image(image)
            observed = {(card, index) for segment in layer_programs(image) for card, index in enumerate(segment.probes)}
        except LayerDispatchError as exc:
            raise CheckError(str(exc)) from None
        logits_probes = {card: index for card, plist in enumerate(probes) for index, probe in enumerate(plist)
                         if probe["name"] == "logits"}
        observed |= set(logits_probes.items())
    else:
        raise CheckError(f"{type(device).__name__} has no run_watched and no load_programs: the layer-by-layer check "
                         "needs a device that can stop after an instruction (the functional simulator) or run a "
                         "layer at a time (Device.load_programs)")
    prompt_ids = [int(t) for t in prompt_ids]
    appliance = Appliance(device, image)
    sampling = SamplingConfig(max_new_tokens=decode_steps + 1, stop_at_eos=False)
    validate_prompt(prompt_ids, sampling, vocab_size=appliance.vocab_size, context=appliance.max_context,
                    context_name="the appliance's context", hint=" (or compile with a larger max_context)")
    reference_tokens = reference_generate(model, prompt_ids, sampling, return_logits=False).generated_ids
    sequence = prompt_ids + reference_tokens[:decode_steps]
    ref = reference_intermediates(model, sequence)
    missing = [kind for kind in BOUNDS if not any(probe_kind(probes[card][index]["name"]) == kind
                                                  for card, index in observed)]

    runs = [(start, min(appliance.max_rows, len(prompt_ids) - start))
            for start in range(0, len(prompt_ids), appliance.max_rows)]
    prompt_runs = len(runs)
    runs += [(len(prompt_ids) + step, 1) for step in range(decode_steps)]
    ids_offset = int(image.meta["host"]["ids_offset"])
    cards = len(image.cards)
    results, logits, tokens = [], [], []
    for run, (pos, rows) in enumerate(runs):
        for card in range(cards):
            device.write_host(card, ids_offset, np.asarray(sequence[pos:pos + rows], np.uint16))
        snapshots = _watched_run(device, probes, pos, rows) if watching else _dispatched_run(
            device, image, appliance, logits_probes, pos, rows)
        if run >= prompt_runs - 1:
            row = appliance.logits()
            logits.append(row)
            tokens.append(int(np.argmax(row)))
        programs = None
        run_results = []
        for card, plist in enumerate(probes):
            for index, probe in enumerate(plist):
                if (card, index) not in observed:
                    continue
                first_row = pos if probe["rows"] == "run" else pos + rows - 1
                count = rows if probe["rows"] == "run" else 1
                compared = _compare(probe, snapshots[(card, index)], ref[probe["name"]][first_row:first_row + count])
                if compared is None:
                    continue
                rel, max_abs, (row, ref_col, abuf_col), value, reference = compared
                if probe["rows"] == "last":
                    row = rows - 1
                inst = image.cards[card].program.instructions[probe["pc"]]
                result = ProbeResult(run, pos, rows, probe["name"], card, probe["pc"],
                                     str(inst if isinstance(inst, Instruction) else decode(inst)), rel, max_abs,
                                     row, ref_col, value, reference,
                                     int(probe["addr"]) + (row if probe["rows"] == "run" else 0) * int(probe["stride"])
                                     + abuf_col, bounds.get(probe_kind(probe["name"]), LOGITS_BOUND))
                if not result.passed:
                    if programs is None:
                        programs = [_instructions(c.program) for c in image.cards]
                        resolved = with_gather_slices([resolve_run(code, i, pos, rows)
                                                       for i, code in enumerate(programs)])
                    result.writer = last_writer(programs, resolved, card, probe["pc"], result.worst_addr)
                run_results.append(result)
        run_results.sort(key=lambda r: (probe_rank(r.name), r.card))
        results += run_results
    reference_logits = ref["logits"][len(prompt_ids) - 1:len(prompt_ids) + decode_steps]
    reference_tokens = list(reference_tokens[:decode_steps + 1])
    return CheckReport(runs, prompt_runs, results, tokens, reference_tokens,
                       relative_rms(np.stack(logits), reference_logits),
                       compare_tokens(tokens, reference_tokens, logits, reference_logits), missing,
                       "run_watched" if watching else "layer dispatch")

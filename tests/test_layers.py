"""Layer dispatch (host/runtime/layers.py, Device.load_programs): a run cut after the embedding and after every layer,
the segments run one after the other, is the whole run bit for bit (every memory, the logits), and the hidden states
read back are the probes' values; the register prelude restores the registers; bad programs and cuts whose
collectives would not meet are refused; `check_layers` compares by layer dispatch on a device without run_watched;
on the RTL, run_layers gives the functional simulator's hidden states and logits."""
import numpy as np
import pytest
from click.testing import CliRunner
from test_reference_support import TINY

from ringgpt.host import check, check_report, cli, device
from ringgpt.host.compiler import compile_model
from ringgpt.host.device import (AddressFault, CollectiveMismatchError, Device, IllegalInstructionFault, NotLoadedError,
                                 ProgramsUnsupportedError)
from ringgpt.host.image import ImageError
from ringgpt.host.reference.models import load_model
from ringgpt.host.runtime import Appliance
from ringgpt.host.runtime.layers import (LayerDispatchError, cut_names, layer_image, layer_programs, prelude_pcs,
                                         run_layers)
from ringgpt.hw.config import get_config
from ringgpt.hw.core.datapath import small_config
from ringgpt.hw.isa import Dim, Opcode, Space
from ringgpt.sim.cocotb_support.pytest_plugin import SLOW_ON_ICARUS
from ringgpt.sim.functional import SimulatorDevice

CASES = {  # name: (model spec, cards)
    "1 card": ("synthetic:n_layer=2,n_embd=32,n_head=2,vocab_size=64", 1),
    "2 cards, 3 heads": ("synthetic:n_layer=2,n_embd=48,n_head=3,vocab_size=64", 2),
}
PROMPT = [5, 17, 3, 60, 22]
RUNS = [(0, PROMPT), (5, [9]), (6, [41])]
"""(pos, ids) of a prompt run and two decode runs."""


def config_of(cards: int):
    return small_config("sim-small", abuf_words=4096, wbuf_words=2048).with_cards(cards)


def build(case: str, n_layer: int | None = None):
    spec, cards = CASES[case]
    if n_layer is not None:
        spec = spec.replace("n_layer=2", f"n_layer={n_layer}")
    model = load_model(spec, seed=7)
    return model, compile_model(model, config_of(cards), max_context=16)


def write_ids(device, cards: int, ids) -> None:
    for card in range(cards):
        device.write_host(card, 0, np.asarray(ids, np.uint16))


def cut_values(device, image, pos: int, rows: int) -> dict:
    """A whole run through run_watched: {(name, card): the cut probe's rows} at the probes' pcs."""
    names = set(cut_names(image))
    values, watch = {}, {}
    for card, probes in enumerate(image.meta["probes"]):
        for probe in probes:
            if probe["name"] in names:
                watch[(card, probe["pc"])] = probe

    def callback(card, pc, read):
        probe = watch[(card, pc)]
        words = read(Space.ABUF, probe["addr"], (rows - 1) * probe["stride"] + probe["width"])
        values[(probe["name"], card)] = np.stack([words[r * probe["stride"]:r * probe["stride"] + probe["width"]]
                                                  for r in range(rows)])
    device.run_watched(pos, rows, {key: callback for key in watch})
    return values


@pytest.mark.parametrize("case", CASES)
def test_segments_in_order_are_the_whole_program_and_read_back_the_probes(case):
    _, plain = build(case)
    image = layer_image(plain)
    cards = image.config.cards
    whole, layered = SimulatorDevice(image.config), SimulatorDevice(image.config)
    whole_app, layered_app = Appliance(whole, image), Appliance(layered, image)
    segments = layer_programs(image)
    assert [s.name for s in segments] == ["embed", "L0.res2", "L1.res2", "head"]
    for pos, ids in RUNS:
        write_ids(whole, cards, ids)
        expected = cut_values(whole, image, pos, len(ids))
        write_ids(layered, cards, ids)
        states = run_layers(layered, image, pos, len(ids))
        assert [(s.name, s.card) for s in states] == [(n, c) for n in cut_names(image) for c in range(cards)]
        for state in states:
            assert state.values.shape == (len(ids), image.meta["model"]["n_embd"])
            expected_values = expected[(state.name, state.card)]
            np.testing.assert_array_equal(state.values.view(np.uint16), expected_values.view(np.uint16))
        np.testing.assert_array_equal(layered_app.logits(), whole_app.logits())
        for card in range(cards):
            for space in (Space.ABUF, Space.WBUF, Space.HBM):
                np.testing.assert_array_equal(layered.memory(card, space).view(np.uint16),
                                              whole.memory(card, space).view(np.uint16))
            used = plain.cards[card].host_words  # beyond it: the hidden-state area
            np.testing.assert_array_equal(layered.memory(card, Space.HOST)[:used].view(np.uint16),
                                          whole.memory(card, Space.HOST)[:used].view(np.uint16))
    # the whole programs are back: a plain run of the dispatched device gives the same as the whole device's
    for device in (whole, layered):
        write_ids(device, cards, [12])
        device.run(7, 1)
    np.testing.assert_array_equal(layered_app.logits(), whole_app.logits())


def test_layer_image_grows_the_host_buffers_past_what_the_runtime_uses():
    _, plain = build("2 cards, 3 heads")
    image = layer_image(plain)
    assert layer_image(image) is image
    for card, entry in enumerate(image.meta["host"]["hidden"]):
        assert entry["card"] == card and entry["offset"] >= plain.cards[card].host_words
        assert entry["offset"] % (image.config.hbm_port_bits // 16) == 0
        assert entry["words"] == image.meta["max_rows"] * image.meta["model"]["n_embd"]
        assert image.cards[card].host_words == entry["offset"] + entry["words"]
        assert image.cards[card].program is plain.cards[card].program
    with pytest.raises(LayerDispatchError, match="no hidden-state area"):
        layer_programs(plain)


def test_register_prelude_gives_the_registers_of_the_whole_program_at_the_segment_start():
    _, image = build("2 cards, 3 heads")
    image = layer_image(image)
    device = SimulatorDevice(image.config)
    device.load(image)
    pos, rows = 6, 3
    segments = layer_programs(image)
    starts = {(card, segment.spans[card][0]) for segment in segments[1:] for card in range(image.config.cards)}
    seen = {}

    def registers(card, pc, read):
        seen[(card, pc)] = list(device.cards[card].regs)
    device.run_watched(pos, rows, {(card, start - 1): registers for card, start in starts})
    whole = {(card, pc + 1): regs for (card, pc), regs in seen.items()}
    for segment in segments[1:]:
        device.load_programs(segment.programs)
        preludes = [[image.cards[card].program.instructions[at] for at in prelude_pcs(
            image.cards[card].program.instructions, start)] for card, (start, _) in enumerate(segment.spans)]
        assert all(preludes) and all(inst.opcode in (Opcode.SETI, Opcode.ADDI, Opcode.MULI, Opcode.ADD)
                                     for prelude in preludes for inst in prelude)
        seen.clear()
        device.run_watched(pos, rows, {(card, len(prelude) - 1): registers for card, prelude in enumerate(preludes)})
        for card, prelude in enumerate(preludes):
            assert seen[(card, len(prelude) - 1)] == whole[(card, segment.spans[card][0])]


def test_load_programs_checks_the_programs_and_needs_a_loaded_image():
    _, image = build("2 cards, 3 heads", n_layer=1)
    device = SimulatorDevice(image.config)
    programs = [card.program for card in image.cards]
    with pytest.raises(NotLoadedError, match="load"):
        device.load_programs(programs)
    device.load(image)
    with pytest.raises(ImageError, match="got 1 programs but config .* has 2 cards"):
        device.load_programs(programs[:1])
    with pytest.raises(ImageError, match="card 1's program is a list"):
        device.load_programs([programs[0], list(programs[1].instructions)])
    with pytest.raises(ImageError, match="card 0's slot holds the program built for card 1"):
        device.load_programs(programs[::-1])
    broken = programs[1].__class__(programs[1].instructions[:5] + [1 << 511], programs[1].config_name,
                                   programs[1].config_hash, 1, 2)
    with pytest.raises(IllegalInstructionFault, match="card 1 pc 5"):
        device.load_programs([programs[0], broken])
    endless = programs[1].__class__(programs[1].instructions[:-1], programs[1].config_name,
                                    programs[1].config_hash, 1, 2)
    with pytest.raises(IllegalInstructionFault, match="no HALT"):
        device.load_programs([programs[0], endless])

    class Plain(Device):
        config = get_config("u280", 1)
        load = write_host = read_host = run = status = None
    assert not Plain.supports_load_programs and SimulatorDevice.supports_load_programs
    with pytest.raises(ProgramsUnsupportedError, match="cannot load programs"):
        Plain().load_programs(programs)


def test_cuts_whose_collectives_would_not_meet_are_refused():
    """Card 1's layer-0 cut moved before its last ALLGATHER of the layer: card 0's segment reaches one more."""
    _, image = build("2 cards, 3 heads", n_layer=1)
    program = image.cards[1].program.instructions
    probe = next(p for p in image.meta["probes"][1] if p["name"] == "L0.res2")
    probe["pc"] = max(pc for pc in range(probe["pc"]) if program[pc].opcode is Opcode.ALLGATHER) - 1
    with pytest.raises(LayerDispatchError, match=r"segment L0.res2 .*: the cards reach \[\d+, \d+\] ALLGATHERs"):
        layer_programs(layer_image(image))
    del image.meta["probes"]
    with pytest.raises(LayerDispatchError, match="records no probes"):
        layer_image(image)


def test_a_fault_in_a_segment_names_the_whole_programs_pc():
    """Card 1's layer-1 residual VADD writing past ABUF, then one of its layer-1 ALLGATHERs with other rows: the
    errors name the pcs of the whole programs and the segment; the whole programs are loaded again."""
    _, plain = build("2 cards, 3 heads")
    program = plain.cards[1].program.instructions
    vadd_pc = next(p for p in plain.meta["probes"][1] if p["name"] == "L1.res2")["pc"]
    gather_pc = max(pc for pc in range(vadd_pc) if program[pc].opcode is Opcode.ALLGATHER)
    good = list(program)
    for patch, error in ((vadd_pc, AddressFault), (gather_pc, CollectiveMismatchError)):
        program[:] = good
        inst = program[patch]
        program[patch] = (inst._replace(dst=inst.dst._replace(offset=plain.config.abuf_words - 8))
                          if error is AddressFault else inst._replace(rows=Dim(0, 1)))
        image = layer_image(plain)
        device = SimulatorDevice(image.config)
        Appliance(device, image)
        write_ids(device, 2, PROMPT)
        with pytest.raises(error, match="in the segment that ends with L1.res2") as caught:
            run_layers(device, image, 0, len(PROMPT))
        if error is AddressFault:
            assert (caught.value.card, caught.value.pc) == (1, vadd_pc)
        else:
            assert caught.value.cards[1][:2] == (1, gather_pc)
            theirs = plain.cards[0].program.instructions
            cut = next(p for p in plain.meta["probes"][0] if p["name"] == "L1.res2")["pc"]
            last_gather = max(pc for pc in range(cut) if theirs[pc].opcode is Opcode.ALLGATHER)
            assert caught.value.cards[0][:2] == (0, last_gather)
        assert [len(card.program) for card in device.cards] == [len(card.program.instructions) for card in image.cards]


class NoWatch(SimulatorDevice):
    """The functional simulator as a back end without run_watched (as the RTL and the boards are)."""
    supports_watch = False


def test_check_layers_compares_by_layer_dispatch_where_a_device_cannot_watch():
    model, image = build("2 cards, 3 heads")
    watched = check.check_layers(model, image, SimulatorDevice(image.config), PROMPT, decode_steps=2)
    report = check.check_layers(model, image, NoWatch(image.config), PROMPT, decode_steps=2)
    assert report.passed, report.verdict()
    assert report.method == "layer dispatch" and watched.method == "run_watched"
    assert report.names() == ["embed", "L0.res2", "L1.res2", "logits"]
    assert report.missing == [kind for kind in check.BOUNDS if kind not in ("embed", "res2", "logits")]
    assert report.runs == watched.runs and report.tokens == watched.tokens
    assert report.logits_rel_rms == watched.logits_rel_rms
    same = {(r.run, r.name, r.card): r for r in watched.results}
    assert len(report.results) == len(report.runs) * 2 * 4
    for result in report.results:  # the same values as run_watched's, so the same errors
        twin = same[(result.run, result.name, result.card)]
        assert (result.rel_rms, result.max_abs, result.pc) == (twin.rel_rms, twin.max_abs, twin.pc)
    assert check_report.report_dict(report)["method"] == "layer dispatch"


class FakeRtl(NoWatch):
    """Stands in for RtlDevice in the CLI test: takes its `simulator` option, cannot watch."""

    def __init__(self, config, simulator: str):
        super().__init__(config)
        assert simulator == "icarus"


def test_cli_check_on_a_backend_without_watch_compares_by_layer_dispatch(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(device.BACKENDS, "rtl", f"{__name__}:FakeRtl")
    result = CliRunner().invoke(cli.main, ["check", "--backend", "rtl", "--simulator", "icarus", "--model", TINY,
                                           "--config", "sim-small", "--cards", "2", "--steps", "1",
                                           "--max-context", "32", "Hello world"])
    assert result.exit_code == 0, result.output
    assert "L1.res2" in result.stdout and "logits" in result.stdout and "L1.fc2" not in result.stdout
    assert "not compared (layer dispatch reads the embedding, each layer's output and the logits): ln1" in result.stdout
    assert "PyTorch FP32 reference: PASS (tokens match" in result.stdout
    result = CliRunner().invoke(cli.main, ["check", "--simulator", "icarus", "--model", TINY])
    assert result.exit_code == 2 and "--simulator does nothing with the sim backend" in result.stderr


@pytest.mark.rtl
@pytest.mark.parametrize("sim", SLOW_ON_ICARUS, indirect=True)
def test_run_layers_on_the_rtl_equals_the_functional_simulator(sim):
    """One prompt run of a one-layer model on two cores, dispatched in three segments, AXI memories pausing."""
    from ringgpt.sim.rtl.device import RtlDevice

    _, image = build("2 cards, 3 heads", n_layer=1)
    image = layer_image(image)
    pos, ids = RUNS[0]
    results = []
    for device in (SimulatorDevice(image.config), RtlDevice(image.config, simulator=sim, pause=True)):
        try:
            appliance = Appliance(device, image)
            write_ids(device, image.config.cards, ids)
            states = run_layers(device, image, pos, len(ids))
            results.append(([(s.name, s.card, s.values.view(np.uint16)) for s in states], appliance.logits()))
        finally:
            device.close()
    (golden, golden_logits), (rtl, rtl_logits) = results
    assert [(name, card) for name, card, _ in rtl] == [(name, card) for name, card, _ in golden]
    for (name, card, values), (_, _, expected) in zip(rtl, golden):
        np.testing.assert_array_equal(values, expected, err_msg=f"{name} on card {card}")
    np.testing.assert_array_equal(rtl_logits, golden_logits)

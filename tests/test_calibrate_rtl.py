"""sim/calibration.py (scripts/calibrate_rtl.py's programs): its short programs are legal and run on the cycle model,
each keeping the unit of every instruction it names busy (the RTL side is the script's own run); the u280 section's
rows from a record of the RTL's counters."""
import json

from ringgpt.hw.config import get_config
from ringgpt.hw.isa import OPCODES, Opcode
from ringgpt.host.image import ApplianceImage, CardImage
from ringgpt.hw.assembly import assemble
from ringgpt.hw.program import Program
from ringgpt.sim.calibration import (SHORT, TAIL, U280_HBM_WORDS, U280_TRANSFERS, calibration_config, model_cards,
                                     run_on_model, as_testbench)
from ringgpt.sim.functional import SimulatorDevice
from ringgpt.sim.cocotb_support import runner
from ringgpt.sim.rtl.device import design_of
from ringgpt.sim.rtl_comparison import SimulatorSide


def test_every_short_program_runs_on_the_model():
    for name, lines in SHORT.items():
        config = calibration_config(2 if name.startswith("ALLGATHER") else 1)
        cards = run_on_model(config, lines)
        assert len(cards) == config.cards
        cycles, busy = cards[-1]
        named = {OPCODES[Opcode[line.split()[0]]].unit.name.lower() for line in lines}
        for unit in named & set(busy):
            assert busy[unit] > 0, (name, unit, busy)
        assert cycles > max(busy.values()), name


def test_the_u280_section_puts_the_recorded_rtl_beside_the_model_now(load_script, tmp_path):
    script = load_script("calibrate_rtl")
    spec = "synthetic:n_layer=1,n_embd=64,n_head=1,vocab_size=64"
    config = get_config("u280", 1)
    side = SimulatorSide(config, spec, prompt_tokens=2, decode_runs=1, max_context=16)
    slower = [[[cycles + 10, busy] for cycles, busy in cards] for cards in side.cards]   # the RTL 10 cycles longer
    entry = {"config": config.name, "model": spec, "weights": "fp16", "prompt_tokens": 2, "decode_runs": 1,
             "max_context": 16, "simulator": "verilator", "commit": "abc1234", "bit_identical": True,
             "rtl_cards": slower, "sources_digest": runner.sources_digest(design_of(config).component),
             "image_digest": side.image.digest()}
    record = tmp_path / "rtl_u280.json"
    record.write_text(json.dumps({"runs": [entry, {**entry, "sources_digest": "other"},
                                           {**entry, "image_digest": "other"}, {**entry, "image_digest": None}]}))
    text = "\n".join(script.u280_sections(record))
    for (cycles, _), label in zip((cards[0] for cards in side.cards), ("prompt pos 0, 2 rows", "decode pos 2, 1 rows")):
        assert text.count(f"| {label} | {cycles + 10} | {cycles} | {100 * -10 / (cycles + 10):+.1f} % |") == 1
    assert text.count("on other RTL sources than today's") == 1
    assert text.count("from another compiled image than today's") == 2    # another image's programs, or none kept
    assert "No record" in script.u280_sections(tmp_path / "missing.json")[0]


def test_the_u280_transfers_are_legal_and_keep_the_dma_busy():
    config = as_testbench(get_config("u280", 1))
    for name, line in U280_TRANSFERS.items():
        program = Program(assemble(line + "\n" + TAIL), config.name, config.hash, 0, 1)
        model = SimulatorDevice(config)
        model.load(ApplianceImage(config, [CardImage(program, [], U280_HBM_WORDS, 256)]))
        model.run(0, 1)
        assert model_cards(model)[0][1]["dma"] > 40, name

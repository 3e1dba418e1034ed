"""`ringgpt check` (host/check.py): the compiled programs on the functional simulator against the PyTorch FP32
reference, probe by probe. A healthy image passes with every sub-block of every layer compared on every card; a
corrupted weight piece and a patched instruction are caught at the right sub-block, card and pc."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import GPT2LMHeadModel
from test_reference_support import TINY

from ringgpt.host import check, cli
from ringgpt.host.check import BOUNDS, CheckError, check_layers
from ringgpt.host.compiler import compile_model
from ringgpt.host.device import Device, WatchUnsupportedError
from ringgpt.host.image import ApplianceImage
from ringgpt.host.reference.models import load_model, synthetic_config
from ringgpt.host.runtime import LOGITS_BOUND
from ringgpt.hw.config import get_config
from ringgpt.hw.isa import Opcode
from ringgpt.hw.resolved import resolve_run, with_gather_slices
from ringgpt.sim.functional import SimulatorDevice

VOCAB = 512
SPEC = f"synthetic:n_layer=2,n_embd=128,n_head=2,vocab_size={VOCAB}"
PROMPT = [int(t) for t in np.random.default_rng(5).integers(0, VOCAB, 7)]


@pytest.fixture(scope="module")
def model():
    return load_model(SPEC, seed=2)


def build(model, cards: int) -> tuple:
    config = get_config("u280", cards)
    return compile_model(model, config, max_context=32, max_rows=4), config


def probes_by_name(image, card: int) -> dict:
    return {p["name"]: p for p in image.meta["probes"][card]}


def test_healthy_model_passes_with_every_sub_block_on_every_card(model):
    image, config = build(model, 2)
    report = check_layers(model, image, SimulatorDevice(config), PROMPT, decode_steps=2)
    assert report.passed and report.first_failure is None, report.verdict()
    assert report.runs == [(0, 4), (4, 3), (7, 1), (8, 1)] and report.prompt_runs == 2
    assert report.missing == []
    names = ["embed"] + [f"L{l}.{k}" for l in range(2) for k in check.LAYER_KINDS] + ["ln_f", "logits"]
    assert report.names() == names
    assert len(report.results) == len(report.runs) * 2 * len(names)
    assert report.tokens == report.reference_tokens and len(report.tokens) == 3
    assert 0 < report.logits_rel_rms <= LOGITS_BOUND
    assert all(0 < r.rel_rms < r.bound / 2 for r in report.results)  # the bounds' margin
    assert report.verdict().startswith(f"PyTorch FP32 reference: PASS (tokens match, logits relative RMS error "
                                       f"{report.logits_rel_rms:.1e} <= 1e-02 bound")
    # Q is stored pre-scaled by 1/sqrt(64): the qkv probe's segments undo it.
    assert sorted(s[3] for s in probes_by_name(image, 0)["L0.qkv"]["segments"]) == [0.125, 1.0, 1.0]


def corrupt_hbm(image: ApplianceImage, card: int, address: int, count: int, factor: float) -> None:
    """Multiplies `count` HBM words of a card's image from `address` on by `factor` (a damaged weight piece)."""
    segments = image.cards[card].hbm_segments
    for i, (start, words) in enumerate(segments):
        if start <= address < start + words.size:
            words = np.array(words, np.float16)
            words[address - start:address - start + count] *= np.float16(factor)
            segments[i] = (start, words)
            return
    raise AssertionError(f"no segment holds HBM word {address}")


def test_corrupted_weight_piece_is_caught_at_its_sub_block_and_traced_to_its_card(model):
    """Card 1's last L0.fc2 weight piece, first column, times 8: every card sees L0.fc2 out of bound after the
    ALLGATHER; the first failure is card 0's ALLGATHER and its worst element leads to card 1's MATMUL."""
    image, config = build(model, 2)
    program = image.cards[1].program.instructions
    gather_pc = probes_by_name(image, 1)["L0.fc2"]["pc"]
    assert program[gather_pc].opcode is Opcode.ALLGATHER
    matmul_pc = max(pc for pc in range(gather_pc) if program[pc].opcode is Opcode.MATMUL)
    matmul = program[matmul_pc]
    load = next(program[pc] for pc in range(matmul_pc, -1, -1) if program[pc].opcode is Opcode.LOAD
                and program[pc].dst == matmul.src2)
    corrupt_hbm(image, 1, load.src1.offset, matmul.k.imm, 8.0)
    report = check_layers(model, image, SimulatorDevice(config), PROMPT, decode_steps=1)
    first = report.first_failure
    assert not report.passed and first is not None
    assert (first.name, first.run, first.card) == ("L0.fc2", 0, 0)
    assert first.pc == probes_by_name(image, 0)["L0.fc2"]["pc"] and first.instruction.startswith("ALLGATHER")
    assert (first.writer.card, first.writer.pc) == (1, matmul_pc) and first.writer.text == str(matmul)
    assert first.worst_col == matmul.dst.offset - probes_by_name(image, 1)["L0.fc2"]["addr"]  # the column
    assert first.rel_rms > 10 * BOUNDS["fc2"]
    assert all(r.passed for r in report.results if check.probe_rank(r.name) < check.probe_rank("L0.fc2"))
    verdict = report.verdict()
    assert verdict.startswith("PyTorch FP32 reference: FAIL")
    assert "first out of bound: L0.fc2" in verdict and f"card 1 pc {matmul_pc}: MATMUL" in verdict


def test_last_writer_follows_piecewise_gathers_to_the_card_that_computed_the_column():
    """An ALLGATHER's destination spans every column between its lowest and highest slice; a column in between
    (another weight piece of a card, gathered piece by piece) came from an earlier ALLGATHER: the trace skips this
    one. GPT-2 1.5B's widths on 4 cards: card 1's first MLP column is its own MATMUL's."""
    with torch.device("meta"):
        wide = GPT2LMHeadModel(synthetic_config("n_layer=1,n_embd=1600,n_head=25,vocab_size=2048"))
    image = compile_model(wide, get_config("u280", 4))
    programs = [check._instructions(c.program) for c in image.cards]
    runs = with_gather_slices([resolve_run(code, card, 32, 1) for card, code in enumerate(programs)])
    probe = probes_by_name(image, 0)["L0.fc"]
    f0, _ = image.meta["partition"]["ffn"][1]
    writer = check.last_writer(programs, runs, 0, probe["pc"], probe["addr"] + f0)
    assert writer.card == 1 and writer.text.startswith("MATMUL") and "+gelu" in writer.text


def test_patched_instruction_is_caught_at_its_pc(model):
    """One card; layer 1's QKV MATMUL reads the residual stream instead of the LayerNorm output (a wrong
    address): L1.qkv is the first failure, at that MATMUL, in the first run."""
    image, config = build(model, 1)
    probe = probes_by_name(image, 0)["L1.qkv"]
    program = image.cards[0].program.instructions
    pc = probe["pc"]
    matmul = program[pc]
    assert matmul.opcode is Opcode.MATMUL
    residual = probes_by_name(image, 0)["L1.res2"]  # not yet written this layer: X still holds layer 0's output
    ln1 = probes_by_name(image, 0)["L1.ln1"]
    assert matmul.src1.offset == ln1["addr"]
    program[pc] = matmul._replace(src1=matmul.src1._replace(offset=residual["addr"]))
    report = check_layers(model, image, SimulatorDevice(config), PROMPT, decode_steps=1)
    first = report.first_failure
    assert (first.name, first.run, first.card, first.pc) == ("L1.qkv", 0, 0, pc)
    assert first.writer is not None and first.writer.pc <= pc and first.writer.text.startswith("MATMUL")
    assert "ALLGATHER" not in first.instruction
    assert not report.passed


def test_requires_probes_and_a_watching_device(model):
    image, config = build(model, 1)
    del image.meta["probes"]
    with pytest.raises(CheckError, match="records no probes"):
        check_layers(model, image, SimulatorDevice(config), PROMPT)

    class Plain(Device):
        config = get_config("u280", 1)
        load = write_host = read_host = run = status = None
    image, config = build(model, 1)
    with pytest.raises(CheckError, match="has no run_watched"):
        check_layers(model, image, Plain(), PROMPT)
    with pytest.raises(WatchUnsupportedError, match="cannot watch"):
        Device.run_watched(Plain(), 0, 1, {})


@pytest.fixture
def image_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_cli_check_passes_and_writes_json(image_cache, tmp_path):
    out = tmp_path / "report.json"
    result = CliRunner().invoke(cli.main, ["check", "--model", TINY, "--cards", "2", "--steps", "2",
                                           "--max-context", "64", "--json", str(out), "Hello world"])
    assert result.exit_code == 0, result.output
    assert "L1.res2" in result.stdout and "logits" in result.stdout
    assert "PyTorch FP32 reference: PASS (tokens match" in result.stdout
    data = json.loads(out.read_text())
    assert data["passed"] and data["first_failure"] is None and len(data["results"]) == 3 * 2 * 21


def test_cli_check_exits_3_naming_the_first_failure(image_cache, monkeypatch):
    monkeypatch.setitem(check.BOUNDS, "attn", 1e-7)
    result = CliRunner().invoke(cli.main, ["check", "--model", TINY, "--cards", "1", "--steps", "1",
                                           "--max-context", "64", "--all-runs", "Hello world"])
    assert result.exit_code == cli.EXIT_CHECK_FAILED, result.output
    assert "PyTorch FP32 reference: FAIL" in result.stdout
    assert "first out of bound: L0.attn" in result.stdout and "card 0 pc" in result.stdout
    assert "Traceback" not in result.output


def test_cli_check_bad_input_exits_2(image_cache):
    result = CliRunner().invoke(cli.main, ["check", "--model", "synthetic:gpt2-huge"])
    assert result.exit_code == 2 and "unknown GPT-2 size" in result.stderr

"""`ringgpt generate` through click's CliRunner on a synthetic model: streamed text equals the reference tokens
(reference backend) and the appliance's tokens (sim backend, the default), status lines on stderr, one verdict
against the reference (a failed check exits 3), bad input exits 2 with one line and no traceback."""
import dataclasses
import sys

import pytest
import torch
from click.testing import CliRunner
from test_reference_support import TINY

from ringgpt.host import cli
from ringgpt.host.reference.generate import generate
from ringgpt.host.reference.models import load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.tokenizer import load_tokenizer

RUN = ["generate", "--backend", "reference", "--model", TINY, "--device", "cpu", "--max-new-tokens", "6"]


def invoke(*args):
    return CliRunner().invoke(cli.main, [*RUN, *args])


def expected_text(prompt, cfg):
    tok = load_tokenizer()
    ids = generate(load_model(TINY), tok.encode(prompt), cfg).generated_ids
    return prompt + tok.decode([i for i in ids if i != tok.eos_id]) + "\n"


def test_prints_the_reference_tokens():
    result = invoke("Hello world")
    assert result.exit_code == 0, result.output
    assert result.stdout == expected_text("Hello world", SamplingConfig(max_new_tokens=6))
    assert "time to first token" in result.stderr and "ms/token" in result.stderr


def test_sampling_options_reach_the_sampler():
    result = invoke("Hello world", "--sample", "--temperature", "1.3", "--top-k", "20", "--top-p", "0.9",
                    "--seed", "9")
    cfg = SamplingConfig(greedy=False, temperature=1.3, top_k=20, top_p=0.9, seed=9, max_new_tokens=6)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected_text("Hello world", cfg)


def test_default_prompt():
    result = invoke()
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(cli.DEFAULT_PROMPT)


def test_streams_each_token_as_it_comes(monkeypatch):
    """Each on_token call has written its text to stdout before the backend continues."""
    text = "Hello there, streaming world"
    ids = load_tokenizer().encode(text)
    written = []

    def backend(request, on_token, status):
        for i in ids:
            on_token(i)
            sys.stdout.flush()
            written.append(sys.stdout.buffer.getvalue().decode())
        return ["done"]
    monkeypatch.setitem(cli.BACKENDS, "reference", backend)
    result = invoke("P:")
    assert result.exit_code == 0, result.output
    assert written == ["P:" + load_tokenizer().decode(ids[:n]) for n in range(1, len(ids) + 1)]


@pytest.mark.parametrize("args, phrase", [
    (["--sample", "--top-p", "0"], "top_p=0.0 must be in (0, 1]"),
    (["--top-p", "0.5"], "--top-p does nothing with greedy decoding"),
    (["--sample", "--temperature", "0"], "temperature=0.0 must be a finite number > 0"),
    (["--max-new-tokens", "0"], "max_new_tokens=0 must be an integer >= 1"),
    (["--model", "/nonexistent/ckpt"], "checkpoint directory /nonexistent/ckpt does not exist"),
    (["--model", "synthetic:gpt2-huge"], "unknown GPT-2 size"),
    (["--max-new-tokens", "1020", "a b c d e f"], "exceeds the model's context of 1024"),
    ([""], "the prompt is empty"),
])
def test_bad_input_exits_2_with_one_line(args, phrase):
    result = invoke(*args)
    assert result.exit_code == 2
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and phrase in error_lines[0]
    assert result.stderr.splitlines()[-1] == error_lines[0]
    assert "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_gpu_exits_2():
    result = invoke("--device", "cuda")
    assert result.exit_code == 2 and "no CUDA GPU" in result.stderr


@pytest.fixture
def image_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_sim_backend_is_the_default_and_matches_the_reference(image_cache):
    """The appliance (2 simulated u280 cards) streams the same greedy tokens as the PyTorch reference and
    reports the modeled times and the check."""
    args = ["generate", "--model", TINY, "--max-new-tokens", "5", "--cards", "2", "Hello world"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected_text("Hello world", SamplingConfig(max_new_tokens=5))
    assert "5 tokens on u280-x2" in result.stderr and "tokens/s" in result.stderr
    assert "modeled u280-x2 at 200 MHz: time to first token" in result.stderr and "ms/token" in result.stderr
    assert "modeled u280-x2 at 250 MHz: time to first token" in result.stderr and "per token at 200 MHz" in result.stderr
    assert "PyTorch FP32 reference: PASS (tokens match, logits relative RMS error " in result.stderr
    assert "<= 1e-02 bound, over 5 steps)" in result.stderr
    again = CliRunner().invoke(cli.main, args + ["--no-check-reference"])
    assert again.exit_code == 0 and again.stdout == result.stdout
    assert "image cached" in again.stderr and "PyTorch FP32 reference" not in again.stderr


def test_sim_backend_with_int8_weights_is_checked_against_the_quantised_model(image_cache):
    """--weights int8: the verdict against the same model quantised in PyTorch, the error against the unquantised
    model for the record, and an image of its own in the cache (the FP16 one is not reused)."""
    args = ["generate", "--model", TINY, "--max-new-tokens", "4", "--cards", "2", "--weights", "int8", "Hello world"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert "PyTorch FP32 reference, INT8 weights: PASS (tokens match, logits relative RMS error " in result.stderr
    assert "INT8 weights: logits relative RMS error " in result.stderr and "against the FP32 model" in result.stderr
    assert "image compiled" in result.stderr
    fp16 = CliRunner().invoke(cli.main, [a for a in args if a not in ("--weights", "int8")])
    assert fp16.exit_code == 0 and "image compiled" in fp16.stderr and "INT8" not in fp16.stderr


@pytest.mark.parametrize("args, phrase", [
    (["--config", "v100"], "unknown architecture config 'v100'"),
    (["--cards", "5"], "5 is not in the range 1<=x<=4"),
])
def test_sim_backend_bad_input(args, phrase, image_cache):
    result = CliRunner().invoke(cli.main, ["generate", "--model", TINY, "--max-new-tokens", "2", *args])
    assert result.exit_code == 2 and phrase in result.stderr
    assert "Traceback" not in result.output


def test_sim_backend_exits_3_when_the_reference_check_fails(image_cache, monkeypatch):
    """One verdict against the stated bound: logits beyond it are a FAIL and exit 3, even with matching tokens."""
    from ringgpt.host.runtime import generation
    real = generation.check_against_reference

    def strict(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), bound=1e-9)
    monkeypatch.setattr(generation, "check_against_reference", strict)
    args = ["generate", "--model", TINY, "--max-new-tokens", "3", "--cards", "1", "Hello world"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == cli.EXIT_CHECK_FAILED == 3, result.output
    assert result.stdout == expected_text("Hello world", SamplingConfig(max_new_tokens=3))
    assert "PyTorch FP32 reference: FAIL (tokens match, logits relative RMS error " in result.stderr
    assert "> 1e-09 bound" in result.stderr and "ringgpt check --model" in result.stderr
    assert "Traceback" not in result.output


def test_generate_help_documents_the_exit_status():
    result = CliRunner().invoke(cli.main, ["generate", "--help"])
    assert result.exit_code == 0 and "3 when the appliance's tokens or logits fail" in result.output

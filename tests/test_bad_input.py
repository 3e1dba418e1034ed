"""Bad input, as a new user gives it, on every surface: the `ringgpt` and compiler command lines driven as
subprocesses (exit code, exactly one line on stderr, no traceback, the working folder untouched), image writing
(nothing of the user's is ever deleted, writes are atomic, a killed writer's temporaries are cleaned), the image
cache (a damaged entry is named, moved aside and rebuilt), and property-based fuzzing of decode, assemble,
Program.from_bytes and ApplianceImage.load asserting that only ringgpt's own errors ever escape.

The subprocess cases all fail before a model is loaded (that is what they check), so each takes a few tenths of
a second; the few that compile use a tiny synthetic model."""
import hashlib
import json
import os
import pickle
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from ringgpt.host import cli, errors
from ringgpt.host.cli_support import EXIT_FAULT, EXIT_INTERRUPTED, EXIT_USER_ERROR
from ringgpt.host.device import DeviceError
from ringgpt.host.image import ApplianceImage, CardImage, ImageError, OutputError, clean_stale_temporaries
from ringgpt.hw import isa
from ringgpt.hw import program
from ringgpt.hw import assembly
from ringgpt.hw.config import ConfigError, ConfigMismatchError, get_config
from ringgpt.hw.errors import RingGPTError
from ringgpt.hw.isa import IllegalInstructionError, Opcode
from ringgpt.hw.program import Program

TINY = "synthetic:n_layer=1,n_embd=64,n_head=1"
SHORT = "synthetic:n_layer=1,n_embd=64,n_head=1,n_positions=8"
SMALL_VOCAB = "synthetic:n_layer=1,n_embd=64,n_head=1,vocab_size=100"
BIN = Path(sys.executable).parent


def command(name: str) -> list:
    """The installed console script when there is one, else the module."""
    script = BIN / name
    if name == "ringgpt":
        return [str(script)] if script.exists() else [sys.executable, "-m", "ringgpt.host.cli"]
    return [sys.executable, "-m", "ringgpt.host.compiler"]


def snapshot(folder: Path) -> dict:
    """Every path under `folder` with its content hash (folders as None)."""
    return {str(p.relative_to(folder)): None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if not p.is_symlink()}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working folder holding a user's files and folders (what --out must never destroy)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine\n")
    (work / "data").mkdir()
    (work / "data" / "results.csv").write_text("a,b\n1,2\n")
    (work / "afile").write_text("x")
    (work / "ckpt-bad-json").mkdir()
    (work / "ckpt-bad-json" / "config.json").write_text("{not json")
    (work / "ckpt-bert").mkdir()
    (work / "ckpt-bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (work / "ckpt-zero-heads").mkdir()
    (work / "ckpt-zero-heads" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": 0}))
    (work / "ckpt-empty").mkdir()
    (work / "foreign").mkdir()
    (work / "foreign" / "manifest.json").write_text(json.dumps({"name": "someone else's"}))
    os.symlink(work / "nowhere", work / "broken-link")
    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path / "cache"))
    return work


def run(argv: list, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RINGGPT_DEBUG", None)
    return subprocess.run(argv, cwd=cwd, capture_output=True, timeout=timeout, env=env)


GENERATE_CASES = [  # (arguments after `ringgpt generate`, phrase of the one error line)
    (["--cards", "5"], "5 is not in the range 1<=x<=4"),
    (["--cards", "0"], "0 is not in the range 1<=x<=4"),
    (["--cards", "two"], "'two' is not a valid integer"),
    (["--config", "v100"], "unknown architecture config 'v100'"),
    (["--config", "u280-x9"], "bad card-count suffix in 'u280-x9'"),
    (["--config", "u280-xfour"], "bad card-count suffix"),
    (["--config", "u280-x4", "--cards", "1"], "names 4 card(s) but 1 were asked for"),
    (["--weights", "int8", "--backend", "reference"], "--weights does nothing with --backend reference"),
    (["--weights", "int4"], "'int4' is not one of 'fp16', 'int8'"),
    (["--temperature", "nan"], "--temperature does nothing with greedy decoding"),
    (["--top-k", "5"], "--top-k does nothing with greedy decoding"),
    (["--seed", "3", "--top-p", "0.5"], "--top-p, --seed do nothing with greedy decoding"),
    (["--sample", "--temperature", "nan"], "temperature=nan must be a finite number > 0"),
    (["--sample", "--temperature", "-1"], "temperature=-1.0 must be a finite number > 0"),
    (["--sample", "--top-p", "0"], "top_p=0.0 must be in (0, 1]"),
    (["--sample", "--top-p", "1.5"], "top_p=1.5 must be in (0, 1]"),
    (["--sample", "--top-k", "-1"], "top_k=-1 must be an integer >= 0"),
    (["--sample", "--top-k", "60000", "--model", TINY, "hi"], "top_k=60000 exceeds the vocabulary size 50257"),
    (["--sample", "--seed", "-1"], "seed=-1 must be an integer >= 0"),
    (["--max-new-tokens", "0"], "max_new_tokens=0 must be an integer >= 1"),
    (["--max-new-tokens", "many"], "'many' is not a valid integer"),
    (["--dtype", "fp16"], "--dtype does nothing with the sim backend"),
    (["--device", "cuda"], "--device does nothing with the sim backend"),
    (["--backend", "reference", "--cards", "2"], "--cards does nothing with --backend reference"),
    (["--backend", "reference", "--config", "u280"], "--config does nothing with --backend reference"),
    (["--backend", "reference", "--no-check-reference"], "--check-reference does nothing with --backend reference"),
    (["--backend", "reference", "--device", "gpu"], "'gpu': use cpu, cuda, cuda:N or auto"),
    (["--backend", "tpu"], "'tpu' is not one of"),
    (["--bogus"], "No such option '--bogus'"),
    ([b"abc\xff"], "the prompt is not valid UTF-8 text: byte 0xff at character 3"),
    ([b"\xc3(x"], "the prompt is not valid UTF-8 text: byte 0xc3 at character 0"),
    ([""], "the prompt is empty"),
    (["--model", SHORT, "one two three four five six seven"], "exceeds the appliance's context of 8 positions"),
    (["--backend", "reference", "--model", SHORT, "one two three four five six seven"],
     "exceeds the model's context of 8 positions"),
    (["--model", SMALL_VOCAB, "hello"], "outside the model's vocabulary [0, 100)"),
    (["--model", "/nonexistent/ckpt"], "checkpoint directory /nonexistent/ckpt does not exist"),
    (["--model", "afile"], "afile is a file"),
    (["--model", "ckpt-empty"], "ckpt-empty has no config.json"),
    (["--model", "ckpt-bad-json"], "config.json is not valid JSON"),
    (["--model", "ckpt-bert"], "describes model_type 'bert', not 'gpt2'"),
    (["--model", "ckpt-zero-heads"], "n_head = 0 must be a positive integer"),
    (["--model", "synthetic:gpt2-huge"], "unknown GPT-2 size 'gpt2-huge'"),
    (["--model", "synthetic:n_layer=1"], "lacks n_embd, n_head"),
    (["--model", "synthetic:n_layer=1,n_embd=65,n_head=2"], "n_embd=65 is not a multiple of n_head=2"),
    (["--model", "synthetic:n_layer=1,n_layer=2,n_embd=64,n_head=1"], "n_layer is given twice"),
    (["--model", ""], "--model is empty"),
    (["--model", "synthetic:n_layer=1,n_embd=4096,n_head=1", "--config", "sim-small", "hi"],
     "the weight buffer (524,288 words) cannot hold one head's keys and V^T for max_context=1024"),
]
CHECK_CASES = [
    (["--json", "/nonexistent/dir/report.json"], "the folder /nonexistent/dir does not exist"),
    (["--json", "data"], "'data' is a directory"),
    (["--model", TINY, "--max-context", "5000"], "--max-context 5000 exceeds the model's 1024 positions"),
    (["--steps", "-1"], "-1 is not in the range x>=0"),
    (["--max-rows", "0"], "0 is not in the range x>=1"),
    (["--model", TINY, ""], "the prompt is empty"),
    (["--config", "u280-x2", "--cards", "3"], "names 2 card(s) but 3 were asked for"),
    (["--model", SHORT, "--steps", "6", "one two three"], "exceeds the appliance's context of 8 positions"),
]
TOP_CASES = [
    (["frobnicate"], "No such command 'frobnicate'"),
    (["--bogus"], "No such option '--bogus'"),
]
COMPILER_CASES = [
    (["--out", "."], "--out . is not empty and not a ringgpt image"),
    (["--out", "data"], "--out data is not empty and not a ringgpt image"),
    (["--out", "afile"], "--out afile is a file, not a folder"),
    (["--out", "afile/sub"], "afile is a file, not a folder"),
    (["--out", "afile", "--force"], "--out afile is a file, not a folder"),
    (["--out", "foreign", "--force"], "holds a manifest.json that is not a ringgpt image's"),
    (["--out", "broken-link"], "is a broken symbolic link"),
    (["--out", "new", "--config", "u280-x4", "--cards", "1"], "names 4 card(s) but 1 were asked for"),
    (["--out", "new", "--max-context", "5000"], "5000 exceeds the model's 1024 positions"),
    (["--out", "new", "--max-context", "0"], "0 is not in the range x>=1"),
    (["--out", "new", "--wbuf-slots", "1"], "1 is not in the range x>=2"),
    ([], "Missing option '--out'"),
    (["--out", "new", "--model", "/nonexistent"], "checkpoint directory /nonexistent does not exist"),
    (["--out", "new", "--model", "synthetic:n_layer=1,n_embd=4096,n_head=1", "--config", "sim-small"],
     "cannot hold one head's keys and V^T"),
]


def _check_one_line(result: subprocess.CompletedProcess, phrase: str, code: int = EXIT_USER_ERROR) -> None:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == code, stderr
    assert "Traceback" not in stderr and result.stdout == b"", stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], stderr


def _argv(args: list) -> list:
    return [os.fsencode(a) if isinstance(a, str) else a for a in args]


@pytest.mark.parametrize("args, phrase", [(["generate", *a], p) for a, p in GENERATE_CASES]
                         + [(["check", *a], p) for a, p in CHECK_CASES] + TOP_CASES)
def test_ringgpt_bad_input_is_one_line_and_exit_2(args, phrase, workdir):
    before = snapshot(workdir)
    _check_one_line(run([*map(os.fsencode, command("ringgpt")), *_argv(args)], workdir), phrase)
    assert snapshot(workdir) == before


@pytest.mark.parametrize("args, phrase", COMPILER_CASES)
def test_compiler_bad_input_is_one_line_and_exit_2_and_deletes_nothing(args, phrase, workdir):
    before = snapshot(workdir)
    model = [] if "--model" in args else ["--model", TINY]
    _check_one_line(run([*command("compiler"), *model, "--cards", "1", *args] if "--cards" not in args
                        else [*command("compiler"), *model, *args], workdir), phrase)
    assert snapshot(workdir) == before and not (workdir / "new").exists()


def test_help_imports_nothing_heavy(workdir):
    """--help answers without importing torch, transformers, rich, amaranth or the simulator (what makes it take
    about 0.2 s; no wall-clock bound is asserted: tests do not time)."""
    probe = ("import sys, ringgpt.host.cli, ringgpt.host.compiler.__main__; "
             "print(sorted(m for m in ('torch', 'transformers', 'rich', 'amaranth', 'ringgpt.sim.functional') "
             "if m in sys.modules))")
    assert run([sys.executable, "-c", probe], workdir).stdout.decode().strip() == "[]"
    for argv in ([*command("ringgpt"), "--help"], [*command("ringgpt"), "generate", "--help"],
                 [*command("compiler"), "--help"]):
        result = run(argv, workdir)
        assert result.returncode == 0 and b"Usage:" in result.stdout


def test_ctrl_c_during_start_up_exits_130_without_a_traceback(workdir):
    """SIGINT while generate loads torch and the model, from a terminal (stderr a pseudo-terminal, where generate
    prints its progress note): one line, exit 130."""
    env = {**os.environ, "COLUMNS": "200"}
    terminal, child_side = pty.openpty()
    # SIGINT at its default in the child, as in a terminal: a suite started in the background of a non-interactive
    # shell runs with SIGINT ignored, which Python then keeps (no KeyboardInterrupt at all)
    proc = subprocess.Popen([*command("ringgpt"), "generate", "--model", TINY, "--no-check-reference", "hello"],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=child_side, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(child_side)
    seen = b""
    while b"simulated appliance" not in seen:  # the note, printed after the checks and before the heavy imports
        seen += os.read(terminal, 4096)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    rest = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:     # EIO: the child closed its side
            break
        if not chunk:
            break
        rest += chunk
    os.close(terminal)
    lines = [line for line in re.sub(rb"\x1b\[[0-9;]*m", b"", rest).decode().splitlines() if line.strip()]
    assert proc.returncode == EXIT_INTERRUPTED, rest
    assert b"Traceback" not in rest and lines[-1].strip() == "interrupted", rest


# --- in-process: internal faults, device errors, --debug ---------------------------------------------------------

@pytest.mark.parametrize("raised, code, start", [
    (ZeroDivisionError("division by zero"), EXIT_FAULT, "internal error: ZeroDivisionError: division by zero"),
    (DeviceError("card 1 pc 7 (HALT): stuck"), EXIT_FAULT, "device error: card 1 pc 7 (HALT): stuck"),
    (ConfigMismatchError("built for 'u280-x2'"), EXIT_USER_ERROR, "error: built for 'u280-x2'"),
    (KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted"),
])
def test_faults_are_one_line_with_their_exit_code_and_debug_shows_them(raised, code, start, monkeypatch, workdir):
    def backend(request, on_token, status):
        raise raised
    monkeypatch.setitem(cli.BACKENDS, "reference", backend)
    args = ["generate", "--backend", "reference", "--model", TINY, "hello"]
    result = CliRunner().invoke(cli.main, args)
    lines = result.stderr.splitlines()
    assert result.exit_code == code and len(lines) == 1 and lines[0].startswith(start), result.stderr
    debug = CliRunner().invoke(cli.main, ["--debug", *args])
    assert debug.exception is raised or isinstance(debug.exception, SystemExit) and code == EXIT_INTERRUPTED


def test_every_error_has_the_one_root():
    from ringgpt.host.check import CheckError
    from ringgpt.host.compiler.errors import CapacityError, CompileError
    from ringgpt.host.compiler.verify import PlanError
    from ringgpt.host.device import NotLoadedError, RingDeadlockError, SimulatorError
    from ringgpt.host.runtime.appliance import ApplianceError
    from ringgpt.sim.functional import StepLimitError

    ours = [ConfigError, ConfigMismatchError, IllegalInstructionError, ImageError, OutputError, DeviceError,
            CompileError, CapacityError, PlanError, ApplianceError, CheckError, errors.CheckpointError,
            errors.ModelSpecError, errors.PromptError, errors.SamplingConfigError, errors.TokenizerError,
            errors.GoldenRecordError, errors.DeviceUnavailableError, SimulatorError,
            RingDeadlockError, NotLoadedError, StepLimitError]
    assert all(issubclass(e, RingGPTError) for e in ours)
    assert errors.RingGPTError is RingGPTError
    assert {e.exit_code for e in (DeviceError, SimulatorError, PlanError)} == {EXIT_FAULT}
    assert {e.exit_code for e in ours if not issubclass(e, DeviceError) and e is not PlanError} == {EXIT_USER_ERROR}
    assert issubclass(ConfigError, ValueError) and issubclass(DeviceError, RuntimeError)  # still caught as before


def test_light_copies_of_defaults_agree():
    from ringgpt.host.compiler import DEFAULT_WBUF_SLOTS
    from ringgpt.host.compiler.__main__ import DEFAULT_WBUF_SLOTS as CLI_SLOTS
    from ringgpt.host.reference.models import DTYPES

    assert CLI_SLOTS == DEFAULT_WBUF_SLOTS and sorted(cli.DTYPE_NAMES) == sorted(DTYPES)


def test_a_pickle_that_safe_loading_refuses_is_named_as_such(tmp_path):
    from ringgpt.host.errors import CheckpointError
    from ringgpt.host.reference.models import load_model

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 64,
                                                      "n_head": 1}))

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'executed'}",))
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"w": Payload()}))
    with pytest.raises(CheckpointError) as info:
        load_model(str(tmp_path))
    message = str(info.value)
    assert "safe loading refuses" in message and "never unpickles" in message
    assert "weights_only" not in message and "download" not in message and "corrupt" not in message
    assert not (tmp_path / "executed").exists()


# --- writing images: nothing of the user's is deleted; atomic; stale temporaries cleaned ---------------------------

CFG1 = get_config("sim-small", 1)


def small_image(cards: int = 1, fill: float = 1.0) -> ApplianceImage:
    """A hand-made image with a runtime host layout (no torch needed)."""
    cfg = get_config("sim-small", cards)
    body = assembly.assemble("SETI rd=r3 imm=7\nHALT")
    card_images = [CardImage(Program(body, cfg.name, cfg.hash, c, cards, {}), [(8, np.full(4, fill, np.float16))],
                             64, 16) for c in range(cards)]
    meta = {"max_rows": 4, "max_context": 16, "model": {"vocab_size": 8}, "eos_token_id": 7,
            "host": {"ids_offset": 0, "logits": [{"card": c, "offset": 8, "vocab": [0, 8]} for c in range(cards)]}}
    return ApplianceImage(cfg, card_images, meta)


def test_save_into_new_nested_folder_and_over_an_earlier_image(tmp_path):
    target = tmp_path / "a" / "b" / "image"
    small_image(cards=2).save(target)
    assert sorted(os.listdir(target)) == ["card0.hbm.safetensors", "card0.prog", "card1.hbm.safetensors",
                                          "card1.prog", "manifest.json"]
    small_image(cards=1, fill=2.0).save(target)  # an earlier image is replaced, its extra card's files too
    assert sorted(os.listdir(target)) == ["card0.hbm.safetensors", "card0.prog", "manifest.json"]
    loaded = ApplianceImage.load(target)
    assert loaded.config.cards == 1 and loaded.cards[0].hbm_segments[0][1][0] == 2.0
    assert [p.name for p in tmp_path.rglob(".*")] == []  # no temporaries left


def test_force_writes_only_our_files_into_a_users_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    with pytest.raises(OutputError, match="is not empty and not a ringgpt image"):
        small_image().save(folder)
    assert os.listdir(folder) == ["notes.txt"]
    small_image().save(folder, force=True)
    assert (folder / "notes.txt").read_text() == "keep" and ApplianceImage.load(folder).config.cards == 1
    small_image(fill=3.0).save(folder, force=True)  # again: still only our files change
    assert (folder / "notes.txt").read_text() == "keep"


def test_a_failed_write_leaves_the_earlier_image_and_no_temporaries(tmp_path, monkeypatch):
    target = tmp_path / "image"
    small_image().save(target)
    before = snapshot(target)
    real = ApplianceImage._write_files

    def interrupted(self, directory, name_of=lambda n: n):
        real(self, directory, name_of)  # every file written (as a temporary), then Ctrl-C before any rename
        raise KeyboardInterrupt
    monkeypatch.setattr(ApplianceImage, "_write_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        small_image(fill=5.0).save(target)
    assert snapshot(target) == before and [p.name for p in tmp_path.rglob(".*")] == []


KILLED_WRITER = """
import os, sys, time
from ringgpt.host.image import ApplianceImage
sys.path.insert(0, {tests!r})
from test_bad_input import small_image
real = ApplianceImage._write_files
def slow(self, directory, name_of=lambda n: n):
    def named(n):
        if n == "manifest.json":
            print("writing", flush=True)
            time.sleep(60)
        return name_of(n)
    return real(self, directory, named)
ApplianceImage._write_files = slow
small_image(fill=9.0).save({target!r}, force={force})
"""


@pytest.mark.parametrize("existing", ["image", "users-folder", "none"])
def test_a_killed_writer_leaves_no_half_image_and_its_temporaries_are_cleaned_next_time(existing, tmp_path):
    target = tmp_path / "out"
    if existing == "image":
        small_image().save(target)
    elif existing == "users-folder":
        target.mkdir()
        (target / "notes.txt").write_text("keep")
    before = snapshot(tmp_path)
    script = KILLED_WRITER.format(tests=str(Path(__file__).parent), target=str(target),
                                  force=existing == "users-folder")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"writing\n", proc.stderr.read()
    proc.kill()
    proc.wait()
    leftovers = [p for p in tmp_path.rglob(".*ringgpt-tmp-*")]
    assert leftovers  # the kill left temporaries, and nothing else changed
    assert {k: v for k, v in snapshot(tmp_path).items() if ".ringgpt-tmp-" not in k} == before
    if existing == "image":
        assert ApplianceImage.load(target).cards[0].hbm_segments[0][1][0] == 1.0  # the earlier image, whole
    small_image(fill=4.0).save(target, force=existing == "users-folder")
    assert not [p for p in tmp_path.rglob(".*ringgpt-tmp-*")]
    assert ApplianceImage.load(target).cards[0].hbm_segments[0][1][0] == 4.0
    if existing == "users-folder":
        assert (target / "notes.txt").read_text() == "keep"


def test_only_dead_writers_temporaries_are_cleaned(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".image.ringgpt-tmp-{dead_pid}-00ff00ff"
    stale.mkdir()
    live = tmp_path / f".image.ringgpt-tmp-{os.getpid()}-00ff00ff"
    live.write_text("in progress")
    lookalike = tmp_path / ".image.ringgpt-tmp-notapid-00"
    lookalike.write_text("not ours")
    assert clean_stale_temporaries(tmp_path) == [stale]
    assert live.exists() and lookalike.exists()


# --- the image cache heals ---------------------------------------------------------------------------------------

def _damage(kind: str, entry: Path) -> None:
    manifest = entry / "manifest.json"
    if kind == "manifest-missing-key":
        data = json.loads(manifest.read_text())
        del data["meta"]["host"]
        manifest.write_text(json.dumps(data))
    elif kind == "zero-in-meta":
        data = json.loads(manifest.read_text())
        data["meta"]["max_rows"] = 0
        manifest.write_text(json.dumps(data))
    elif kind == "edited-config":
        data = json.loads(manifest.read_text())
        data["config"]["clock_mhz"] = 1.0
        manifest.write_text(json.dumps(data))
    elif kind == "manifest-not-json":
        manifest.write_text("{")
    elif kind == "truncated-program":
        prog = entry / "card0.prog"
        prog.write_bytes(prog.read_bytes()[:100])
    elif kind == "hbm-missing":
        (entry / "card0.hbm.safetensors").unlink()
    elif kind == "entry-is-a-file":
        import shutil
        shutil.rmtree(entry)
        entry.write_text("junk")


@pytest.fixture(scope="module")
def tiny_model():
    from ringgpt.host.reference.models import load_model
    return load_model(TINY + ",vocab_size=300,n_positions=32")


@pytest.mark.parametrize("kind", ["manifest-missing-key", "zero-in-meta", "edited-config", "manifest-not-json",
                                  "truncated-program", "hbm-missing", "entry-is-a-file"])
def test_a_damaged_cache_entry_is_named_moved_aside_and_rebuilt(kind, tiny_model, tmp_path):
    from ringgpt.host.runtime.images import CacheRepairWarning, cached_image

    config = get_config("u280", 1)
    image, cached = cached_image(tiny_model, config, 32, root=tmp_path)
    entry = next((tmp_path / "images").iterdir())
    _damage(kind, entry)
    with pytest.warns(CacheRepairWarning, match=f"the cached image {re.escape(str(entry))} could not be used .*moved "
                                                f"to {re.escape(str(entry))}.damaged-1; compiling it again"):
        again, cached = cached_image(tiny_model, config, 32, root=tmp_path)
    assert not cached and (entry.parent / f"{entry.name}.damaged-1").exists()
    assert again.meta == image.meta
    third, cached = cached_image(tiny_model, config, 32, root=tmp_path)
    assert cached and third.meta == image.meta


# --- fuzzing: only our own errors escape -------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID_TEXT = assembly.disassemble([
    assembly.parse_instruction("LOAD dst=WBUF[64+r3] src1=HBM[0x100] rows=r2+1 n=8 dst_stride=8 src1_stride=8"),
    assembly.parse_instruction("MATMUL dst=ABUF[0] src1=ABUF[64] src2=WBUF[0] aux=WBUF[9] rows=r2 n=16 k=64 +gelu"),
    assembly.parse_instruction("VADD dst=ABUF[1] src1=ABUF[2] src2=IMM[0x3c00] rows=4 n=r5"),
    assembly.parse_instruction("SETI rd=r3 imm=-5"), assembly.parse_instruction("HALT")])
VALID_WORDS = [i.encode() for i in assembly.assemble(VALID_TEXT)]


def _only_ours(call, *args):
    try:
        return call(*args)
    except RingGPTError:
        return None


@FUZZ
@given(st.one_of(st.integers(0, 2 ** 512 - 1),
                 st.tuples(st.sampled_from(VALID_WORDS), st.lists(st.integers(0, 511), max_size=4)).map(
                     lambda t: t[0] ^ sum(1 << b for b in set(t[1]))),
                 st.integers(-2 ** 600, 2 ** 600), st.none(), st.floats(), st.text(max_size=4)))
def test_fuzz_decode_raises_only_illegal_instruction(word):
    try:
        inst = isa.decode(word)
    except IllegalInstructionError:
        return
    assert isa.decode(inst.encode()) == inst


TOKENS = st.sampled_from([*(o.name for o in Opcode), "dst=ABUF[0]", "src1=HBM[0x10+r2]", "src2=IMM[0x3c00]",
                          "aux=WBUF[3]", "rows=r2+1", "n=8", "k=r4", "pos=r1", "rd=r3", "rs=r1", "rt=r0", "imm=-5",
                          "imm=0x7fffffff", "imm=1e3", "dst_stride=8", "+gelu", "+transpose", "+fast", "rd=r99",
                          "n=", "=", "src1=ABUF[-1]", "dst=HBM[1]", "#", "\n", "rd=r٣", "imm=1_0", "src2=NONE[0]"])


@FUZZ
@given(st.one_of(st.text(max_size=60), st.lists(TOKENS, max_size=12).map(" ".join),
                 st.tuples(st.integers(0, len(VALID_TEXT)), st.text(max_size=6)).map(
                     lambda t: VALID_TEXT[:t[0]] + t[1] + VALID_TEXT[t[0] + len(t[1]):])))
def test_fuzz_assemble_raises_only_illegal_instruction(text):
    program = _only_ours(assembly.assemble, text)
    if program:
        assert assembly.assemble(assembly.disassemble(program)) == program


VALID_PROGRAM = Program(assembly.assemble(VALID_TEXT), "sim-small-x2", "0123456789abcdef", 1, 2, {"k": 1}).to_bytes()
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2 ** 70) | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)
HEADER_KEYS = ("config_name", "config_hash", "card", "cards", "count", "meta")


def _with_header(blob: bytes, change) -> bytes:
    hlen = int.from_bytes(blob[8:12], "little")
    header = json.loads(blob[12:12 + hlen])
    key, value = change
    if value is _DELETE:
        header.pop(key, None)
    else:
        header[key] = value
    text = json.dumps(header).encode()
    return blob[:8] + len(text).to_bytes(4, "little") + text + blob[12 + hlen:]


_DELETE = object()


@FUZZ
@given(st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=40).map(lambda b: program.PROGRAM_MAGIC + b),
    st.integers(0, len(VALID_PROGRAM)).map(lambda n: VALID_PROGRAM[:n]),
    st.tuples(st.integers(0, len(VALID_PROGRAM) - 1), st.integers(1, 255)).map(
        lambda t: VALID_PROGRAM[:t[0]] + bytes([VALID_PROGRAM[t[0]] ^ t[1]]) + VALID_PROGRAM[t[0] + 1:]),
    st.tuples(st.sampled_from(HEADER_KEYS), st.one_of(JSON, st.just(_DELETE))).map(
        lambda c: _with_header(VALID_PROGRAM, c)),
    JSON.map(lambda h: program.PROGRAM_MAGIC + len(json.dumps(h).encode()).to_bytes(4, "little") + json.dumps(h).encode()),
    st.integers(0, 2 ** 32 - 1).map(lambda n: VALID_PROGRAM[:8] + n.to_bytes(4, "little") + VALID_PROGRAM[12:]),
))
def test_fuzz_program_from_bytes_raises_only_illegal_instruction(blob):
    program = _only_ours(Program.from_bytes, blob)
    if program is not None:
        assert Program.from_bytes(program.to_bytes()) == program


@pytest.fixture(scope="module")
def saved_image(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("fuzz-image") / "image"
    small_image(cards=2).save(folder)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


MANIFEST_PATHS = [("format",), ("config",), ("config", "cards"), ("config", "mac_width"), ("config_hash",),
                  ("cards",), ("cards", 0), ("cards", 1, "hbm_words"), ("meta",), ("meta", "max_rows"),
                  ("meta", "model"), ("meta", "host", "logits"), ("meta", "host", "logits", 0, "vocab"),
                  ("meta", "host", "ids_offset"), ("meta", "eos_token_id")]


def _edit(data, path, value):
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@FUZZ
@given(st.one_of(
    st.tuples(st.just("manifest"), st.sampled_from(MANIFEST_PATHS), st.one_of(JSON, st.just(_DELETE))),
    st.tuples(st.sampled_from(["card0.prog", "card1.hbm.safetensors", "manifest.json"]), st.integers(0, 10 ** 6),
              st.integers(0, 255)),
    st.tuples(st.just("remove"), st.sampled_from(["card0.prog", "card1.hbm.safetensors", "manifest.json"])),
))
def test_fuzz_image_load_raises_only_image_error(saved_image, tmp_path_factory, change):
    folder = tmp_path_factory.mktemp("case")
    files = dict(saved_image)
    if change[0] == "manifest":
        files["manifest.json"] = json.dumps(_edit(json.loads(files["manifest.json"]), change[1], change[2])).encode()
    elif change[0] == "remove":
        del files[change[1]]
    else:
        name, at, xor = change
        data = files[name]
        at %= len(data) + 1
        files[name] = data[:at] if xor == 0 else data[:at] + bytes([data[at % len(data)] ^ xor]) + data[at + 1:]
    for name, data in files.items():
        (folder / name).write_bytes(data)
    try:
        image = ApplianceImage.load(folder)
    except ImageError:
        return
    assert image.config.cards == len(image.cards)

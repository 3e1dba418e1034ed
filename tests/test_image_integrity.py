"""Images prove themselves and writing them destroys nothing (issue 35): card files without a manifest of ours are the
user's (never deleted, never overwritten, even with --force); a write killed inside a safetensors file, or stopped
by SIGTERM between its renames, leaves only temporaries of ours and a folder the next write accepts; two writers of
one folder take turns; the cache key covers the model's whole config; flipped bytes, a missing HBM segment, an edited
host layout, an earlier format and FIFOs in a cached image are caught, set aside and rebuilt; an unusable cache root
only costs the cache; a damaged compiled kernel is rebuilt; and fuzzed manifests through the cache's loader raise
only ImageError.

Most cases use a hand-made image (no torch); the cache cases compile a tiny synthetic model (hundredths of a second
each)."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ringgpt.host.image import ApplianceImage, CardImage, ImageError, OutputError, check_output_dir
from ringgpt.hw import assembly
from ringgpt.hw.config import get_config
from ringgpt.hw.program import Program

TESTS = str(Path(__file__).parent)
TINY = "synthetic:n_layer=1,n_embd=64,n_head=1,vocab_size=300,n_positions=32"
OURS = re.compile(r"^(manifest\.json|card\d+\.prog|card\d+\.hbm\.safetensors)$")
OUR_TEMPORARY = re.compile(r"^\..+\.ringgpt-tmp-\d+-[0-9a-f]+$")


def hand_image(cards: int = 1, fill: float = 1.0, words: int = 4) -> ApplianceImage:
    """A hand-made image with two HBM segments per card ([0, 4) and [8, 8 + words)) and a runtime host layout."""
    cfg = get_config("sim-small", cards)
    body = assembly.assemble("SETI rd=r3 imm=7\nHALT")
    card_images = [CardImage(Program(body, cfg.name, cfg.hash, c, cards, {}),
                             [(0, np.full(4, fill, np.float16)), (8, np.full(words, fill, np.float16))],
                             16 + words, 16) for c in range(cards)]
    meta = {"max_rows": 4, "max_context": 16, "model": {"vocab_size": 8}, "eos_token_id": 7, "weights_hash": "w",
            "host": {"ids_offset": 0, "logits": [{"card": c, "offset": 8, "vocab": [0, 8]} for c in range(cards)]}}
    return ApplianceImage(cfg, card_images, meta)


def fill_of(folder: Path) -> float:
    return float(ApplianceImage.load(folder).cards[0].hbm_segments[0][1][0])


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def temporaries(folder: Path) -> list:
    return [p for p in folder.rglob(".*") if OUR_TEMPORARY.match(p.name)]


def compiler(*args: str) -> list:
    return [sys.executable, "-m", "ringgpt.host.compiler", *args]


# --- card files are ours only by a manifest of ours --------------------------------------------------------------

def _users_folder(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "d"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text(f"the user's own {name}\n")
    return folder


@pytest.mark.parametrize("force, users_files, phrase", [
    (False, ["card5.prog", "card6.hbm.safetensors"],
     "--out d is not empty and not a ringgpt image (2 entries no ringgpt manifest lists: card5.prog, "
     "card6.hbm.safetensors)"),
    (True, ["card0.prog"], "--out d: card0.prog is there and no ringgpt manifest lists it, so it is not ours to "
                           "overwrite, even with --force"),
])
def test_the_compiler_refuses_card_files_without_a_manifest_of_ours(force, users_files, phrase, tmp_path):
    folder = _users_folder(tmp_path, *users_files)
    before = snapshot(tmp_path)
    result = subprocess.run(compiler("--model", "synthetic:n_layer=1,n_embd=128,n_head=2", "--out", "d",
                                     *(["--force"] if force else [])),
                            cwd=tmp_path, capture_output=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    lines = result.stderr.decode().splitlines()
    assert (result.returncode, len(lines)) == (2, 1) and phrase in lines[0], result.stderr.decode()
    assert snapshot(tmp_path) == before and folder.exists()


def test_force_writes_beside_the_users_card_files_and_never_removes_them(tmp_path):
    folder = _users_folder(tmp_path, "card5.prog", "card6.hbm.safetensors")
    users = snapshot(folder)
    hand_image(cards=1).save(folder, force=True)
    hand_image(cards=2, fill=2.0).save(folder, force=True)  # an earlier image of ours there now: still only ours
    hand_image(cards=1, fill=3.0).save(folder, force=True)  # card1.* (ours, listed) go; the user's stay
    assert {k: v for k, v in snapshot(folder).items() if k in users} == users
    assert sorted(os.listdir(folder)) == ["card0.hbm.safetensors", "card0.prog", "card5.prog",
                                          "card6.hbm.safetensors", "manifest.json"]
    assert fill_of(folder) == 3.0
    with pytest.raises(OutputError, match="2 entries no ringgpt manifest lists: card5.prog, card6.hbm.safetensors"):
        hand_image().save(folder)
    (folder / "card3.prog").write_text("the user's own card3.prog\n")
    users = snapshot(folder)
    with pytest.raises(OutputError, match="card3.prog is there and no ringgpt manifest lists it, so it is not ours "
                                          "to overwrite, even with --force"):
        hand_image(cards=4).save(folder, force=True)
    assert snapshot(folder) == users


# --- interrupted writes leave only temporaries of ours ------------------------------------------------------------

KILLED_IN_SAFETENSORS = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
from test_image_integrity import hand_image
image = hand_image(fill=9.0, words=1 << 19)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # the kernel kills the writer inside the 1 MiB safetensors file
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
image.save({target!r}, force={force})
"""


@pytest.mark.parametrize("existing", ["image", "users-folder"])
def test_a_writer_killed_inside_a_safetensors_file_leaves_only_temporaries_of_ours(existing, tmp_path):
    target = tmp_path / "out"
    if existing == "image":
        hand_image().save(target)
    else:
        _users_folder(tmp_path, "notes.txt")
        target = tmp_path / "d"
    before = snapshot(tmp_path)
    script = KILLED_IN_SAFETENSORS.format(tests=TESTS, target=str(target), force=existing == "users-folder")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert result.returncode == -signal.SIGXFSZ, result.stderr.decode()
    left = [name for name in os.listdir(target)
            if not (OURS.match(name) or OUR_TEMPORARY.match(name) or name == "notes.txt")]
    assert left == [] and temporaries(tmp_path)  # nothing but ours and our temporaries (safetensors' own: none)
    assert {k: v for k, v in snapshot(tmp_path).items() if not OUR_TEMPORARY.match(Path(k).name)} == before
    hand_image(fill=4.0).save(target, force=existing == "users-folder")
    assert temporaries(tmp_path) == [] and fill_of(target) == 4.0


SIGTERMED_COMPILE = """
import os, sys, time, types
sys.path.insert(0, {tests!r})
from test_image_integrity import hand_image
import ringgpt.host.image as image
# the compile is faked (what is under test is the CLI's write): no torch, no transformers, a hand-made image
sys.modules["torch"] = types.SimpleNamespace(float16="float16")
sys.modules["ringgpt.host.reference.models"] = types.SimpleNamespace(load_model=lambda *args, **kwargs: None)
sys.modules["ringgpt.host.compiler.build"] = types.SimpleNamespace(
    compile_model=lambda *args, **kwargs: hand_image(cards=1, fill=5.0))
real = os.replace
def paused(src, dst):
    real(src, dst)
    if os.path.basename(dst) == "card0.prog":  # after the manifest that lists old and new, before the rest
        print("renaming", flush=True)
        time.sleep(60)
image.os.replace = paused
from ringgpt.host.compiler.__main__ import main
main(["--model", "synthetic:n_layer=1,n_embd=64,n_head=1", "--config", "sim-small", "--cards", "1",
      "--out", {target!r}], prog_name="compiler")
"""


def test_sigterm_between_the_renames_exits_130_and_leaves_a_folder_the_next_write_accepts(tmp_path):
    target = tmp_path / "out"
    hand_image(cards=2).save(target)
    proc = subprocess.Popen([sys.executable, "-c", SIGTERMED_COMPILE.format(tests=TESTS, target=str(target))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"renaming\n", proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stderr) == (130, b"interrupted\n")
    assert temporaries(tmp_path) == []
    assert all(OURS.match(name) for name in os.listdir(target))
    with pytest.raises(ImageError, match="writing was interrupted: compile it again"):
        ApplianceImage.load(target)
    assert check_output_dir(target) == "image"
    hand_image(cards=1, fill=6.0).save(target)
    assert sorted(os.listdir(target)) == ["card0.hbm.safetensors", "card0.prog", "manifest.json"]
    assert fill_of(target) == 6.0


WRITER = """
import sys, time
sys.path.insert(0, {tests!r})
from test_image_integrity import hand_image
from ringgpt.host.image import ApplianceImage
real = ApplianceImage._write_files
def timed(self, directory, name_of=lambda n: n):
    print("start", time.time(), flush=True)
    time.sleep({pause})
    real(self, directory, name_of)
    print("end", time.time(), flush=True)
ApplianceImage._write_files = timed
hand_image(cards=2, fill={fill}).save({target!r})
"""


@pytest.mark.parametrize("existing", ["image", "none"])
def test_two_writers_of_one_folder_take_turns(existing, tmp_path):
    target = tmp_path / "out"
    if existing == "image":
        hand_image().save(target)

    def writer(pause: float, fill: float) -> subprocess.Popen:
        script = WRITER.format(tests=TESTS, pause=pause, fill=fill, target=str(target))
        return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = writer(1.5, 1.0)
    started = first.stdout.readline()
    assert started.startswith(b"start"), first.stderr.read()
    second = writer(0, 2.0)
    outputs = [started + first.communicate(timeout=60)[0], second.communicate(timeout=60)[0]]
    times = [dict(line.split() for line in output.decode().splitlines()) for output in outputs]
    assert (first.returncode, second.returncode) == (0, 0)
    assert float(times[1]["start"]) >= float(times[0]["end"])  # the second wrote only after the first was done
    assert fill_of(target) == 2.0 and ApplianceImage.load(target).config.cards == 2
    assert temporaries(tmp_path) == []


# --- the cache ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_model():
    from ringgpt.host.reference.models import load_model
    return load_model(TINY)


@pytest.mark.parametrize("field, value, read", [
    ("layer_norm_epsilon", 1e-3, lambda meta: meta["model"]["layer_norm_epsilon"]),
    ("eos_token_id", 5, lambda meta: meta["eos_token_id"])])
def test_the_cache_key_covers_the_models_whole_config(field, value, read, tmp_path):
    from ringgpt.host.reference.models import load_model
    from ringgpt.host.runtime.images import cached_image

    config = get_config("u280", 1)
    first, other = load_model(TINY), load_model(TINY)  # the same weights
    setattr(other.config, field, value)
    image, cached = cached_image(first, config, 32, root=tmp_path)
    assert not cached and read(image.meta) == getattr(first.config, field) != value
    image, cached = cached_image(other, config, 32, root=tmp_path)
    assert not cached and read(image.meta) == value
    image, cached = cached_image(first, config, 32, root=tmp_path)
    assert cached and read(image.meta) == getattr(first.config, field)
    assert len(list((tmp_path / "images").iterdir())) == 2


def digest_of(manifest: dict) -> str:
    """A manifest's own digest, as the format defines it: sha256 of its canonical JSON without 'digest'."""
    body = {key: value for key, value in manifest.items() if key != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _redigest(entry: Path, manifest: dict) -> None:
    """Writes `manifest` with its digest recomputed, as a forger who knows the format would."""
    manifest["digest"] = digest_of(manifest)
    (entry / "manifest.json").write_text(json.dumps(manifest))


def _without_last_segment(entry: Path) -> bytes:
    from safetensors.numpy import load, save
    file = entry / "card0.hbm.safetensors"
    segments = load(file.read_bytes())
    del segments[max(segments)]
    data = save(segments)
    file.write_bytes(data)
    return data


def _mkfifo(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    os.mkfifo(path)


def _damage(kind: str, entry: Path) -> None:
    manifest = json.loads((entry / "manifest.json").read_text())
    if kind == "flipped-hbm-byte":
        file = entry / "card0.hbm.safetensors"
        data = bytearray(file.read_bytes())
        data[-2] ^= 0x40
        file.write_bytes(bytes(data))
    elif kind == "missing-segment":
        _without_last_segment(entry)
    elif kind == "missing-segment-digests-forged":
        data = _without_last_segment(entry)
        manifest["files"]["card0.hbm.safetensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        _redigest(entry, manifest)
    elif kind == "ids-offset-edited":
        manifest["meta"]["host"]["ids_offset"] = 1
        (entry / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "ids-offset-outside-digest-forged":
        manifest["meta"]["host"]["ids_offset"] = manifest["cards"][0]["host_words"] - 1
        _redigest(entry, manifest)
    elif kind == "logits-outside-digest-forged":
        manifest["meta"]["host"]["logits"][0]["chunk_max_offset"] = manifest["cards"][0]["host_words"]
        _redigest(entry, manifest)
    elif kind == "earlier-format":
        manifest = {**manifest, "format": "ringgpt-image/1",
                    "cards": [{k: v for k, v in c.items() if k != "segments"} for c in manifest["cards"]]}
        manifest.pop("files", None), manifest.pop("digest", None)
        (entry / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "entry-is-a-file":
        shutil.rmtree(entry)
        entry.write_text("junk")
    else:  # "<name>-is-a-fifo"
        _mkfifo(entry if kind == "entry-is-a-fifo" else entry / kind.split("-is-")[0])


FIFO_WATCHDOG = """
import os, sys, time
from pathlib import Path
time.sleep({seconds})
for fifo in [p for p in Path({folder!r}).rglob("*") if p.is_fifo()]:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO unless a reader waits on it
        print(fifo, flush=True)
    except OSError:
        pass
"""


@contextmanager
def fifo_watchdog(folder: Path, seconds: float):
    """Yields a list; after `seconds`, a separate process (a reader blocked in native code may hold the GIL) opens
    for writing every FIFO under `folder` that a reader waits on, which ends the wait (the reader sees an empty
    file); the FIFOs it opened are in the list after the block. Empty: nothing hung."""
    waited = []
    watchdog = subprocess.Popen([sys.executable, "-c", FIFO_WATCHDOG.format(seconds=seconds, folder=str(folder))],
                                stdout=subprocess.PIPE)
    try:
        yield waited
    finally:
        watchdog.kill()
        waited += watchdog.communicate()[0].decode().split()


DAMAGE = [  # (kind, what the warning names)
    ("flipped-hbm-byte", "card0.hbm.safetensors does not match the sha256 its manifest lists"),
    ("missing-segment", "card0.hbm.safetensors holds"),
    ("missing-segment-digests-forged", "card0.hbm.safetensors: its segments differ from the manifest's "
                                       r"\(\[address, words\] \[\d+, \d+\] is missing\)"),
    ("ids-offset-edited", "manifest.json: 'digest' does not match the manifest"),
    ("ids-offset-outside-digest-forged", "host.ids_offset = 356: its 32 token ids end at word 388, beyond a "
                                         "card's host buffer of 357 words"),
    ("logits-outside-digest-forged", "host.logits of card 0: chunk_max_offset = 357 ends at word 362"),
    ("earlier-format", r"an image of an earlier ringgpt \(format 'ringgpt-image/1', without file digests\)"),
    ("manifest.json-is-a-fifo", "manifest.json is not a regular file"),
    ("card0.hbm.safetensors-is-a-fifo", "card0.hbm.safetensors is not a regular file"),
    ("entry-is-a-fifo", "could not be used"),
    ("entry-is-a-file", "could not be used"),
]


@pytest.mark.parametrize("kind, phrase", DAMAGE, ids=[kind for kind, _ in DAMAGE])
def test_a_damaged_cache_entry_is_caught_set_aside_and_rebuilt(kind, phrase, tiny_model, tmp_path):
    from ringgpt.host.runtime.images import CacheRepairWarning, cached_image

    config = get_config("u280", 1)
    image, _ = cached_image(tiny_model, config, 32, root=tmp_path)
    entry = next((tmp_path / "images").iterdir())
    _damage(kind, entry)
    with fifo_watchdog(tmp_path, 10) as waited, pytest.warns(CacheRepairWarning) as record:
        again, cached = cached_image(tiny_model, config, 32, root=tmp_path)
    assert waited == []  # no read waited on a FIFO
    message = str(record[0].message)
    assert re.search(phrase, message) and f"moved to {entry}.damaged-1; compiling it again" in message, message
    assert not cached and again.meta == image.meta
    third, cached = cached_image(tiny_model, config, 32, root=tmp_path)
    assert cached and third.meta == image.meta


def test_an_image_of_an_earlier_format_in_a_users_folder_names_the_fix(tmp_path):
    folder = tmp_path / "image"
    hand_image().save(folder)
    _damage("earlier-format", folder)
    with pytest.raises(ImageError, match=re.escape(f"{folder} is an image of an earlier ringgpt (format "
                                                   "'ringgpt-image/1', without file digests): compile it again "
                                                   f"(python -m ringgpt.host.compiler ... --out {folder})")):
        ApplianceImage.load(folder)
    hand_image(fill=2.0).save(folder)  # an earlier image's files are still ours to replace
    assert fill_of(folder) == 2.0 and sorted(os.listdir(folder)) == ["card0.hbm.safetensors", "card0.prog",
                                                                     "manifest.json"]


@pytest.mark.parametrize("kind", ["root-is-a-file", "images-is-a-file", "unwritable"])
def test_an_unusable_cache_costs_only_the_cache(kind, tiny_model, tmp_path):
    from ringgpt.host.runtime.images import CacheUnavailableWarning, cached_image

    root = tmp_path / "cache"
    if kind == "root-is-a-file":
        root.write_text("not a folder")
    elif kind == "images-is-a-file":
        root.mkdir()
        (root / "images").write_text("not a folder")
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into any folder")
        (root / "images").mkdir(parents=True)
        (root / "images").chmod(0o500)
    before = snapshot(tmp_path)
    with pytest.warns(CacheUnavailableWarning, match=f"the image cache {re.escape(str(root / 'images'))} cannot be "
                                                     "used .*: compiling the image for this run only"):
        image, cached = cached_image(tiny_model, get_config("u280", 1), 32, root=root)
    assert not cached and image.meta["max_context"] == 32 and len(image.cards[0].hbm_segments) > 0
    assert snapshot(tmp_path) == before


# --- the compiled native kernel --------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")
def test_a_damaged_compiled_kernel_is_rebuilt_with_a_warning(tmp_path, monkeypatch):
    from ringgpt.hw import native

    monkeypatch.setenv("RINGGPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RINGGPT_NATIVE", raising=False)
    source = f"int ringgpt_answer(void) {{ return 42; }} /* {tmp_path} */\n"
    path = native.library_path("answer", source)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x7fELF truncated by a crash")
    with pytest.warns(native.NativeRebuildWarning, match=f"the compiled kernel {re.escape(str(path))} fails to "
                                                         "load .*: building it again"):
        lib = native.build("answer", source)
    assert lib is not None and lib.ringgpt_answer() == 42
    assert path.read_bytes()[:4] == b"\x7fELF" and len(path.read_bytes()) > 1000


# --- fuzzing manifests through the cache's loader ------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2 ** 70) | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=6)
PATHS = [("format",), ("writing",), ("digest",), ("files",), ("files", "card0.prog"), ("files", "card0.prog", "bytes"),
         ("files", "card1.hbm.safetensors", "sha256"), ("cards", 0, "segments"), ("cards", 1, "segments", 0),
         ("cards", 0, "segments", 1, 0), ("cards", 0, "hbm_words"), ("cards", 1, "host_words"), ("config", "cards"),
         ("meta", "max_rows"), ("meta", "max_context"), ("meta", "weights_hash"), ("meta", "host", "ids_offset"),
         ("meta", "host", "logits", 0, "offset"), ("meta", "host", "logits", 1, "chunk_max_offset"),
         ("meta", "host", "logits", 0, "vocab"), ("meta", "model", "vocab_size")]
_DELETE = object()


@pytest.fixture(scope="module")
def saved_files(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("fuzz") / "image"
    hand_image(cards=2).save(folder)
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _edited(blob: bytes, path: tuple, value, redigest: bool) -> bytes:
    manifest = json.loads(blob)
    node = manifest
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        node.pop(path[-1]) if isinstance(node, list) else node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    if redigest:
        manifest["digest"] = digest_of(manifest)
    return json.dumps(manifest).encode()


@FUZZ
@given(st.one_of(
    st.tuples(st.just("edit"), st.sampled_from(PATHS), st.one_of(JSON, st.just(_DELETE)), st.booleans()),
    st.tuples(st.just("bytes"), st.integers(0, 10 ** 5), st.integers(0, 255)),
    st.tuples(st.just("whole"), JSON),
))
def test_fuzz_manifest_through_the_cache_loader_raises_only_image_error(saved_files, tmp_path_factory, change):
    from ringgpt.host.runtime.images import _load_entry

    folder = tmp_path_factory.mktemp("case")
    files = dict(saved_files)
    blob = files["manifest.json"]
    if change[0] == "edit":
        blob = _edited(blob, *change[1:])
    elif change[0] == "bytes":
        at = change[1] % len(blob)
        blob = blob[:at] if change[2] == 0 else blob[:at] + bytes([blob[at] ^ change[2]]) + blob[at + 1:]
    else:
        blob = json.dumps(change[1]).encode()
    files["manifest.json"] = blob
    for name, data in files.items():
        (folder / name).write_bytes(data)
    try:
        image = _load_entry(folder, get_config("sim-small", 2), "w", 16, "fp16")
    except ImageError:
        return
    assert image.config.cards == len(image.cards) == 2


def test_an_images_digest_is_the_one_its_saved_manifest_records_and_follows_its_contents(tmp_path):
    image = hand_image()
    image.save(tmp_path / "image")
    manifest = json.loads((tmp_path / "image" / "manifest.json").read_text())
    assert image.digest() == manifest["digest"] == ApplianceImage.load(tmp_path / "image").digest()
    assert hand_image(fill=2.0).digest() != image.digest()              # other HBM words
    assert hand_image(words=5).digest() != image.digest()               # another segment
    assert hand_image(cards=2).digest() != image.digest()

"""Golden records: bit-identical round trip of arrays and metadata, atomic writes, and files of the wrong format."""
import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file
from test_reference_support import TINY

from ringgpt.host.errors import GoldenRecordError
from ringgpt.host.reference.generate import generate
from ringgpt.host.reference.golden import FORMAT_NAME, FORMAT_VERSION, load_golden, save_golden
from ringgpt.host.reference.models import load_model, weights_hash
from ringgpt.host.reference.sampling import SamplingConfig

CFG = SamplingConfig(greedy=False, temperature=0.9, top_k=50, seed=11, max_new_tokens=6)


@pytest.fixture(scope="module")
def model():
    return load_model(TINY, seed=3)


@pytest.fixture(scope="module")
def result(model):
    return generate(model, [464, 3290, 318], CFG, hidden_layers=(1, 0))


@pytest.fixture
def saved(tmp_path, result, model):
    path = tmp_path / "golden" / "tiny.safetensors"
    save_golden(path, result, model, CFG)
    return path


def bits(a):
    return a.view(np.uint8)


def test_round_trip_is_bit_identical(saved, result, model):
    record = load_golden(saved)
    assert record.prompt_ids.dtype == record.generated_ids.dtype == np.int64
    assert record.prompt_ids.tolist() == result.prompt_ids
    assert record.generated_ids.tolist() == result.generated_ids
    assert record.logits.dtype == np.float32 and np.array_equal(bits(record.logits), bits(result.logits))
    assert sorted(record.hidden_states) == [0, 1]
    for layer, h in result.hidden_states.items():
        assert np.array_equal(bits(record.hidden_states[layer]), bits(h))


def test_round_trip_metadata(saved, model):
    record = load_golden(saved)
    assert record.sampling == CFG
    assert record.weights_hash == weights_hash(model)
    assert record.model_config == json.loads(model.config.to_json_string(use_diff=False))
    assert (record.dtype, record.model_source) == ("float32", TINY)
    assert (record.torch_version, record.transformers_version) == (torch.__version__, transformers.__version__)


def test_write_leaves_no_temporary_file(saved):
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


def test_result_without_logits_is_refused_and_nothing_written(tmp_path, model):
    bare = generate(model, [464], CFG, return_logits=False)
    with pytest.raises(GoldenRecordError, match="return_logits=True"):
        save_golden(tmp_path / "g.safetensors", bare, model, CFG)
    assert list(tmp_path.iterdir()) == []


def metadata_of(path):
    with open(path, "rb") as f:
        return json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]


def rewrite_metadata(path, **changes):
    save_file(load_file(path), path, metadata={**metadata_of(path), **changes})


def test_wrong_format_version(saved):
    rewrite_metadata(saved, format_version="999")
    with pytest.raises(GoldenRecordError, match=f"format version '999', this ringgpt reads version {FORMAT_VERSION}"):
        load_golden(saved)


def test_other_safetensors_file(saved):
    rewrite_metadata(saved, format="pt")
    with pytest.raises(GoldenRecordError, match=f"is not a {FORMAT_NAME} record"):
        load_golden(saved)


def test_record_missing_a_field(saved):
    tensors = load_file(saved)
    del tensors["logits"]
    save_file(tensors, saved, metadata=metadata_of(saved))
    with pytest.raises(GoldenRecordError, match="lacks logits"):
        load_golden(saved)


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x00" * 3)
    with pytest.raises(GoldenRecordError, match="not a safetensors file"):
        load_golden(path)


def test_missing_file(tmp_path):
    with pytest.raises(GoldenRecordError, match="does not exist"):
        load_golden(tmp_path / "nope.safetensors")

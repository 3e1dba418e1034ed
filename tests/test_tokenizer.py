"""The shipped GPT-2 tokenizer: known ids, round trips, agreement with transformers' GPT2TokenizerFast, streaming."""
import pytest
from transformers import GPT2TokenizerFast

from ringgpt.host.errors import TokenizerError
from ringgpt.host.reference.models import VOCAB_SIZE
from ringgpt.host.tokenizer import BPE_DIR, EOS_TOKEN, TextStream, Tokenizer, load_tokenizer

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 1234567890 !@#$%^&*()",
    "naïve café, Ærøskøbing, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, עברית",
    "emoji 🤖👍🏽 family 👨‍👩‍👧‍👦 flag 🇳🇴",
    "runs   of    spaces\n\n\n\ttabs\t\tand trailing   ",
    " leading space",
    "",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_known_ids(tok):
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" Hello") == [18435]
    assert tok.encode(EOS_TOKEN) == [50256]
    assert tok.eos_id == 50256
    assert tok.vocab_size == VOCAB_SIZE == 50257


def test_empty_string(tok):
    assert tok.encode("") == []
    assert tok.decode([]) == ""


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", TEXTS + [f"one{EOS_TOKEN}two"])
def test_agrees_with_transformers(tok, text):
    hf = GPT2TokenizerFast(vocab=str(BPE_DIR / "encoder.json"), merges=str(BPE_DIR / "vocab.bpe"))
    assert tok.encode(text) == hf.encode(text)


def test_decode_rejects_ids_outside_vocabulary(tok):
    with pytest.raises(TokenizerError, match="outside the GPT-2 vocabulary"):
        tok.decode([15496, VOCAB_SIZE])


def test_missing_vocabulary_file(tmp_path):
    with pytest.raises(TokenizerError, match="is missing"):
        Tokenizer(tmp_path / "encoder.json", BPE_DIR / "vocab.bpe")


@pytest.mark.parametrize("text", TEXTS)
def test_stream_holds_back_partial_characters(tok, text):
    stream = TextStream(tok)
    pieces = [stream.push(t) for t in tok.encode(text)]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + stream.flush() == text

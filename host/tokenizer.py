"""GPT-2 byte-level BPE tokenizer, loaded offline from the vocabulary shipped in host/data/gpt2-bpe."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from ringgpt.host.errors import PromptError, TokenizerError

BPE_DIR = Path(__file__).parent / "data" / "gpt2-bpe"
EOS_TOKEN = "<|endoftext|>"


class Tokenizer:
    """Text <-> GPT-2 token ids; `<|endoftext|>` in text is the single EOS token, as in GPT-2."""

    def __init__(self, vocab_path: Path, merges_path: Path):
        for path in (vocab_path, merges_path):
            if not path.is_file():
                raise TokenizerError(f"tokenizer file {path} is missing: reinstall ringgpt (it ships in host/data/gpt2-bpe)")
        try:
            bpe = models.BPE.from_file(str(vocab_path), str(merges_path))
        except Exception as exc:
            raise TokenizerError(f"cannot read the tokenizer files {vocab_path} and {merges_path} ({exc}): "
                                 "reinstall ringgpt to restore them") from exc
        self._tok = _HFTokenizer(bpe)
        self._tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self._tok.decoder = decoders.ByteLevel()
        self._tok.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
        eos = self._tok.token_to_id(EOS_TOKEN)
        if eos is None:
            raise TokenizerError(f"{vocab_path} has no {EOS_TOKEN} token: it is not a GPT-2 vocabulary")
        self.eos_id: int = eos
        self.vocab_size: int = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no prefix space is added). Raises PromptError for text that is not valid Unicode
        (for example bytes that were not UTF-8, which Python passes on from the command line as lone surrogates)."""
        if not isinstance(text, str):
            raise PromptError(f"the prompt must be text (str), not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            char = text[exc.start]
            what = (f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF
                    else f"lone surrogate U+{ord(char):04X}")
            raise PromptError(f"the prompt is not valid UTF-8 text: {what} at character {exc.start} "
                              f"(after {text[max(0, exc.start - 20):exc.start]!r}): pass UTF-8 text") from None
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`; bytes that do not form complete UTF-8 characters come out as U+FFFD."""
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"token ids {bad[:5]} are outside the GPT-2 vocabulary [0, {self.vocab_size}): "
                                 "the model's vocabulary is larger than the tokenizer's")
        return self._tok.decode(list(ids), skip_special_tokens=False)


class TextStream:
    """Turns token ids arriving one at a time into text pieces, holding back incomplete UTF-8 characters."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes (may be empty)."""
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self._emitted = text[self._emitted:], len(text)
        return piece

    def flush(self) -> str:
        """The text still held back at the end of the stream."""
        text = self._tokenizer.decode(self._ids)
        piece, self._emitted = text[self._emitted:], len(text)
        return piece


@cache
def load_tokenizer() -> Tokenizer:
    """The GPT-2 tokenizer from the shipped files (loaded once per process)."""
    return Tokenizer(BPE_DIR / "encoder.json", BPE_DIR / "vocab.bpe")

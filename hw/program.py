"""The program file: one card's instruction stream with the configuration it was built for (`Program`), as bytes
(`to_bytes` / `from_bytes`: PROGRAM_MAGIC, a JSON header, then the instructions' 512-bit words)."""
import dataclasses
import json
import struct
from dataclasses import dataclass

from ringgpt.hw.isa import INSTRUCTION_BYTES, IllegalInstructionError, decode

PROGRAM_MAGIC = b"RGPTPRG1"


@dataclass
class Program:
    """One card's instruction stream with the configuration it was built for."""
    instructions: list
    config_name: str
    config_hash: str
    card: int = 0
    cards: int = 1
    meta: dict = dataclasses.field(default_factory=dict)

    def to_bytes(self) -> bytes:
        header = json.dumps({"config_name": self.config_name, "config_hash": self.config_hash,
                             "card": self.card, "cards": self.cards, "count": len(self.instructions),
                             "meta": self.meta}, sort_keys=True).encode()
        body = b"".join(i.encode().to_bytes(INSTRUCTION_BYTES, "little") for i in self.instructions)
        return PROGRAM_MAGIC + struct.pack("<I", len(header)) + header + body

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Program":
        """The program `to_bytes` wrote; anything else raises IllegalInstructionError naming the field or the
        instruction that is wrong."""
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise IllegalInstructionError(f"a program is bytes, not {type(blob).__name__}")
        blob = bytes(blob)
        if blob[:8] != PROGRAM_MAGIC:
            raise IllegalInstructionError("not a ringgpt program (bad magic): compile the model again "
                                          "(python -m ringgpt.host.compiler)")
        if len(blob) < 12:
            raise IllegalInstructionError(f"truncated program: {len(blob)} bytes, the header length needs 12")
        (hlen,) = struct.unpack_from("<I", blob, 8)
        if 12 + hlen > len(blob):
            raise IllegalInstructionError(f"truncated program: the header is {hlen} bytes but the file ends "
                                          f"{len(blob) - 12} bytes after its length field")
        try:
            header = json.loads(blob[12:12 + hlen])
        except (ValueError, RecursionError) as exc:
            raise IllegalInstructionError(f"corrupt program header: {exc}") from None
        if not isinstance(header, dict):
            raise IllegalInstructionError(f"corrupt program header: a JSON {type(header).__name__}, not an object")

        def field(name: str, check, expected: str):
            if name not in header:
                raise IllegalInstructionError(f"corrupt program header: field '{name}' is missing")
            value = header[name]
            if not check(value):
                raise IllegalInstructionError(f"corrupt program header: field '{name}' = {value!r:.60} is not "
                                              f"{expected}")
            return value

        def count(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 0
        config_name = field("config_name", lambda v: isinstance(v, str), "a string")
        config_hash = field("config_hash", lambda v: isinstance(v, str), "a string")
        cards = field("cards", lambda v: count(v) and v >= 1, "an integer >= 1")
        card = field("card", lambda v: count(v) and v < cards, f"a card number below cards = {cards}")
        number = field("count", count, "an instruction count (an integer >= 0)")
        meta = field("meta", lambda v: isinstance(v, dict), "an object")
        body = blob[12 + hlen:]
        if len(body) != number * INSTRUCTION_BYTES:
            raise IllegalInstructionError(f"truncated program: header says {number} instructions, "
                                          f"body holds {len(body) / INSTRUCTION_BYTES:g}")
        insts = []
        for index in range(number):
            word = int.from_bytes(body[index * INSTRUCTION_BYTES:(index + 1) * INSTRUCTION_BYTES], "little")
            try:
                insts.append(decode(word))
            except IllegalInstructionError as exc:
                raise IllegalInstructionError(f"instruction {index}: {exc}") from None
        return cls(insts, config_name, config_hash, card, cards, meta)

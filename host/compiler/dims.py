"""A GPT-2 model's dimensions as the compiler sees them, and the checks that need nothing but those dimensions
and the architecture config (no torch, no weights): the command line runs them before it loads a model."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from ringgpt.host.compiler.errors import CompileError
from ringgpt.host.compiler.layout import check_hbm, plan_buffers
from ringgpt.host.compiler.partition import model_partition
from ringgpt.host.reference.spec import SUPPORTED_ACTIVATIONS
from ringgpt.hw.config import ArchConfig
from ringgpt.hw.errors import RingGPTError


@dataclass(frozen=True)
class ModelDims:
    n_layer: int
    n_embd: int
    n_head: int
    n_inner: int
    vocab_size: int
    n_positions: int
    layer_norm_epsilon: float

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def q_scale(self) -> float:
        """The attention scale 1/sqrt(head_dim), folded into the Q weights and bias."""
        return 1.0 / math.sqrt(self.head_dim)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, model) -> "ModelDims":
        """The dimensions of a GPT2LMHeadModel; raises CompileError for GPT-2 variants the appliance lacks."""
        c = model.config
        if getattr(c, "model_type", None) != "gpt2":
            raise CompileError(f"model_type {getattr(c, 'model_type', None)!r} is not 'gpt2': "
                               "the compiler builds GPT-2 only")
        if c.activation_function not in SUPPORTED_ACTIVATIONS:
            raise CompileError(f"activation {c.activation_function!r} is not supported: the appliance computes "
                               f"GELU with the tanh approximation ({' / '.join(SUPPORTED_ACTIVATIONS)})")
        if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx:
            raise CompileError("only GPT-2's standard attention scaling (1/sqrt(head_dim), scale_attn_weights=True, "
                               "scale_attn_by_inverse_layer_idx=False) is supported")
        if c.n_embd % c.n_head:
            raise CompileError(f"n_embd={c.n_embd} is not a multiple of n_head={c.n_head}")
        if c.vocab_size > 1 << 16:
            raise CompileError(f"vocab_size={c.vocab_size} exceeds 65536: token ids travel as 16-bit words")
        return cls(n_layer=c.n_layer, n_embd=c.n_embd, n_head=c.n_head, n_inner=c.n_inner or 4 * c.n_embd,
                   vocab_size=c.vocab_size, n_positions=c.n_positions,
                   layer_norm_epsilon=float(c.layer_norm_epsilon))


def preflight(fields: dict, config: ArchConfig, max_context: int, *, wbuf_slots: int = 2,
              max_rows: int | None = None, int8: bool = False) -> ModelDims:
    """The checks compile_model makes before it reads a weight, from a model's GPT2Config fields alone
    (ringgpt.host.reference.spec): the GPT-2 variant, max_context, wbuf_slots, the split over the cards, the
    activation-buffer plan and the HBM map (layout.check_hbm: weights, FP16 or INT8 (`int8`), and KV caches within
    each card's HBM).
    Raises CompileError / CapacityError as compile_model would; returns the dims."""
    try:
        return _preflight(fields, config, max_context, wbuf_slots, max_rows, int8)
    except RingGPTError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:  # a config.json field of the wrong type
        raise CompileError(f"the model's config cannot be compiled ({type(exc).__name__}: {exc}): check its "
                           "config.json") from None


def _preflight(fields: dict, config: ArchConfig, max_context: int, wbuf_slots: int, max_rows: int | None,
               int8: bool) -> ModelDims:
    dims = ModelDims.of(SimpleNamespace(config=SimpleNamespace(**fields)))
    if not 1 <= max_context <= dims.n_positions:
        raise CompileError(f"max_context={max_context} must be in 1..{dims.n_positions} (the model's positions)")
    if not 2 <= wbuf_slots <= config.wbuf_words // config.mac_width:
        raise CompileError(f"wbuf_slots={wbuf_slots} must be in 2..{config.wbuf_words // config.mac_width}")
    if max_rows is not None and max_rows < 1:
        raise CompileError(f"max_rows={max_rows} must be at least 1")
    part = model_partition(dims, config)
    kv, plans = plan_buffers(config, dims, part, max_context, wbuf_slots, max_rows=max_rows, int8=int8)
    check_hbm(config, dims, part, kv.slot_words, plans, max_context, int8)
    return dims

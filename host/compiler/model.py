"""What the compiler reads from a transformers GPT2LMHeadModel: its dimensions and its weights as FP16
numpy arrays (the 1/sqrt(head_dim) attention scale folded into the Q weights and bias)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ringgpt.host.compiler.errors import CompileError

SUPPORTED_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
"""The tanh approximation of GELU (numerics.gelu_tanh); both names denote it."""


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


def has_weights(model) -> bool:
    """False for a model on the meta device (dimensions only: programs can be built, HBM contents cannot)."""
    return not any(p.is_meta for p in model.parameters())


def fp16(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(device="cpu", dtype=torch.float16).numpy()


def lm_head_tied(model) -> bool:
    """Whether the LM head is the token embedding (GPT-2's tied weights), so one HBM copy serves both."""
    head, wte = model.lm_head.weight, model.transformer.wte.weight
    return head is wte or (not head.is_meta and head.shape == wte.shape and torch.equal(head, wte))


class LayerWeights:
    """One decoder layer's FP16 tensors, linear weights as (in, out) like GPT-2's Conv1D."""

    def __init__(self, model, index: int, dims: ModelDims):
        block = model.transformer.h[index]
        scale = dims.q_scale
        d = dims.n_embd
        w = block.attn.c_attn.weight.detach().float().clone()
        b = block.attn.c_attn.bias.detach().float().clone()
        w[:, :d] *= scale
        b[:d] *= scale
        self.ln1 = (fp16(block.ln_1.weight), fp16(block.ln_1.bias))
        self.ln2 = (fp16(block.ln_2.weight), fp16(block.ln_2.bias))
        self.qkv = (fp16(w), fp16(b))
        self.proj = (fp16(block.attn.c_proj.weight), fp16(block.attn.c_proj.bias))
        self.fc = (fp16(block.mlp.c_fc.weight), fp16(block.mlp.c_fc.bias))
        self.fc2 = (fp16(block.mlp.c_proj.weight), fp16(block.mlp.c_proj.bias))

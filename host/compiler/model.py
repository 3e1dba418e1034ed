"""What the compiler reads from a transformers GPT2LMHeadModel: its dimensions and its weights as FP16
numpy arrays (the 1/sqrt(head_dim) attention scale folded into the Q weights and bias)."""
from __future__ import annotations

import numpy as np
import torch

from ringgpt.host.compiler.dims import SUPPORTED_ACTIVATIONS, ModelDims  # noqa: F401
from ringgpt.hw.numerics import quantize_int8

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
    """One decoder layer's tensors, linear weights as (in, out) like GPT-2's Conv1D: FP16, or with `int8`
    numerics.quantize_int8's (q, scale) of the FP32 weights (biases FP16 either way)."""

    def __init__(self, model, index: int, dims: ModelDims, int8: bool = False):
        block = model.transformer.h[index]
        scale = dims.q_scale
        d = dims.n_embd
        w = block.attn.c_attn.weight.detach().float().clone()
        b = block.attn.c_attn.bias.detach().float().clone()
        w[:, :d] *= scale
        b[:d] *= scale

        def linear(weight, bias):
            return (quantize_int8(weight.detach().float().cpu().numpy()) if int8 else fp16(weight)), fp16(bias)
        self.ln1 = (fp16(block.ln_1.weight), fp16(block.ln_1.bias))
        self.ln2 = (fp16(block.ln_2.weight), fp16(block.ln_2.bias))
        self.qkv = linear(w, b)
        self.proj = linear(block.attn.c_proj.weight, block.attn.c_proj.bias)
        self.fc = linear(block.mlp.c_fc.weight, block.mlp.c_fc.bias)
        self.fc2 = linear(block.mlp.c_proj.weight, block.mlp.c_proj.bias)


def lm_head_int8(model) -> tuple[np.ndarray, np.ndarray]:
    """numerics.quantize_int8 of the LM head's columns (n_embd x vocab): one scale per vocabulary entry."""
    return quantize_int8(model.lm_head.weight.detach().float().cpu().numpy().T)

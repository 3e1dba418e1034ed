"""Shared helpers of the reference-path tests (no tests here): tiny seeded synthetic models."""
import torch

from ringgpt.host.reference.models import SYNTHETIC_PREFIX, load_model

TINY = f"{SYNTHETIC_PREFIX}n_layer=2,n_embd=64,n_head=2"


def varied_model(dtype=torch.float32, seed=0):
    """The TINY model with large position embeddings, so that greedy decoding does not repeat one token."""
    model = load_model(TINY, dtype=dtype, seed=seed)
    with torch.no_grad():
        model.transformer.wpe.weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
    return model

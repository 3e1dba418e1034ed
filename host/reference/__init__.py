"""The PyTorch reference path: GPT-2 models, sampling, generation, golden records and timing."""

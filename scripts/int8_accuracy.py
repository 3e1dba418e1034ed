#!/usr/bin/env python3
"""The accuracy of INT8 weights (W8A16) on the simulated appliance, beside FP16 weights.

    python scripts/int8_accuracy.py --out docs/bench

1. GPT-2's four widths (one layer, seeded GPT-2-initialised weights, a 2,048-token vocabulary, the u280 preset,
   max_context 64) on 1-4 cards: the teacher-forced logits of a 5-token prompt and 3 decode steps, FP16 and INT8
   weights, against the FP32 model and against the same model quantised in PyTorch (host.reference.models.
   int8_model); the logits of every card count must be bit-identical.
2. The bundled model's perplexity on Python text it was not trained on (its validation files: every 50th file of
   this interpreter's standard library, as scripts/train_bundled_model.py holds them out), token by token on the
   appliance (4 u280 cards) in windows spread over them, FP16 and INT8 weights, beside PyTorch's FP32 model and its
   quantised copy.

Prints both tables and writes int8_accuracy.json to --out. About 3 minutes on 2 cores.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import click
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from ringgpt.host.compiler import compile_model
from ringgpt.host.reference.generate import generate as reference_generate
from ringgpt.host.reference.models import int8_model, load_model
from ringgpt.host.reference.sampling import SamplingConfig
from ringgpt.host.runtime import Appliance, relative_rms
from ringgpt.host.tokenizer import load_tokenizer
from ringgpt.hw.config import get_config
from ringgpt.hw.numerics import WEIGHT_FORMATS
from ringgpt.sim.functional import SimulatorDevice

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = {"124M": (768, 12), "345M": (1024, 16), "774M": (1280, 20), "1.5B": (1600, 25)}
CARDS = (1, 2, 3, 4)
VOCAB, PROMPT, STEPS = 2048, 5, 3


def _training_script():
    """scripts/train_bundled_model.py as a module (its `tabify`: the corpus's indentation rule)."""
    spec = importlib.util.spec_from_file_location("train_bundled_model", ROOT / "scripts" / "train_bundled_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def teacher_forced(image, prompt: list, continuation: list) -> np.ndarray:
    """The appliance's logits after the prompt and after each continuation token but the last."""
    return Appliance(SimulatorDevice(image.config), image).teacher_forced(prompt, continuation[:-1])


def widths_case(width: str) -> dict:
    d, heads = WIDTHS[width]
    model = load_model(f"synthetic:n_layer=1,n_embd={d},n_head={heads},vocab_size={VOCAB}", seed=d)
    prompt = [int(t) for t in np.random.default_rng(d).integers(0, VOCAB, PROMPT)]
    sampling = SamplingConfig(max_new_tokens=STEPS + 1, stop_at_eos=False)
    quantised = reference_generate(int8_model(model), prompt, sampling)
    full = reference_generate(model, prompt, sampling)
    out = {"n_embd": d, "n_head": heads, "same_reference_tokens": full.generated_ids == quantised.generated_ids}
    for weights in WEIGHT_FORMATS:
        feed = quantised if weights == "int8" else full
        results = [teacher_forced(compile_model(model, get_config("u280", cards), 64, weights=weights), prompt,
                                  feed.generated_ids) for cards in CARDS]
        logits = results[0]
        out[weights] = {"vs_fp32": relative_rms(logits, full.logits) if feed is full or out["same_reference_tokens"]
                        else None,
                        "vs_quantised": relative_rms(logits, quantised.logits) if weights == "int8" else None,
                        "greedy_tokens_equal": [int(np.argmax(r)) for r in logits] == feed.generated_ids,
                        "identical_across_cards": all(np.array_equal(r, logits) for r in results[1:])}
    return out


EOT = 50256
"""<|endoftext|>: joins the validation files, as in training."""


def held_out_windows(windows: int, length: int) -> tuple[list, int]:
    """`windows` spans of `length` + 1 token ids at even steps over the bundled model's validation tokens
    (scripts/train_bundled_model.py: every VAL_EVERY-th standard-library file, indentation as tabs, files joined by
    <|endoftext|>, none of them trained on), and how many validation tokens there are."""
    train = _training_script()
    _, files = train.corpus_files()
    ids = []
    for path in files[::train.VAL_EVERY]:
        ids += load_tokenizer().encode(train.tabify(path.read_text(encoding="utf-8", errors="replace"))) + [EOT]
    step = (len(ids) - length - 1) // max(1, windows - 1)
    return [ids[w * step:w * step + length + 1] for w in range(windows)], len(ids)


def nll(logits: np.ndarray, targets: list) -> float:
    """Summed negative log-likelihood (nats) of `targets` under the rows of `logits`."""
    z = torch.from_numpy(np.asarray(logits, np.float32))
    return float(torch.nn.functional.cross_entropy(z, torch.tensor(targets), reduction="sum"))


def perplexity(windows: int, length: int) -> dict:
    """exp(mean NLL) over every predicted token of the windows, each window a sequence from position 0."""
    model = load_model("bundled", dtype=torch.float32)
    spans, total = held_out_windows(windows, length)
    out = {"windows": windows, "window_tokens": length, "validation_tokens": total}
    nets = {"pytorch_fp32": model, "pytorch_int8": int8_model(model)}
    config = get_config("u280", 4)
    images = {w: compile_model(model, config, length + 1, weights=w) for w in WEIGHT_FORMATS}
    sums = dict.fromkeys([*nets, *(f"appliance_{w}" for w in WEIGHT_FORMATS)], 0.0)
    with torch.inference_mode():
        for ids in spans:
            context, targets = ids[:-1], ids[1:]
            for name, net in nets.items():
                sums[name] += nll(net(torch.tensor([context])).logits[0].numpy(), targets)
            for weights, image in images.items():
                sums[f"appliance_{weights}"] += nll(teacher_forced(image, context[:1], context[1:] + [0]), targets)
    return out | {name: math.exp(value / (windows * length)) for name, value in sums.items()}


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default="out", show_default=True)
@click.option("--windows", type=int, default=8, show_default=True, help="held-out windows the perplexity runs over")
@click.option("--window", type=int, default=128, show_default=True, help="tokens a window predicts")
def main(out: str, windows: int, window: int) -> None:
    """INT8 against FP16 weights: logits errors at GPT-2's widths on 1-4 cards, and the bundled model's perplexity."""
    widths = {width: widths_case(width) for width in WIDTHS}
    ppl = perplexity(windows, window)
    console = Console(width=160)
    t = Table(title="logits relative RMS error, one layer at GPT-2's widths (u280, 1-4 cards)")
    for column in ("width", "FP16 vs FP32", "INT8 vs quantised PyTorch", "INT8 vs FP32", "greedy equal",
                   "identical on 1-4 cards"):
        t.add_column(column, justify="left" if column == "width" else "right")
    for width, r in widths.items():
        vs_fp32 = r["int8"]["vs_fp32"]
        t.add_row(f"{width} ({r['n_embd']} / {r['n_head']})", f"{r['fp16']['vs_fp32']:.2e}",
                  f"{r['int8']['vs_quantised']:.2e}", "n/a (other tokens)" if vs_fp32 is None else f"{vs_fp32:.2e}",
                  str(r["fp16"]["greedy_tokens_equal"] and r["int8"]["greedy_tokens_equal"]),
                  str(r["fp16"]["identical_across_cards"] and r["int8"]["identical_across_cards"]))
    console.print(t)
    p = Table(title=f"bundled model, perplexity over {windows} windows of {window} tokens spread over its "
                    f"{ppl['validation_tokens']:,} validation tokens (held out of training)")
    for column in ("PyTorch FP32", "appliance FP16", "PyTorch, INT8-quantised", "appliance INT8"):
        p.add_column(column, justify="right")
    p.add_row(*(f"{ppl[k]:.3f}" for k in ("pytorch_fp32", "appliance_fp16", "pytorch_int8", "appliance_int8")))
    console.print(p)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "int8_accuracy.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"widths": widths, "perplexity": ppl, "cards": CARDS, "vocab": VOCAB,
                               "prompt_tokens": PROMPT, "decode_steps": STEPS}, indent=1))
    tmp.replace(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

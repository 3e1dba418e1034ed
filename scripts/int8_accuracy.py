#!/usr/bin/env python3
"""The accuracy of INT8 weights (W8A16) on the simulated appliance, beside FP16 weights.

    python scripts/int8_accuracy.py --out docs/bench

1. GPT-2's four widths (one layer, seeded GPT-2-initialised weights, a 2,048-token vocabulary, the u280 preset,
   max_context 64) on 1-4 cards: the teacher-forced logits of a 5-token prompt and 3 decode steps, FP16 and INT8
   weights, against the FP32 model and against the same model quantised in PyTorch (host.reference.models.
   int8_model); the logits of every card count must be bit-identical.
2. The bundled model's perplexity on Python text it was not trained on (its validation files: every 50th file of
   this interpreter's standard library, as scripts/train_bundled_model.py holds them out), token by token on the
   appliance (4 u280 cards), FP16 and INT8 weights, beside PyTorch's FP32 model and its quantised copy.

Prints both tables and writes int8_accuracy.json to --out. About 3 minutes on 2 cores.
"""
from __future__ import annotations

import importlib.util
import json
import math
import time
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
    """The appliance's logits after the prompt and after each continuation token but the last, fed in turn."""
    app = Appliance(SimulatorDevice(image.config), image)
    app.prefill(prompt)
    rows = [app.logits()]
    for pos, token in enumerate(continuation[:-1], start=len(prompt)):
        app.run(pos, [token])
        rows.append(app.logits())
    return np.stack(rows).astype(np.float32)


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


def held_out_ids(tokens: int) -> tuple[list, list]:
    """The first `tokens` + 1 token ids of the bundled model's validation files (scripts/train_bundled_model.py: every
    VAL_EVERY-th standard-library file, indentation as tabs, none of them trained on), and the files used."""
    train = _training_script()
    stdlib, files = train.corpus_files()
    ids, used = [], []
    for path in files[::train.VAL_EVERY]:
        ids += load_tokenizer().encode(train.tabify(path.read_text(encoding="utf-8", errors="replace")))
        used.append(str(path.relative_to(stdlib)))
        if len(ids) > tokens:
            break
    return ids[:tokens + 1], used


def nll(logits: np.ndarray, targets: list) -> float:
    """Mean negative log-likelihood (nats) of `targets` under the rows of `logits`."""
    z = torch.from_numpy(np.asarray(logits, np.float32))
    return float(torch.nn.functional.cross_entropy(z, torch.tensor(targets)))


def perplexity(tokens: int) -> dict:
    model = load_model("bundled", dtype=torch.float32)
    ids, files = held_out_ids(tokens)
    context, targets = ids[:-1], ids[1:]
    out = {"text": files, "tokens": len(targets)}
    with torch.inference_mode():
        for name, net in (("pytorch_fp32", model), ("pytorch_int8", int8_model(model))):
            out[name] = math.exp(nll(net(torch.tensor([context])).logits[0].numpy(), targets))
    config = get_config("u280", 4)
    for weights in WEIGHT_FORMATS:
        started = time.perf_counter()
        logits = teacher_forced(compile_model(model, config, len(ids), weights=weights), context[:1],
                                context[1:] + [0])     # the last token is never fed
        out[f"appliance_{weights}"] = math.exp(nll(logits, targets))
        out[f"appliance_{weights}_s"] = time.perf_counter() - started
    return out


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default="out", show_default=True)
@click.option("--tokens", type=int, default=256, show_default=True, help="held-out tokens the perplexity runs over")
def main(out: str, tokens: int) -> None:
    """INT8 against FP16 weights: logits errors at GPT-2's widths on 1-4 cards, and the bundled model's perplexity."""
    widths = {width: widths_case(width) for width in WIDTHS}
    ppl = perplexity(tokens)
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
    p = Table(title=f"bundled model, perplexity over {ppl['tokens']} held-out tokens ({', '.join(ppl['text'])})")
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

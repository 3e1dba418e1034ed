#!/usr/bin/env python3
"""Train the bundled default model: a small GPT-2 (head size 64, full GPT-2 vocabulary) on the
Python standard library's source, saved in FP16 to host/data/models/bundled.

The learning rate warms up, stays constant, then cools down (cosine). --steps fixes the step counts;
--max-minutes starts the cool-down from the clock instead, so a run fits a wall-clock budget on a
loaded machine. Either way TRAINING.json records the `--steps N --cooldown-steps D` that reproduce it.
"""
import argparse
import hashlib
import json
import math
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import ByteLevelBPETokenizer
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = Path(__file__).resolve().parent.parent
BPE = ROOT / "host" / "data" / "gpt2-bpe"
DEFAULT_OUT = ROOT / "host" / "data" / "models" / "bundled"
EOT = 50256                      # <|endoftext|>, separates files in the token stream
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
VAL_EVERY = 50                   # every 50th file (sorted order) is held out for validation
SAMPLE_PROMPTS = ["def fibonacci(n):\n", "import os\n"]
SAMPLE_TOKENS = 32


def load_tokenizer() -> ByteLevelBPETokenizer:
    """The GPT-2 byte-level BPE shipped with the package."""
    tok = ByteLevelBPETokenizer(str(BPE / "encoder.json"), str(BPE / "vocab.bpe"))
    assert tok.encode("Hello world").ids == [15496, 995], "GPT-2 BPE did not load"
    return tok


def corpus_files() -> tuple[Path, list[Path]]:
    """The interpreter's standard-library *.py files, sorted, without tests and site-packages."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in sorted(stdlib.rglob("*.py"))
             if not EXCLUDED_DIRS & set(f.relative_to(stdlib).parts[:-1])]
    return stdlib, files


LEADING_INDENT = re.compile(r"^(?:    )+", re.MULTILINE)


def tabify(text: str) -> str:
    """Leading indentation as one tab per 4 spaces: GPT-2's BPE spends a token on every space of
    indentation, which a small model otherwise learns to repeat instead of code."""
    return LEADING_INDENT.sub(lambda m: "\t" * (len(m.group()) // 4), text)


def tokenize_corpus(tok: ByteLevelBPETokenizer, cache_dir: Path) -> dict:
    """Train/val token arrays (uint16, files joined by EOT, indentation as tabs), cached under
    cache_dir by content hash."""
    stdlib, files = corpus_files()
    texts = [tabify(f.read_text(encoding="utf-8", errors="replace")) for f in files]
    digest = hashlib.sha256()
    for f, t in zip(files, texts):
        digest.update(str(f.relative_to(stdlib)).encode() + b"\0" + t.encode() + b"\0")
    key = digest.hexdigest()[:16]
    cache = cache_dir / f"ringgpt-stdlib-tabs-tokens-{key}.npz"
    if cache.exists():
        data = np.load(cache)
        train, val = data["train"], data["val"]
    else:
        ids = [e.ids + [EOT] for e in tok.encode_batch(texts)]
        val = np.array([t for i, s in enumerate(ids) if i % VAL_EVERY == 0 for t in s], dtype=np.uint16)
        train = np.array([t for i, s in enumerate(ids) if i % VAL_EVERY != 0 for t in s], dtype=np.uint16)
        cache_dir.mkdir(parents=True, exist_ok=True)
        np.savez(cache, train=train, val=val)
    return {"train": train, "val": val, "stdlib": str(stdlib), "files": len(files),
            "val_files": len(range(0, len(files), VAL_EVERY)), "sha256_16": key}


def lr_at(step: int, total: int | None, cooldown: int, peak: float, warmup: int, floor: float) -> float:
    """Linear warm-up to peak, constant, then a cosine cool-down over the last `cooldown` of `total` steps
    to floor * peak (total None: cool-down not yet scheduled)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if total is None or step < total - cooldown:
        return peak
    frac = (step - (total - cooldown)) / cooldown
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


def val_windows(val: np.ndarray, ctx: int, count: int) -> torch.Tensor:
    """`count` evenly spaced, fixed windows of ctx+1 tokens from the validation stream."""
    starts = np.linspace(0, len(val) - ctx - 1, count).astype(np.int64)
    return torch.from_numpy(np.stack([val[s:s + ctx + 1] for s in starts]).astype(np.int64))


def next_token_loss(model: GPT2LMHeadModel, w: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean cross-entropy (nats/token) of predicting w[:, 1:] from w[:, :-1]; bf16 autocasts the matmuls."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(w[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), w[:, 1:].flatten())


@torch.no_grad()
def mean_loss(model: GPT2LMHeadModel, windows: torch.Tensor, batch: int, bf16: bool) -> float:
    """Mean next-token loss (nats/token) over the given windows."""
    model.eval()
    total = 0.0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch]
        total += next_token_loss(model, w, bf16).item() * len(w)
    model.train()
    return total / len(windows)


def greedy(model: GPT2LMHeadModel, tok: ByteLevelBPETokenizer, prompt: str, n: int) -> str:
    """Greedy continuation of `prompt` by n tokens (text of the new tokens only)."""
    ids = torch.tensor([tok.encode(prompt).ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, pad_token_id=EOT)
    return tok.decode(out[0, ids.shape[1]:].tolist())


def save_atomically(model: GPT2LMHeadModel, facts: dict, out: Path) -> None:
    """Write the FP16 model and TRAINING.json to a temp dir beside `out`, then swap it in."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bundled-", dir=out.parent))
    model.half().save_pretrained(tmp, safe_serialization=True)
    facts["safetensors_bytes"] = (tmp / "model.safetensors").stat().st_size
    (tmp / "TRAINING.json").write_text(json.dumps(facts, indent=2) + "\n")
    tmp.chmod(0o755)  # mkdtemp makes it private
    for f in tmp.iterdir():
        f.chmod(0o644)
    old = out.parent / f".{out.name}-old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def reproduce_command(parser: argparse.ArgumentParser, args: argparse.Namespace, steps: int, cooldown: int) -> str:
    """The command that reruns this training with fixed step counts (non-default options kept)."""
    parts = ["python scripts/train_bundled_model.py", f"--steps {steps} --cooldown-steps {cooldown}"]
    for k, v in vars(args).items():
        if k not in ("steps", "cooldown_steps", "max_minutes", "cache_dir", "out") and v != parser.get_default(k):
            parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--steps", type=int, help="number of optimizer steps")
    budget.add_argument("--max-minutes", type=float, help="wall-clock budget: start the cool-down when "
                        "1 - cooldown-frac of the training time is spent, and size it from the steps done")
    p.add_argument("--cooldown-steps", type=int, help="cool-down steps with --steps (default: cooldown-frac of it)")
    p.add_argument("--cooldown-frac", type=float, default=0.25)
    p.add_argument("--n-layer", type=int, default=5)
    p.add_argument("--n-head", type=int, default=3, help="heads of size 64 each (n_embd = 64 * n_head)")
    p.add_argument("--ctx", type=int, default=256, help="training context length")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--val-windows", type=int, default=64, help="fixed held-out windows for validation loss")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)

    t0 = time.monotonic()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    tok = load_tokenizer()
    corpus = tokenize_corpus(tok, args.cache_dir)
    train, val = corpus["train"], corpus["val"]
    print(f"corpus: {corpus['files']} files, {len(train)} train + {len(val)} val tokens "
          f"({time.monotonic() - t0:.0f}s)", flush=True)

    config = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=64 * args.n_head, n_head=args.n_head,
                        n_layer=args.n_layer, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=EOT, eos_token_id=EOT)
    model = GPT2LMHeadModel(config)
    model.train()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    vwin = val_windows(val, args.ctx, args.val_windows)

    total = args.steps
    cooldown = args.cooldown_steps or (round(args.cooldown_frac * total) if total else None)
    # --max-minutes: the cool-down starts once this much wall-clock time has passed (90 s kept for the end)
    cooldown_at = t0 + (1 - args.cooldown_frac) * (args.max_minutes * 60 - 90) if args.max_minutes else None
    log, recent = [], []
    step = 0
    while total is None or step < total:
        if total is None and step >= args.warmup and time.monotonic() >= cooldown_at:
            cooldown = round(step * args.cooldown_frac / (1 - args.cooldown_frac))
            total = step + cooldown
            print(f"cool-down from step {step} for {cooldown} steps", flush=True)
        lr = lr_at(step, total, cooldown, args.lr, args.warmup, 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train) - args.ctx - 1, args.batch)
        x = torch.from_numpy(np.stack([train[s:s + args.ctx + 1] for s in starts]).astype(np.int64))
        loss = next_token_loss(model, x, bf16=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        recent = (recent + [loss.item()])[-50:]
        step += 1
        if step % args.eval_every == 0 or step == total:
            v = mean_loss(model, vwin, args.batch, bf16=True)
            log.append({"step": step, "lr": float(f"{lr:.3g}"), "train_loss": round(float(np.mean(recent)), 4),
                        "val_loss": round(v, 4), "minutes": round((time.monotonic() - t0) / 60, 2)})
            print(json.dumps(log[-1]), flush=True)

    model.half().float()  # the weights as saved; final losses and samples are theirs, in FP32
    final_val = mean_loss(model, vwin, args.batch, bf16=False)
    samples = {pr: greedy(model, tok, pr, SAMPLE_TOKENS) for pr in SAMPLE_PROMPTS}
    facts = {
        "command": reproduce_command(p, args, total, cooldown),
        "argv": argv if argv is not None else sys.argv[1:],
        "seed": args.seed, "steps": total, "warmup_steps": args.warmup, "cooldown_steps": cooldown,
        "schedule": "AdamW(0.9, 0.95); LR linear warm-up, constant, cosine cool-down to 0.1 x peak",
        "peak_lr": args.lr, "batch": args.batch, "ctx": args.ctx,
        "tokens_seen": total * args.batch * args.ctx,
        "precision": "training: FP32 weights, bf16 autocast; saved: FP16; final_val_loss: saved weights in FP32",
        "final_train_loss": log[-1]["train_loss"], "final_val_loss": round(final_val, 4),
        "final_val_perplexity": round(math.exp(final_val), 2), "val_windows": args.val_windows,
        "wall_minutes": round((time.monotonic() - t0) / 60, 2),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
        "corpus": {"description": "Python standard library *.py (sorted; test dirs and site-packages excluded); "
                                  f"every {VAL_EVERY}th file held out", **{k: corpus[k] for k in
                                  ("stdlib", "files", "val_files", "sha256_16")},
                   "train_tokens": int(len(train)), "val_tokens": int(len(val))},
        "greedy_samples": samples, "log": log,
    }
    save_atomically(model, facts, args.out)
    print(json.dumps({k: v for k, v in facts.items() if k != "log"}, indent=2))


if __name__ == "__main__":
    main()

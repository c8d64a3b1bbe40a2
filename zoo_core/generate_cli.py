"""``zoo generate MODEL --prompt TEXT``: continue a prompt with a character language model.

The model's ``vocab.json`` (``zoo_core.tokenizer``) encodes the prompt and decodes the new tokens;
decoding is ``zoo_core.generate.generate`` (prefill in parallel, then one ``step`` per token).
Torch is imported only when the command runs, so ``zoo --help`` stays torch-free.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .errors import SpecError
from .hub.pulling import pull
from .tokenizer import CharTokenizer


def _check_args(args: argparse.Namespace) -> None:
    """Usage errors before anything is pulled or loaded."""
    if not args.prompt:
        raise SpecError("--prompt is empty; generation continues a prompt of at least one character")
    if args.max_new_tokens < 0:
        raise SpecError(f"--max-new-tokens must be ≥ 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise SpecError(f"--temperature must be ≥ 0 (0 is greedy decoding), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise SpecError(f"--top-k must be ≥ 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise SpecError(f"--top-p must be in (0, 1], got {args.top_p}")


def continue_text(model_ref: str, prompt: str, *, max_new_tokens: int = 200, temperature: float = 1.0,
                  top_k: int | None = None, top_p: float | None = None, seed: int = 0, compile: bool = False) -> str:
    """The text a model appends to ``prompt`` (temperature 0: greedy, deterministic).

    ``model_ref`` is a saved folder or a reference (``arch.tag``, ``hf-hub:``, ``local-dir:``) whose
    folder ships a ``vocab.json``; the model's eos, if it has one, ends the text early.
    """
    import torch

    from .factory import load_pretrained  # lazy: keeps safetensors, torch out of generate_cli
    from .generate import generate  # lazy: keeps torch out of generate_cli

    folder = Path(model_ref)
    if not folder.is_dir():
        folder = Path(pull(model_ref).path)
    tokenizer = CharTokenizer.from_pretrained(folder)
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long)  # (1, L)
    model = load_pretrained(folder)
    sample = temperature > 0
    out = generate(model, ids, max_new_tokens, do_sample=sample, temperature=temperature if sample else 1.0,
                   top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(seed), compile=compile)
    return tokenizer.decode(out[0, ids.shape[1]:].tolist())


def cmd_generate(args: argparse.Namespace) -> int:
    _check_args(args)
    text = continue_text(args.model, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed, compile=args.compile)
    sys.stdout.write(text + "\n")
    return 0


def register_cli(sub: Any) -> None:
    """Add ``generate`` to the ``zoo`` subparsers."""
    g = sub.add_parser("generate", help="continue a text prompt with a character language model (its vocab.json)",
                       description="Encode --prompt with the model's vocab.json, generate, print the continuation.")
    g.add_argument("model", metavar="MODEL", help="a saved model folder or a reference: arch.tag, hf-hub:org/name[@rev], local-dir:path")
    g.add_argument("--prompt", required=True, help="the text to continue (characters of the model's vocabulary)")
    g.add_argument("--max-new-tokens", type=int, default=200, help="most characters to add (default 200)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy and deterministic (default 1)")
    g.add_argument("--top-k", type=int, help="sample from the k most likely tokens only")
    g.add_argument("--top-p", type=float, help="sample from the smallest set of tokens holding this probability mass")
    g.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0: the same command gives the same text)")
    g.add_argument("--compile", action="store_true",
                   help="decode with the model's step compiled by torch.compile: about 2x the tokens/s on a CPU after "
                        "a one-time compile of tens of seconds, so worth it for long continuations; the same text")
    g.set_defaults(fn=cmd_generate)

"""Registers the synthetic recall tasks. Metadata only: numpy and the generators load when a split is read.

Every variant gives ``train``, ``val`` and ``test`` (``training.protocol: official`` uses them as they
are). Variants of one task that differ only in their test length share the training and
validation sequences exactly (same streams), so a model trained on the base variant is scored on
a longer one with ``zoo eval RUN/best --dataset induction-heads-L4096``. Cards: ``docs/tasks/``.
"""

from __future__ import annotations

from typing import Any

from zoo_core.hookspecs import RegisterSimple, hookimpl

zoo_api = 1

CARDS = "docs/tasks/{name}.md"

# MQAR: name -> (vocab_size, {split: [[length, pairs, count], ...]}, power_a). Zoology's protocol: the
# training mix spans short and long settings (training only on long ones does not generalise,
# zoology #24), the test mix adds more pairs at short lengths and longer sequences.
MQAR: dict[str, tuple[int, dict[str, list[list[int]]], float]] = {
    # the quick one (CI, learnability): 4 x fewer steps than `mqar`
    "mqar-small": (64, {
        "train": [[32, 2, 3000], [64, 4, 3000]],
        "val": [[32, 2, 250], [64, 4, 250]],
        "test": [[32, 2, 250], [32, 4, 250], [64, 8, 250], [128, 16, 250]],
    }, 0.01),
    # zoology's mix at half the lengths and pairs, vocab 256
    "mqar": (256, {
        "train": [[32, 2, 8000], [64, 4, 2000], [128, 8, 2000], [128, 16, 2000], [128, 32, 2000]],
        "val": [[32, 2, 400], [64, 4, 100], [128, 8, 100], [128, 16, 100], [128, 32, 100]],
        "test": [[32, 2, 250], [32, 4, 250], [32, 8, 250], [64, 16, 250], [128, 32, 250], [256, 64, 250]],
    }, 0.01),
    # zoology's own (experiments/mqar_example_configs/original_mqar_configs.py); val: ours (zoology has none)
    "mqar-paper": (8192, {
        "train": [[64, 4, 100_000], [128, 8, 20_000], [256, 16, 20_000], [256, 32, 20_000], [256, 64, 20_000]],
        "val": [[64, 4, 1000], [128, 8, 1000], [256, 16, 1000], [256, 32, 1000], [256, 64, 1000]],
        "test": [[64, 4, 1000], [64, 8, 1000], [64, 16, 1000], [128, 32, 1000], [256, 64, 1000], [512, 128, 1000],
                 [1024, 256, 1000]],
    }, 0.01),
}

# Selective copying and induction heads: train and val at one length, the test split at each length.
SC_TRAIN = {"train": [256, 4000], "val": [256, 500]}
SC_TESTS = {256: 500, 512: 500, 1024: 250, 2048: 128, 4096: 64}
IH_TRAIN = {"train": [256, 4000], "val": [256, 500]}
IH_TESTS = {2**k: min(500, max(64, 2**19 // 2**k)) for k in range(6, 17)}  # 64 .. 65,536 steps
# The CPU-scale protocol (``-short``): train at length 64, where a step costs a quarter of one at 256, so
# a 2-core machine gives each model 4x the updates in the same time; 16,000 sequences (500 updates per
# epoch at batch 32) so that many updates do not revisit a small set; test at 64 .. 65,536 (4,096).
SC_SHORT_TRAIN = {"train": [64, 16000], "val": [64, 500]}
SC_SHORT_TESTS = {2**k: 500 if k <= 8 else SC_TESTS.get(2**k, 64) for k in range(6, 13)}  # 64 .. 4,096
IH_SHORT_TRAIN = {"train": [64, 16000], "val": [64, 500]}
IH_SHORT_TESTS = IH_TESTS


def _settings(settings: list[list[int]]) -> str:
    return " ".join(f"({length}, {pairs})" for length, pairs, _ in settings)


def _variant(base: str, length: int, train_length: int) -> str:
    return base if length == train_length else f"{base}-L{length}"


@hookimpl
def zoo_register_datasets(register: RegisterSimple) -> None:
    for name, (vocab, mix, power_a) in MQAR.items():
        meta = {"sizes": {s: sum(c for _, _, c in mix[s]) for s in mix}, "length": max(L for s in mix for L, _, _ in mix[s])}
        register(name, "zoo_synthetic.mqar:load", task="lm", vocab_size=vocab, unequal_length=True,
                 description=f"MQAR (Zoology), vocab {vocab}, (length, pairs) train {_settings(mix['train'])}; "
                             f"test {_settings(mix['test'])}",
                 source=f"generated (zoo-synthetic, after HazyResearch/zoology multiquery_ar); card {CARDS.format(name='mqar')}",
                 params={"vocab_size": vocab, "mix": mix, "power_a": power_a, "random_non_queries": True, "seed": 0}, **meta)
    for length, count in SC_TESTS.items():
        _register_lengths(register, "selective-copying", "zoo_synthetic.selective_copying:load", SC_TRAIN, length, count,
                          {"num_tokens": 16, "vocab_size": 16},
                          "Selective copying (Mamba §4.1.1): 16 data tokens among noise, copied in order at 16 markers; vocab 16")
    register("selective-copying-paper", "zoo_synthetic.selective_copying:load", task="lm", vocab_size=16, length=4096,
             sizes={"train": 8192, "val": 512, "test": 512},
             description="Selective copying at the Mamba paper's length 4096 (16 data tokens, vocab 16)",
             source="generated (zoo-synthetic, after state-spaces/s4 copying variable=True); "
                    f"card {CARDS.format(name='selective-copying')}",
             params={"splits": {"train": [4096, 8192], "val": [4096, 512], "test": [4096, 512]},
                     "num_tokens": 16, "vocab_size": 16, "seed": 0})
    for length, count in IH_TESTS.items():
        _register_lengths(register, "induction-heads", "zoo_synthetic.induction_heads:load", IH_TRAIN, length, count,
                          {"vocab_size": 16}, "Induction heads (Mamba §4.1.2): recall the token after the special token; vocab 16")
    for length, count in SC_SHORT_TESTS.items():
        _register_lengths(register, "selective-copying-short", "zoo_synthetic.selective_copying:load", SC_SHORT_TRAIN,
                          length, count, {"num_tokens": 16, "vocab_size": 16},
                          "Selective copying (Mamba §4.1.1) at CPU scale: 16 data tokens among noise, copied in order "
                          "at 16 markers; vocab 16", card="selective-copying")
    for length, count in IH_SHORT_TESTS.items():
        _register_lengths(register, "induction-heads-short", "zoo_synthetic.induction_heads:load", IH_SHORT_TRAIN, length,
                          count, {"vocab_size": 16}, "Induction heads (Mamba §4.1.2) at CPU scale: recall the token after "
                          "the special token; vocab 16", card="induction-heads")


def _register_lengths(register: RegisterSimple, base: str, loader: str, train: dict[str, list[int]], length: int, count: int,
                      params: dict[str, Any], what: str, card: str | None = None) -> None:
    """One length variant: the shared train/val at the training length, its own test split at ``length``."""
    train_length = train["train"][0]
    splits = {**train, "test": [length, count]}
    register(_variant(base, length, train_length), loader, task="lm", vocab_size=params["vocab_size"],
             length=max(length, train_length), sizes={s: c for s, (_, c) in splits.items()},
             description=f"{what}; train/val at length {train_length}, test at {length}",
             source=f"generated (zoo-synthetic); card {CARDS.format(name=card or base)}",
             params={"splits": splits, **params, "seed": 0})

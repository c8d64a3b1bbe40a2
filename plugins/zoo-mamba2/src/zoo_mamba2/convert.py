"""Converters for Mamba-2 language-model checkpoints (the ``zoo_core.convert`` protocol).

* ``TRANSFORMERS`` ("transformers-mamba2"): a folder of transformers' ``Mamba2ForCausalLM``
  (``config.json`` with model_type "mamba2", ``model.safetensors`` or shards).
* ``MAMBA_SSM`` ("mamba-ssm-mamba2"): a ``state-spaces/mamba2-*`` folder of mamba_ssm's
  ``MambaLMHeadModel`` with ``ssm_cfg.layer = "Mamba2"`` (``config.json`` + ``pytorch_model.bin``,
  read only through torch's weights-only loader).

Both give the zoo LM: Embedding → depth × (x + Mamba2(RMSNorm(x))) → final RMSNorm → head. The
mixer's parameter names are equal on all sides, so conversion renames prefixes only. The readers
(config, safetensors, weights-only .bin, special tokens) are zoo-mamba's, shared with Mamba-1.
Settings that change only the initialisation or low-precision numerics are accepted and have no
effect; what the zoo cannot express (d_ssm < d_inner, D per channel, MLP or attention layers) is
refused with the field named, and a config that contradicts the weights names every such field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo_core.errors import CheckpointError, ZooError
from zoo_mamba.convert import (
    CONFIG,
    _field,
    _layer_renames,
    _peek,
    _refuse,
    read_config,
    read_safetensors,
    read_torch_bin,
    special_tokens,
)


@dataclass
class Arch2:
    """A Mamba-2 LM's architecture, with the source's name for each field (for error messages)."""

    d_model: int
    n_layer: int
    vocab_size: int
    core: dict[str, Any]  # the zoo core's arguments (d_state, n_heads, head_dim, n_groups, ...)
    eps: float
    tied: bool
    names: dict[str, str]
    notes: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)

    def spec(self, description: str) -> dict[str, Any]:
        return {
            "schema_version": 1, "name": "mamba2-converted", "description": " ".join([description, *self.notes]),
            "task": {"kind": "lm", **self.tokens}, "input": {"vocab_size": self.vocab_size},
            "model": {"d_model": self.d_model, "depth": self.n_layer,
                      "block": {"norm": "rms", "norm_eps": self.eps, "activation": "identity", "output": "none",
                                "residual": True, "prenorm": True, "dropout": 0.0},
                      "final_norm": "rms", "tie_embeddings": self.tied, "core": {"kind": "mamba2", **self.core}},
        }


def _number(v: Any) -> float | None:
    """A JSON number, or transformers' encoding of a non-finite one ({"__float__": "Infinity"})."""
    if isinstance(v, dict) and set(v) == {"__float__"} and v["__float__"] in ("Infinity", "-Infinity"):
        return float(v["__float__"].replace("Infinity", "inf"))
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _limits(value: Any, where: str, key: str) -> dict[str, Any]:
    """A (lo, hi) Δ limit pair -> dt_limit_min/dt_limit_max (an infinite hi is no limit)."""
    pair = [_number(v) for v in value] if isinstance(value, (list, tuple)) and len(value) == 2 else [None]
    lo, hi = (pair + [None])[:2]
    if lo is None or hi is None:
        raise CheckpointError(f"{where}: {key} must be a pair [min, max] of numbers, got {value!r}")
    return {"dt_limit_min": lo, "dt_limit_max": None if math.isinf(hi) else hi}


def check_weights(arch: Arch2, tensors: dict[str, Any], emb_key: str, where: str) -> None:
    """Name every config field the weights contradict."""
    n, c = arch.names, arch.core
    problems: list[str] = []
    emb = tensors.get(emb_key)
    if emb is None or emb.dim() != 2:
        raise CheckpointError(f"{where}: no 2-D embedding {emb_key!r} among the weights; is this a Mamba-2 LM checkpoint?")
    if emb.shape[0] != arch.vocab_size:
        problems.append(f"{n['vocab_size']}: the config gives {arch.vocab_size} tokens, {emb_key} has {emb.shape[0]} rows")
    if emb.shape[1] != arch.d_model:
        problems.append(f"{n['d_model']}: the config says {arch.d_model}, {emb_key} has width {emb.shape[1]}")
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"backbone\.layers\.(\d+)\.", k))}
    if len(layers) != arch.n_layer:
        problems.append(f"{n['n_layer']}: the config says {arch.n_layer} layers, the weights hold {len(layers)}")
    mixer = {k.split(".mixer.", 1)[1]: v for k, v in tensors.items() if k.startswith("backbone.layers.0.mixer.")}
    Di = c["expand"] * arch.d_model
    heads, G, N = c["n_heads"], c["n_groups"], c["d_state"]
    wants = [("A_log", 0, heads, "n_heads", heads), ("conv1d.weight", 2, c["d_conv"], "d_conv", c["d_conv"]),
             ("conv1d.weight", 0, Di + 2 * G * N, "d_state", f"{N} (with n_groups {G}: {Di + 2 * G * N} conv channels)"),
             ("in_proj.weight", 0, 2 * Di + 2 * G * N + heads, "expand", f"{c['expand']} (in_proj rows {2 * Di + 2 * G * N + heads})"),
             ("norm.weight", 0, Di, "expand", f"{c['expand']} (inner width {Di})")]
    for key, dim, want, name, said in wants:
        t = mixer.get(key)
        if t is not None and t.dim() > dim and t.shape[dim] != want:
            problems.append(f"{n[name]}: the config says {said}, layer 0's mixer.{key} has {t.shape[dim]}")
    for key, flag, name in (("in_proj.bias", c["bias"], "bias"), ("conv1d.bias", c["conv_bias"], "conv_bias"),
                            ("norm.weight", c["rmsnorm"], "rmsnorm")):
        if mixer and (key in mixer) != flag:
            problems.append(f"{n[name]}: the config says {flag}, but layer 0's mixer.{key} is "
                            f"{'present' if key in mixer else 'absent'}")
    if problems:
        raise CheckpointError(f"{where}: config.json does not match the weights:\n  " + "\n  ".join(problems))


def build(arch: Arch2, tensors: dict[str, Any], emb_key: str, source: Path, what: str) -> Any:
    """Build the zoo model for ``arch`` and load the renamed tensors strictly (float32)."""
    import torch

    from zoo_core.build import build_model
    from zoo_core.io.strict import compare_state

    try:
        model = build_model(arch.spec(f"Converted from {what} ({source.name})."))
    except ZooError as exc:
        raise CheckpointError(f"{source / CONFIG}: describes a model the zoo cannot build: {exc}") from None
    renames = [(emb_key, "encoder.weight"), ("backbone.norm_f.", "final_norm."), *_layer_renames(arch.n_layer)]
    mapped: dict[str, Any] = {}
    for key, value in tensors.items():
        new = next((repl + key[len(old):] for old, repl in renames if key.startswith(old)), key)
        mapped[new] = value.to(torch.float32) if value.is_floating_point() else value
    lm = mapped.pop("lm_head.weight", None)
    if arch.tied:
        if lm is not None and not torch.equal(lm, mapped.get("encoder.weight", lm)):
            raise CheckpointError(f"{source}: the embeddings are tied in the config, but lm_head.weight differs from the embedding")
        mapped["head.weight"] = mapped["encoder.weight"]
    else:
        if lm is None:
            raise CheckpointError(f"{source}: the embeddings are untied in the config, but there is no lm_head.weight")
        mapped["head.weight"], mapped["head.bias"] = lm, torch.zeros(lm.shape[0])  # the source's head has no bias
    compare_state({k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}, mapped,
                  source=f"{source} ({what}, renamed)")
    model.load_state_dict(mapped, strict=True)
    return model.eval()


# transformers ----------------------------------------------------------------------------------
class TransformersMamba2:
    """transformers' ``Mamba2ForCausalLM`` folders (their bos/eos/pad token ids go into ``task``)."""

    NAMES = {"d_model": "hidden_size", "n_layer": "num_hidden_layers", "vocab_size": "vocab_size",
             "d_state": "state_size", "d_conv": "conv_kernel", "expand": "expand", "n_heads": "num_heads",
             "bias": "use_bias", "conv_bias": "use_conv_bias", "rmsnorm": "(always an RMSNorm)"}

    def detect(self, source: Path) -> bool:
        cfg = _peek(source)
        has_weights = (source / "model.safetensors").is_file() or (source / "model.safetensors.index.json").is_file()
        return cfg is not None and cfg.get("model_type") == "mamba2" and has_weights

    def arch(self, cfg: dict[str, Any], where: str, source: Path | None = None) -> Arch2:
        if cfg.get("model_type") != "mamba2":
            raise CheckpointError(f"{where}: model_type is {cfg.get('model_type')!r}, not 'mamba2'; "
                                  "this is not a transformers Mamba-2 checkpoint")
        f = lambda k, t, d: _field(cfg, k, t, d, where)  # noqa: E731
        H, E = f("hidden_size", int, 4096), f("expand", int, 2)
        heads, P = f("num_heads", int, 128), f("head_dim", int, 64)
        if heads * P != E * H:
            raise CheckpointError(f"{where}: num_heads · head_dim = {heads} · {P} = {heads * P} must equal expand · "
                                  f"hidden_size = {E} · {H} = {E * H}; the config is inconsistent")
        act = f("hidden_act", str, "silu")
        if act != "silu":
            _refuse(where, "hidden_act", act, "the Mamba-2 mixer here uses SiLU, as mamba_ssm does")
        vocab, eps = f("vocab_size", int, 32768), float(f("layer_norm_epsilon", (int, float), 1e-5))
        notes: list[str] = []
        core = {"d_state": f("state_size", int, 128), "d_conv": f("conv_kernel", int, 4), "expand": E,
                "n_heads": heads, "head_dim": P, "n_groups": f("n_groups", int, 8), "chunk_size": f("chunk_size", int, 256),
                "dt_min": float(f("time_step_min", (int, float), 1e-3)), "dt_max": float(f("time_step_max", (int, float), 0.1)),
                "dt_init_floor": float(f("time_step_floor", (int, float), 1e-4)),
                **_limits(cfg.get("time_step_limit", [0.0, math.inf]), where, "time_step_limit"),
                "norm_eps": eps, "norm_before_gate": False, "rmsnorm": True,
                "bias": f("use_bias", bool, False), "conv_bias": f("use_conv_bias", bool, True)}
        return Arch2(d_model=H, n_layer=f("num_hidden_layers", int, 64), vocab_size=vocab, core=core, eps=eps,
                     tied=f("tie_word_embeddings", bool, False), names=self.NAMES, notes=notes,
                     tokens=special_tokens(source, cfg, vocab, notes, where))

    def convert(self, source: Path) -> Any:
        source = Path(source)
        where = str(source / CONFIG)
        arch = self.arch(read_config(source), where, source)
        tensors = read_safetensors(source)
        emb = "backbone.embeddings.weight" if "backbone.embeddings.weight" in tensors else "backbone.embedding.weight"
        check_weights(arch, tensors, emb, where)
        return build(arch, tensors, emb, source, "transformers Mamba2ForCausalLM")


# mamba_ssm -------------------------------------------------------------------------------------
SSM_CFG_KEYS = {"layer", "d_state", "d_conv", "conv_init", "expand", "headdim", "d_ssm", "ngroups", "A_init_range",
                "D_has_hdim", "rmsnorm", "norm_before_gate", "dt_min", "dt_max", "dt_init_floor", "dt_limit", "bias",
                "conv_bias", "chunk_size", "use_mem_eff_path"}


class MambaSSM2:
    """state-spaces/mamba2-* folders: mamba_ssm's ``MambaLMHeadModel`` with Mamba2 layers."""

    NAMES = {"d_model": "d_model", "n_layer": "n_layer", "vocab_size": "vocab_size (padded to pad_vocab_size_multiple)",
             "d_state": "ssm_cfg.d_state", "d_conv": "ssm_cfg.d_conv", "expand": "ssm_cfg.expand",
             "n_heads": "ssm_cfg.headdim (heads = expand · d_model / headdim)", "bias": "ssm_cfg.bias",
             "conv_bias": "ssm_cfg.conv_bias", "rmsnorm": "ssm_cfg.rmsnorm"}

    def detect(self, source: Path) -> bool:
        cfg = _peek(source)
        ssm = cfg.get("ssm_cfg") if cfg is not None else None
        return (cfg is not None and "d_model" in cfg and isinstance(ssm, dict) and ssm.get("layer") == "Mamba2"
                and (source / "pytorch_model.bin").is_file())

    def arch(self, cfg: dict[str, Any], where: str) -> Arch2:
        f = lambda k, t, d: _field(cfg, k, t, d, where)  # noqa: E731
        if f("d_intermediate", int, 0) != 0:
            _refuse(where, "d_intermediate", cfg["d_intermediate"], "MLP layers between the mixers are not part of this model")
        if f("attn_layer_idx", list, []):
            _refuse(where, "attn_layer_idx", cfg["attn_layer_idx"], "attention layers (hybrid models) are not part of this model")
        ssm = f("ssm_cfg", dict, {})
        unknown = sorted(set(ssm) - SSM_CFG_KEYS)
        if unknown:
            _refuse(where, "ssm_cfg keys", unknown, f"known keys are {', '.join(sorted(SSM_CFG_KEYS))}")
        s = lambda k, t, d: _field(ssm, k, t, d, f"{where}: ssm_cfg")  # noqa: E731
        if s("layer", str, "Mamba1") != "Mamba2":
            _refuse(where, "ssm_cfg.layer", ssm.get("layer", "Mamba1"), "this converter reads Mamba-2 layers (Mamba-1: mamba-ssm)")
        if s("D_has_hdim", bool, False):
            _refuse(where, "ssm_cfg.D_has_hdim", True, "D is one scalar per head here, not one per channel")
        H, E = f("d_model", int, 2560), s("expand", int, 2)
        d_ssm = s("d_ssm", (int, type(None)), None)
        if d_ssm is not None and d_ssm != E * H:
            _refuse(where, "ssm_cfg.d_ssm", d_ssm, f"the SSM must span the whole inner width expand · d_model = {E * H}")
        P = s("headdim", int, 64)
        if (E * H) % P:
            raise CheckpointError(f"{where}: ssm_cfg.headdim = {P} must divide expand · d_model = {E * H}")
        vocab, multiple = f("vocab_size", int, 50277), f("pad_vocab_size_multiple", int, 8)
        if multiple < 1:
            raise CheckpointError(f"{where}: pad_vocab_size_multiple must be ≥ 1, got {multiple}")
        padded = math.ceil(vocab / multiple) * multiple
        notes = [] if padded == vocab else [
            f"Vocabulary {vocab} padded to {padded} (pad_vocab_size_multiple {multiple}); rows ≥ {vocab} are padding."]
        if not f("rms_norm", bool, True):
            _refuse(where, "rms_norm", False, "the blocks here use RMSNorm, as the Mamba-2 checkpoints do")
        core = {"d_state": s("d_state", int, 128), "d_conv": s("d_conv", int, 4), "expand": E, "n_heads": E * H // P,
                "head_dim": P, "n_groups": s("ngroups", int, 1), "chunk_size": s("chunk_size", int, 256),
                "dt_min": float(s("dt_min", (int, float), 1e-3)), "dt_max": float(s("dt_max", (int, float), 0.1)),
                "dt_init_floor": float(s("dt_init_floor", (int, float), 1e-4)),
                **_limits(ssm.get("dt_limit", [0.0, math.inf]), where, "ssm_cfg.dt_limit"),
                "rmsnorm": s("rmsnorm", bool, True), "norm_before_gate": s("norm_before_gate", bool, False),
                "norm_eps": 1e-5, "bias": s("bias", bool, False), "conv_bias": s("conv_bias", bool, True)}
        return Arch2(d_model=H, n_layer=f("n_layer", int, 64), vocab_size=padded, core=core, eps=1e-5,
                     tied=f("tie_embeddings", bool, True), names=self.NAMES, notes=notes)

    def convert(self, source: Path) -> Any:
        source = Path(source)
        where = str(source / CONFIG)
        arch = self.arch(read_config(source), where)
        tensors = read_torch_bin(source / "pytorch_model.bin")
        check_weights(arch, tensors, "backbone.embedding.weight", where)
        return build(arch, tensors, "backbone.embedding.weight", source, "mamba_ssm MambaLMHeadModel (Mamba2)")


TRANSFORMERS = TransformersMamba2()
MAMBA_SSM = MambaSSM2()

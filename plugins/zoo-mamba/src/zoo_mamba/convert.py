"""Converters for Mamba language-model checkpoints (the ``zoo_core.convert`` protocol).

* ``TRANSFORMERS`` ("transformers-mamba"): a folder written by transformers'
  ``MambaForCausalLM.save_pretrained``: ``config.json`` (model_type "mamba") and
  ``model.safetensors`` (or shards listed in ``model.safetensors.index.json``).
* ``MAMBA_SSM`` ("mamba-ssm"): a folder of state-spaces/mamba's ``MambaLMHeadModel``:
  ``config.json`` (d_model, n_layer, ssm_cfg, ...) and ``pytorch_model.bin``, read only with
  ``torch.load(weights_only=True)`` and accepted only if it is a flat {name: tensor} dict.

Both give the zoo LM: Embedding → depth × (x + Mamba(RMSNorm(x))) → final RMSNorm → head tied to
the embedding. The mixer's parameter names are the same on all three sides, so conversion renames
the prefixes only. Weights are converted to float32 (lossless from float16/bfloat16). Settings that
change only initialisation (initializer_range, rescale_prenorm_residual) or the numerics of
low-precision runs (residual_in_fp32, fused_add_norm: this model keeps its residual stream in
float32 anyway) are accepted and have no effect; anything the zoo cannot express (other
activations, attention or MLP layers, Mamba-2 layers) is refused with the field named.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo_core.errors import CheckpointError, SpecError, ZooError

CONFIG = "config.json"


@dataclass
class Arch:
    """A Mamba LM's architecture, with the source's name for each field (for error messages)."""

    d_model: int
    n_layer: int
    vocab_size: int
    d_state: int
    d_conv: int
    expand: int
    dt_rank: int | str
    core_init: dict[str, Any]
    conv_bias: bool
    bias: bool
    norm: str
    eps: float
    tied: bool
    names: dict[str, str]
    notes: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)  # bos/eos/pad_token_id of the source's tokenizer

    def spec(self, description: str) -> dict[str, Any]:
        core = {"kind": "mamba", "d_state": self.d_state, "d_conv": self.d_conv, "expand": self.expand,
                "dt_rank": self.dt_rank, "conv_bias": self.conv_bias, "bias": self.bias, **self.core_init}
        return {
            "schema_version": 1, "name": "mamba-converted", "description": " ".join([description, *self.notes]),
            "task": {"kind": "lm", **self.tokens}, "input": {"vocab_size": self.vocab_size},
            "model": {"d_model": self.d_model, "depth": self.n_layer,
                      "block": {"norm": self.norm, "norm_eps": self.eps, "activation": "identity", "output": "none",
                                "residual": True, "prenorm": True, "dropout": 0.0},
                      "final_norm": self.norm, "tie_embeddings": self.tied, "core": core},
        }


# reading configs --------------------------------------------------------------------------------
def read_config(source: Path, name: str = CONFIG) -> dict[str, Any]:
    path = source / name
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing; a checkpoint folder needs its config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _peek(source: Path) -> dict[str, Any] | None:
    try:
        return read_config(source)
    except CheckpointError:
        return None


def _field(cfg: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    value = cfg.get(key, default)
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)))
    if not ok:
        want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise CheckpointError(f"{where}: field {key!r} must be {want}, got {value!r}")
    return value


TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
GENERATION_CONFIG = "generation_config.json"


def special_tokens(source: Path | None, cfg: dict[str, Any], vocab_size: int, notes: list[str], where: str) -> dict[str, int]:
    """bos/eos/pad token ids, as transformers' ``generate`` reads them: ``generation_config.json``
    first, then ``config.json``. Dropping them made ``generate`` run past eos where transformers stops.

    Several eos ids (a list) keep the first, with a note in the description.
    """
    gen_path = None if source is None else source / GENERATION_CONFIG
    gen: dict[str, Any] = {}
    if gen_path is not None and gen_path.is_file():
        gen = read_config(gen_path.parent, GENERATION_CONFIG)
    out: dict[str, int] = {}
    for key in TOKEN_IDS:
        value, said = (gen[key], str(gen_path)) if gen.get(key) is not None else (cfg.get(key), where)
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            if len(value) > 1:
                notes.append(f"The source lists {len(value)} {key}s {value}; generate stops at the first, {value[0]}.")
            value = value[0]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
            raise CheckpointError(f"{said}: {key} must be a token id in [0, {vocab_size}) or null, got {value!r}")
        out[key] = value
    return out


def _refuse(where: str, key: str, value: Any, why: str) -> None:
    raise SpecError(f"{where}: {key} = {value!r} is not supported: {why}")


# weights ----------------------------------------------------------------------------------------
def read_safetensors(source: Path) -> dict[str, Any]:
    """model.safetensors, or the shards of model.safetensors.index.json, read through zoo_core's checks."""
    from zoo_core.io.safetensors_check import read_checked

    single, index = source / "model.safetensors", source / "model.safetensors.index.json"
    if single.is_file():
        return read_checked(single)[0]
    if not index.is_file():
        raise CheckpointError(f"{source}: no model.safetensors (nor model.safetensors.index.json)")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
    tensors: dict[str, Any] = {}
    for shard in shards:
        if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard.startswith("."):
            raise CheckpointError(f"{index}: shard name {shard!r} is not a plain file name")
        tensors.update(read_checked(source / shard)[0])
    return tensors


def read_torch_bin(path: Path) -> dict[str, Any]:
    """A flat {name: tensor} dict from a torch .bin, read with the weights-only unpickler.

    Anything else — objects that need code to rebuild, nested dicts, non-tensor values — is refused
    before it is used; nothing in the file is executed.
    """
    import torch

    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, ...: all mean "refuse"
        msg = " ".join(str(exc).split())[:400]
        raise CheckpointError(
            f"{path}: refused: torch's weights-only loader cannot read it as plain tensors ({type(exc).__name__}: {msg}). "
            "It may hold code or pickled objects, which are never loaded; re-save it as a state dict of tensors "
            "(or as safetensors) in a trusted environment"
        ) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: refused: it holds a {type(obj).__name__}, not a {{name: tensor}} state dict")
    bad = [f"{k!r} ({type(v).__name__})" for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: refused: not a plain state dict of tensors; non-tensor entries: {', '.join(bad[:8])}")
    return {k: v.detach() for k, v in obj.items()}


def _check_against_weights(arch: Arch, tensors: dict[str, Any], emb_key: str, where: str) -> None:
    """Name every config field the weights contradict."""
    n = arch.names
    problems = []
    emb = tensors.get(emb_key)
    if emb is None or emb.dim() != 2:
        raise CheckpointError(f"{where}: no 2-D embedding {emb_key!r} among the weights; is this a Mamba LM checkpoint?")
    if emb.shape[0] != arch.vocab_size:
        problems.append(f"{n['vocab_size']}: the config gives {arch.vocab_size} tokens, {emb_key} has {emb.shape[0]} rows")
    if emb.shape[1] != arch.d_model:
        problems.append(f"{n['d_model']}: the config says {arch.d_model}, {emb_key} has width {emb.shape[1]}")
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"backbone\.layers\.(\d+)\.", k))}
    if len(layers) != arch.n_layer:
        problems.append(f"{n['n_layer']}: the config says {arch.n_layer} layers, the weights hold {len(layers)}")
    mixer = {k.split(".mixer.", 1)[1]: v for k, v in tensors.items() if k.startswith("backbone.layers.0.mixer.")}
    Di = arch.expand * arch.d_model
    # (key, dim, wanted size, config name, what the config says, how a found size reads, its divisor)
    checks: list[tuple[str, int, int, str, str, str, int]] = [
        ("in_proj.weight", 0, 2 * Di, n["expand"], f"{arch.expand} (inner width {Di})", "inner width ", 2),
        ("A_log", 1, arch.d_state, n["d_state"], str(arch.d_state), "", 1),
        ("conv1d.weight", 2, arch.d_conv, n["d_conv"], str(arch.d_conv), "", 1),
    ]
    if isinstance(arch.dt_rank, int):
        checks.append(("dt_proj.weight", 1, arch.dt_rank, n["dt_rank"], str(arch.dt_rank), "", 1))
    for key, dim, want, name, said, found, per in checks:
        t = mixer.get(key)
        if t is not None and t.dim() > dim and t.shape[dim] != want:
            problems.append(f"{name}: the config says {said}, layer 0's mixer.{key} has {found}{t.shape[dim] // per}")
    for key, flag, name in (("in_proj.bias", arch.bias, n["bias"]), ("conv1d.bias", arch.conv_bias, n["conv_bias"])):
        if mixer and (key in mixer) != flag:
            problems.append(f"{name}: the config says {flag}, but layer 0's mixer.{key} is {'present' if key in mixer else 'absent'}")
    if problems:
        raise CheckpointError(f"{where}: config.json does not match the weights:\n  " + "\n  ".join(problems))


def _build(arch: Arch, tensors: dict[str, Any], renames: list[tuple[str, str]], lm_key: str, source: Path, what: str) -> Any:
    """Build the zoo model for ``arch`` and load the renamed tensors strictly (float32)."""
    import torch

    from zoo_core.build import build_model
    from zoo_core.io.strict import compare_state

    try:
        model = build_model(arch.spec(f"Converted from {what} ({source.name})."))
    except ZooError as exc:
        raise CheckpointError(f"{source / CONFIG}: describes a model the zoo cannot build: {exc}") from None
    mapped: dict[str, Any] = {}
    for key, value in tensors.items():
        new = key
        for old, repl in renames:
            if key.startswith(old):
                new = repl + key[len(old):]
                break
        mapped[new] = value.to(torch.float32) if value.is_floating_point() else value
    lm = mapped.pop("head.weight", None) if lm_key == "lm_head.weight" else None
    if arch.tied:
        if lm is not None and not torch.equal(lm, mapped.get("encoder.weight", lm)):
            raise CheckpointError(f"{source}: the embeddings are tied in the config, but lm_head.weight differs from the embedding")
        if "encoder.weight" in mapped:
            mapped["head.weight"] = mapped["encoder.weight"]
    else:
        if lm is None:
            raise CheckpointError(f"{source}: the embeddings are untied in the config, but there is no lm_head.weight")
        mapped["head.weight"] = lm
        mapped["head.bias"] = torch.zeros(lm.shape[0])  # the source's head has no bias
    own = model.state_dict()
    compare_state({k: (tuple(v.shape), v.dtype) for k, v in own.items()}, mapped, source=f"{source} ({what}, renamed)")
    model.load_state_dict(mapped, strict=True)
    return model.eval()


# transformers --------------------------------------------------------------------------------------
class TransformersMamba:
    """transformers' ``MambaForCausalLM`` folders (their bos/eos/pad token ids go into ``task``)."""

    NAMES = {"d_model": "hidden_size", "n_layer": "num_hidden_layers", "vocab_size": "vocab_size",
             "d_state": "state_size", "d_conv": "conv_kernel", "expand": "expand (intermediate_size)",
             "dt_rank": "time_step_rank", "bias": "use_bias", "conv_bias": "use_conv_bias"}

    def detect(self, source: Path) -> bool:
        cfg = _peek(source)
        has_weights = (source / "model.safetensors").is_file() or (source / "model.safetensors.index.json").is_file()
        return cfg is not None and cfg.get("model_type") == "mamba" and has_weights

    def arch(self, cfg: dict[str, Any], where: str, source: Path | None = None) -> Arch:
        """The architecture ``cfg`` describes; ``source``'s generation_config.json, if any, gives the token ids."""
        if cfg.get("model_type") != "mamba":
            raise CheckpointError(f"{where}: model_type is {cfg.get('model_type')!r}, not 'mamba'; "
                                  "this is not a transformers Mamba checkpoint")
        f = lambda k, t, d: _field(cfg, k, t, d, where)  # noqa: E731
        H, E = f("hidden_size", int, 768), f("expand", int, 2)
        inter = f("intermediate_size", int, E * H)
        if inter != E * H:
            raise CheckpointError(f"{where}: intermediate_size = {inter} but expand · hidden_size = {E} · {H} = {E * H}; "
                                  "the config is inconsistent")
        act = f("hidden_act", str, "silu")
        if act != "silu":
            _refuse(where, "hidden_act", act, "the Mamba mixer here uses SiLU, as mamba_ssm does")
        dt_init = f("time_step_init_scheme", str, "random")
        if dt_init not in ("random", "constant"):
            _refuse(where, "time_step_init_scheme", dt_init, "choose 'random' or 'constant'")
        rank = f("time_step_rank", (int, str), "auto")
        if isinstance(rank, str) and rank != "auto":
            raise CheckpointError(f"{where}: time_step_rank must be an int or 'auto', got {rank!r}")
        notes: list[str] = []
        if cfg.get("residual_in_fp32") is False:
            notes.append("residual_in_fp32=false in the source: this float32 model keeps a float32 residual regardless.")
        vocab = f("vocab_size", int, 50280)
        return Arch(
            d_model=H, n_layer=f("num_hidden_layers", int, 32), vocab_size=vocab,
            d_state=f("state_size", int, 16), d_conv=f("conv_kernel", int, 4), expand=E, dt_rank=rank,
            core_init={"dt_min": float(f("time_step_min", (int, float), 1e-3)), "dt_max": float(f("time_step_max", (int, float), 0.1)),
                       "dt_init": dt_init, "dt_scale": float(f("time_step_scale", (int, float), 1.0)),
                       "dt_init_floor": float(f("time_step_floor", (int, float), 1e-4))},
            conv_bias=f("use_conv_bias", bool, True), bias=f("use_bias", bool, False), norm="rms",
            eps=float(f("layer_norm_epsilon", (int, float), 1e-5)), tied=f("tie_word_embeddings", bool, True),
            names=self.NAMES, notes=notes, tokens=special_tokens(source, cfg, vocab, notes, where),
        )

    def convert(self, source: Path) -> Any:
        source = Path(source)
        where = str(source / CONFIG)
        arch = self.arch(read_config(source), where, source)
        tensors = read_safetensors(source)
        emb = "backbone.embeddings.weight" if "backbone.embeddings.weight" in tensors else "backbone.embedding.weight"
        _check_against_weights(arch, tensors, emb, where)
        renames = [(emb, "encoder.weight"), ("backbone.norm_f.", "final_norm."), ("lm_head.weight", "head.weight"),
                   *_layer_renames(arch.n_layer)]
        return _build(arch, tensors, renames, "lm_head.weight", source, "transformers MambaForCausalLM")


def _layer_renames(n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        out += [(f"backbone.layers.{i}.mixer.", f"stack.blocks.{i}.core."), (f"backbone.layers.{i}.norm.", f"stack.blocks.{i}.norm.")]
    return out


# mamba_ssm ---------------------------------------------------------------------------------------
SSM_CFG_KEYS = {"layer", "d_state", "d_conv", "expand", "dt_rank", "dt_min", "dt_max", "dt_init", "dt_scale",
                "dt_init_floor", "conv_bias", "bias", "use_fast_path"}


class MambaSSM:
    """state-spaces/mamba's ``MambaLMHeadModel`` folders (config.json + pytorch_model.bin)."""

    NAMES = {"d_model": "d_model", "n_layer": "n_layer", "vocab_size": "vocab_size (padded to pad_vocab_size_multiple)",
             "d_state": "ssm_cfg.d_state", "d_conv": "ssm_cfg.d_conv", "expand": "ssm_cfg.expand",
             "dt_rank": "ssm_cfg.dt_rank", "bias": "ssm_cfg.bias", "conv_bias": "ssm_cfg.conv_bias"}

    def detect(self, source: Path) -> bool:
        cfg = _peek(source)
        ssm = cfg.get("ssm_cfg") if cfg is not None else None
        layer = ssm.get("layer", "Mamba1") if isinstance(ssm, dict) else "Mamba1"  # Mamba2 folders are zoo-mamba2's
        return cfg is not None and "d_model" in cfg and "n_layer" in cfg and layer != "Mamba2" and (source / "pytorch_model.bin").is_file()

    def arch(self, cfg: dict[str, Any], where: str) -> Arch:
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
        layer = s("layer", str, "Mamba1")
        if layer != "Mamba1":
            _refuse(where, "ssm_cfg.layer", layer, "only Mamba-1 mixers convert (Mamba-2 is a different layer)")
        dt_init = s("dt_init", str, "random")
        if dt_init not in ("random", "constant"):
            _refuse(where, "ssm_cfg.dt_init", dt_init, "choose 'random' or 'constant'")
        expand = s("expand", (int, float), 2)
        if float(expand) != int(expand):
            _refuse(where, "ssm_cfg.expand", expand, "a fractional expand is not supported; use an integer")
        rank = s("dt_rank", (int, str), "auto")
        if isinstance(rank, str) and rank != "auto":
            raise CheckpointError(f"{where}: ssm_cfg.dt_rank must be an int or 'auto', got {rank!r}")
        vocab, multiple = f("vocab_size", int, 50277), f("pad_vocab_size_multiple", int, 8)
        if multiple < 1:
            raise CheckpointError(f"{where}: pad_vocab_size_multiple must be ≥ 1, got {multiple}")
        padded = math.ceil(vocab / multiple) * multiple
        notes = [] if padded == vocab else [
            f"Vocabulary {vocab} padded to {padded} (pad_vocab_size_multiple {multiple}); rows ≥ {vocab} are padding."]
        return Arch(
            d_model=f("d_model", int, 2560), n_layer=f("n_layer", int, 64), vocab_size=padded,
            d_state=s("d_state", int, 16), d_conv=s("d_conv", int, 4), expand=int(expand), dt_rank=rank,
            core_init={"dt_min": float(s("dt_min", (int, float), 1e-3)), "dt_max": float(s("dt_max", (int, float), 0.1)),
                       "dt_init": dt_init, "dt_scale": float(s("dt_scale", (int, float), 1.0)),
                       "dt_init_floor": float(s("dt_init_floor", (int, float), 1e-4))},
            conv_bias=s("conv_bias", bool, True), bias=s("bias", bool, False),
            norm="rms" if f("rms_norm", bool, True) else "layer", eps=1e-5,  # MixerModel's norm_epsilon default
            tied=f("tie_embeddings", bool, True), names=self.NAMES, notes=notes,
        )

    def convert(self, source: Path) -> Any:
        source = Path(source)
        where = str(source / CONFIG)
        arch = self.arch(read_config(source), where)
        tensors = read_torch_bin(source / "pytorch_model.bin")
        _check_against_weights(arch, tensors, "backbone.embedding.weight", where)
        renames = [("backbone.embedding.weight", "encoder.weight"), ("backbone.norm_f.", "final_norm."),
                   ("lm_head.weight", "head.weight"), *_layer_renames(arch.n_layer)]
        return _build(arch, tensors, renames, "lm_head.weight", source, "mamba_ssm MambaLMHeadModel")


TRANSFORMERS = TransformersMamba()
MAMBA_SSM = MambaSSM()

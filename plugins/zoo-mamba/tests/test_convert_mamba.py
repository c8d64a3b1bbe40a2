"""Converting transformers and mamba_ssm checkpoints: parity with transformers (logits to 1e-4
relative, 32 greedy tokens identical to its cached generate), and the bad inputs: a config that
contradicts the weights (every field named), architectures the zoo cannot express, and a .bin that
is not a plain state dict (refused, never executed). Nothing is half-written on failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install -e 'plugins/zoo-mamba[test]' (the Mamba parity oracle)")

from zoo_core import cli  # noqa: E402
from zoo_core.build import build_model  # noqa: E402
from zoo_core.convert import convert_checkpoint, detect_converter  # noqa: E402
from zoo_core.errors import CheckpointError, SpecError  # noqa: E402
from zoo_core.factory import load_pretrained  # noqa: E402
from zoo_core.generate import generate  # noqa: E402

V = 57
ODD = dict(hidden_size=21, state_size=5, conv_kernel=3, expand=2, num_hidden_layers=3, vocab_size=V,
           bos_token_id=None, eos_token_id=None, pad_token_id=None)


def hf_model(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(**{**ODD, **overrides})).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # move every weight off its init (norm weights are all ones there)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def save_hf(model, folder: Path, **kw) -> Path:
    model.save_pretrained(folder, **kw)
    return folder


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def prompt(B=2, L=9, seed=0):
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def hf_default(tmp_path_factory):
    model = hf_model(layer_norm_epsilon=1e-3)  # a large eps, so a lost eps would show
    return model, save_hf(model, tmp_path_factory.mktemp("hf") / "ckpt")


# parity ----------------------------------------------------------------------------------------
def test_transformers_checkpoint_converts_with_logit_and_generation_parity(hf_default, tmp_path):
    ref, src = hf_default
    path, name, _ = convert_checkpoint(src, tmp_path / "zoo")
    assert name == "transformers-mamba"
    ours = load_pretrained(path)
    ids = prompt()
    with torch.no_grad():
        assert rel(ours(ids), ref(ids).logits) < 1e-4
    want = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False, use_cache=True)
    got = generate(ours, ids, 32)
    assert want.shape == (2, 9 + 32) and torch.equal(got, want)
    spec = ours.spec["model"]
    assert spec["block"]["norm_eps"] == 1e-3 and spec["tie_embeddings"] is True
    assert spec["core"]["dt_rank"] == 2 and spec["core"]["d_conv"] == 3


def test_norm_eps_matters(hf_default, tmp_path):
    """The same weights with the default eps differ: the parity above depends on reading layer_norm_epsilon."""
    ref, src = hf_default
    _, _, model = convert_checkpoint(src, tmp_path / "zoo")
    spec = json.loads(json.dumps(model.spec))
    spec["model"]["block"]["norm_eps"] = 1e-5
    wrong = build_model(spec)
    wrong.load_state_dict(model.state_dict())
    ids = prompt()
    with torch.no_grad():
        assert rel(wrong.eval()(ids), ref(ids).logits) > 1e-3


@pytest.mark.parametrize("overrides", [
    {"tie_word_embeddings": False},
    {"use_bias": True, "use_conv_bias": False, "time_step_rank": 3, "expand": 3},
])
def test_config_variants_keep_parity(overrides, tmp_path):
    ref = hf_model(seed=4, **overrides)
    src = save_hf(ref, tmp_path / "hf")
    ours = load_pretrained(convert_checkpoint(src, tmp_path / "zoo")[0])
    ids = prompt(seed=2)
    with torch.no_grad():
        assert rel(ours(ids), ref(ids).logits) < 1e-4
    assert torch.equal(generate(ours, ids, 8), ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False))


def test_sharded_and_half_precision_checkpoints(tmp_path):
    ref = hf_model(seed=5)
    src = save_hf(ref.to(torch.bfloat16), tmp_path / "hf", max_shard_size="20KB")
    assert (src / "model.safetensors.index.json").is_file() and not (src / "model.safetensors").exists()
    _, _, ours = convert_checkpoint(src, tmp_path / "zoo")
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    ref32 = ref.float()  # the bfloat16 weights, exactly, in float32
    ids = prompt()
    with torch.no_grad():
        assert rel(ours(ids), ref32(ids).logits) < 1e-4


def mamba_ssm_folder(ref, folder: Path, *, multiple=8, **cfg_overrides) -> Path:
    """``ref``'s weights in mamba_ssm's layout and names, the vocabulary padded to ``multiple``."""
    folder.mkdir(parents=True)
    sd = {}
    for k, v in ref.state_dict().items():
        sd[k.replace("backbone.embeddings.", "backbone.embedding.")] = v.clone()
    padded = -(-V // multiple) * multiple
    emb = torch.cat([sd["backbone.embedding.weight"], torch.randn(padded - V, ref.config.hidden_size)])
    sd["backbone.embedding.weight"] = emb
    sd["lm_head.weight"] = emb  # tied, as MambaLMHeadModel saves it
    torch.save(sd, folder / "pytorch_model.bin")
    cfg = {"d_model": 21, "n_layer": 3, "vocab_size": V, "d_intermediate": 0,
           "ssm_cfg": {"layer": "Mamba1", "d_state": 5, "d_conv": 3, "expand": 2},
           "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True,
           "pad_vocab_size_multiple": multiple, "tie_embeddings": True, **cfg_overrides}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_mamba_ssm_checkpoint_converts_with_parity(tmp_path):
    ref = hf_model(seed=6, layer_norm_epsilon=1e-5)  # mamba_ssm's norm_epsilon is 1e-5 and not in its config
    src = mamba_ssm_folder(ref, tmp_path / "ssm")
    assert detect_converter(src) == "mamba-ssm"
    path, name, _ = convert_checkpoint(src, tmp_path / "zoo")
    ours = load_pretrained(path)
    assert ours.head.out_features == 64 and "padded to 64" in ours.spec["description"]
    ids = prompt()
    with torch.no_grad():
        assert rel(ours(ids)[..., :V], ref(ids).logits) < 1e-4


def test_mamba_ssm_layernorm_variant_loads_its_biases(tmp_path):
    ref = hf_model(seed=7)
    src = mamba_ssm_folder(ref, tmp_path / "ssm", rms_norm=False)
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    for i in range(3):
        sd[f"backbone.layers.{i}.norm.bias"] = torch.randn(21)
    sd["backbone.norm_f.bias"] = torch.randn(21)
    torch.save(sd, src / "pytorch_model.bin")
    _, _, ours = convert_checkpoint(src, tmp_path / "zoo")
    assert isinstance(ours.final_norm, torch.nn.LayerNorm)
    torch.testing.assert_close(ours.final_norm.bias, sd["backbone.norm_f.bias"])


# bad input ---------------------------------------------------------------------------------------
def edit_config(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("changes,fields", [
    ({"hidden_size": 24, "intermediate_size": 48}, ["hidden_size"]),
    ({"state_size": 6}, ["state_size"]),
    ({"num_hidden_layers": 4}, ["num_hidden_layers"]),
    ({"conv_kernel": 4}, ["conv_kernel"]),
    ({"vocab_size": 60}, ["vocab_size"]),
    ({"use_conv_bias": False, "time_step_rank": 3}, ["use_conv_bias", "time_step_rank"]),
    ({"expand": 3, "intermediate_size": 63, "state_size": 4}, ["expand", "state_size"]),
])
def test_config_that_contradicts_the_weights_names_each_field(hf_default, tmp_path, changes, fields):
    src = edit_config(hf_default[1], tmp_path / "hf", **changes)
    with pytest.raises(CheckpointError) as info:
        convert_checkpoint(src, tmp_path / "zoo")
    for f in fields:
        assert f in str(info.value)
    assert not (tmp_path / "zoo").exists()  # nothing half-written


@pytest.mark.parametrize("changes,exc,match", [
    ({"intermediate_size": 40}, CheckpointError, "intermediate_size = 40 but expand"),
    ({"hidden_act": "gelu"}, SpecError, "hidden_act"),
    ({"time_step_init_scheme": "normal"}, SpecError, "time_step_init_scheme"),
    ({"time_step_rank": "full"}, CheckpointError, "time_step_rank"),
    ({"state_size": "5"}, CheckpointError, "'state_size' must be int"),
    ({"use_bias": 1}, CheckpointError, "'use_bias' must be bool"),
    ({"time_step_min": 0.5, "time_step_max": 0.1}, CheckpointError, "dt_min"),
    ({"model_type": "jamba"}, SpecError, "no registered converter recognises"),  # (mamba2: zoo-mamba2's converter)
])
def test_unsupported_or_malformed_transformers_configs(hf_default, tmp_path, changes, exc, match):
    src = edit_config(hf_default[1], tmp_path / "hf", **changes)
    with pytest.raises(exc, match=match):
        convert_checkpoint(src, tmp_path / "zoo")
    assert not (tmp_path / "zoo").exists()


@pytest.mark.parametrize("changes,match", [
    ({"d_intermediate": 64}, "d_intermediate"),
    ({"attn_layer_idx": [1]}, "attn_layer_idx"),
    ({"ssm_cfg": {"layer": "Mamba3", "d_state": 5, "d_conv": 3}}, "ssm_cfg.layer"),  # (Mamba2: zoo-mamba2's converter)
    ({"ssm_cfg": {"d_state": 5, "d_conv": 3, "headdim": 8}}, "headdim"),
    ({"ssm_cfg": {"d_state": 5, "d_conv": 3, "expand": 1.5}}, "fractional"),
])
def test_unsupported_mamba_ssm_configs_are_refused(tmp_path, changes, match):
    src = mamba_ssm_folder(hf_model(), tmp_path / "ssm", **changes)
    with pytest.raises(SpecError, match=match):
        convert_checkpoint(src, tmp_path / "zoo")


def test_mamba_ssm_config_mismatch_names_padded_vocab_and_d_state(tmp_path):
    src = mamba_ssm_folder(hf_model(), tmp_path / "ssm", vocab_size=100, ssm_cfg={"d_state": 4, "d_conv": 3})
    with pytest.raises(CheckpointError) as info:
        convert_checkpoint(src, tmp_path / "zoo")
    assert "vocab_size (padded to pad_vocab_size_multiple)" in str(info.value) and "ssm_cfg.d_state" in str(info.value)


class _Payload:
    """Unpickling this runs code: it writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_a_bin_that_would_run_code_is_refused_and_not_run(tmp_path):
    src = mamba_ssm_folder(hf_model(), tmp_path / "ssm")
    marker = tmp_path / "pwned"
    sd = torch.load(src / "pytorch_model.bin", weights_only=True)
    sd["backbone.norm_f.weight"] = _Payload(marker)
    torch.save(sd, src / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused"):
        convert_checkpoint(src, tmp_path / "zoo")
    assert not marker.exists() and not (tmp_path / "zoo").exists()
    torch.load(src / "pytorch_model.bin", weights_only=False)  # what a plain pickle load would have done
    assert marker.read_text() == "ran"


@pytest.mark.parametrize("payload,match", [
    (lambda sd: list(sd.values()), "holds a list"),
    (lambda sd: {"model": sd}, "non-tensor entries: 'model'"),
    (lambda sd: {**sd, "step": 3}, "'step' \\(int\\)"),
])
def test_a_bin_that_is_not_a_flat_tensor_dict_is_refused(tmp_path, payload, match):
    src = mamba_ssm_folder(hf_model(), tmp_path / "ssm")
    torch.save(payload(torch.load(src / "pytorch_model.bin", weights_only=True)), src / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=match):
        convert_checkpoint(src, tmp_path / "zoo")


def test_missing_and_unexpected_tensors_are_listed(hf_default, tmp_path):
    from safetensors.torch import load_file, save_file

    src = shutil.copytree(hf_default[1], tmp_path / "hf")
    sd = load_file(src / "model.safetensors")
    del sd["backbone.layers.1.mixer.D"]
    sd["backbone.layers.1.mixer.extra"] = torch.zeros(3)
    save_file(sd, src / "model.safetensors")
    with pytest.raises(CheckpointError, match="stack.blocks.1.core.D") as info:
        convert_checkpoint(src, tmp_path / "zoo")
    assert "stack.blocks.1.core.extra" in str(info.value)


# the command line --------------------------------------------------------------------------------
def test_zoo_convert_on_the_command_line(hf_default, tmp_path, monkeypatch, capsys):
    dst = tmp_path / "zoo"
    assert cli.main(["convert", str(hf_default[1]), str(dst)]) == 0
    assert "converted" in capsys.readouterr().out and load_pretrained(dst).task == "lm"
    assert cli.main(["convert", str(hf_default[1]), str(dst)]) == 2  # exists: refuse
    bad = edit_config(hf_default[1], tmp_path / "bad", state_size=6)
    assert cli.main(["convert", str(bad), str(tmp_path / "out"), "--from", "transformers-mamba"]) == 3
    assert "state_size" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert cli.main(["convert", str(hf_default[1]), str(tmp_path / "o2"), "--from", "mamba-ssm"]) == 3  # no .bin

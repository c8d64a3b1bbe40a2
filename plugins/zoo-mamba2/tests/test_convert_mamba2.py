"""Mamba-2 against transformers (the parity oracle, test-only): the mixer alone in float64 and
float32, and whole converted LMs (logits to 1e-4 relative, 32 greedy tokens, step = forward) at odd
sizes: 3 groups, head_dim 7, an untied head, a chunk size that does not divide L. Then the mamba_ssm
layout and the bad inputs (a config that contradicts the weights names each field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install -e 'plugins/zoo-mamba2[test]' (the parity oracle)")

from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer  # noqa: E402

from zoo_core.convert import convert_checkpoint, detect_converter  # noqa: E402
from zoo_core.errors import CheckpointError  # noqa: E402
from zoo_core.generate import generate  # noqa: E402
from zoo_mamba2.core import Mamba2  # noqa: E402

V = 53
# 6 heads of head_dim 7 = expand 2 · 21, 3 groups, chunk 5 (L = 9, 13: not multiples of it)
ODD = dict(hidden_size=21, num_heads=6, head_dim=7, n_groups=3, state_size=5, conv_kernel=3, expand=2,
           num_hidden_layers=2, vocab_size=V, chunk_size=5, tie_word_embeddings=False, layer_norm_epsilon=1e-3,
           bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _jiggle(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # move every weight off its init (norm weights are ones there)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def hf_lm(seed=0, **over):
    torch.manual_seed(seed)
    return _jiggle(transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**{**ODD, **over})), seed + 1).eval()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    ref = hf_lm()
    src = tmp_path_factory.mktemp("hf") / "ckpt"
    ref.save_pretrained(src)
    assert detect_converter(src) == "transformers-mamba2"
    model = convert_checkpoint(src, src.parent / "zoo")[2].eval()
    return ref, model, src


# the mixer ---------------------------------------------------------------------------------------
# transformers runs its SSM in float32 even in a float64 mixer, hence 1e-6 there
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 1e-4)])
@pytest.mark.parametrize("backend", ["chunked", "sequential"])
def test_the_mixer_equals_transformers_torch_path(dtype, tol, backend):
    cfg = transformers.Mamba2Config(**{**ODD, "time_step_limit": (0.0, 0.08)})
    torch.manual_seed(0)
    hf = _jiggle(Mamba2Mixer(cfg, 0), 3).to(dtype)
    zoo = Mamba2(21, d_state=5, d_conv=3, n_heads=6, n_groups=3, chunk_size=5, norm_eps=1e-3, dt_limit_max=0.08,
                 backend=backend, dtype=dtype)
    zoo.load_state_dict(hf.state_dict())
    x = torch.randn(2, 13, 21, dtype=dtype)
    assert rel(zoo(x), hf(x)) < tol


# whole LMs ---------------------------------------------------------------------------------------
def test_logits_and_greedy_tokens_match_transformers(converted):
    ref, model, _ = converted
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel(model(ids), ref(ids).logits) < 1e-4
        ours = generate(model, ids[:1], 32)
        theirs = ref.generate(ids[:1], max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(ids[:1]))
    assert ours.shape == (1, 9 + 32) and ours[0].tolist() == theirs[0].tolist()  # prompt + 32 greedy tokens


def test_step_decoding_equals_the_parallel_forward(converted):
    model = converted[1].double()
    ids = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(ids)
        state = model.init_state(2)
        steps = []
        for t in range(13):
            y, state = model.step(ids[:, t], state)
            steps.append(y)
    torch.testing.assert_close(torch.stack(steps, 1), whole, rtol=1e-9, atol=1e-9)
    converted[1].float()


# the mamba_ssm layout -----------------------------------------------------------------------------
def _as_mamba_ssm(ref, folder: Path, **cfg_over) -> Path:
    """A state-spaces/mamba2-* folder holding ``ref``'s weights (mamba_ssm names: backbone.embedding)."""
    folder.mkdir(parents=True)
    sd = {k.replace("backbone.embeddings.", "backbone.embedding."): v.clone() for k, v in ref.state_dict().items()}
    torch.save(sd, folder / "pytorch_model.bin")
    cfg = {"d_model": 21, "d_intermediate": 0, "n_layer": 2, "vocab_size": V, "pad_vocab_size_multiple": 1,
           "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True, "tie_embeddings": False,
           "ssm_cfg": {"layer": "Mamba2", "d_state": 5, "d_conv": 3, "expand": 2, "headdim": 7, "ngroups": 3,
                       "chunk_size": 5}, **cfg_over}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_a_mamba_ssm_mamba2_folder_converts_to_the_same_model(tmp_path):
    ref = hf_lm(seed=4, layer_norm_epsilon=1e-5)  # mamba_ssm's norms have eps 1e-5, not in its config
    src = _as_mamba_ssm(ref, tmp_path / "ssm")
    assert detect_converter(src) == "mamba-ssm-mamba2"
    ours = convert_checkpoint(src, tmp_path / "zoo")[2].eval()
    ids = torch.randint(0, V, (1, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert rel(ours(ids), ref(ids).logits) < 1e-4


def test_a_config_that_contradicts_the_weights_names_each_field(converted, tmp_path):
    ref = converted[0]
    ssm = {"layer": "Mamba2", "d_state": 4, "d_conv": 3, "expand": 2, "headdim": 3, "ngroups": 3, "chunk_size": 5}
    src = _as_mamba_ssm(ref, tmp_path / "bad", ssm_cfg=ssm, n_layer=3)
    with pytest.raises(CheckpointError) as info:
        convert_checkpoint(src, tmp_path / "out", converter="mamba-ssm-mamba2")
    msg = str(info.value)
    for name in ("n_layer", "ssm_cfg.headdim", "ssm_cfg.d_state"):
        assert name in msg, msg


@pytest.mark.parametrize("over,field", [({"D_has_hdim": True}, "D_has_hdim"), ({"d_ssm": 14}, "d_ssm"),
                                        ({"layer": "Mamba1"}, "layer")])
def test_what_the_zoo_cannot_express_is_refused_naming_the_field(converted, tmp_path, over, field):
    ssm = {"layer": "Mamba2", "d_state": 5, "d_conv": 3, "expand": 2, "headdim": 7, "ngroups": 3, **over}
    src = _as_mamba_ssm(converted[0], tmp_path / "x", ssm_cfg=ssm)
    with pytest.raises(Exception, match=field):
        convert_checkpoint(src, tmp_path / "out", converter="mamba-ssm-mamba2")


def test_an_inconsistent_transformers_config_is_refused(converted, tmp_path):
    src = converted[2]
    cfg = json.loads((src / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    (bad / "config.json").write_text(json.dumps({**cfg, "num_heads": 7}))
    with pytest.raises(CheckpointError, match="num_heads · head_dim"):
        convert_checkpoint(bad, tmp_path / "out")


def test_a_tied_mamba_ssm_folder_without_lm_head_converts(tmp_path):
    """The released state-spaces/mamba2-* checkpoints tie the head to the embedding."""
    ref = hf_lm(seed=5, layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    src = _as_mamba_ssm(ref, tmp_path / "ssm", tie_embeddings=True)
    sd = torch.load(src / "pytorch_model.bin")
    sd.pop("lm_head.weight", None)
    torch.save(sd, src / "pytorch_model.bin")
    ours = convert_checkpoint(src, tmp_path / "zoo")[2].eval()
    assert ours.spec["model"]["tie_embeddings"] is True
    ids = torch.randint(0, V, (1, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert rel(ours(ids), ref(ids).logits) < 1e-4

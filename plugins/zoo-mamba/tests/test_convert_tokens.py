"""bos/eos/pad token ids survive ``zoo convert`` (they were dropped, so ``generate`` ran past eos where
transformers stops): greedy decoding stops exactly where transformers' ``generate`` stops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="pip install -e 'plugins/zoo-mamba[test]' (the Mamba parity oracle)")

from zoo_core.convert import convert_checkpoint  # noqa: E402
from zoo_core.errors import CheckpointError, SpecError  # noqa: E402
from zoo_core.factory import load_pretrained  # noqa: E402
from zoo_core.generate import generate  # noqa: E402

V = 41
ARCH = dict(hidden_size=16, state_size=4, conv_kernel=3, expand=2, num_hidden_layers=2, vocab_size=V, pad_token_id=None)


def hf_model(**tokens: int | None):
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(transformers.MambaConfig(**ARCH, **tokens)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the init, so greedy decoding wanders through the vocabulary
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _prompt() -> torch.Tensor:
    return torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(3))


def _hf_generate(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, use_cache=True)


@pytest.fixture(scope="module")
def with_eos(tmp_path_factory):
    """A checkpoint whose eos is a token greedy decoding emits for both prompts (at different steps)."""
    free = _hf_generate(hf_model(eos_token_id=None, bos_token_id=None), _prompt(), 24)[:, 5:]
    seen = [set(row.tolist()) for row in free]
    eos = next(t for t in free[0].tolist()[3:] if t in seen[1])  # hit by both rows, not at once
    model = hf_model(eos_token_id=eos, bos_token_id=1)
    folder = tmp_path_factory.mktemp("hf") / "ckpt"
    model.save_pretrained(folder)
    return model, folder, eos


def test_token_ids_are_carried_into_the_converted_spec(with_eos, tmp_path):
    _, src, eos = with_eos
    ours = load_pretrained(convert_checkpoint(src, tmp_path / "zoo")[0])
    assert ours.spec["task"] == {"kind": "lm", "bos_token_id": 1, "eos_token_id": eos}


def test_greedy_generation_stops_where_transformers_stops(with_eos, tmp_path):
    ref, src, eos = with_eos
    ours = load_pretrained(convert_checkpoint(src, tmp_path / "zoo")[0])
    ids = _prompt()
    want = _hf_generate(ref, ids, 24)
    got = generate(ours, ids, 24)  # the model's eos by default
    assert want.shape[1] < 5 + 24, "the test needs transformers to stop early"
    assert torch.equal(got, want)
    assert (got[:, 5:] == eos).any(dim=1).all()


def test_an_explicit_eos_overrides_and_none_disables(with_eos, tmp_path):
    _, src, eos = with_eos
    ours = load_pretrained(convert_checkpoint(src, tmp_path / "zoo")[0])
    ids = _prompt()
    assert generate(ours, ids, 24, eos_token_id=None).shape == (2, 5 + 24)
    free = generate(ours, ids, 24, eos_token_id=None)
    other = int(free[0, 5])  # the first token sequence 0 emits
    stopped = generate(ours, ids, 24, eos_token_id=other)
    assert stopped[0, 5] == other and (stopped[0, 5:] == other).all()
    with pytest.raises(SpecError, match="'model'"):
        generate(ours, ids, 4, eos_token_id="eos")


def test_generation_config_wins_and_bad_token_ids_are_refused(with_eos, tmp_path):
    _, src, eos = with_eos
    copy = tmp_path / "src"
    copy.mkdir()
    for p in Path(src).iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    gen = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [7, eos]}))
    ours = load_pretrained(convert_checkpoint(copy, tmp_path / "zoo")[0])
    assert ours.spec["task"]["eos_token_id"] == 7 and "stops at the first, 7" in ours.spec["description"]
    (copy / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": V + 3}))
    with pytest.raises(CheckpointError, match=r"eos_token_id must be a token id in \[0, 41\)"):
        convert_checkpoint(copy, tmp_path / "zoo2")
    assert not (tmp_path / "zoo2").exists()

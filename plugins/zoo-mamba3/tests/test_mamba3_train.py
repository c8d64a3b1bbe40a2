"""The zoo's workflows on a Mamba-3 model (zoo_core.testing.workflows): one epoch of `zoo train` on
JapaneseVowels, `zoo eval` with adaptive depth, `zoo stream` (step by step = the parallel forward),
save/load."""

from __future__ import annotations

import pytest

from zoo_core.testing.workflows import check_workflows


@pytest.mark.requires("aeon")
def test_train_eval_stream_and_save_load_on_japanese_vowels(tmp_path):
    check_workflows({"kind": "mamba3", "d_state": 4, "headdim": 4, "chunk_size": 8}, tmp_path)

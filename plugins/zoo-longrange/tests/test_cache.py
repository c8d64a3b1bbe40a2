"""The generated-data cache: one generation for concurrent callers of the same key, a key per parameter set."""

from __future__ import annotations

import threading
import time

import numpy as np

from zoo_longrange import cache


def test_concurrent_callers_wait_for_one_generation(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_DATA_DIR", str(tmp_path))
    calls: list[int] = []

    def make() -> dict[str, np.ndarray]:
        calls.append(1)
        time.sleep(0.4)  # the second caller arrives while this one generates
        return {"X": np.arange(5)}

    out: list[dict[str, np.ndarray]] = []
    threads = [threading.Thread(target=lambda: out.append(cache.cached("t", 1, {"a": 1}, make))) for _ in range(2)]
    threads[0].start()
    time.sleep(0.1)
    threads[1].start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(np.array_equal(o["X"], np.arange(5)) for o in out)
    assert cache.key("t", 1, {"a": 1}) != cache.key("t", 1, {"a": 2}) != cache.key("t", 2, {"a": 2})
    monkeypatch.setenv("ZOO_LONGRANGE_CACHE", "0")
    cache.cached("t", 1, {"a": 1}, make)
    assert len(calls) == 2  # off: generated every time

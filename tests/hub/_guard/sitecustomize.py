"""Loaded by subprocesses of the hub tests (PYTHONPATH): refuse any non-loopback connection."""

import os
import socket

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_connect = socket.socket.connect


def _guarded(self, address):  # type: ignore[no-untyped-def]
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOOPBACK:
        raise OSError(f"zoo hub tests: a subprocess tried to connect to {address[0]}:{address[1]}; only loopback is allowed")
    return _connect(self, address)


if os.environ.get("ZOO_TEST_LOOPBACK_ONLY") == "1":
    socket.socket.connect = _guarded  # type: ignore[method-assign]

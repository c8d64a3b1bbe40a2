"""Say a thing once per process: the one helper behind every "logged once" in the zoo.

A degraded or surprising path (``backend: auto`` picking a path, a BatchNorm shared across depth,
a sizing fallback, padded sequences scored without lengths) is announced, but a model built in a
loop or a 200-epoch run must not repeat it 200 times. Before this module each of those places kept
its own private set or flag; one keyed registry means one behaviour and one ``reset`` for tests.

No torch import: the CLI's light commands may use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

_SAID: set[tuple[str, Hashable]] = set()
_LOCK = threading.Lock()


def log_once(logger: logging.Logger, level: int, key: Hashable, msg: str, *args: object) -> bool:
    """Log ``msg % args`` at ``level`` the first time ``key`` is seen for ``logger``; return whether it did.

    Args:
        logger: where the record goes (the key is scoped to its name, so two modules never mute
            each other with the same key).
        level: a ``logging`` level (``logging.INFO``, ``logging.WARNING``, ...).
        key: what makes two calls "the same thing"; usually the formatted message itself, or a
            shorter identity (a core and a reason) when the message holds varying numbers.
        msg, args: passed to ``logger.log`` unchanged (lazy %-formatting).

    A key counts as said even when ``level`` is disabled for ``logger``: enabling logging later
    does not replay it, exactly like the private sets this replaced.
    """
    slot = (logger.name, key)
    with _LOCK:
        if slot in _SAID:
            return False
        _SAID.add(slot)
    logger.log(level, msg, *args)
    return True


def reset_log_once(logger: logging.Logger | None = None) -> None:
    """Forget what was said (for ``logger`` only, or for everyone): tests that assert a message use it."""
    with _LOCK:
        if logger is None:
            _SAID.clear()
        else:
            _SAID.difference_update({slot for slot in _SAID if slot[0] == logger.name})

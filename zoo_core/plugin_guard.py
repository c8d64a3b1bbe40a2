"""What the plugin loader protects against a plugin's code, in-process: global torch state and Ctrl-C.

A plugin is code the user installed and runs with the user's rights, so nothing here is a sandbox:
``os._exit``, monkeypatching zoo-core or torch, or a thread left running cannot be undone. What can
be undone cheaply is global torch state (default dtype, grad mode, threads, default device, ...)
changed while a plugin imports or registers: one ``torch.set_default_dtype(torch.float64)`` there
would otherwise make every pretrained load fail with an integrity error that blames the weights.

torch is touched only when it is already imported, so torch-free commands stay torch-free; when a
plugin itself imports torch, the state torch had right after its own import is the baseline.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, ModuleType
from typing import Any

Getter = Callable[[ModuleType], Any]
Setter = Callable[[ModuleType, Any], None]


def _set_device(torch: ModuleType, device: Any) -> None:
    torch.set_default_device(None if str(device) == "cpu" else device)


def _set_deterministic(torch: ModuleType, value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


# name -> (read, restore); every one is process-wide state a library must leave alone
STATE: dict[str, tuple[Getter, Setter]] = {
    "default dtype": (lambda t: t.get_default_dtype(), lambda t, v: t.set_default_dtype(v)),
    "grad mode": (lambda t: t.is_grad_enabled(), lambda t, v: t.set_grad_enabled(v)),
    "number of threads": (lambda t: t.get_num_threads(), lambda t, v: t.set_num_threads(v)),
    "default device": (lambda t: str(t.get_default_device()), _set_device),
    "deterministic algorithms": (
        lambda t: (t.are_deterministic_algorithms_enabled(), t.is_deterministic_algorithms_warn_only_enabled()),
        _set_deterministic,
    ),
    "anomaly detection": (lambda t: t.is_anomaly_enabled(), lambda t, v: t.set_anomaly_enabled(v)),
    "float32 matmul precision": (
        lambda t: t.get_float32_matmul_precision(), lambda t, v: t.set_float32_matmul_precision(v)
    ),
}


def snapshot(torch: ModuleType) -> dict[str, Any]:
    """The global torch state of ``STATE``; a getter this torch lacks is skipped."""
    out: dict[str, Any] = {}
    for name, (get, _) in STATE.items():
        try:
            out[name] = get(torch)
        except Exception:  # noqa: BLE001 - an older torch without this setting
            continue
    return out


def restore(torch: ModuleType, before: dict[str, Any]) -> list[str]:
    """Put back every setting that differs from ``before``; one line per change ("what: old -> new")."""
    changed = []
    now = snapshot(torch)
    for name, old in before.items():
        if name in now and now[name] != old:
            changed.append(f"{name} {old} -> {now[name]}")
            STATE[name][1](torch, old)
    return changed


class TorchImportWatch(importlib.abc.MetaPathFinder):
    """Records torch's state right after torch's own import, if that happens while installed.

    A plugin that imports torch and then changes a default must be compared with what torch set
    itself (its thread count depends on the machine and ``OMP_NUM_THREADS``), not with constants.
    """

    def __init__(self) -> None:
        self.baseline: dict[str, Any] | None = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        real = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            real(module)
            self.baseline = snapshot(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec

    def baseline_for(self, before: dict[str, Any] | None) -> dict[str, Any] | None:
        """The state to restore: what it was before (torch imported), torch's own defaults (imported
        meanwhile), or None (torch still not imported: nothing to check)."""
        return before if before is not None else self.baseline


@contextlib.contextmanager
def watching_torch_import() -> Iterator[TorchImportWatch]:
    """Install a ``TorchImportWatch`` while plugins load (removed afterwards)."""
    watch = TorchImportWatch()
    if "torch" in sys.modules:
        yield watch
        return
    sys.meta_path.insert(0, watch)
    try:
        yield watch
    finally:
        if watch in sys.meta_path:
            sys.meta_path.remove(watch)


@contextlib.contextmanager
def guarded_torch_state(watch: TorchImportWatch, changes: list[str]) -> Iterator[None]:
    """Run a plugin's import/registration and undo its changes to global torch state afterwards,
    appending one line per change to ``changes`` (the caller reports them)."""
    torch = sys.modules.get("torch")
    before = snapshot(torch) if torch is not None else None
    try:
        yield
    finally:
        baseline = watch.baseline_for(before)
        torch = sys.modules.get("torch")
        if baseline is not None and torch is not None:
            changes.extend(restore(torch, baseline))


class CtrlC:
    """Tells a real Ctrl-C from a ``KeyboardInterrupt`` a plugin raised itself.

    While installed (main thread only), SIGINT sets ``pressed`` before raising as Python's default
    handler does; a KeyboardInterrupt with ``pressed`` unset came from code, i.e. the plugin.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True
        previous = self._previous
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # the application's own handler decides
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[CtrlC]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals reach only the main thread: any KeyboardInterrupt here is raised by code
            return
        self._previous = signal.getsignal(signal.SIGINT)
        if self._previous is signal.SIG_IGN:
            yield self
            return
        signal.signal(signal.SIGINT, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, self._previous)

    def is_users(self, exc: BaseException) -> bool:
        """True when ``exc`` is the user's Ctrl-C (re-raise it), not a plugin's own exception."""
        return isinstance(exc, KeyboardInterrupt) and self.pressed

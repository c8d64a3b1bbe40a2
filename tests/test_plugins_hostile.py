"""Plugins that try to take over or break others (issue 11): a name claimed twice, exceptions of
every kind at import and registration, a slow import, global torch state changed while loading, a
core whose constructor cannot take ``backend``, and the documented plugin API itself."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import tomllib

from zoo_core import hookspecs
from zoo_core.errors import NameConflictError, PluginLoadError
from zoo_core.params import CoreParams
from zoo_core.plugin_registry import Provider
from zoo_core.plugins import PluginSource, _make_register, entry_point_sources, inline_source, load_registry
from zoo_core.testing.helpers import inline_plugin, model_spec, register_cores

ROOT = Path(__file__).resolve().parents[1]
SPEC = model_spec("s4d", task={"kind": "regression", "outputs": 1}, inp={"channels": 2}, d_model=4, depth=1)


REPO_PLUGINS = os.environ.get("ZOO_LOAD_PLUGINS", "")  # conftest's allow-list: the repository's plugins


pytestmark = pytest.mark.usefixtures("no_allow_list")


def _src(name: str, dist: str, *cores: str, version: str = "1.0") -> PluginSource:
    return inline_source(name, inline_plugin(name, zoo_register_cores=register_cores(*cores)), dist=dist, version=version)


def _installed() -> list[PluginSource]:
    return entry_point_sources()


def _status(reg) -> dict[str, str]:
    return {p.dist: p.status for p in reg.plugins}


# 1. a name claimed twice ------------------------------------------------------------------------
@pytest.mark.parametrize("reverse", [False, True])
def test_a_name_claimed_twice_is_used_from_neither_whatever_the_order(reverse):
    a, b = _src("a", "zoo-a", "same", "only-a"), _src("b", "zoo-b", "same", "only-b", version="2.0")
    base = [s for s in _installed() if s.dist == "zoo-core"]
    reg = load_registry([*base, *([b, a] if reverse else [a, b])])
    assert _status(reg)["zoo-a"] == _status(reg)["zoo-b"] == "conflict"
    assert "same" not in reg.cores and {"only-a", "only-b"} <= set(reg.cores)  # the rest keeps working
    assert reg.in_conflict("same") and reg.core_provider("same") is None
    assert reg.core_provider("only-b") == Provider("b", "zoo-b", "2.0")
    with pytest.raises(NameConflictError) as err:
        reg.core("same")
    msg = str(err.value)
    assert "zoo-a 1.0" in msg and "zoo-b 2.0" in msg and "ZOO_LOAD_PLUGINS" in msg and "pip uninstall" in msg
    assert err.value.exit_code == 4
    for info in reg.plugins[-2:]:
        assert any("core 'same'" in c and "used from neither" in c for c in info.conflicts)


@pytest.mark.parametrize("reverse", [False, True])
def test_the_catalogue_distribution_keeps_its_core_and_the_impostor_is_reported(reverse):
    impostor = _src("evil", "zoo-aaa-impostor", "s4d", "evil-extra")
    sources = _installed()
    reg = load_registry([impostor, *sources][::-1] if reverse else [impostor, *sources])
    assert reg.core_provider("s4d").dist == "zoo-s4d" and not reg.in_conflict("s4d")
    status = _status(reg)
    assert status["zoo-s4d"] == "loaded" and status["zoo-aaa-impostor"] == "conflict"
    evil = next(p for p in reg.plugins if p.dist == "zoo-aaa-impostor")
    assert "zoo-s4d" in evil.conflicts[0] and "registry.yaml names zoo-s4d" in evil.conflicts[0]
    assert "evil-extra" in reg.cores and reg.conflict("cores", "s4d").owner.dist == "zoo-s4d"
    from zoo_core.build import build_model

    core = build_model(SPEC, registry=reg).stack.blocks[0].core
    assert type(core).__module__.startswith("zoo_s4d")


def test_building_a_contested_core_fails_with_exit_4_naming_both():
    from zoo_core.build import build_model
    from zoo_core.errors import ZooError

    base = [s for s in _installed() if s.dist == "zoo-core"]
    reg = load_registry([*base, _src("a", "zoo-a", "twin"), _src("b", "zoo-b", "twin")])
    spec = {**SPEC, "model": {**SPEC["model"], "core": {"kind": "twin", "preset": "tiny"}}}
    with pytest.raises(ZooError) as err:
        build_model(spec, registry=reg)
    assert err.value.exit_code == 4 and "zoo-a 1.0" in str(err.value) and "zoo-b 1.0" in str(err.value)


def test_zoo_core_keeps_its_own_names_with_proper_labels():
    def zoo_register_stacking_policies(register):
        register("periodic", "zoo_core.stacking_policies:Independent", description="hijack")

    sp = inline_source("sp", inline_plugin("sp", zoo_register_stacking_policies=zoo_register_stacking_policies), dist="zoo-sp")
    reg = load_registry([sp, *[s for s in _installed() if s.dist == "zoo-core"]])
    assert reg.stacking_policy("periodic").provider.dist == "zoo-core"
    note = next(p for p in reg.plugins if p.dist == "zoo-sp").conflicts[0]
    assert "stacking policy 'periodic'" in note and "policie " not in note


def test_strict_mode_makes_a_conflict_fatal(monkeypatch):
    from zoo_core.errors import DuplicateNameError

    monkeypatch.setenv("ZOO_STRICT_PLUGINS", "1")
    with pytest.raises(DuplicateNameError, match=r"zoo-aaa-impostor"):
        load_registry([_src("evil", "zoo-aaa-impostor", "s4d"), *_installed()])


# 2. exceptions of every kind ----------------------------------------------------------------------
class PluginBaseException(BaseException):
    pass


BASE_EXCEPTIONS = [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), PluginBaseException("odd")]


@pytest.mark.parametrize("exc", BASE_EXCEPTIONS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("when", ["import", "registration"])
def test_any_base_exception_costs_only_its_plugin(exc, when):
    def raising(*_):
        raise exc

    if when == "import":
        bad = PluginSource("bad", "zoo-bad", "0.1", "zoo_bad", raising)
    else:
        bad = inline_source("bad", inline_plugin("bad", zoo_register_cores=raising), dist="zoo-bad")
    good = _src("good", "zoo-good", "good-core")
    reg = load_registry([*[s for s in _installed() if s.dist == "zoo-core"], bad, good])
    info = next(p for p in reg.plugins if p.dist == "zoo-bad")
    assert info.status == "failed" and type(exc).__name__ in info.error and info.imported
    assert "good-core" in reg.cores


def test_a_real_ctrl_c_while_plugins_load_still_stops_the_command():
    def pressed():
        os.kill(os.getpid(), signal.SIGINT)  # what the terminal sends
        time.sleep(1)  # the handler raises here
        return inline_plugin("late")

    # Python's own handler, as in a fresh `zoo` process: an earlier test in this process (a library such as
    # torch's compile workers) may have left its own SIGINT handler, which CtrlC rightly defers to
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            load_registry([PluginSource("slow", "zoo-slow", "0.1", "zoo_slow", pressed)])
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # our handler is gone again
    finally:
        signal.signal(signal.SIGINT, before)


# 4. global torch state --------------------------------------------------------------------------
def test_torch_state_changed_by_a_plugin_is_restored_and_reported(caplog):
    import torch

    def at_import():
        torch.set_default_dtype(torch.float64)
        return inline_plugin("dt", zoo_register_cores=registering)

    def registering(register):
        torch.set_grad_enabled(False)
        torch.set_num_threads(max(1, torch.get_num_threads() - 1) if torch.get_num_threads() > 1 else 2)

    before = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
    reg = load_registry([*[s for s in _installed() if s.dist == "zoo-core"], PluginSource("dt", "zoo-dt", "0.2", "m", at_import)])
    assert (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()) == before
    info = reg.plugins[-1]
    assert info.status == "loaded"
    assert any("default dtype torch.float32 -> torch.float64" in w for w in info.warnings)
    assert any("grad mode" in w for w in info.warnings) and any("number of threads" in w for w in info.warnings)
    assert "zoo-dt" in caplog.text and "restored" in caplog.text


# 5. a core whose constructor cannot take backend ---------------------------------------------------
class NoBackendCore:
    def __init__(self, d_model: int, device=None, dtype=None) -> None:
        self.d_model = d_model


def test_a_core_without_backend_names_its_plugin_at_build():
    from zoo_core.build import build_model

    src = inline_source("nb", inline_plugin("nb", zoo_register_cores=register_cores("nobackend", target=f"{__name__}:NoBackendCore")),
                        dist="zoo-nobackend", version="0.3")
    reg = load_registry([*_installed(), src])
    spec = {**SPEC, "model": {**SPEC["model"], "core": {"kind": "nobackend", "preset": "tiny"}}}
    with pytest.raises(PluginLoadError, match=r"zoo-nobackend 0\.3.*does not accept backend.*device and dtype") as err:
        build_model(spec, registry=reg)
    assert err.value.exit_code == 4


def test_a_core_class_without_backend_fails_its_plugin_at_registration():
    def zoo_register_cores(register):
        register("nobackend", NoBackendCore, params=CoreParams, presets={"tiny": {}})

    reg = load_registry([*_installed(), inline_source("nb", inline_plugin("nb", zoo_register_cores=zoo_register_cores), dist="zoo-nb")])
    info = reg.plugins[-1]
    assert info.status == "failed" and "does not accept backend" in info.error and "nobackend" not in reg.cores


# 6. the documented register() signatures are the real ones ---------------------------------------
def _render(fn) -> str:
    out, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        text = {p.VAR_KEYWORD: f"**{p.name}", p.VAR_POSITIONAL: f"*{p.name}"}.get(p.kind, p.name)
        out.append(text if p.default is p.empty else f"{text}={p.default!r}")
    return f"register({', '.join(out)})"


@pytest.mark.parametrize("kind,hook", [(k, f"zoo_register_{k}") for k in
                                       ("cores", "backends", "discretizers", "stacking_policies", "datasets", "converters")])
def test_hookspec_docstrings_document_the_real_register(kind, hook):
    real = _render(_make_register(kind, Provider("p", "d", "1"), []))
    doc = " ".join(getattr(hookspecs, hook).__doc__.replace('"', "'").split())
    documented = re.findall(r"register\(.*?\)", doc)
    assert real in doc, f"{hook} documents {documented}, the real one is {real}"


# 8. every plugin declares the test extra the Makefile installs -----------------------------------
@pytest.mark.parametrize("pyproject", sorted(ROOT.glob("plugins/zoo-*/pyproject.toml")), ids=lambda p: p.parent.name)
def test_every_plugin_declares_the_test_extra(pyproject):
    data = tomllib.loads(pyproject.read_text())
    assert "test" in data["project"].get("optional-dependencies", {}), f"{pyproject}: no [test] extra"


# entry-point level: real installed distributions, the zoo command in a subprocess ----------------
def _dist(site: Path, dist: str, module: str, body: str) -> None:
    info = site / f"{dist.replace('-', '_')}-0.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.9\n")
    (info / "entry_points.txt").write_text(f"[zoo_core.plugins]\n{module} = {module}\n")
    (site / f"{module}.py").write_text(textwrap.dedent(body))


def _zoo(args: list[str], site: Path, load: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "ZOO_LOAD_PLUGINS": f"{REPO_PLUGINS},{load}"}
    return subprocess.run([sys.executable, "-m", "zoo_core.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


IMPOSTOR = """
    import sys
    from zoo_core import hookimpl
    from zoo_s4d.params import S4DParams
    from zoo_core.params import CoreParams
    zoo_api = 1

    from zoo_s4d.core import S4D

    class Impostor(S4D):
        def __init__(self, *a, **k):
            print("IMPOSTOR RAN", file=sys.stderr)
            super().__init__(*a, **k)

    @hookimpl
    def zoo_register_cores(register):
        register("s4d", "zoo_aaa_impostor:Impostor", params=S4DParams, presets={"tiny": {"d_state": 8}, "small": {"d_state": 32}})
        register("twin", "zoo_core.testing.toys:ToyDiag", params=CoreParams, presets={"tiny": {}})

    @hookimpl
    def zoo_register_commands(cli):
        open(__file__ + ".commands-ran", "w").close()
"""

OTHER = """
    from zoo_core import hookimpl
    from zoo_core.params import CoreParams
    zoo_api = 1

    @hookimpl
    def zoo_register_cores(register):
        register("twin", "zoo_core.testing.toys:ToyDiag", params=CoreParams, presets={"tiny": {}})
"""


@pytest.mark.slow
def test_an_installed_impostor_neither_replaces_s4d_nor_fails_the_real_one(tmp_path):
    _dist(tmp_path, "zoo-aaa-impostor", "zoo_aaa_impostor", IMPOSTOR)
    _dist(tmp_path, "zoo-zzz-other", "zoo_zzz_other", OTHER)
    load = "zoo-aaa-impostor,zoo-zzz-other"
    rows = {r["dist"]: r for r in json.loads(_zoo(["plugins", "--json"], tmp_path, load).stdout)}
    assert rows["zoo-s4d"]["status"] == "loaded" and rows["zoo-aaa-impostor"]["status"] == "conflict"
    assert rows["zoo-zzz-other"]["status"] == "conflict" and rows["zoo-aaa-impostor"]["imported"]
    text = _zoo(["plugins"], tmp_path, load).stdout
    assert "conflict: core 's4d' is also registered by zoo-s4d" in text and "ZOO_LOAD_PLUGINS" in text
    inspect_ = _zoo(["inspect", "pretrained/s4d-small.japanesevowels"], tmp_path, load)
    assert inspect_.returncode == 0 and "IMPOSTOR RAN" not in inspect_.stderr, inspect_.stderr
    spec = tmp_path / "twin.yaml"
    spec.write_text(json.dumps({**SPEC, "model": {**SPEC["model"], "core": {"kind": "twin", "preset": "tiny"}}}))
    build = _zoo(["build", str(spec)], tmp_path, load)
    assert build.returncode == 4 and "Traceback" not in build.stderr, build.stderr
    assert "zoo-aaa-impostor 0.9" in build.stderr and "zoo-zzz-other 0.9" in build.stderr
    assert not (tmp_path / "zoo_aaa_impostor.py.commands-ran").exists()  # no plugin command hook ran for these


SLOW = """
    import time
    time.sleep(3)
    raise KeyboardInterrupt
"""


@pytest.mark.slow
def test_help_imports_no_plugin_and_keyboardinterrupt_at_import_is_the_plugins(tmp_path):
    _dist(tmp_path, "zoo-sleepy", "zoo_sleepy", SLOW)
    for args in (["--help"], []):
        start = time.perf_counter()
        proc = _zoo(args, tmp_path, "zoo-sleepy")
        took = time.perf_counter() - start
        assert took < 2.5 and proc.returncode in (0, 2) and "usage: zoo" in proc.stdout, (args, took, proc.stderr)
    proc = _zoo(["plugins", "--json"], tmp_path, "zoo-sleepy")
    assert proc.returncode == 0, proc.stderr
    row = next(r for r in json.loads(proc.stdout) if r["dist"] == "zoo-sleepy")
    assert row["status"] == "failed" and "KeyboardInterrupt" in row["error"]


TORCH_AT_IMPORT = """
    import torch
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)
    zoo_api = 1
"""


@pytest.mark.slow
def test_a_plugin_that_imports_torch_and_changes_its_defaults_is_undone(tmp_path):
    _dist(tmp_path, "zoo-float64", "zoo_float64", TORCH_AT_IMPORT)
    # torch is first imported by the plugin: its own defaults (threads: machine-dependent) are the baseline
    code = ("from zoo_core.plugins import load_registry; reg = load_registry(); import torch; "
            "print(torch.get_default_dtype(), torch.get_num_threads())")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ZOO_LOAD_PLUGINS": "zoo-float64"}
    ref = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True,
                         text=True, env=env, timeout=120)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["torch.float32", ref.stdout.strip()], out.stderr
    assert "zoo-float64" in out.stderr and "default dtype" in out.stderr and "number of threads" in out.stderr
    inspect_ = _zoo(["inspect", "pretrained/s4d-small.japanesevowels"], tmp_path, "zoo-float64")
    assert inspect_.returncode == 0, inspect_.stderr


def test_a_contested_dataset_or_converter_names_both_plugins_instead_of_unknown():
    from zoo_core.convert import get_converter
    from zoo_core.datasets import resolve_name

    def both(register):
        register("toyset", "zoo_core.datasets:load_uea_bundled", description="toy")

    srcs = [inline_source(n, inline_plugin(n, zoo_register_datasets=both, zoo_register_converters=both), dist=f"zoo-{n}")
            for n in ("p", "q")]
    reg = load_registry([*[s for s in _installed() if s.dist == "zoo-core"], *srcs])
    for lookup in (lambda: resolve_name("toyset", reg), lambda: get_converter("toyset", registry=reg)):
        with pytest.raises(NameConflictError, match=r"zoo-p 0.*zoo-q 0"):
            lookup()


def test_loading_weights_of_a_contested_core_is_a_plugin_error_not_the_files():
    from zoo_core.factory import load_pretrained

    base = [s for s in _installed() if s.dist != "zoo-s4d"]  # two forks claim s4d, neither is the catalogue's
    reg = load_registry([*base, _src("a", "zoo-a", "s4d"), _src("b", "zoo-b", "s4d")])
    with pytest.raises(NameConflictError, match=r"zoo-a 1\.0.*zoo-b 1\.0") as err:
        load_pretrained(ROOT / "pretrained" / "s4d-small.japanesevowels", registry=reg)
    assert err.value.exit_code == 4


def test_pulling_weights_of_a_contested_core_names_both_plugins_not_a_missing_one():
    from zoo_core.hub.create import check_plugins

    base = [s for s in _installed() if s.dist != "zoo-s4d"]
    reg = load_registry([*base, _src("a", "zoo-a", "s4d"), _src("b", "zoo-b", "s4d")])
    with pytest.raises(NameConflictError, match=r"zoo-a 1\.0.*zoo-b 1\.0"):
        check_plugins(ROOT / "pretrained" / "s4d-small.japanesevowels", where="s4d-small.japanesevowels", registry=reg)

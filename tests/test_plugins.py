"""The plugin loader: broken plugins cost only themselves, duplicates and API mismatches are
errors naming the culprits, misspelled hooks are caught, strict mode makes failures fatal."""

from __future__ import annotations

import types

import pytest

from zoo_core import hookimpl
from zoo_core.errors import DuplicateNameError, PluginLoadError
from zoo_core.params import CoreParams
from zoo_core.plugins import PluginSource, entry_point_sources, inline_source, load_registry
from zoo_core.testing.helpers import inline_plugin, register_cores

pytestmark = pytest.mark.usefixtures("no_allow_list")


def _failing_import() -> PluginSource:
    def load():
        raise ModuleNotFoundError("No module named 'zoo_missing_dep'")

    return PluginSource("broken", "zoo-broken", "0.3.1", "zoo_broken.plugin", load)


def _base() -> list[PluginSource]:
    return [s for s in entry_point_sources() if s.dist == "zoo-core"]


@pytest.mark.parametrize("exc", [ModuleNotFoundError("x"), SyntaxError("bad syntax"), RuntimeError("boom"), SystemExit(3)])
def test_import_failure_is_recorded_and_others_load(exc):
    def load():
        raise exc

    good = inline_source("good", inline_plugin("good", zoo_register_cores=register_cores("good-core")))
    reg = load_registry([*_base(), PluginSource("broken", "zoo-broken", "0.3.1", "m", load), good])
    failed = [p for p in reg.plugins if p.status == "failed"]
    assert [(p.dist, p.version) for p in failed] == [("zoo-broken", "0.3.1")]
    assert type(exc).__name__ in failed[0].error
    assert "good-core" in reg.cores


def test_strict_mode_makes_failures_fatal(monkeypatch):
    monkeypatch.setenv("ZOO_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match=r"zoo-broken 0\.3\.1.*No module named"):
        load_registry([*_base(), _failing_import()])


def test_unknown_core_mentions_the_failed_plugin():
    reg = load_registry([*_base(), _failing_import()])
    with pytest.raises(KeyError, match="zoo-broken 0.3.1: import failed"):
        reg.core("broken-core")


def test_duplicate_names_name_both_plugins(monkeypatch):
    a = inline_source("a", inline_plugin("a", zoo_register_cores=register_cores("same", "only-a")), dist="zoo-a", version="1.0")
    b = inline_source("b", inline_plugin("b", zoo_register_cores=register_cores("same", "only-b")), dist="zoo-b", version="2.0")
    reg = load_registry([*_base(), a, b])
    info = reg.plugins[-1]
    assert info.status == "conflict" and "zoo-a 1.0" in info.conflicts[0]
    assert "same" not in reg.cores and {"only-a", "only-b"} <= set(reg.cores)  # neither keeps it; the rest works
    with pytest.raises(DuplicateNameError, match=r"zoo-a 1\.0.*zoo-b 2\.0"):
        reg.core("same")
    monkeypatch.setenv("ZOO_STRICT_PLUGINS", "1")
    with pytest.raises(DuplicateNameError, match=r"zoo-a 1\.0.*zoo-b 2\.0"):
        load_registry([*_base(), a, b])


def test_misspelled_hook_is_caught():
    bad = types.SimpleNamespace(__name__="typo", zoo_api=1, zoo_register_coers=hookimpl(register_cores("x")))
    reg = load_registry([*_base(), inline_source("typo", bad)])
    info = reg.plugins[-1]
    assert info.status == "failed" and "zoo_register_coers" in info.error


def test_wrong_hook_arguments_are_caught():
    def zoo_register_cores(register, extra):
        pass

    reg = load_registry([*_base(), inline_source("args", inline_plugin("args", zoo_register_cores=zoo_register_cores))])
    assert reg.plugins[-1].status == "failed" and "extra" in reg.plugins[-1].error


@pytest.mark.parametrize("api,fragment", [
    (None, "declares no plugin API"), (2, "API 2"), ((3, 4), "(3, 4)"),
    ("1", "must be an int"), (1.0, "must be an int"), (True, "must be an int"),
])
def test_plugin_api_version_is_checked(api, fragment):
    plugin = inline_plugin("old", zoo_register_cores=register_cores("old-core"))
    plugin.zoo_api = api
    reg = load_registry([*_base(), inline_source("old", plugin)])
    assert reg.plugins[-1].status == "failed" and fragment in reg.plugins[-1].error
    assert "old-core" not in reg.cores


def test_raising_registration_drops_only_that_plugin():
    def explode(register):
        register("half-registered", "x:y", params=CoreParams, presets={"tiny": {}})
        raise RuntimeError("registration exploded")

    good1 = inline_source("g1", inline_plugin("g1", zoo_register_cores=register_cores("one")))
    bad = inline_source("bad", inline_plugin("bad", zoo_register_cores=explode))
    good2 = inline_source("g2", inline_plugin("g2", zoo_register_cores=register_cores("two")))
    reg = load_registry([*_base(), good1, bad, good2])
    assert {"one", "two"} <= set(reg.cores) and "half-registered" not in reg.cores
    assert [p.status for p in reg.plugins[-3:]] == ["loaded", "failed", "loaded"]


def test_a_core_without_tiny_preset_is_refused():
    def no_tiny(register):
        register("big-only", "x:y", params=CoreParams, presets={"big": {}})

    reg = load_registry([*_base(), inline_source("nt", inline_plugin("nt", zoo_register_cores=no_tiny))])
    assert reg.plugins[-1].status == "failed" and "tiny" in reg.plugins[-1].error


def test_allow_list_and_autoload_switch(monkeypatch):
    monkeypatch.setenv("ZOO_LOAD_PLUGINS", "")
    reg = load_registry()
    assert not reg.cores and {p.status for p in reg.plugins if p.dist != "zoo-core"} <= {"disabled"}
    assert reg.discretizers  # the essential set always loads
    monkeypatch.setenv("ZOO_LOAD_PLUGINS", "zoo-s4d")
    assert "s4d" in load_registry().cores
    monkeypatch.delenv("ZOO_LOAD_PLUGINS")
    monkeypatch.setenv("ZOO_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert not load_registry().cores


def test_builtins_register_through_entry_points_with_provenance():
    reg = load_registry()
    assert reg.cores["s4d"].provider.dist == "zoo-s4d"
    assert reg.backends[("scan", "naive")].provider.dist == "zoo-core"
    assert {p.name for p in reg.plugins if p.dist == "zoo-core"} == {"backends", "datasets", "discretizers", "stacking"}


def test_loading_changes_no_global_torch_state():
    import torch

    before = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    load_registry()
    assert before == (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())


def test_every_hookspec_is_exercised_by_a_test():
    """datasette's rule: every hook has a test (this file and tests/test_cli.py use them all)."""
    from pathlib import Path

    from zoo_core import hookspecs

    hooks = [n for n in dir(hookspecs) if n.startswith("zoo_register_")]
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    missing = [h for h in hooks if h not in tests.replace("zoo_register_commands\"", "")]
    assert not missing, f"hooks without a test: {missing}"


def test_datasets_and_converters_hooks_register():
    def zoo_register_datasets(register):
        register("toyset", "zoo_core.datasets:load_uea_bundled", description="a toy")

    def zoo_register_converters(register):
        register("toyconv", "zoo_core.io.pretrained:read_folder", description="a toy converter")

    plugin = inline_plugin("dc", zoo_register_datasets=zoo_register_datasets, zoo_register_converters=zoo_register_converters)
    reg = load_registry([*_base(), inline_source("dc", plugin)])
    assert reg.datasets["toyset"].description == "a toy"
    assert reg.converters["toyconv"].load().__name__ == "read_folder"


def test_stacking_policy_hook_registers():
    def zoo_register_stacking_policies(register):
        register("mirror", "zoo_core.stacking_policies:Independent", description="test policy")

    reg = load_registry([*_base(), inline_source("sp", inline_plugin("sp", zoo_register_stacking_policies=zoo_register_stacking_policies))])
    assert reg.stacking_policy("mirror").load()().schedule(3) == [0, 1, 2]


def test_discretizer_and_backend_hooks_register():
    def zoo_register_discretizers(register):
        register("zoh2", "zoo_core.discretize:zoh", structures=("diag",))

    def zoo_register_backends(register):
        register("fastkernel", "kernel", "zoo_core.kernels.kernel:kernel_vandermonde", priority=99, requires=("pykeops_is_not_here",))

    reg = load_registry([*_base(), inline_source("db", inline_plugin("db", zoo_register_discretizers=zoo_register_discretizers, zoo_register_backends=zoo_register_backends))])
    assert "zoh2" in reg.discretizers
    assert "pykeops_is_not_here" in reg.backend("kernel", "fastkernel").unavailable_reason()


def test_broken_model_code_names_its_plugin():
    from zoo_core.build import build_model
    from zoo_core.errors import PluginLoadError

    def zoo_register_cores(register):
        register("lazy", "zoo_lazy_missing.core:Core", params=CoreParams, presets={"tiny": {}})

    reg = load_registry([*_base(), inline_source("lazy", inline_plugin("lazy", zoo_register_cores=zoo_register_cores), dist="zoo-lazy", version="0.2")])
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 4, "depth": 1, "core": {"kind": "lazy"}}}
    with pytest.raises(PluginLoadError, match=r"zoo_lazy_missing.core:Core.*zoo-lazy 0\.2"):
        build_model(spec, registry=reg)


def test_cores_resolve_backends_in_the_registry_of_their_spec():
    """A backend that exists only in a custom registry is usable by build_model(registry=...)."""
    from zoo_core.build import build_model

    def zoo_register_backends(register):
        register("myvander", "kernel", "zoo_core.kernels.kernel:kernel_vandermonde", priority=1)

    reg = load_registry([*entry_point_sources(), inline_source("mine", inline_plugin("mine", zoo_register_backends=zoo_register_backends))])
    spec = {"schema_version": 1, "task": {"kind": "regression", "outputs": 1}, "input": {"channels": 2},
            "model": {"d_model": 4, "depth": 1, "core": {"kind": "s4d", "preset": "tiny", "backend": "myvander"}}}
    model = build_model(spec, registry=reg)
    assert model.stack.blocks[0].core.backend_choice.entries["kernel"].name == "myvander"


def test_auto_ranks_backends_per_device():
    """On CPU the fused C++ scan wins, and where it cannot be built the sequential loop, which beats both
    parallel scans there (benchmarks/REPORT_SCAN.md); the parallel scan elsewhere."""
    from zoo_core.backends import resolve
    from zoo_core.kernels.scan_cpu import unavailable_reason
    from zoo_core.plugin_registry import Problem

    reg = load_registry()
    kw = {"paths": {"recurrent": ("scan",)}, "prefer": ("recurrent",), "reference": {"scan": "naive"}, "who": "t", "registry": reg}
    on_cpu = "cpu-scan" if unavailable_reason() is None else "naive"
    assert resolve("auto", problem=Problem(structure="diag", device="cpu"), **kw).entries["scan"].name == on_cpu
    assert resolve("auto", problem=Problem(structure="diag", device="cuda"), **kw).entries["scan"].name == "scan"
    assert resolve("scan", problem=Problem(structure="diag", device="cpu"), **kw).entries["scan"].name == "scan"


def test_cores_resolve_for_the_device_they_are_built_for():
    from zoo_core.kernels.scan_cpu import unavailable_reason
    from zoo_lru.core import LRU

    layer = LRU(d_model=2, d_state=4)
    assert layer.backend_choice.entries["scan"].name == ("cpu-scan" if unavailable_reason() is None else "naive")  # built on CPU
    assert layer.resolve_backend("auto", who="lru", device="cuda").entries["scan"].name == "scan"


def test_an_api_mismatch_raises_plugin_api_version_error_recorded_as_the_reason(monkeypatch):
    from zoo_core.errors import PluginAPIVersionError
    from zoo_core.plugins import check_api

    with pytest.raises(PluginAPIVersionError, match="API 2"):
        check_api(types.SimpleNamespace(zoo_api=2))
    old = inline_plugin("old", zoo_register_cores=register_cores("old-core"))
    old.zoo_api = 2
    reg = load_registry([*_base(), inline_source("old", old)])
    assert reg.plugins[-1].error.startswith("PluginAPIVersionError: written for zoo plugin API 2")
    monkeypatch.setenv("ZOO_STRICT_PLUGINS", "1")
    with pytest.raises(PluginAPIVersionError, match="plugin 'old' .* failed to load: PluginAPIVersionError"):
        load_registry([*_base(), inline_source("old", old)])


def test_backend_aliases_are_a_registry_feature():
    """A backend may take other names; a name another backend of the op already has reaches the
    alias only where that one cannot serve (Mamba's 'scan' next to zoo-core's parallel 'scan')."""
    from zoo_core.backends import resolve
    from zoo_core.plugin_registry import Problem

    def only_weird(p):
        return None if p.structure == "weird" else "weird systems only"

    def zoo_register_backends(register):
        register("weird-loop", "scan", "zoo_core.kernels.scan:scan_naive", supports=only_weird, aliases=("scan", "wl"))

    reg = load_registry([*entry_point_sources(), inline_source("w", inline_plugin("w", zoo_register_backends=zoo_register_backends))])
    weird, diag = Problem(structure="weird", lti=False), Problem(structure="diag")
    assert reg.backend("scan", "wl").name == "weird-loop"
    assert reg.backend("scan", "scan", weird).name == "weird-loop" and reg.backend("scan", "scan", diag).name == "scan"
    kw = {"paths": {"r": ("scan",)}, "prefer": ("r",), "reference": {"scan": "naive"}, "who": "t", "registry": reg}
    assert resolve("scan", problem=weird, **kw).entries["scan"].name == "weird-loop"
    assert resolve({"scan": "wl"}, problem=weird, **kw).entries["scan"].name == "weird-loop"
    assert resolve("scan", problem=diag, **kw).entries["scan"].name == "scan"


def test_auto_announces_a_fallback_once_and_only_for_an_unavailable_backend(caplog):
    """A faster backend whose probe fails (or whose package is missing) is a fallback: one WARNING per
    process, from the resolver, with the reason and the backend taken. One that does not serve the
    problem (another device) is not. A probe is asked only once the problem fits, so a GPU kernel's
    probe never runs for a CPU problem."""
    import logging

    from zoo_core.backends import resolve
    from zoo_core.logs import reset_log_once
    from zoo_core.plugin_registry import Problem

    probed: list[str] = []

    def gpu_only(p):
        return None if p.device == "cuda" else f"CUDA tensors only, not {p.device!r}"

    def broken_probe(p):
        probed.append(p.device)
        return "the kernel failed its self-test (test)"

    def zoo_register_backends(register):
        register("fused-gpu", "scan", "zoo_core.kernels.scan:scan_naive", priority=90, supports=gpu_only, probe=broken_probe)
        register("fused-cpu", "scan", "zoo_core.kernels.scan:scan_naive", priority=80, probe=broken_probe)
        register("needs-pkg", "scan", "zoo_core.kernels.scan:scan_naive", priority=70, requires=("zoo_no_such_pkg",))

    reg = load_registry([*entry_point_sources(), inline_source("f", inline_plugin("f", zoo_register_backends=zoo_register_backends))])
    kw = {"paths": {"r": ("scan",)}, "prefer": ("r",), "reference": {"scan": "naive"}, "registry": reg}
    reset_log_once()
    with caplog.at_level(logging.INFO, logger="zoo_core.backends"):
        first = resolve("auto", problem=Problem(structure="diag"), who="core A", **kw)
        resolve("auto", problem=Problem(structure="diag"), who="core B", **kw)
    assert first.entries["scan"].name not in ("fused-gpu", "fused-cpu", "needs-pkg")
    assert probed == ["cpu", "cpu"]  # fused-cpu's probe (real ones cache their verdict), never fused-gpu's on a CPU
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and ("'fused-" in r.getMessage() or "'needs-pkg'" in r.getMessage())]  # not cpu-scan's, if g++ is absent
    assert len(warnings) == 2, warnings  # each unavailable one once, though two cores resolved
    (cpu,) = [w for w in warnings if "'fused-cpu'" in w]
    assert "self-test (test)" in cpu and f"slower {first.entries['scan'].name!r}" in cpu and "core A" in cpu
    (pkg,) = [w for w in warnings if "'needs-pkg'" in w]
    assert "zoo_no_such_pkg" in pkg
    assert not any("fused-gpu" in w for w in warnings)  # not for this device: no fallback
    assert len([r for r in caplog.records if r.levelno == logging.INFO and "core A: backend auto" in r.getMessage()]) == 1
    # a backend named in the setting is refused with the probe's reason, not announced
    with pytest.raises(Exception, match="self-test"):
        resolve("fused-cpu", problem=Problem(structure="diag"), who="core C", **kw)


def test_a_backend_whose_checks_raise_costs_only_itself(caplog):
    """A third-party backend whose supports or probe raises is passed over (its reason names the plugin, said
    once); every core still builds on the others. A supports that imports its own missing package reads as that."""
    import logging

    from zoo_core.backends import resolve
    from zoo_core.logs import reset_log_once
    from zoo_core.plugin_registry import Problem

    def supports_raises(p):
        raise ZeroDivisionError("oops in supports")

    def supports_imports(p):
        import zoo_no_such_pkg_either  # noqa: F401

    def probe_raises(p):
        raise RuntimeError("oops in probe")

    def zoo_register_backends(register):
        register("bad-supports", "scan", "zoo_core.kernels.scan:scan_naive", priority=99, supports=supports_raises)
        register("bad-import", "scan", "zoo_core.kernels.scan:scan_naive", priority=98, supports=supports_imports,
                 requires=("zoo_no_such_pkg_either",))
        register("bad-probe", "scan", "zoo_core.kernels.scan:scan_naive", priority=97, probe=probe_raises)

    reg = load_registry([*entry_point_sources(), inline_source("h", inline_plugin("h", zoo_register_backends=zoo_register_backends))])
    kw = {"paths": {"r": ("scan",)}, "prefer": ("r",), "reference": {"scan": "naive"}, "registry": reg, "who": "t"}
    reset_log_once()
    with caplog.at_level(logging.WARNING):
        choice = resolve("auto", problem=Problem(structure="diag"), **kw)
    assert choice.entries["scan"].name not in ("bad-supports", "bad-import", "bad-probe")
    assert reg.backend("scan", "bad-supports").check(Problem(structure="diag"))[0].startswith(
        "its supports check raised ZeroDivisionError: oops in supports (a bug in")
    assert reg.backend("scan", "bad-import").check(Problem(structure="diag")) == (
        "package 'zoo_no_such_pkg_either' is not installed", True)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "oops in supports" in said and "oops in probe" in said  # the plugin's author hears of both


def test_capabilities_come_from_the_params_model_and_must_agree():
    from typing import ClassVar

    class CausalParams(CoreParams):
        capabilities: ClassVar[frozenset[str]] = frozenset({"causal", "step", "initial_state"})

    def agree(register):
        register("c1", "zoo_core.testing.toys:ToyDiag", params=CausalParams, presets={"tiny": {}})

    def disagree(register):
        register("c2", "zoo_core.testing.toys:ToyDiag", params=CausalParams, presets={"tiny": {}}, capabilities={"step"})

    reg = load_registry([*_base(), inline_source("a", inline_plugin("a", zoo_register_cores=agree)),
                         inline_source("d", inline_plugin("d", zoo_register_cores=disagree))])
    assert reg.cores["c1"].capabilities == CausalParams.capabilities
    assert reg.plugins[-1].status == "failed" and "declare them once, on the params model" in reg.plugins[-1].error


def test_register_callbacks_are_typed_protocols():
    import inspect

    from zoo_core import hookspecs

    for hook, proto in [("zoo_register_cores", "RegisterCore"), ("zoo_register_backends", "RegisterBackend"),
                        ("zoo_register_discretizers", "RegisterDiscretizer"), ("zoo_register_datasets", "RegisterSimple")]:
        assert inspect.signature(getattr(hookspecs, hook)).parameters["register"].annotation == proto
        assert hasattr(hookspecs, proto)


def test_built_in_plugins_carry_no_type_ignore():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = [f"{p.relative_to(root)}:{i}" for p in sorted(root.glob("plugins/zoo-*/src/**/*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if "type: ignore" in line]
    assert not found, f"type: ignore in {found}"

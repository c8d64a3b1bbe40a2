"""Bad input in specs: each gives a clear error naming the file, line and key, with a fix."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from zoo_core import hookimpl
from zoo_core.build import build_model
from zoo_core.errors import SpecError
from zoo_core.plugins import entry_point_sources, inline_source, load_registry
from zoo_core.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
GOOD = """\
schema_version: 1
task: {kind: classification, classes: 3}
input: {channels: 2}
model:
  d_model: 8
  depth: 4
  stacking: {policy: periodic, period: 2}
  core:
    kind: s4d
    d_state: 8
    backend: auto
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def error_of(tmp_path: Path, text: str, registry=None) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text), registry=registry)
    return str(info.value)


def test_every_shipped_spec_validates_and_builds():
    specs = sorted(ROOT.glob("specs/**/*.yaml"))
    assert len(specs) >= 5
    for path in specs:
        model = build_model(path, seed=0)
        assert model.spec["schema_version"] == 1, path


def test_normalisation_is_a_fixed_point():
    for path in sorted(ROOT.glob("specs/**/*.yaml")):
        once = load_spec(path).resolved()
        assert load_spec(once).resolved() == once, path


@pytest.mark.parametrize("old,new,expect", [
    ("kind: s4d", "kind: s4dd", ["spec.yaml:9", "model.core.kind", "unknown core 's4dd'", "did you mean 's4d'"]),
    ("d_state: 8", "d_stat: 8", ["spec.yaml:10", "model.core.d_stat", "did you mean 'd_state'"]),
    ("backend: auto", "backend: vandermond", ["spec.yaml:11", "model.core.backend", "did you mean 'vandermonde'"]),
    ("period: 2", "period: 3", ["spec.yaml:7", "model.stacking.period", "does not divide depth 4", "[1, 2, 4]"]),
    ("d_model: 8", "d_model: -8", ["spec.yaml:5", "model.d_model", "greater than 0"]),
    ("d_state: 8", "d_state: 0", ["spec.yaml:10", "model.core.d_state"]),
    ("d_state: 8", "d_state: '8'", ["model.core.d_state", "valid integer"]),
    ("d_state: 8", "d_state: 7", ["d_state must be even"]),
    ("policy: periodic", "policy: periodik", ["model.stacking.policy", "did you mean 'periodic'"]),
    ("depth: 4", "dept: 4", ["model.dept", "did you mean 'depth'"]),
    ("kind: s4d", "kind: s4d\n    preset: tiniest", ["model.core.preset", "no preset 'tiniest'", "did you mean 'tiny'"]),
    ("d_state: 8", "d_state: 8\n    d_model: 8", ["model.core.d_model", "move it to model.d_model"]),
    ("d_state: 8", "d_state: 8\n    discretizer: zho", ["model.core.discretizer"]),
    ("classes: 3", "classes: 3, outputs: 2", ["does not take task.outputs"]),
    ("{policy: periodic, period: 2}", "{policy: periodic}", ["model.stacking.policy", "needs model.stacking.period"]),
    ("{policy: periodic, period: 2}", "{policy: independent, period: 2}", ["model.stacking.period", "takes no period"]),
    # depth recurrence
    ("period: 2}", "period: 2, adaptive: {epsilon: 0}}", ["spec.yaml:7", "model.stacking.adaptive.epsilon", "greater than 0"]),
    ("period: 2}", "period: 2, adaptive: {epsilon: -0.1}}", ["model.stacking.adaptive.epsilon", "greater than 0"]),
    ("period: 2}", "period: 2, adaptive: {min_depth: 6, max_depth: 4}}", ["spec.yaml:7", "model.stacking.adaptive.min_depth", "exceeds the maximum depth 4"]),
    ("period: 2}", "period: 2, adaptive: {min_depth: 6}}", ["model.stacking.adaptive.min_depth", "defaults to the depth"]),
    ("period: 2}", "period: 2, adaptive: {max_depth: 5}}", ["model.stacking.adaptive.max_depth", "multiple of the period 2", "stop_at: block"]),
    ("period: 2}", "period: 2, adaptive: {max_depth: 5, stop_at: blok}}", ["model.stacking.adaptive.stop_at", "'block' or 'period'"]),
    ("period: 2}", "period: 2, adaptive: {epsilon: 0.1, max_dept: 5}}", ["model.stacking.adaptive.max_dept", "did you mean 'max_depth'"]),
    ("period: 2}", "period: 2, norms: per_position, adaptive: {max_depth: 8}}", ["model.stacking.adaptive.max_depth", "norms: per_position"]),
    ("period: 2}", "period: 2, norms: per_layer}", ["model.stacking.norms", "'shared' or 'per_position'"]),
    ("period: 2}", "period: 2, damping: 1.5}", ["spec.yaml:7", "model.stacking.damping", "(0, 1]"]),
    ("period: 2}", "period: 2, damping: 0.0}", ["model.stacking.damping", "(0, 1]"]),
    ("period: 2}", "period: 2, damping: 0.5, damping_init: 0.3}", ["model.stacking.damping_init", "damping: learned"]),
    ("period: 2}", "period: 2, damping: learned, damping_init: 1.0}", ["model.stacking.damping_init", "less than 1"]),
    # backbone pieces
    ("  core:", "  encoder: {kind: mpl}\n  core:", ["model.encoder.kind", "'linear' or 'mlp'"]),
    ("  core:", "  block: {preset: lrcssm, output: linear}\n  core:", ["model.block", "does not apply to layout 'lrcssm'"]),
])
def test_bad_specs_name_file_line_key_and_fix(tmp_path, old, new, expect):
    msg = error_of(tmp_path, GOOD.replace(old, new))
    for fragment in expect:
        assert fragment in msg, (fragment, msg)


def test_missing_plugin_gives_install_hint(tmp_path, monkeypatch):
    import yaml

    from zoo_core.plugin_catalogue import default_path

    catalogue = yaml.safe_load(default_path().read_text())
    catalogue["planned"] = {"zoo-hyena": {"cores": ["hyena"]}}  # a family not released yet
    (tmp_path / "registry.yaml").write_text(yaml.safe_dump(catalogue))
    monkeypatch.setenv("ZOO_REGISTRY", str(tmp_path / "registry.yaml"))
    msg = error_of(tmp_path, GOOD.replace("kind: s4d", "kind: hyena").replace("    d_state: 8\n", ""))
    assert "zoo-hyena" in msg and "planned" in msg and "spec.yaml:9" in msg
    monkeypatch.setenv("ZOO_LOAD_PLUGINS", "")
    msg = error_of(tmp_path, GOOD, registry=load_registry())
    assert "zoo-s4d" in msg and "pip install -e plugins/zoo-s4d" in msg and "spec.yaml:9" in msg


def test_backends_that_cannot_serve_give_the_reason(tmp_path):
    msg = error_of(tmp_path, GOOD.replace("backend: auto", "backend: {kernel: vandermonde, scan: naive}"))
    assert "does not fit" in msg and "conv uses kernel+conv" in msg

    keops = type("P", (), {})()
    keops.__name__ = "keops"
    keops.zoo_api = 1
    keops.zoo_register_backends = hookimpl(lambda register: register(
        "fastkernel", "kernel", "zoo_core.kernels.kernel:kernel_vandermonde", priority=1, requires=("pykeops_not_installed",)))
    reg = load_registry([*entry_point_sources(), inline_source("keops", keops)])
    msg = error_of(tmp_path, GOOD.replace("backend: auto", "backend: fastkernel"), registry=reg)
    assert "cannot serve core 's4d'" in msg and "'pykeops_not_installed' is not installed" in msg


@pytest.mark.parametrize("text,fragment", [
    ("schema_version: 1\ntask: [unclosed\n", "spec.yaml:"),
    ("a: 1\na: 2\n", "duplicate"),
    ("!!python/object/apply:os.system ['true']\n", "tag"),
    ("", "empty"),
])
def test_malformed_yaml(tmp_path, text, fragment):
    assert fragment in error_of(tmp_path, text)


def test_alias_bomb_rejected_fast(tmp_path):
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i-1}"] * 9) + "]" for i in range(1, 10)]
    t = time.perf_counter()
    assert "alias" in error_of(tmp_path, "\n".join(lines) + "\n")
    assert time.perf_counter() - t < 0.5


def test_yaml_12_numbers(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("backend: auto", "backend: auto\n    dt_min: 1e-4\n    dt_max: 1e-1")))
    assert spec.core_params.dt_min == 1e-4


def test_spec_never_imports_what_it_names(tmp_path, monkeypatch):
    import importlib

    seen = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: seen.append(name) or real(name, *a))
    error_of(tmp_path, GOOD.replace("kind: s4d", "kind: os.path:join"))
    assert not any("os" == n.split(".")[0] for n in seen)

"""The benchmark harness (``python -m benchmarks``): its CLI, the case generator and the renderer.

Nothing here times anything: the CLI is listed, cases are generated and checked for coverage, the
agreement check is run on a deliberately wrong implementation, and a tiny hand-written JSONL is
rendered.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> dict[str, ModuleType]:
    """The harness's modules, imported as ``python -m benchmarks`` would (from the repository root)."""
    monkeypatch.syspath_prepend(str(ROOT))
    return {m: importlib.import_module(f"benchmarks.{m}") for m in ("harness", "cases", "catalog", "render")}


def test_list_runs_from_the_repository_root() -> None:
    res = subprocess.run([sys.executable, "-m", "benchmarks", "list", "s4d"], cwd=ROOT, capture_output=True,
                         text=True, check=False, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "s4d/layer" in res.stdout and "s4d/kernel" in res.stdout
    assert "straightforward" in res.stdout and "kernel=vandermonde conv=fft" in res.stdout


def test_list_refuses_an_unknown_family_with_the_fix() -> None:
    res = subprocess.run([sys.executable, "-m", "benchmarks", "list", "no-such-core"], cwd=ROOT,
                         capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 2 and "python -m benchmarks list" in res.stderr and "Traceback" not in res.stderr


def test_every_registered_core_has_a_layer_family_with_every_backend_choice(bench: dict[str, ModuleType]) -> None:
    from zoo_core.backends import all_choices
    from zoo_core.plugins import get_registry

    reg, cases = get_registry(), bench["cases"]
    fams = bench["catalog"].families()
    for core, entry in reg.cores.items():
        fam = fams.get(f"{core}/layer")
        assert fam is not None, f"no benchmark family for registered core {core!r}"
        cls = entry.load()
        names = {i.name for i in fam.impls()}
        paths, problem, _ = cases.plan_of(cls)
        for choice in all_choices(paths=paths, problem=problem, registry=reg):
            assert cases.choice_name(choice.path, choice.as_setting()) in names, (core, choice.label())
        assert fam.ref() in names, f"{core}: its reference {fam.ref()!r} is not among {sorted(names)}"


def test_kernel_family_follows_the_registered_kernel_backends(bench: dict[str, ModuleType]) -> None:
    from zoo_core.plugins import get_registry

    fam = bench["catalog"].families()["s4d/kernel"]
    names = {i.name for i in fam.impls()}
    problem = get_registry().core("s4d").load().problem
    for (op, name), entry in get_registry().backends.items():
        if op == "kernel" and (entry.supports_fn is None or entry.supports_fn(problem) is None):
            assert f"kernel={name}" in names
    assert "straightforward_kernel" in names  # the peer, from zoo_s4d.reference


def test_agreement_check_stops_a_wrong_implementation(bench: dict[str, ModuleType]) -> None:
    import torch

    cases = bench["cases"]
    s4d = bench["catalog"].families()["s4d/layer"]

    def wrong(s: dict[str, int], mode: str) -> Any:
        built = s4d.impls()[0].build(s, mode)
        with torch.no_grad():
            built.module.D.add_(1.0)  # type: ignore[union-attr]
        return built

    fam = cases.with_impls(s4d, lambda: [cases.Impl("broken", wrong, origin="peer")])
    with pytest.raises(AssertionError, match="broken L=37"):
        cases.check_layers(fam)


def _rows() -> list[dict[str, Any]]:
    base = {"schema": 2, "bench": "REPORT.md", "run": "r1", "threads": 2, "family": "s4d/layer", "kind": "layer",
            "L": 64, "B": 4,
            "mode": "fwd", "workload": "s4d/layer B=4 L=64 fwd", "foreign": 0.01, "status": "ok", "n": 3}
    return [
        {"schema": 2, "bench": "REPORT.md", "kind": "check", "workload": "agreement", "impl": "all", "run": "r1",
         "errors": {"x L=37": 3e-6}},
        {**base, "bench": "REPORT_SCAN.md", "impl": "another report's row", "median_s": 1.0},
        {**base, "impl": "straightforward", "median_s": 0.2, "q25_s": 0.19, "q75_s": 0.21},
        {**base, "impl": "kernel=vandermonde conv=fft", "median_s": 0.05, "q25_s": 0.049, "q75_s": 0.051},
        {**base, "impl": "scan=scan", "status": "skipped", "reason": "too big", "median_s": None},
        {**base, "kind": "memory", "workload": "memory s4d/kernel L=64 fwd", "impl": "kernel=vandermonde",
         "core": "s4d", "median_s": None, "peak_mib": 12.4, "floors": {"(H, L) float32 output": 2**21}},
        {"kind": "run", "run": "r1", "workload": "run", "impl": "-", "median_s": None, "commit": "abc1234",
         "cmd": "python -m benchmarks run s4d --L 64", "machine": {"cpu": "Test CPU", "logical_cpus": 2},
         "total_s": 60.0},
    ]


def test_renderer_turns_jsonl_into_markdown_with_ratios_floors_and_findings(
        bench: dict[str, ModuleType], tmp_path: Path) -> None:
    render = bench["render"]
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    (tmp_path / "REPORT.md").write_text("## Targets\n\nA finding, kept verbatim: **4.0×**.\n")
    md = render.render(render.REPORTS["REPORT.md"], path, findings_dir=tmp_path)
    assert "| implementation | median | IQR | n | tokens/s | vs straightforward | foreign |" in md
    assert "| kernel=vandermonde conv=fft | 50.0 ms | 49.0 ms – 51.0 ms | 3 | 5,120 | 4.00× | 0.01 |" in md
    assert "| straightforward | 200.0 ms |" in md and "1.00×" in md
    assert "- scan=scan skipped: too big." in md
    assert "A finding, kept verbatim: **4.0×**." in md
    assert "Measured at commit `abc1234`." in md and "python -m benchmarks run s4d --L 64" in md
    assert "| s4d B=4 | 64 | fwd | 12 | 2 |" in md  # peak MiB beside the (H, L) floor
    assert "python -m benchmarks report REPORT.md" in md
    assert "another report's row" not in md and "max relative error 3.0e-06" in md


def test_renderer_reads_the_pre_harness_rows_unchanged(bench: dict[str, ModuleType], tmp_path: Path) -> None:
    """Old script rows (no schema, Mamba's kind 'result') render with their own numbers."""
    render = bench["render"]
    rows = [{"kind": "run", "run": "o1", "machine": {"cpu": "Old CPU"}, "repeats": 3, "argv": []},
            {"kind": "result", "run": "o1", "threads": 2, "workload": "mixer Di=128 L=256 fwd", "impl": "zoo-scan",
             "D": 128, "L": 256, "mode": "fwd", "foreign": 0.0, "median_s": 0.0122, "q25_s": 0.0104,
             "q75_s": 0.0128, "n": 3, "peak_mib": 21.1},
            {"kind": "result", "run": "o1", "threads": 2, "workload": "mixer Di=128 L=256 fwd", "impl": "mambapy",
             "D": 128, "L": 256, "mode": "fwd", "foreign": 0.0, "median_s": 0.0434, "q25_s": 0.0418,
             "q75_s": 0.0444, "n": 3, "peak_mib": 120.8}]
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = render.render(render.REPORTS["REPORT_MAMBA.md"], path, findings_dir=tmp_path)
    assert "| mambapy | 43.4 ms | 41.8 ms – 44.4 ms | 3 | 0.28× | 120.8 | 0.00 |" in md
    assert "recorded no commit" in md


def test_fmt_t_and_the_slow_call_prediction(bench: dict[str, ModuleType]) -> None:
    fmt_t = bench["harness"].fmt_t
    assert (fmt_t(None), fmt_t(0.0123), fmt_t(2.5)) == ("–", "12.3 ms", "2.50 s")
    runner = importlib.import_module("benchmarks.runner")
    h = runner.History()
    key = ("f", "i", "fwd", 1)
    h.points[key] = [(1024, 1.0), (2048, 4.0)]  # quadratic so far
    assert h.predict(key, 4096) == pytest.approx(16.0)
    h.points[key] = [(1024, 1.0)]
    assert h.predict(key, 4096) == pytest.approx(4.0) and h.predict(key, 512) is None


def test_every_family_feeds_a_report_the_renderer_knows(bench: dict[str, ModuleType]) -> None:
    """A family whose rows no report renders would be measured for nothing."""
    reports = bench["render"].REPORTS
    for name, fam in bench["catalog"].families().items():
        assert fam.report in reports, f"{name} writes rows for {fam.report}, which no ReportSpec renders"


def test_kernel_check_stops_a_wrong_kernel(bench: dict[str, ModuleType]) -> None:
    cases = bench["cases"]
    s4d = bench["catalog"].families()["s4d/kernel"]
    good = next(i for i in s4d.impls() if i.name == "kernel=vandermonde")

    def wrong(s: dict[str, int], mode: str) -> Any:
        built = good.build(s, mode)
        out = built.output
        assert out is not None
        built.output = lambda: 1.01 * out()
        return built

    fam = cases.with_impls(s4d, lambda: [cases.Impl("off by 1%", wrong)])
    with pytest.raises(AssertionError, match="off by 1% L=37"):
        fam.check(fam)  # type: ignore[misc]


def test_stream_families_time_every_streaming_path_and_agree(bench: dict[str, ModuleType]) -> None:
    """stream/<spec>: one family per small classifier; each implementation's outputs over the same tokens
    match the general path's (the family's start-up check), onnxruntime with bound buffers included."""
    pytest.importorskip("onnxruntime")
    import torch

    stream = importlib.import_module("benchmarks.stream")
    assert {f"stream/{s}" for s in stream.STREAM_SPECS} <= set(bench["catalog"].families())
    ref = torch.cat(stream._runner("lru-jv", "general path", 6)())
    for impl in ("eager step", "onnxruntime", "onnxruntime io-binding"):
        got = torch.cat(stream._runner("lru-jv", impl, 6)())
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, msg=impl)

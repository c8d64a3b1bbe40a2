"""The zoo CLI: commands, exit codes, torch-free listing, and surviving a broken plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zoo_core.cli import main

ROOT = Path(__file__).resolve().parents[1]
ZOO = [sys.executable, "-m", "zoo_core.cli"]


def run(args, env=None, cwd=ROOT):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*ZOO, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=300)


@pytest.mark.parametrize("args", [["--help"], ["list"], ["plugins"], ["list", "--json"], ["plugins", "--json"], ["info", "s4d"]])
def test_listing_never_imports_torch(args):
    code = f"import sys; from zoo_core.cli import main; rc = main({args!r}); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


_THP_PROBE = """
import os, re, sys
sys.argv = ["zoo", "list"]
from zoo_core.cli import main
main()
import torch
x = torch.ones(16 << 20)  # 64 MiB, touched
with open("/proc/self/smaps") as f:
    huge = sum(int(n) for n in re.findall(r"AnonHugePages:\\s+(\\d+) kB", f.read()))
print(os.environ.get("THP_MEM_ALLOC_ENABLE"), huge)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="c10 asks for huge pages on Linux only")
@pytest.mark.parametrize("preset", [None, "0"])
def test_the_console_entry_asks_for_huge_pages_unless_told(preset):
    """``zoo`` (the console entry point) turns on c10's THP_MEM_ALLOC_ENABLE before any tensor exists,
    and a user's own setting wins; where the kernel lends transparent huge pages on request, a large
    tensor then lies in them."""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if preset is not None:
        env["THP_MEM_ALLOC_ENABLE"] = preset
    proc = subprocess.run([sys.executable, "-c", _THP_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    value, huge_kib = proc.stdout.split()[-2:]
    assert value == (preset or "1")
    try:
        policy = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        policy = "[never]"
    if "[never]" not in policy:
        assert (int(huge_kib) >= 32 << 10) == (preset is None), f"{huge_kib} KiB in huge pages ({policy.strip()})"


def test_list_filters_and_json(capsys):
    assert main(["list", "s4d*", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in table["cores"]] == ["s4d"]
    assert {r["name"] for r in table["presets"]} >= {"s4d-tiny", "s4d-base"}
    assert table["backends"] == []
    assert main(["list", "--kind", "backends", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["backends"]
    names = {r["name"] for r in rows if r["provider"] == "zoo-core"}
    assert {r["name"] for r in rows if r["provider"] == "zoo-mamba"} >= {"scan:selective-naive", "scan:selective-chunked"}
    assert names == {"kernel:naive", "kernel:vandermonde", "kernel:cauchy", "kernel:keops", "conv:naive", "conv:fft", "scan:naive",
                     "scan:scan", "scan:chunked", "scan:cpu-scan", "scan:triton-diag"}


def test_list_keeps_long_names_apart_from_their_descriptions(capsys):
    assert main(["list", "--kind", "datasets", "induction-heads-short-L*"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  ")]
    assert lines and all(ln.split()[0].startswith("induction-heads-short-L") for ln in lines)
    assert all(ln[2:].split("  ")[0] == ln.split()[0] for ln in lines)  # two spaces after every name
    assert len({ln.index(ln.split()[1]) for ln in lines}) == 1  # one description column


def test_info_on_each_kind(capsys):
    for name, kind in [("s4d", "core"), ("s4d-tiny", "preset"), ("vandermonde", "backend"), ("zoh", "discretizer"), ("periodic", "stacking policy")]:
        assert main(["info", name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["kind"] == kind
    assert main(["info", "linoss-imex", "--json"]) == 0  # a preset and a discretizer share the name
    assert {m["kind"] for m in json.loads(capsys.readouterr().out)} == {"preset", "discretizer"}
    assert main(["info", "s4dd"]) == 2
    assert "did you mean 's4d'" in capsys.readouterr().err


def test_build_prints_summary_and_saves(tmp_path, capsys):
    assert main(["build", str(ROOT / "specs/s4d-shared-abab.yaml"), "-o", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "depth 6, 2 unique block(s), schedule ABABAB" in out
    assert "applied 3x" in out and "as applied over depth" in out
    assert "backend (blocks AB): conv: kernel=vandermonde, conv=fft" in out
    assert (tmp_path / "m" / "model.safetensors").is_file() and (tmp_path / "m" / "config.json").is_file()
    assert main(["inspect", str(tmp_path / "m")]) == 0
    assert "ok (every tensor present" in capsys.readouterr().out
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    assert main(["inspect", str(tmp_path / "m")]) == 3
    err = capsys.readouterr().err
    assert "truncated" in err and len(err.strip().splitlines()) == 1


def test_schema_includes_plugin_params(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    branches = schema["$defs"]["CoreSpec"]["oneOf"]
    s4d = next(b for b in branches if b["properties"]["kind"]["const"] == "s4d")
    assert {"d_state", "init", "discretizer", "dt_min", "dt_max"} <= set(s4d["properties"])
    assert "d_model" not in s4d["properties"] and s4d["additionalProperties"] is False


def test_validate_ok_and_bad(tmp_path, capsys):
    assert main(["validate", str(ROOT / "specs/s4d-tiny.yaml")]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "specs/s4d-tiny.yaml").read_text().replace("preset: tiny", "preset: tiny, d_stat: 4"))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:" in err and "d_stat" in err and "did you mean 'd_state'" in err


def _install_fake_dist(site: Path, body: str) -> None:
    """A real installed distribution (dist-info + module) whose plugin module runs ``body``."""
    info = site / "zoo_broken-0.3.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: zoo-broken\nVersion: 0.3.1\n")
    (info / "entry_points.txt").write_text("[zoo_core.plugins]\nbroken = zoo_broken_plugin\n")
    (site / "zoo_broken_plugin.py").write_text(textwrap.dedent(body))


BROKEN_BODIES = {
    "ModuleNotFoundError": "import zoo_dependency_that_is_missing\n",
    "SyntaxError": "def broken(:\n",
    "RuntimeError": "raise RuntimeError('plugin exploded at import')\n",
    "SystemExit": "raise SystemExit(7)\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BROKEN_BODIES))
def test_cli_survives_a_broken_installed_plugin(tmp_path, kind):
    _install_fake_dist(tmp_path, BROKEN_BODIES[kind])
    env = {"PYTHONPATH": str(tmp_path), "ZOO_LOAD_PLUGINS": "zoo-s4d,zoo-broken"}
    for args in (["--help"], ["list"], ["build", "specs/s4d-tiny.yaml"]):
        proc = run(args, env)
        assert proc.returncode == 0, (args, proc.stderr)
    proc = run(["plugins", "--json"], env)
    rows = {r["dist"]: r for r in json.loads(proc.stdout)}
    assert rows["zoo-broken"]["status"] == "failed" and kind in rows["zoo-broken"]["error"]
    assert rows["zoo-broken"]["version"] == "0.3.1"
    assert rows["zoo-s4d"]["status"] == "loaded"
    strict = run(["list"], {**env, "ZOO_STRICT_PLUGINS": "1"})
    assert strict.returncode == 4 and "zoo-broken 0.3.1" in strict.stderr and "Traceback" not in strict.stderr


def test_plugin_commands_hook(tmp_path):
    _install_fake_dist(tmp_path, """
        from zoo_core import hookimpl
        zoo_api = 1

        @hookimpl
        def zoo_register_commands(cli):
            p = cli.add_parser("hello", help="say hello")
            p.set_defaults(fn=lambda args: print("hello from a plugin") or 0)
    """)
    proc = run(["hello"], {"PYTHONPATH": str(tmp_path), "ZOO_LOAD_PLUGINS": "zoo-broken"})
    assert proc.returncode == 0 and "hello from a plugin" in proc.stdout, proc.stderr


def test_error_exit_codes_and_no_traceback(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("schema_version: 1\ntask: {kind: classification, classes: 2}\ninput: {channels: 3}\nmodel: {d_model: 8, depth: 2, core: {kind: mamba}}\n")
    others = ",".join(d for d in os.environ["ZOO_LOAD_PLUGINS"].split(",") if d != "zoo-mamba")
    proc = run(["build", str(spec)], {"ZOO_LOAD_PLUGINS": others})  # as if zoo-mamba were not installed
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "s.yaml:4" in proc.stderr and "pip install -e plugins/zoo-mamba" in proc.stderr
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"<!DOCTYPE html><html>rate limited</html>")
    from zoo_core.errors import CheckpointError
    from zoo_core.factory import load_pretrained

    with pytest.raises(CheckpointError, match="HTML"):
        load_pretrained(tmp_path / "m")


@pytest.mark.requires("aeon")
def test_stream_demo_on_a_real_sequence(capsys):
    assert main(["stream", str(ROOT / "specs/s4d-basicmotions.yaml"), "--index", "3"]) == 0
    out = capsys.readouterr().out
    assert "basicmotions test sequence 3: length 100, 6 channels" in out
    assert "agreement        : OK" in out
    # the dataset as specs and the source spell it (any case) is the same bundled set
    assert main(["stream", str(ROOT / "specs/s4d-basicmotions.yaml"), "--dataset", "BasicMotions", "--index", "3"]) == 0
    assert "basicmotions test sequence 3" in capsys.readouterr().out
    assert main(["stream", str(ROOT / "specs/s4d-basicmotions.yaml"), "--dataset", "NoSuchSet"]) == 2
    assert "unknown dataset 'NoSuchSet'; bundled: basicmotions, japanesevowels" in capsys.readouterr().err
    assert main(["stream", str(ROOT / "specs/s4d-tiny.yaml")]) == 2  # 2 channels, the data has 6
    assert main(["stream", str(ROOT / "specs/s4d-lm.yaml")]) == 2  # tokens, not a time series
    assert main(["stream", str(ROOT / "specs/s4d-basicmotions.yaml"), "--index", "999"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size" in err and "out of range" in err and "Traceback" not in err


@pytest.mark.requires("aeon")
def test_stream_a_saved_model_folder_streams_its_own_weights(tmp_path, capsys):
    """A folder streams the weights it holds (a trained run's best/), not a fresh draw from its spec."""
    import torch

    from zoo_core.build import build_model
    from zoo_core.io.pretrained import save_pretrained

    model = build_model(ROOT / "specs/s4d-basicmotions.yaml", seed=5).eval()
    save_pretrained(model, tmp_path / "m")
    assert main(["stream", str(tmp_path / "m"), "--index", "2"]) == 0
    out = capsys.readouterr().out
    assert "agreement        : OK" in out
    from zoo_core.datasets import load_uea_bundled

    X, _, lengths = load_uea_bundled("basicmotions", split="test")
    with torch.no_grad():
        y = model(torch.from_numpy(X[2:3, : int(lengths[2])]))[0]
    assert f"{y[0].item():.6f}"[:6] in out  # the saved weights' output, printed
    bi = tmp_path / "bi"
    spec = dict(model.spec)
    spec["model"] = {**spec["model"], "block": {**spec["model"]["block"], "bidirectional": {"combine": "sum"}}}
    save_pretrained(build_model(spec, seed=0).eval(), bi)
    assert main(["stream", str(bi)]) == 2
    err = capsys.readouterr().err
    assert "bidirectional block" in err and "cannot" in err and "Traceback" not in err

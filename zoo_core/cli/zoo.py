"""The ``zoo`` command line. ``zoo --help``, ``zoo list`` and ``zoo plugins`` never import torch.

Exit codes: 0 ok, 1 unexpected failure, 2 usage / spec / input errors, 3 integrity errors
(weights files), 4 plugin errors, 5 connection failures (the Hub unreachable after retries).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import UnknownNameError, ZooError, did_you_mean
from ..footprint import available_memory, check_build, estimate, fmt_bytes
from ..plugins import call_command_hooks, get_registry
from ..spec import load_spec
from ..spec.jsonschema import full_schema
from .hub import cmd_info_pretrained, cmd_list_pretrained
from .runner import add_memory_flags, run

log = logging.getLogger("zoo_core.cli")


def _registry() -> Any:
    return get_registry()


# list / info / plugins (torch-free) ---------------------------------------------------------
LIST_KINDS = ("cores", "presets", "backends", "discretizers", "stacking_policies", "datasets", "converters")


def _rows(kind: str) -> list[dict[str, Any]]:
    reg = _registry()
    if kind == "presets":
        return [{"name": n, "core": c.name, "params": dict(c.presets[p])} for n, (c, p) in sorted(reg.presets().items())]
    if kind == "backends":
        return [
            {"name": f"{op}:{b.name}", "op": op, "priority": b.priority, "available": b.unavailable_reason() is None,
             "description": b.description, "provider": b.provider.dist}
            for (op, _), b in sorted(reg.backends.items())
        ]
    rows = []
    for name, e in sorted(getattr(reg, kind).items()):
        row = {"name": name, "provider": e.provider.dist, "description": getattr(e, "description", "")}
        if kind == "cores":
            row.update(capabilities=sorted(e.capabilities), presets=sorted(e.presets), description=e.card.split("\n")[0])
        if kind == "discretizers":
            row["structures"] = sorted(e.structures)
        rows.append(row)
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    if args.pretrained:
        return cmd_list_pretrained(args)
    kinds = [args.kind] if args.kind else list(LIST_KINDS)
    table = {k: [r for r in _rows(k) if fnmatch.fnmatch(r["name"], args.pattern)] for k in kinds}
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    for kind, rows in table.items():
        if not rows:
            continue
        print(f"{kind.replace('_', ' ')}:")
        width = max(24, *(len(r["name"]) + 2 for r in rows))  # a long name never runs into its description
        for r in rows:
            extra = f"  [{r['provider']}]" if kind != "presets" else f"  {r['params']}"
            note = "" if r.get("available", True) else "  (unavailable)"
            print(f"  {r['name']:<{width}}{r.get('description', '')[:70]}{note}{extra}")
    return 0


def _info_matches(reg: Any, name: str) -> list[dict[str, Any]]:
    """Everything registered under ``name``: a preset and a discretizer may share one."""
    found: list[dict[str, Any]] = []
    if name in reg.presets():
        core, preset = reg.presets()[name]
        found.append({"kind": "preset", "name": name, "core": core.name, "params": dict(core.presets[preset])})
    if name in reg.cores:
        e = reg.cores[name]
        found.append({"kind": "core", "name": name, "provider": str(e.provider), "capabilities": sorted(e.capabilities),
                      "presets": {k: dict(v) for k, v in e.presets.items()}, "card": e.card,
                      "params": e.params.model_json_schema()})
    backends = [
        {"op": op, "priority": b.priority, "description": b.description, "provider": str(b.provider),
         "unavailable": b.unavailable_reason()}
        for (op, n), b in sorted(reg.backends.items()) if name in (n, f"{op}:{n}")
    ]
    if backends:
        found.append({"kind": "backend", "name": name, "implementations": backends})
    if name in reg.discretizers:
        e = reg.discretizers[name]
        found.append({"kind": "discretizer", "name": name, "structures": sorted(e.structures),
                      "description": e.description, "provider": str(e.provider)})
    if name in reg.stacking_policies:
        e = reg.stacking_policies[name]
        found.append({"kind": "stacking policy", "name": name, "description": e.description, "provider": str(e.provider)})
    return found


def cmd_info(args: argparse.Namespace) -> int:
    reg = _registry()
    found = _info_matches(reg, args.name)
    if not found:  # arch.tag: a pretrained model in registry.yaml's catalogue?
        try:
            return cmd_info_pretrained(args)
        except UnknownNameError:
            pass
        names = [*reg.cores, *reg.presets(), *reg.discretizers, *reg.stacking_policies, *(n for _, n in reg.backends)]
        raise UnknownNameError(f"nothing is registered as {args.name!r};{did_you_mean(args.name, names)} see `zoo list`.")
    if args.json:
        print(json.dumps(found[0] if len(found) == 1 else found, indent=2, default=str))
        return 0
    for info in found:
        for key, value in info.items():
            text = json.dumps(value, indent=2, default=str) if isinstance(value, (dict, list)) else str(value)
            print(f"{key}: {text}")
        print()
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    reg = _registry()
    rows = [p.as_dict() for p in reg.plugins]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for p in rows:
        provides = ", ".join(f"{k}: {len(v)}" for k, v in p["provides"].items())
        ran = "imported" if p["imported"] else "not imported"
        print(f"{p['status']:<9}{p['dist']} {p['version']}  ({p['name']} -> {p['module']}; {ran})  {provides}")
        for line in [p["error"], *(f"conflict: {c}" for c in p["conflicts"]), *(f"warning: {w}" for w in p["warnings"])]:
            if line:
                print(f"         {line}")
    imported = sum(p["imported"] for p in rows)
    print(f"{imported} of {len(rows)} plugins ran code in this process. A plugin is code you installed: it can exit "
          "the process or monkeypatch anything, which no status can undo; ZOO_LOAD_PLUGINS=a,b loads only those.")
    return 0


# spec commands --------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    m = spec.envelope.model
    cores = ", ".join(dict.fromkeys(f"{e.name} from {e.provider.dist}" for e, _ in spec.named.values())) or \
        f"{spec.core.name} from {spec.core.provider.dist}"
    print(f"{args.spec}: ok ({cores}, depth {m.depth}, d_model {m.d_model})")
    fp = estimate(spec, batch=args.batch_size, length=args.length)
    print(f"size: {fp.describe()}")
    if fp.train_bytes > (free := available_memory()):
        print(f"note: training needs more than the {fmt_bytes(free)} available here; zoo build / zoo train will refuse it "
              "(--memory-budget SIZE or --no-memory-check to override)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(full_schema(_registry()), indent=2))
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from ..build import build_model, summary  # lazy: keeps torch out of zoo
    from ..io.pretrained import check_destination, save_pretrained  # lazy: keeps safetensors, torch out of zoo

    if args.output:
        check_destination(args.output)  # before building: a path under a file fails at once
    spec = load_spec(args.spec)
    check_build(spec, budget=args.memory_budget, check=args.memory_check, saving=bool(args.output))
    model = build_model(spec, seed=args.seed)
    print(summary(model))
    if args.output:
        path = save_pretrained(model, args.output)
        print(f"saved to {path}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..build import summary  # lazy: keeps torch out of zoo
    from ..factory import load_pretrained  # lazy: keeps safetensors, torch out of zoo
    from ..io.pretrained import read_folder  # lazy: keeps safetensors, torch out of zoo

    _, info = read_folder(args.directory, allow_nonfinite=args.allow_nonfinite)
    model = load_pretrained(args.directory, allow_nonfinite=args.allow_nonfinite)
    print(summary(model))
    print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(info["versions"].items())))
    finite = "" if args.allow_nonfinite else ", all values finite"
    print(f"{args.directory}: ok (every tensor present, shapes match{finite})")
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    from ..demo import stream_demo  # lazy: keeps torch out of zoo

    return stream_demo(args.spec, dataset=args.dataset, index=args.index, seed=args.seed)


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``zoo`` parser; plugins are imported to add their commands only when ``argv`` names a
    command that is not built in (so ``zoo --help`` and ``zoo list`` run no plugin code to parse)."""
    p = argparse.ArgumentParser(
        prog="zoo", description="SSM Zoo: build, inspect and check state space sequence models.",
        epilog="Plugins may add commands: `zoo COMMAND` looks them up when COMMAND is none of the above "
               "(--help imports no plugin); `zoo plugins` lists the installed plugins.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log backend choices and show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser("list", help="list registered cores, presets, backends, discretizers, stacking policies")
    s.add_argument("pattern", nargs="?", default="*", help="wildcard filter on names, e.g. 's4d*'")
    s.add_argument("--kind", choices=LIST_KINDS)
    s.add_argument("--pretrained", action="store_true", help="list the pretrained tags of registry.yaml instead")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_list)
    s = sub.add_parser("info", help="details of one registered name (core, preset, backend, ...)")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_info)
    s = sub.add_parser("plugins", help="installed plugins and their load status")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_plugins)
    s = sub.add_parser("validate", help="validate a spec file and print its size (parameters, activations)")
    s.add_argument("spec")
    s.add_argument("--batch-size", type=int, help="batch of the activation estimate (default: training.batch_size, else 32)")
    s.add_argument("--length", type=int, help="sequence length of the activation estimate (default: input.length, else 1024)")
    s.set_defaults(fn=cmd_validate)
    s = sub.add_parser("schema", help="JSON Schema of specs, including every core's params")
    s.set_defaults(fn=cmd_schema)
    s = sub.add_parser("build", help="build a model from a spec and print its summary")
    s.add_argument("spec")
    s.add_argument("-o", "--output", help="save the initialised model to this folder")
    s.add_argument("--seed", type=int, default=0)
    add_memory_flags(s)
    s.set_defaults(fn=cmd_build)
    s = sub.add_parser("inspect", help="check a saved model folder strictly and print its summary")
    s.add_argument("directory")
    s.add_argument("--allow-nonfinite", action="store_true", help="load even if a tensor holds NaN or Inf")
    s.set_defaults(fn=cmd_inspect)
    s = sub.add_parser("stream", help="run a model on a real sequence in parallel and streamed through step, and compare")
    s.add_argument("spec", help="a spec (fresh weights from --seed) or a saved model folder (its trained weights)")
    s.add_argument("--dataset", default="basicmotions", help="a bundled dataset (zoo list --kind datasets)")
    s.add_argument("--index", type=int, default=0, help="which test sequence")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_stream)
    _builtin_commands(sub)
    if _names_other_command(argv, sub.choices):
        _plugin_commands(sub)
    return p


def _names_other_command(argv: Sequence[str] | None, builtin: Any) -> bool:
    """True when the first positional word of ``argv`` is not a built-in command (a plugin's, or a typo)."""
    first = next((a for a in argv or () if not a.startswith("-")), None)
    return first is not None and first not in builtin


# zoo-core's own command groups, each a module with ``register_cli(subparsers)`` that imports
# nothing heavy at load time (``zoo --help`` stays torch-free).
BUILTIN_COMMANDS = ("zoo_core.cli.train", "zoo_core.sweep.cli", "zoo_core.cli.hub", "zoo_core.convert", "zoo_core.generate_cli",
                    "zoo_core.scaffold", "zoo_core.export_cli")


def _builtin_commands(sub: Any) -> None:
    import importlib

    for name in BUILTIN_COMMANDS:
        importlib.import_module(name).register_cli(sub)


def _plugin_commands(sub: Any) -> None:
    """Let plugins add subcommands; a failing plugin loses only its own commands."""
    try:
        problems = call_command_hooks(sub)
    except ZooError as exc:  # the registry itself failed (strict mode, duplicate names)
        problems = [str(exc)]
    for problem in problems:
        log.warning(problem)


def huge_pages() -> None:
    """Ask c10's CPU allocator for transparent huge pages for large tensors (``THP_MEM_ALLOC_ENABLE=1``),
    unless the environment already says (``0`` turns it off). A fresh (B, L, ...) tensor then takes 2 MiB
    pages, 512× fewer first-touch page faults, which were most of a long sequence's scan on a CPU: at
    B = 32, L = 4096 the fused scan's forward 3.1-5.3× faster, a compiled S5 or LRU layer's 1.5-2.2×
    (``benchmarks/REPORT_SCAN.md``, its THP tables). c10 reads the variable once, early (at an
    allocation), so it is set dependably only before any tensor exists: by the console entry point (a
    sweep's workers inherit it). Library users set it in their own environment. Linux only (c10 ignores it
    elsewhere)."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the console entry point: a fresh process
        huge_pages()
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(_parser(argv), argv)

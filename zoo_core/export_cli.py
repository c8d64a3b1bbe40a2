"""``zoo export MODEL --format onnx|pt2|executorch --mode stream|sequence``: a model as a file that
runs with no Python and no zoo.

Modes:
    stream    one ``step``: inputs ``x_t`` then the state, outputs ``y_t`` then the new state (what an
              edge device runs, one token at a time, in constant memory). Names are stable:
              ``x_t``, ``state.<name>`` in; ``y_t``, ``next.<name>`` out, ``<name>`` the model's flat
              state names sorted as strings (``input.t``, ``layer0.h``, ..., ``zoo_core.export``).
              The first state is all zeros (``model.init_state``); a dynamic batch.
    sequence  the parallel forward over ``x`` (B, L, ...): dynamic batch and, where the model's ops
              trace without a loop over time, a dynamic length (else the exported length is fixed to
              ``--length``, and that is said once), bounded where a core's forward holds up to a
              length only (S4: its ``l_max``; the file's ``zoo.max_length`` says it). For ONNX, where an op of the parallel forward has
              no ONNX form (complex arithmetic, the zoo's fused scans), the sequence model is an ONNX
              ``Scan`` over the exported step instead (said once): input ``x``, outputs ``y`` and
              ``next.<name>`` (the state after the last step), any length.

Formats:
    pt2         ``torch.export`` archive, every core; ``zoo_core.export.load_program`` reads it back (it
                imports the modules that register the zoo custom ops the program calls, which
                ``torch.export.load`` needs: the file's ``zoo.imports``).
    onnx        ``torch.onnx.export(..., dynamo=True)``; checked against the eager model in
                onnxruntime when it is installed (``zoo-core[export]``).
    executorch  ``torch.export`` lowered by ExecuTorch (``zoo-core[executorch]``) to a ``.pte``.

Every file carries the spec and the versions it came from: ONNX metadata_props, the pt2 archive's
``extra/zoo.json``, beside a ``.pte`` as ``<file>.json``. Torch and the exporters are imported only
when the command runs (``zoo --help`` stays torch-free).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from . import __version__
from .errors import SpecError, ZooError
from .hub.pulling import pull

log = logging.getLogger(__name__)

FORMATS = {"onnx": ".onnx", "pt2": ".pt2", "executorch": ".pte"}
MODES = ("stream", "sequence")


class ExportError(ZooError):
    """A model cannot be exported in the asked format or mode; the message names the core and the option."""

    exit_code = 2


def load_any(model_ref: str) -> Any:
    """A model from a spec YAML (random init, seed 0), a saved folder or a reference (``arch.tag``,
    ``hf-hub:``, ``local-dir:``, pulled and checked first)."""
    from .build import build_model  # lazy: torch
    from .factory import load_pretrained  # lazy: torch

    path = Path(model_ref)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return build_model(path, seed=0).eval()
    folder = path if path.is_dir() else Path(pull(model_ref).path)
    return load_pretrained(folder).eval()


def example_input(model: Any, batch: int, length: int) -> Any:
    """(B, L, C) float32 features or (B, L) token ids, as the model's spec says; seeded."""
    import torch

    spec_in = model.spec["input"]
    g = torch.Generator().manual_seed(0)
    if "vocab_size" in spec_in:
        return torch.randint(0, int(spec_in["vocab_size"]), (batch, length), generator=g)
    return torch.randn(batch, length, int(spec_in["channels"]), generator=g)


def core_kinds(model: Any) -> str:
    """The model's core kinds, for messages ("s4d", "mamba + attention")."""
    kinds = sorted({getattr(type(c), "__name__", "?") for c in model.cores()})
    return " + ".join(kinds)


def metadata(model: Any, source: str, fmt: str, mode: str, inputs: list[str], outputs: list[str]) -> dict[str, str]:
    """What travels inside the file: the spec, the names, the versions (all strings, as ONNX wants)."""
    from importlib.metadata import packages_distributions

    import torch


    owners = packages_distributions()
    plugins = {dist: _dist_version(dist) for core in model.cores()
               for dist in owners.get(type(core).__module__.split(".")[0], ())}
    return {
        "zoo.spec": json.dumps(model.spec, sort_keys=True),
        "zoo.source": source,
        "zoo.format": fmt,
        "zoo.mode": mode,
        "zoo.inputs": json.dumps(inputs),
        "zoo.outputs": json.dumps(outputs),
        "zoo.versions": json.dumps({"zoo-core": __version__, "torch": torch.__version__, **plugins}, sort_keys=True),
    }


def _dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


class Exported:
    """What ``export_model`` made: the file, the program it came from (for an ONNX Scan sequence model,
    ``scan``, the step program the Scan repeats), the example inputs and what inputs and outputs are called."""

    def __init__(self, path: Path, program: Any, module: Any, args: tuple[Any, ...], inputs: list[str],
                 outputs: list[str], meta: dict[str, str], dynamic_length: bool, scan: bool = False) -> None:
        self.path, self.program, self.module, self.args = path, program, module, args
        self.inputs, self.outputs, self.meta, self.dynamic_length = inputs, outputs, meta, dynamic_length
        self.scan = scan


def _stream(model: Any, batch: int, real: bool, fmt: str) -> tuple[Any, tuple[Any, ...], list[str], list[str], Any]:
    import torch
    from torch.export import Dim

    from .export import MAX_BATCH, MAX_LENGTH, StepModule, _batch_dims  # lazy: torch

    stepless = _stepless(model)
    if stepless:
        raise ExportError(f"--mode stream exports one step, and this model's core {', '.join(stepless)} has "
                          "none (it is bidirectional: each output reads the whole sequence); export it with --mode sequence")
    state = model.init_state(batch)
    x = example_input(model, batch, 1)[:, 0].clone()  # not a view: export would guard on its base
    if real:
        complex_cores = sorted({type(c).__name__ for c in model.cores() if not getattr(c, "real_stream", False)
                                and any(t.is_complex() for t in c.init_state(1).values())})
        if complex_cores:
            raise ExportError(f"--format {fmt} needs a step in real arithmetic ({fmt} runtimes have no complex tensors), "
                              f"and {', '.join(complex_cores)} steps a complex state; --format pt2 exports it")
    with torch.no_grad():  # also fills the cores' cached constants (CoreBase.cached): constants of the program
        _, second = model.step(x, model.step(x, state)[1])
        _, third = model.step(x, second)
    wrapper = StepModule(model, state, real=real)
    # the example is the state after two steps: a growing state (attention's KV cache) is then 2 long, not
    # 0 (which export would fix as a constant); the dimensions that grow by the third step are dynamic
    flat, after = wrapper.flatten(second), wrapper.flatten(third)
    args = (x, *(t.clone() for t in flat))  # not views: export would guard on their bases
    dims = _batch_dims(args, batch, Dim("batch", min=1, max=MAX_BATCH))
    steps = Dim("steps", min=0, max=MAX_LENGTH)
    wrapper.growing = []
    for i, (a, b) in enumerate(zip(flat, after, strict=True), start=1):
        grown = [d for d in range(a.dim()) if a.shape[d] != b.shape[d]]
        if grown:
            dims[i] = {**(dims[i] or {}), **{d: steps for d in grown}}
            wrapper.growing.append(wrapper.names[i - 1])
    shapes = (dims[0], tuple(dims[1:]))
    inputs = ["x_t", *[f"state.{n}" for n in wrapper.names]]
    outputs = ["y_t", *[f"next.{n}" for n in wrapper.names]]
    return wrapper, args, inputs, outputs, shapes


def _sequence(model: Any, batch: int, length: int, dynamic_length: bool) -> tuple[Any, tuple[Any, ...], Any]:
    """The model, its example input and the dynamic shapes; for a dynamic length the example stays within
    the model's bound (``length_bound``: S4's l_max), so the default --length does not forfeit it."""
    from torch.export import Dim

    from .export import MAX_BATCH, MAX_LENGTH, length_bound  # lazy: torch

    bound = length_bound(model) if dynamic_length else None
    x = example_input(model, batch, min(length, bound) if bound else length)
    dims: dict[int, Any] = {0: Dim("batch", min=1, max=MAX_BATCH)}
    if dynamic_length:
        dims[1] = Dim("length", min=2, max=bound or MAX_LENGTH)
    return model, (x,), ({**dims},)


def custom_ops_of(program: Any) -> tuple[list[str], list[str]]:
    """The zoo custom ops an exported program calls (``zoo::...``) and the modules that register them
    (what must be imported before ``torch.export.load`` can read the program back)."""
    import torch

    names = sorted({str(n.target.name()) for n in program.graph.nodes
                    if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "zoo"})
    try:
        from torch._library.custom_ops import OPDEFS  # torch's registry of torch.library.custom_op definitions
    except ImportError:  # a torch without it: the op names alone
        return names, []
    modules = {getattr(getattr(OPDEFS.get(n), "_init_fn", None), "__module__", None) for n in names}
    return names, sorted(m for m in modules if m)


def _stepless(model: Any) -> list[str]:
    """The model's cores that do not stream (no ``step`` capability: the bidirectional ones), by class name."""
    return sorted({type(c).__name__ for c in model.cores() if "step" not in getattr(c, "capabilities", ("step",))})


def _torch_export(module: Any, args: tuple[Any, ...], shapes: Any) -> Any:
    import torch

    with torch.no_grad():
        return torch.export.export(module, args, dynamic_shapes=shapes)


def export_model(model_ref: str, *, fmt: str = "onnx", mode: str = "stream", output: str | Path | None = None,
                 length: int = 256, static_length: bool = False, batch: int = 2, model: Any = None,
                 quantize: str | None = None) -> Exported:
    """Export ``model_ref`` (or an already loaded ``model``) to ``output`` (default ``<model>-<mode><ext>``).

    ``length`` is the example (and, where the length cannot be dynamic, the fixed) sequence length of
    ``--mode sequence``; ``batch`` the example batch (the exported batch is dynamic). ``quantize="int8"``
    (ONNX only) stores the weights of the matrix products in int8, dequantised on the fly by
    onnxruntime (dynamic quantization); never applied unless asked, and ``benchmarks/export_int8.py``
    reports what it costs in accuracy.
    """
    if quantize not in (None, "int8"):
        raise SpecError(f"--quantize {quantize!r}: the one quantization offered is int8 (dynamic, ONNX)")
    if quantize and fmt != "onnx":
        raise SpecError(f"--quantize int8 is for --format onnx (onnxruntime's dynamic quantization), not {fmt}")
    if fmt not in FORMATS:
        raise SpecError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if mode not in MODES:
        raise SpecError(f"--mode {mode!r}: choose stream (one step, what an edge device runs) or sequence (the parallel forward)")
    if batch < 2:
        raise SpecError(f"the example batch must be ≥ 2 (export specialises a batch of 1), got {batch}")
    if length < 2:
        raise SpecError(f"--length must be ≥ 2 (export specialises lengths 0 and 1), got {length}")
    model = model if model is not None else load_any(model_ref)
    stem = Path(model_ref.rstrip("/")).name.removesuffix(".yaml").removesuffix(".yml").replace(":", "-") or "model"
    path = Path(output) if output else Path(f"{stem}-{mode}{FORMATS[fmt]}")
    dynamic_length, scan = False, False
    if mode == "stream":
        module, args, inputs, outputs, shapes = _stream(model, batch, real=fmt != "pt2", fmt=fmt)
        program = _export_or_explain(module, args, shapes, model, mode)
    else:
        inputs, outputs = ["x"], ["y"]
        program = None
        scan_instead = False  # ONNX: a Scan over the step takes any length, where the parallel forward takes one
        if not static_length:
            from .kernels.export_ops import EXPORT_ONLY  # lazy: torch

            module, args, shapes = _sequence(model, batch, length, True)
            try:
                program = _torch_export(module, args, shapes)
                dynamic_length = True
                held = [o for o in custom_ops_of(program)[0] if o in EXPORT_ONLY] if fmt == "executorch" else []
                if held:  # ExecuTorch lowers no custom op (no out variant): at a fixed length these trace their compositions
                    log.warning("zoo export: the dynamic-length %s holds %s, which ExecuTorch cannot lower; exporting the "
                                "sequence model at the fixed length %d (--length)", core_kinds(model), ", ".join(held), length)
                    program, dynamic_length = None, False
            except Exception as exc:  # noqa: BLE001 - a dynamic length the ops refuse: fall back, said once
                scan_instead = fmt == "onnx" and not _stepless(model)
                log.warning("zoo export: %s does not export with a dynamic length (%s: %s); %s", core_kinds(model),
                            type(exc).__name__, str(exc).splitlines()[0][:200],
                            "the ONNX sequence model is a Scan over its step (any length)" if scan_instead else
                            f"the exported sequence model takes exactly {length} steps (--length)")
        if program is None and not scan_instead:
            from .kernels.export_ops import fixed_length  # lazy: torch

            module, args, shapes = _sequence(model, batch, length, False)
            with fixed_length():  # one length: the chunked ops and loops trace as in eager (standard ONNX ops)
                program = _export_or_explain(module, args, shapes, model, mode)
    meta = metadata(model, model_ref, fmt, mode, inputs, outputs)
    meta["zoo.dynamic_length"] = json.dumps(dynamic_length if mode == "sequence" else None)
    from .export import length_bound  # lazy: torch

    bound = length_bound(model) if mode == "sequence" and dynamic_length else None
    if bound is not None:  # the parallel forward holds up to a length (S4: its l_max)
        meta["zoo.max_length"] = str(bound)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "pt2":
        import torch

        ops, modules = custom_ops_of(program)
        if ops:  # torch.export.load must find them registered: zoo_core.export.load_program imports these first
            meta["zoo.custom_ops"], meta["zoo.imports"] = json.dumps(ops), json.dumps(modules)
        torch.export.save(program, str(path), extra_files={"zoo.json": json.dumps(meta, sort_keys=True)})
    elif fmt == "onnx" and mode == "sequence":
        try:
            if program is None:  # the dynamic-length parallel forward failed: straight to the Scan
                raise ExportError("the parallel forward has no dynamic length")
            _save_onnx(program, path, inputs, outputs, meta, model, mode)
        except ExportError as exc:  # an op without an ONNX translation: the sequence as a Scan over the step
            stepless = _stepless(model)
            if stepless:
                raise ExportError(f"{exc}; {', '.join(stepless)} is bidirectional, so no Scan over its step can stand in "
                                  "for the parallel forward") from None
            if static_length:
                raise ExportError(f"{exc}; with --static-length no Scan over the step stands in (it would take any "
                                  "length): leave --static-length out, or use --format pt2") from None
            if program is not None:
                log.warning("zoo export: the parallel forward of %s has no ONNX form (%s); exporting the sequence model "
                            "as an ONNX Scan over its step instead (the same outputs, one step at a time, any length)",
                            core_kinds(model), str(exc).split(" failed: ", 1)[-1][:160])
            module, args, inputs, outputs, shapes = _stream(model, batch, real=True, fmt=fmt)
            if module.growing:
                raise ExportError(f"{exc}; and an ONNX Scan over the step cannot stand in: the state "
                                  f"{', '.join(module.growing)} grows each step (attention's KV cache), and a Scan "
                                  "carries fixed shapes. --mode stream exports it, or --format pt2") from None
            program = _torch_export(module, args, shapes)  # the step program the Scan repeats
            _save_scan(_onnx_proto(program, inputs, outputs, model, "stream"), path, module, model, meta)
            module, args, inputs, outputs = model, (example_input(model, batch, length),), ["x"], ["y", *outputs[1:]]
            dynamic_length, scan = True, True
            meta["zoo.dynamic_length"] = "true"
            meta.pop("zoo.max_length", None)  # a Scan over the step takes any length
            meta["zoo.sequence"] = "scan over the step"
            meta["zoo.outputs"] = json.dumps(outputs)
    elif fmt == "onnx":
        _save_onnx(program, path, inputs, outputs, meta, model, mode)
    else:
        _save_executorch(program, path, meta, model)
    if quantize:
        _quantize_int8(path, meta)
    return Exported(path, program, module, args, inputs, outputs, meta, dynamic_length, scan)


def _export_or_explain(module: Any, args: tuple[Any, ...], shapes: Any, model: Any, mode: str) -> Any:
    try:
        return _torch_export(module, args, shapes)
    except Exception as exc:  # noqa: BLE001 - torch.export's own error, given the model's name and the way out
        raise ExportError(f"torch.export of {core_kinds(model)} in --mode {mode} failed: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:300]}") from None


def _onnx_program(program: Any, inputs: list[str], outputs: list[str], model: Any, mode: str) -> Any:
    """``torch.onnx.export`` of a ``torch.export`` program, its failures said as ``ExportError``."""
    import torch

    try:
        import onnxscript  # noqa: F401  - torch.onnx's dynamo exporter needs it
    except ImportError:
        raise ExportError("--format onnx needs the onnx and onnxscript packages: pip install 'zoo-core[export]'") from None
    try:
        onnx_program = torch.onnx.export(program, dynamo=True, input_names=inputs, output_names=outputs,
                                         optimize=True, verbose=False)
    except Exception as exc:  # noqa: BLE001 - the converter's error, reduced to what failed and the way out
        text = str(exc)
        op = (_first_line_with(text, "No ONNX function found for") or _first_line_with(text, "Error when translating")
              or text.splitlines()[0])
        op = op.split(">: ", 1)[-1] if op.lstrip().startswith("<class") else op  # the exception's class, said once
        raise ExportError(f"ONNX export of {core_kinds(model)} (--mode {mode}) failed: {op.strip()[:300]}. "
                          "An op here has no ONNX translation; --format pt2 (or executorch) exports this model") from None
    assert onnx_program is not None
    return onnx_program


def _onnx_proto(program: Any, inputs: list[str], outputs: list[str], model: Any, mode: str) -> Any:
    """The ONNX ``ModelProto`` of a ``torch.export`` program."""
    return _onnx_program(program, inputs, outputs, model, mode).model_proto


def _save_onnx(program: Any, path: Path, inputs: list[str], outputs: list[str], meta: dict[str, str], model: Any,
               mode: str) -> None:
    onnx_program = _onnx_program(program, inputs, outputs, model, mode)
    onnx_program.model.metadata_props.update(meta)
    onnx_program.save(str(path))


def _save_scan(step: Any, path: Path, wrapper: Any, model: Any, meta: dict[str, str]) -> None:
    """The sequence model as one ONNX ``Scan`` over the exported step: input ``x`` (B, L, ...) scanned
    along L from the model's initial state; outputs ``y`` (the last step's output for a pooled task, every
    step's (B, L, O) otherwise) and ``next.<name>``, the state after the last step (to go on streaming)."""
    import numpy as np
    import onnx
    import torch
    from onnx import helper, numpy_helper

    names = list(wrapper.names)
    body = onnx.GraphProto()
    body.CopyFrom(step.graph)
    body.name = "zoo_step"
    by_name = {v.name: v for v in step.graph.input}
    out_by_name = {v.name: v for v in step.graph.output}
    del body.input[:]
    body.input.extend([by_name[f"state.{n}"] for n in names] + [by_name["x_t"]])
    del body.output[:]
    body.output.extend([out_by_name[f"next.{n}"] for n in names] + [out_by_name["y_t"]])
    nodes, inits = [], []
    def with_length(name: str, info: Any) -> Any:
        """``info``'s type with a "length" dimension inserted after the batch, named ``name``."""
        out = helper.make_value_info(name, info.type)
        dims = out.type.tensor_type.shape.dim
        dims.insert(1, onnx.TensorShapeProto.Dimension(dim_param="length"))
        return out

    x_info = with_length("x", by_name["x_t"])
    nodes.append(helper.make_node("Shape", ["x"], ["zoo_x_shape"]))
    inits.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "zoo_zero"))
    inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "zoo_one"))
    nodes.append(helper.make_node("Slice", ["zoo_x_shape", "zoo_zero", "zoo_one"], ["zoo_batch"]))
    with torch.no_grad():
        start = wrapper.flatten(model.init_state(1))  # the first state of one stream, repeated over the batch
        twice = wrapper.flatten(model.init_state(2))  # which tensors have a batch dimension (dim 0 follows it)
    initial = []
    for n, t, t2 in zip(names, start, twice, strict=True):
        row = f"zoo_init.{n}"
        inits.append(numpy_helper.from_array(t.numpy(), row))
        if t.dim() == 0 or t.shape[0] == t2.shape[0]:  # no batch dimension: the same tensor for every batch
            initial.append(row)
            continue
        rest = f"zoo_rest.{n}"
        inits.append(numpy_helper.from_array(np.array(list(t.shape[1:]), dtype=np.int64), rest))
        nodes.append(helper.make_node("Concat", ["zoo_batch", rest], [f"zoo_shape.{n}"], axis=0))
        nodes.append(helper.make_node("Expand", [row, f"zoo_shape.{n}"], [f"zoo_state.{n}"]))
        initial.append(f"zoo_state.{n}")
    nodes.append(helper.make_node("Scan", [*initial, "x"], [*[f"next.{n}" for n in names], "zoo_ys"], body=body,
                                  num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1]))
    if model.pool.per_step:
        nodes.append(helper.make_node("Identity", ["zoo_ys"], ["y"]))
    else:
        inits.append(numpy_helper.from_array(np.array(-1, dtype=np.int64), "zoo_last"))
        nodes.append(helper.make_node("Gather", ["zoo_ys", "zoo_last"], ["y"], axis=1))
    y_t = out_by_name["y_t"]
    outputs = [with_length("y", y_t) if model.pool.per_step else helper.make_value_info("y", y_t.type)]
    outputs += [helper.make_value_info(f"next.{n}", out_by_name[f"next.{n}"].type) for n in names]
    graph = helper.make_graph(nodes, "zoo_sequence", [x_info], outputs, initializer=inits)
    outer = helper.make_model(graph, opset_imports=list(step.opset_import), ir_version=step.ir_version)
    outer.functions.extend(step.functions)
    for key, value in meta.items():
        entry = outer.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(outer)
    onnx.save(outer, str(path))


def _quantize_int8(path: Path, meta: dict[str, str]) -> None:
    """The ONNX file at ``path`` with its MatMul/Gemm weights in int8 (onnxruntime's ``quantize_dynamic``:
    activations quantised per call), the metadata kept and the quantization named in it."""
    import onnx

    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        raise ExportError("--quantize int8 needs onnxruntime: pip install 'zoo-core[export]'") from None
    full = path.with_name(path.name + ".float32")
    path.replace(full)
    try:
        quantize_dynamic(str(full), str(path), weight_type=QuantType.QInt8)
    finally:
        full.unlink(missing_ok=True)
    quantized = onnx.load(str(path))
    props = {p.key: p.value for p in quantized.metadata_props}
    props.update(meta, **{"zoo.quantization": "int8 dynamic (onnxruntime quantize_dynamic: MatMul/Gemm weights)"})
    del quantized.metadata_props[:]
    for key, value in props.items():
        entry = quantized.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(quantized, str(path))


def _first_line_with(text: str, needle: str) -> str | None:
    for line in text.splitlines():
        if needle in line:
            return line
    return None


def _save_executorch(program: Any, path: Path, meta: dict[str, str], model: Any) -> None:
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
    except ImportError:
        raise ExportError("--format executorch needs ExecuTorch: pip install 'zoo-core[executorch]'") from None
    try:
        lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"ExecuTorch lowering of {core_kinds(model)} failed: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:300]}; --format pt2 or onnx may serve") from None
    path.write_bytes(lowered.buffer)
    Path(f"{path}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def onnx_parity(exported: Exported, steps: int = 3) -> float:
    """Largest absolute difference between onnxruntime on the exported file and the eager model: for a
    stream model after ``steps`` steps fed back through both (so the decays act on a non-zero state),
    for a sequence model on the example input. Raises ``ExportError`` when onnxruntime is missing or
    cannot run the file."""
    import numpy as np
    import torch

    try:
        import onnxruntime as ort
    except ImportError:
        raise ExportError("checking an ONNX file needs onnxruntime: pip install 'zoo-core[export]'") from None
    try:
        session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
        args, worst = tuple(exported.args), 0.0
        for _ in range(steps if exported.inputs[0] == "x_t" else 1):
            got = session.run(None, {name: a.numpy() for name, a in zip(exported.inputs, args, strict=True)})
            with torch.no_grad():
                ref = exported.module(*args)
            ref = ref if isinstance(ref, tuple) else (ref,)
            # (a Scan sequence model also returns its final state: compared where the eager model gives one)
            worst = max(worst, *(float(np.abs(g.astype(np.float64) - r.double().numpy()).max()) if g.size else 0.0
                                 for g, r in zip(got[:len(ref)], ref, strict=True)))
            args = (args[0], *ref[1:])  # the next step from the eager model's new state
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own failure, said as what failed
        raise ExportError(f"onnxruntime could not run {exported.path}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
    return worst


PARITY_TOL = 1e-4  # max |onnxruntime - eager| that zoo export accepts (float32 rounding of a few ops)


def cmd_export(args: argparse.Namespace) -> int:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")  # torch.export.save's pytree notice
    exported = export_model(args.model, fmt=args.format, mode=args.mode, output=args.output, length=args.length,
                            static_length=args.static_length, quantize=args.quantize)
    size = exported.path.stat().st_size
    bound = exported.meta.get("zoo.max_length")
    shape = "" if args.mode == "stream" else (
        (f" (dynamic length up to {bound})" if bound else " (dynamic length)") if exported.dynamic_length
        else f" (length {args.length})")
    sys.stdout.write(f"{exported.path}: {args.format}, {args.mode}{shape}, {size / 1024:.1f} KiB\n"
                     f"  inputs  {', '.join(exported.inputs)}\n  outputs {', '.join(exported.outputs)}\n")
    if args.format == "onnx" and args.quantize:
        sys.stdout.write("  int8: not checked against the eager model here (quantization changes the numbers by design); "
                         "python -m benchmarks.export_int8 measures the accuracy it costs\n")
    elif args.format == "onnx":
        try:
            err = onnx_parity(exported)
        except ExportError as exc:
            if "needs onnxruntime" not in str(exc):
                raise
            sys.stdout.write(f"  not checked: {exc}\n")
        else:
            sys.stdout.write(f"  onnxruntime vs the eager model: max |diff| {err:.2e}\n")
            if not err <= PARITY_TOL:
                raise ExportError(f"{exported.path}: onnxruntime differs from the eager model by {err:.2e} (> {PARITY_TOL:.0e}); "
                                  "the file is kept for inspection, but do not deploy it")
    return 0


def register_cli(sub: Any) -> None:
    """Add ``export`` to the ``zoo`` subparsers."""
    e = sub.add_parser("export", help="export a model to ONNX, a torch.export archive or ExecuTorch (stream: one step)",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    e.add_argument("model", metavar="MODEL",
                   help="a spec YAML (random weights), a saved folder or a reference: arch.tag, hf-hub:org/name[@rev], local-dir:path")
    e.add_argument("--format", default="onnx", choices=tuple(FORMATS), help="default onnx")
    e.add_argument("--mode", default="stream", choices=MODES,
                   help="stream: one step (x_t, state) -> (y_t, next state), what an edge device runs (default); "
                        "sequence: the parallel forward")
    e.add_argument("-o", "--output", help="the file (default <model>-<mode>.<ext>)")
    e.add_argument("--length", type=int, default=256,
                   help="--mode sequence: the example length, and the fixed one where the ops allow no dynamic length")
    e.add_argument("--static-length", action="store_true", help="--mode sequence: export exactly --length steps")
    e.add_argument("--quantize", choices=("int8",),
                   help="--format onnx: int8 weights for the matrix products (dynamic quantization); changes accuracy, "
                        "measured by python -m benchmarks.export_int8")
    e.set_defaults(fn=cmd_export)

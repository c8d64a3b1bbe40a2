"""``CoreBase``: the class contract of an SSM core, made explicit.

A core subclasses ``CoreBase`` and names its params model in the class statement::

    class S4D(CoreBase, params=S4DParams):
        ssm_params = ("log_dt", "log_A_real", "A_imag", "B")
        paths = {"conv": ("kernel", "conv"), "recurrent": ("scan",)}
        reference = {"scan": "naive"}
        problem = Problem(structure="diag", lti=True, complex=True)

From that declaration the machinery does, for every constructor call (spec or direct):

1. **validates** the constructor's keyword arguments against the params model (one mechanism and
   one message style for every core: ``CoreArgumentError`` naming the core and the argument);
2. runs the core's own ``__init__`` (parameters are drawn there, in the core's order);
3. **resolves the backend** from the ``backend`` argument for the device the core is built on,
   and **binds** the result: ``self.ops.kernel`` / ``.conv`` / ``.scan`` /
   ``.selective_scan`` are the chosen implementations with the problem's structure already bound
   (typed by the op Protocols of ``zoo_core.protocols``), and ``self.run_path`` is the method
   marked ``@runs_path(name)`` for the chosen path. ``forward`` never tests a path name. Moving
   the module to another device type (``.to``, ``.cuda``, ``to_empty``) binds the setting again there.

Capabilities are declared once, on the params model (``CoreParams.capabilities``, torch-free, so
registration can read it without importing model code); the class reports the same set.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from pydantic import ValidationError
from torch import Tensor, nn

from .backends import BackendChoice, BoundOps, resolve
from .errors import BackendUnavailableError, CoreArgumentError
from .params import CoreParams
from .plugin_registry import Problem
from .plugins import get_registry  # the registry the core is built in (using_registry)
from .precision import at_compute_precision, compute_dtype
from .protocols import BoundDiscretizer, OptimHint, State

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_PATH_ATTR = "__zoo_path__"
_NOT_ARGS = ("self", "device", "dtype")
#: the entry points that take the input first: run at the core's compute precision (zoo_core.precision)
_PRECISION_METHODS = ("forward", "forward_with_state", "forward_packed", "step")


def runs_path(name: str) -> Callable[[F], F]:
    """Mark a method as the computation of path ``name`` (one of the class's ``paths``): the one
    ``self.run_path`` is bound to when ``name`` is the chosen path. Needed only with two paths or more."""

    def mark(fn: F) -> F:
        setattr(fn, _PATH_ATTR, name)
        return fn

    return mark


def _path_methods(cls: type) -> dict[str, str]:
    """path name -> method name, over the class and its bases (a subclass's marks win)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            path = getattr(value, _PATH_ATTR, None)
            if isinstance(path, str):
                out[path] = attr
    return out


def _argument_error(cls: type, exc: ValidationError) -> CoreArgumentError:
    """One message style for every core: the core, each argument and its rule, and the fix."""
    parts = []
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc} = {err['input']!r}: {msg}" if loc else msg)
    model = getattr(cls, "params_model", None)
    return CoreArgumentError(
        f"{cls.__name__}: invalid constructor argument{'s' if len(parts) > 1 else ''}: {'; '.join(parts)}. "
        f"Pass values its params model {getattr(model, '__name__', '?')} accepts (`zoo info` lists each field's range)"
    )


def _constructing(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a core's ``__init__``: validate its arguments before, resolve and bind the backend after.
    Only the outermost constructor of a call does either (a subclass calling ``super().__init__``)."""
    sig = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: CoreBase, *args: Any, **kwargs: Any) -> None:
        if self.__dict__.get("_zoo_building"):
            init(self, *args, **kwargs)
            return
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = {k: v for k, v in bound.arguments.items() if k not in _NOT_ARGS}
        object.__setattr__(self, "_zoo_building", True)  # before nn.Module.__init__: a plain attribute
        try:
            object.__setattr__(self, "hparams", type(self).validate_args(values))
            init(self, *args, **kwargs)
        finally:
            self.__dict__.pop("_zoo_building", None)
        if type(self).paths and "backend" in values and "backend_choice" not in self.__dict__:
            # (a core written before this contract resolves in __init__ and keeps its own choice)
            self.bind_backend(values["backend"], device=bound.arguments.get("device"))

    return __init__


def _own_parameters(module: nn.Module, seen: set[int] | None = None) -> list[nn.Parameter]:
    """``list(module.parameters())`` by a plain walk (the generator is slow on a per-token path): each
    parameter once, in the generator's order."""
    seen = set() if seen is None else seen
    params = []
    for p in module._parameters.values():
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    for child in module._modules.values():
        if child is not None:
            params.extend(_own_parameters(child, seen))
    return params


class CoreBase(nn.Module):
    """Base class of the built-in cores (optional for third parties, who may satisfy ``SSMCore``
    alone): the compute plan as typed class attributes, validation and backend binding done by the
    machinery, ``forward``/``step`` from ``forward_with_state``, optimiser hints from ``ssm_params``.

    Class attributes (the compute plan):
        params_model: the params model (set by ``class X(CoreBase, params=XParams)``).
        capabilities: what the core supports; from ``params_model.capabilities``.
        paths: path name -> the ops it runs, e.g. ``{"conv": ("kernel", "conv"), "recurrent": ("scan",)}``;
            a path may use no op (``()``: the core's own loop).
        prefer: the order ``auto`` tries paths in (default: the order of ``paths``).
        reference: the all-naive setting every other backend is checked against (``{}``: the op-less path).
        problem: what the core asks of a backend (structure, lti, complex); the device is filled in.
        auto_backends: device type -> {op: backend} that ``auto`` and a bare path name pin there
            (a measured preference the generic priorities do not express).
        ssm_params: parameters that get ``ssm_lr`` and no weight decay.
        real_stream: a core with a complex state whose ``step`` also takes that state's real view
            (``torch.view_as_real``) and returns the new state in the same form, in real arithmetic
            (``zoo_core.stream``): what ONNX export of the stream model needs.
    """

    params_model: ClassVar[type[CoreParams] | None] = None
    capabilities: ClassVar[frozenset[str]] = frozenset()
    paths: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    prefer: ClassVar[tuple[str, ...]] = ()
    reference: ClassVar[Mapping[str, str]] = {}
    problem: ClassVar[Problem] = Problem()
    auto_backends: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    ssm_params: ClassVar[tuple[str, ...]] = ()
    real_stream: ClassVar[bool] = False  # a complex state's step also takes and returns its real view (ONNX)
    path_methods: ClassVar[Mapping[str, str]] = {}

    # set for every instance by the machinery
    hparams: CoreParams | None
    backend_choice: BackendChoice
    ops: BoundOps
    run_path: Callable[..., Any]

    def __init_subclass__(cls, *, params: type[CoreParams] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if params is not None:
            cls.params_model = params
            cls.capabilities = frozenset(params.capabilities)
        if cls.paths and not cls.prefer:
            cls.prefer = tuple(cls.paths)
        cls.path_methods = _path_methods(cls)
        missing = [p for p in cls.paths if p not in cls.path_methods]
        if len(cls.paths) > 1 and missing:
            raise TypeError(f"{cls.__name__} declares paths {list(cls.paths)} but no method marked "
                            f"@runs_path for {missing}: mark the method that computes each path")
        for name in _PRECISION_METHODS:  # half-precision input and autocast: computed in the parameters' dtype
            if name in cls.__dict__ and callable(cls.__dict__[name]):
                setattr(cls, name, at_compute_precision(cls.__dict__[name]))
        init = cls.__dict__.get("__init__")
        params_ = inspect.signature(init).parameters.values() if init is not None else ()
        if init is not None and not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params_):
            setattr(cls, "__init__", _constructing(init))  # noqa: B010  mypy refuses assigning a method; the machinery's wrapper (signature kept)

    # the machinery ------------------------------------------------------------------------
    @classmethod
    def validate_args(cls, values: Mapping[str, Any]) -> CoreParams | None:
        """The constructor's keyword arguments through the params model (None without one);
        raise ``CoreArgumentError`` (exit 2) naming the core and each bad argument."""
        if cls.params_model is None:
            return None
        try:
            return cls.params_model.model_validate(dict(values))
        except ValidationError as exc:
            raise _argument_error(cls, exc) from None

    def resolve_backend(self, setting: Any, *, who: str | None = None, device: Any = None) -> BackendChoice:
        """Resolve ``setting`` for this core's paths on ``device`` (its type: cpu, cuda, ...)."""
        kind = torch.device(device or "cpu").type
        problem = dataclasses.replace(self.problem, device=kind)
        return resolve(setting, paths=self.paths, prefer=self.prefer, reference=self.reference, problem=problem,
                       who=who or f"core {type(self).__name__}", pinned=self.auto_backends.get(kind, {}))

    def bind_backend(self, setting: Any, *, device: Any = None) -> BackendChoice:
        """Resolve ``setting`` and bind it: ``backend_choice``, ``ops`` and ``run_path``; bound again
        when the module moves to another device type (``_apply``: ``.to``, ``.cuda``, ``to_empty``)."""
        choice = self.resolve_backend(setting, device=device)
        self.__dict__["_zoo_backend"] = (setting, torch.device(device or "cpu").type)  # not a module attribute
        self.backend_choice = choice
        self.ops = BoundOps(choice, self.problem.structure)
        if choice.path in self.path_methods:
            self.run_path = getattr(self, self.path_methods[choice.path])
        return choice

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> CoreBase:
        """``nn.Module._apply`` (what ``.to``/``.cuda``/``.cpu``/``to_empty`` run), then, if the core's
        tensors now live on another device type, the backend setting resolved again there: a core built
        on CPU (``auto``: the C++ scan) and moved to a GPU runs the GPU's kernels, not a CPU-only op. A
        setting that names a backend the new device cannot run is refused with the reason."""
        out = super()._apply(fn, recurse)
        bound = self.__dict__.get("_zoo_backend")
        tensor: Tensor | None = next(iter(self.parameters()), None)
        if tensor is None:
            tensor = next(iter(self.buffers()), None)
        if bound is not None and tensor is not None and tensor.device.type != bound[1]:
            try:
                self.bind_backend(bound[0], device=tensor.device)
            except BackendUnavailableError as exc:
                raise BackendUnavailableError(
                    f"{exc} The core was built on {bound[1]} with backend={bound[0]!r} and then moved to {tensor.device.type}: "
                    f"build it with backend='auto' (it picks per device), or name a backend that runs on "
                    f"{tensor.device.type}") from None
        return out

    def discretizer_for(self, name: str, structure: str | None = None) -> BoundDiscretizer:
        """The registered discretizer ``name`` with ``structure`` (default: the problem's) bound, its
        attributes kept (e.g. a stability bound); refused naming both when it does not handle that structure."""
        structure = structure or self.problem.structure
        entry = get_registry().discretizer(name)
        if structure not in entry.structures:
            raise CoreArgumentError(
                f"{type(self).__name__}: discretizer {name!r} handles {'/'.join(sorted(entry.structures))} systems, "
                f"not the {structure!r} systems this core needs; use one that lists {structure!r} (`zoo list --kind discretizers`)")
        fn = entry.load()
        return functools.update_wrapper(functools.partial(fn, structure=structure), fn)  # keeps its attributes

    # the protocol ---------------------------------------------------------------------------
    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        return self.forward_with_state(x, state)[0]

    def forward_with_state(self, x: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        raise NotImplementedError

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        y, new_state = self.forward_with_state(x_t[:, None, :], state)
        return y[:, 0], new_state

    if TYPE_CHECKING:  # every core defines its own (SSMCore); declared for the type checker only, so a core
        # without one still fails the conformance suite's isinstance(core, SSMCore)
        def init_state(self, batch_size: int, *, device: Any = None, dtype: Any = None) -> State: ...

    def cached(self, name: str, make: Callable[[], T]) -> T:
        """``make()``, reused while this core's parameters are unchanged (same tensors, same in-place
        version, dtype and device) and no gradient is asked for; with gradients, always fresh (so
        backpropagation through ``step`` sees the parameters). What ``step`` uses for its
        input-independent tensors (a discretised system: ``zoo_core.stream``). While ``torch.export``
        traces, a value cached before is used as a constant (``zoo_core.export`` fills it first); under
        ``torch.compile`` it is computed afresh (the graph fuses it); under ``torch.inference_mode`` it is
        made as normal tensors, so it serves later calls outside that mode too. A value that depends on
        more than the parameters (a setting such as ``dt_scale``) is forgotten by ``clear_cache``."""
        if torch.compiler.is_exporting():  # filled just before export: a constant of the program
            filled = self.__dict__.get("_zoo_cache", {})
            return filled[name][1] if name in filled else make()
        if torch.compiler.is_compiling():  # a compiled graph computes it in place (and fuses it)
            return make()
        store = self.__dict__.setdefault("_zoo_cache", {})
        params = _own_parameters(self)
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return make()
        # dt_scale, where a core has one, is the setting a cached discretisation depends on beyond its parameters
        # (the parameters themselves are kept with the value, so their ids cannot be reused while it is); one
        # pass over the parameters, as this runs at every streaming step (get_device: p.device costs a new object)
        try:
            key = (getattr(self, "dt_scale", None), *[(id(p), p.data_ptr(), p._version, p.dtype, p.get_device()) for p in params])
        except RuntimeError:  # an inference tensor has no version counter to key on
            return make()
        hit = store.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        if torch.is_inference_mode_enabled():  # kept for later calls: made as normal tensors, not inference ones
            with torch.inference_mode(False), torch.no_grad():
                value = make()
        else:
            value = make()
        store[name] = (key, value, params)
        return value

    def clear_cache(self) -> None:
        """Forget ``cached`` values: after changing what they depend on other than by an in-place update
        of a parameter (``rescale_dt`` does it; an edit through ``p.data`` bypasses the version counter)."""
        self.__dict__.pop("_zoo_cache", None)

    def compute_dtype(self) -> torch.dtype:
        """The dtype this core computes in: half-precision input is cast to it (``zoo_core.precision``)."""
        return compute_dtype(self)

    def optim_hints(self) -> Mapping[str, OptimHint]:
        lr = getattr(self, "ssm_lr", None)
        if lr is None:
            return {}
        hint = OptimHint(lr=lr, weight_decay=0.0)
        return {name: hint for name in self.ssm_params}

    def rescale_dt(self, factor: float) -> None:
        """Multiply every step size Δ by ``factor`` (2.0: the input is sampled at half the rate).

        For continuous-time cores, which keep a ``dt_scale`` attribute that multiplies their Δ.
        """
        if "continuous_time" not in self.capabilities:
            raise ValueError(f"{type(self).__name__} is discrete-time: it has no step size Δ to rescale")
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"dt rescaling factor must be a positive finite number, got {factor}")
        self.dt_scale: float = self.dt_scale * factor
        self.clear_cache()  # the cached discretised system used the old step sizes

"""The sweep on Ray (the optional extra ``zoo-core[sweep-ray]``): one task per cell, with the cell's
``num_cpus``/``num_gpus`` request; each task runs the same ``zoo train`` subprocess as a local worker
(``execute.run_payload``) and returns its metrics, so the rows the driver appends are the local run's.

``--ray auto`` (or ``local``) starts a private local cluster with ``--workers`` × ``num_cpus`` CPUs
(default: this machine's); any other value is the address of a running cluster (``ray start
--head`` prints it; ``ray://host:10001`` through Ray Client). The run folders must be on storage
every node sees for a half-done cell to resume on another node.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable

from ..errors import ZooError
from .config import Cell, Sweep
from .execute import Outcome, Payload, as_dict, machine_cpus, payload, run_payload

INSTALL = "pip install 'zoo-core[sweep-ray]'"


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def _init(ray: Any, address: str, cpus: int) -> None:
    opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address in ("auto", "local"):
        opts.update(address="local", num_cpus=cpus)
    else:
        opts["address"] = address
    try:
        ray.init(**opts)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ZooError(f"--ray {address}: Ray did not start or connect ({exc}); check the address (ray status) "
                       "or use --ray auto for a local cluster") from None


def run_on_ray(sweep: Sweep, todo: list[Cell], address: str, workers: int | None,
               record: Callable[[Cell, Payload, Outcome], None], started: Callable[[Cell], None]) -> None:
    """Submit every cell, then record each as it ends (in finishing order, as local workers do)."""
    if not ray_available():
        raise ZooError(f"--ray needs Ray, which is not installed: {INSTALL}")
    import ray  # lazy: an optional extra, and heavy

    per = max(sweep.resources.num_cpus, 1e-3)
    cpus = max(1, int((workers or int(machine_cpus() // max(per, 1))) * per))
    _init(ray, address, cpus)
    try:
        task = ray.remote(run_payload).options(num_cpus=sweep.resources.num_cpus, num_gpus=sweep.resources.num_gpus,
                                               max_retries=0)
        refs: dict[Any, tuple[Cell, Payload]] = {}
        for cell in todo:
            pay = payload(sweep, cell)
            refs[task.remote(as_dict(pay))] = (cell, pay)
            started(cell)
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell, pay = refs.pop(ref)
                try:
                    out: Outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the worker died (node lost, OOM): the cell failed
                    out = Outcome(key=cell.key, ok=False, error=f"Ray task failed: {exc}", wall_s=0.0, metrics=None,
                                  host=os.uname().nodename)
                record(cell, pay, out)
    finally:
        ray.shutdown()

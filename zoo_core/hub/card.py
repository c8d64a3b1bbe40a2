"""Model cards, generated (never hand-edited) from the spec and a run's measured metrics.

The card is the Hub repo's ``README.md``: Hugging Face front matter (``library_name``, ``tags``,
``license``, ``datasets``, ``model-index`` with the metrics) and a body saying what the model is,
how it was trained (the exact command), its results, parameter count, intended use and limits.
The same text goes to ``model_cards/<arch.tag>.md`` and to the Hub, so the two cannot drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from .catalogue import Metric

LIBRARY_NAME = "ssm-zoo"
_TASK_TYPES = {"classification": "time-series-classification", "regression": "time-series-regression",
               "sequence": "time-series-forecasting", "lm": "text-generation"}


def _metric(m: Metric | Mapping[str, Any]) -> Metric:
    if isinstance(m, Metric):
        return m
    return Metric(str(m["dataset"]), str(m["split"]), str(m["metric"]), float(m["value"]), m.get("task"), m.get("name"))


def _model_index(name: str, task: str | None, metrics: Sequence[Metric]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[Metric]] = {}
    for m in metrics:
        groups.setdefault((m.task or _TASK_TYPES.get(task or "", "other"), m.dataset, m.split), []).append(m)
    results = []
    for (task_type, dataset, split), ms in sorted(groups.items()):
        results.append({
            "task": {"type": task_type},
            "dataset": {"name": dataset, "type": dataset, "split": split},
            "metrics": [{"type": m.metric, "value": m.value, "name": m.name or f"{split} {m.metric}"} for m in ms],
        })
    return [{"name": name, "results": results}]


def front_matter(*, name: str, spec: Mapping[str, Any], metrics: Sequence[Metric | Mapping[str, Any]] = (),
                 license: str = "apache-2.0", datasets: Sequence[str] = (), tags: Sequence[str] = (),
                 plugin: str | None = None) -> dict[str, Any]:
    """The card's YAML metadata as a dict (what the Hub indexes)."""
    core = spec.get("model", {}).get("core", {}).get("kind")
    task = spec.get("task", {}).get("kind")
    ms = [_metric(m) for m in metrics]
    all_tags = ["state-space-model", LIBRARY_NAME, *([core] if core else []), *([plugin] if plugin else []), *tags]
    meta: dict[str, Any] = {"library_name": LIBRARY_NAME, "license": license,
                            "tags": list(dict.fromkeys(all_tags))}
    ds = list(dict.fromkeys([*datasets, *(m.dataset for m in ms)]))
    if ds:
        meta["datasets"] = ds
    if ms:
        meta["model-index"] = _model_index(name, task, ms)
    return meta


def render_card(*, name: str, spec: Mapping[str, Any], metrics: Sequence[Metric | Mapping[str, Any]] = (),
                license: str = "apache-2.0", datasets: Sequence[str] = (), tags: Sequence[str] = (),
                num_params: int | None = None, training_command: str | None = None, plot: str | None = None,
                description: str = "", intended_use: str | None = None, limitations: str | None = None,
                versions: Mapping[str, str] | None = None, repo_id: str | None = None) -> str:
    """The full ``README.md`` text. Deterministic: the same inputs give the same bytes.

    Args:
        name: ``arch.tag`` (or any display name).
        spec: the resolved model spec (as stored in ``config.json``).
        metrics: measured results, each with dataset, split, metric and value.
        plot: a file name in the repo (e.g. ``curves.png``) shown under the results.
        versions: zoo-core, torch and plugin versions (``config.json``'s ``versions``).
    """
    plugin = next((k for k in (versions or {}) if k.startswith("zoo-") and k != "zoo-core"), None)
    meta = front_matter(name=name, spec=spec, metrics=metrics, license=license, datasets=datasets, tags=tags, plugin=plugin)
    m, task = spec.get("model", {}), spec.get("task", {})
    core = m.get("core", {})
    ms = [_metric(x) for x in metrics]
    ref = f"hf-hub:{repo_id}" if repo_id else name
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, default_flow_style=False).rstrip(), "---", "", f"# {name}", ""]
    lines += [description or (f"A {core.get('kind', '?')} sequence model for {task.get('kind', '?')}, "
                              f"assembled by SSM Zoo from the spec below."), ""]
    lines += ["## Model", "", f"- core: `{core.get('kind')}` ({plugin or 'plugin not recorded'})",
              f"- width d_model={m.get('d_model')}, depth={m.get('depth')}, task: {task.get('kind')}"]
    lines += [f"- parameters: {num_params:,}" if num_params is not None else "- parameters: not recorded", ""]
    lines += ["```json", json.dumps(dict(spec), indent=2, sort_keys=True), "```", ""]
    lines += ["## Training", "", *(["```bash", training_command, "```"] if training_command else ["Not recorded."]), ""]
    lines += ["## Results", ""]
    if ms:
        lines += ["| dataset | split | metric | value |", "| --- | --- | --- | --- |"]
        lines += [f"| {x.dataset} | {x.split} | {x.metric} | {x.value:.4g} |" for x in ms]
    else:
        lines += ["No measured results recorded."]
    if plot:
        lines += ["", f"![training curves]({plot})"]
    lines += ["", "## How to use", "", "```python", "from zoo_core.hub import create_model", "",
              f'model = create_model("{ref}", pretrained=True)', "```", "",
              "```bash", f"zoo pull {ref}", "```", ""]
    lines += ["## Intended use", "", intended_use or "Research and teaching on sequence modelling with state space models.", ""]
    lines += ["## Limitations", "", limitations or ("Small model trained on one dataset; the numbers above hold for that "
                                                    "dataset's split only and say nothing about other data."), ""]
    if versions:
        lines += ["## Versions", "", *[f"- {k} {v}" for k, v in sorted(versions.items())], ""]
    return "\n".join(lines)

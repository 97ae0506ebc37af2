"""audit: which pairs are bad and why, and whether cheap features give the answer away.

Reads a release folder, a run directory (its release, or its pair stage's kept pairs when
it has none), or any file in the reference schema (JSONL, JSON, parquet, a ``datasets``
``save_to_disk`` folder). Writes ``audit.html`` (one self-contained page),
``audit.json`` (every figure) and ``flags.jsonl`` (one line per pair and check that
fires). See ``docs/audit.md``.

Modules: ``load`` (sources, type checks), ``checks`` (the pass of the rules' audit checks
over a set), ``figures`` (length, similarity, judge figures, per category), ``probe``
(the shortcut probe), ``report`` (HTML, files, comparison), ``run`` (:func:`audit`).

Names are imported on first use. The rules the checks apply live below this package, in
``pipeline/rules/``: one class per rule, shared with the pair stage.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "audit": "run",
    "parse_fail_on": "run",
    "gate": "run",
    "AuditGateError": "run",
    "compute_figures": "figures",
    "Judge": "figures",
    "load_pairs": "load",
    "REQUIRED_COLUMNS": "load",
    "render_html": "report",
    "svg_bars": "report",
    "shortcut_probe": "probe",
    "surface_features": "probe",
    "PROBE_FEATURES": "probe",
    "PROBE_FLAG_AUC": "probe",
    "PROBE_MIN_PAIRS": "probe",
    "_auc": "probe",
}

__all__ = sorted(k for k in _EXPORTS if not k.startswith("_"))


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline.audit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pipeline.audit.{module}"), name)
    globals()[name] = value
    return value

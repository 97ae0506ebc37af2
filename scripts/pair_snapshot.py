"""What the pair stage and the audit decide, as one comparable file: the sample and a
synthetic run against the stand-in server, each run then audited.

A refactor of the rules must leave this file unchanged but for what it was meant to
change; a change to the judge's order shows here what it saves (requests per stage) and
what it costs (kept pairs, drops by reason)::

    python scripts/pair_snapshot.py --out before.json          # then change the code
    python scripts/pair_snapshot.py --out after.json --compare before.json

The synthetic input is ``benchmarks/scale.py``'s generator (labelled synthetic on every
row). What is recorded per run: the requests each LLM stage sent, the kept pair ids, every
drop (example, reason, detail; and each combination's reason), and the audit's
``audit.json`` (without timings and paths) and ``flags.jsonl``, both whole.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT)]

import yaml  # noqa: E402
from standin_server import StandinServer  # noqa: E402

from pipeline.cli import main as prb  # noqa: E402

STAGES = ("rubrics", "responses", "judge", "pairs")
# volatile parts of audit.json: timings, where things lie, when it ran
VOLATILE = {"timings", "path", "paths", "source", "written_at", "seconds", "out", "config"}


def _scrub(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if k not in VOLATILE and not k.endswith("_s")}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def _rows(folder: Path, pattern: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted(folder.glob(pattern)):
        out += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line]
    return out


def _requests(stats: dict[str, Any]) -> dict[str, Any]:
    """The request counts a stage's stats.json holds (``requests`` and what is under it)."""
    found = stats.get("llm") or stats.get("requests") or {}
    if not isinstance(found, dict):
        return {"requests": found}
    return {k: v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool)}


def snapshot_run(cfg: Path, run: Path) -> dict[str, Any]:
    assert prb(["run", str(cfg), "--no-progress"]) in (0, 5), f"prb run {cfg} failed"
    out: dict[str, Any] = {"stages": {}}
    for stage in STAGES:
        stats = json.loads((run / stage / "stats.json").read_text(encoding="utf-8"))
        out["stages"][stage] = {
            "requests": _requests(stats),
            **{k: stats[k] for k in ("kept", "dropped", "dropped_by_reason") if k in stats},
        }
    kept = _rows(run / "pairs", "data-*.jsonl")
    out["kept"] = sorted(r["pair_id"] for r in kept)
    out["drops"] = sorted(
        (
            {
                "example_id": r["example_id"],
                "reason": r["reason"],
                "detail": r["detail"],
                "pairs": [(p["chosen_id"], p["rejected_id"], p["reason"]) for p in r["pairs"]],
            }
            for r in _rows(run / "pairs", "rejects-*.jsonl")
        ),
        key=lambda d: d["example_id"],
    )
    if not kept:
        return out
    report = run / "report-snapshot"
    code = prb(["audit", str(run), "--out", str(report)])
    assert code in (0, 3), f"prb audit {run} failed ({code})"
    audit = json.loads((report / "audit.json").read_text(encoding="utf-8"))
    flags = (report / "flags.jsonl").read_bytes()
    out["audit"] = _scrub(audit)
    out["flags_sha256"] = hashlib.sha256(flags).hexdigest()
    out["flags"] = [json.loads(line) for line in flags.decode().splitlines() if line]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--synthetic", type=int, default=240, help="synthetic examples (0: none)")
    ap.add_argument("--compare", type=Path, help="an earlier snapshot to compare with")
    args = ap.parse_args(argv)
    from scale import write_config, write_synthetic_input

    result: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        StandinServer() as server,
        StandinServer(mode="filler") as filler,
    ):
        work = Path(tmp)
        # the sample as the README runs it, and answered with filler (random text and
        # verdicts: drops of every kind)
        for name, url in (("sample", server.base_url), ("sample-filler", filler.base_url)):
            sample = yaml.safe_load((ROOT / "configs" / "sample.yaml").read_text())
            sample["run"]["output_dir"] = str(work / "outputs")
            sample["run"]["name"] = name
            sample["input"]["path"] = str(ROOT / "examples" / "sample_lamp.jsonl")
            sample["backend"]["openai"]["base_url"] = url
            (work / f"{name}.yaml").write_text(yaml.safe_dump(sample))
            result[name] = snapshot_run(work / f"{name}.yaml", work / "outputs" / name)
        if args.synthetic:
            data = work / "synthetic.jsonl"
            write_synthetic_input(data, args.synthetic)
            cfg = write_config(work, "synthetic", data, server.base_url, 64)
            result["synthetic"] = snapshot_run(cfg, work / "outputs" / "synthetic")
        # where the runs lay is not what they decided
        text = json.dumps(result, indent=1, sort_keys=True).replace(str(work), "<work>")
    args.out.write_text(text + "\n")
    result = json.loads(text)
    for name, snap in result.items():
        print(f"{name}: kept {len(snap['kept'])}, drops {len(snap['drops'])}, "
              f"judge {snap['stages']['judge']['requests']}")  # fmt: skip
    if args.compare:
        before = json.loads(args.compare.read_text())
        same = True
        for name in sorted(set(before) | set(result)):
            a, b = before.get(name, {}), result.get(name, {})
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    same = False
                    print(f"{name}.{key}: differs")
        print("identical" if same else "differences above")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The whole pipeline on the hand-written sample (configs/sample.yaml, 12 examples) with the
# in-process vLLM engine, then the funnel and each stage's failure counts.
#
# usage (from anywhere; on a GPU machine with vLLM importable):
#   bash scripts/gpu_e2e.sh MODEL_DIR [OUT_DIR] [-- extra prb run arguments]
# e.g.  bash scripts/gpu_e2e.sh /root/smol
#       bash scripts/gpu_e2e.sh /root/smol /tmp/e2e -- --set backend.vllm.max_model_len=4096
#
# It runs the project as `python -m pipeline.cli`, so it works from a checkout that is only
# on PYTHONPATH (the ../shared/gpu recipe: `source .gpu/kit/env.sh` first) as well as from an
# installed one. PYTHON picks the interpreter (default python3). The exit status is the
# run's: non-zero when a stage kept failed requests (they are retried by running it again),
# and 5 when the run kept no pair (docs/errors.md).
set -uo pipefail

if [ $# -lt 1 ] || [ -z "$1" ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash scripts/gpu_e2e.sh MODEL_DIR [OUT_DIR] [-- extra prb run arguments]" >&2
  exit 2
fi
MODEL_DIR=$1
shift
OUT_DIR=outputs/gpu_e2e
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  OUT_DIR=$1
  shift
fi
[ "${1:-}" = "--" ] && shift
if [ ! -d "$MODEL_DIR" ]; then
  echo "gpu_e2e: model folder $MODEL_DIR does not exist (give a local Hugging Face folder)" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
MODEL_DIR=$(cd "$MODEL_DIR" && pwd)
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$ROOT" || exit 2

echo "== prb run configs/sample.yaml with backend.name=vllm, model $MODEL_DIR, into $OUT_DIR"
start=$(date +%s)
"$PY" -m pipeline.cli run configs/sample.yaml \
  --set backend.name=vllm --set "backend.model=$MODEL_DIR" --set "run.output_dir=$OUT_DIR" \
  --set run.name=gpu_e2e "$@"
rc=$?
echo "== run finished with exit status $rc after $(($(date +%s) - start)) s"

"$PY" - "$OUT_DIR/gpu_e2e" <<'EOF'
"""Print the funnel and each stage's failure counts from the run's stats files."""
import json
import sys
from pathlib import Path

run = Path(sys.argv[1])


def llm_counts(stats):
    """Sum every LLM-call block in a stage's stats (the judge has pointwise + pairwise)."""
    blocks = []

    def walk(d):
        if isinstance(d, dict):
            if "sent" in d and "failed" in d:
                blocks.append(d)
            else:
                for v in d.values():
                    walk(v)

    walk(stats.get("llm", {}))
    total = {"requests": 0, "sent": 0, "cached": 0, "failed": 0, "reasks": 0, "length_reasks": 0}
    reasons = {}
    for b in blocks:
        for k in total:
            total[k] += int(b.get(k) or 0)
        for k, v in (b.get("failure_reasons") or {}).items():
            reasons[k] = reasons.get(k, 0) + v
    return total, reasons


for stage in ("ingest", "rubrics", "responses", "judge", "pairs"):
    folder = run / stage
    stats_file = folder / "stats.json"
    if not stats_file.exists():
        print(f"{stage:>9}: not finished (no stats.json)")
        continue
    stats = json.loads(stats_file.read_text())
    done = (folder / "_DONE.json").exists()
    parts = [] if done else ["PARTIAL"]
    total, reasons = llm_counts(stats)
    if total["requests"]:
        parts.append(
            f"requests {total['requests']} (sent {total['sent']}, cached {total['cached']}), "
            f"failed {total['failed']}, re-asks {total['reasks']} "
            f"(length {total['length_reasks']})"
        )
        parts.append(f"failure reasons {json.dumps(reasons, sort_keys=True)}")
    for key in ("reject_reasons", "parse_failures", "pending_examples", "finish_reasons"):
        if key in stats:
            parts.append(f"{key} {json.dumps(stats[key], sort_keys=True)}")
    if stage == "rubrics":
        parts.insert(0, f"rubrics {stats.get('rubrics')}, rejected {stats.get('rejected')}")
    print(f"{stage:>9}: " + "; ".join(parts))

pairs = run / "pairs" / "stats.json"
if pairs.exists():
    s = json.loads(pairs.read_text())
    print(f"\nfunnel: {s.get('examples')} examples -> {s.get('kept')} kept, {s.get('dropped')} dropped")
    for reason, n in (s.get("dropped_by_reason") or {}).items():
        if n:
            print(f"  dropped by {reason}: {n}")
    print(f"  pairs judged {s.get('pairs_judged')}, pair-level drops "
          f"{json.dumps(s.get('pairs_dropped_by_filter', {}), sort_keys=True)}")
    print(f"  kept by strategy {json.dumps(s.get('kept_by_strategy', {}), sort_keys=True)}")
env = run / "environment.json"
if env.exists():
    e = json.loads(env.read_text())
    print(f"\nenvironment: {json.dumps({k: e[k] for k in e if 'vllm' in k or k in ('python', 'torch')})}")
EOF
exit $rc

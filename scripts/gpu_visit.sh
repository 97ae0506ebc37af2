#!/usr/bin/env bash
# The GPU visit's one script (docs/vllm.md, "A 7B reasoning model on one visit"): at most
# LIMIT_S (default 240) seconds of scripts/gpu_visit.py, in one process, on the model staged
# by scripts/gpu_stage_model.sh into MODEL_DIR (default /root/model). Every step writes its
# figures as it finishes into OUT_DIR (default $OUT/visit on the device machine, else
# outputs/visit), so a visit cut at its limit still returns what it measured.
#
# usage (from the checkout root on the GPU machine, the ../shared/gpu bundle set up):
#   bash scripts/gpu_visit.sh [OUT_DIR] [-- gpu_visit.py arguments, e.g. --dummy --budget 384]
# Environment: PYTHON (default python3), MODEL_DIR, LIMIT_S, KIT (default .gpu/kit: its
# env.sh is sourced when present).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
KIT=${KIT:-.gpu/kit}
# shellcheck disable=SC1091
[ -f "$KIT/env.sh" ] && source "$KIT/env.sh"
PY=${PYTHON:-python3}
LIMIT_S=${LIMIT_S:-240}
OUT_DIR=${OUT:-outputs}/visit
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  OUT_DIR=$1
  shift
fi
[ "${1:-}" = "--" ] && shift
mkdir -p "$OUT_DIR"
echo "== gpu_visit: at most $LIMIT_S s, figures in $OUT_DIR/visit.json"
start=$SECONDS
# the script stops starting steps 15 s before the limit; the limit stops a step that overruns
timeout -k 10 "$LIMIT_S" "$PY" scripts/gpu_visit.py --out "$OUT_DIR" \
  --deadline-s "$((LIMIT_S - 15))" "$@" 2>&1 | tee "$OUT_DIR/visit.log" | grep -v -E "it/s\]|s/it\]"
rc=${PIPESTATUS[0]}
echo "== gpu_visit: exit $rc after $((SECONDS - start)) s"
[ -f "$OUT_DIR/visit.json" ] && "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: (v if k != 'steps' else {s: ('error' in e and 'ERROR') or ('skipped' in e and 'skipped') or 'ok' for s, e in v.items()}) for k, v in d.items() if k in ('device', 'elapsed_s', 'steps')}, indent=1))" "$OUT_DIR/visit.json"
exit "$rc"

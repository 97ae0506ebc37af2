#!/usr/bin/env bash
# One prepared check of the vLLM path on a GPU machine, sized to fit 8 minutes on one H100 or
# H200 with the ../shared/gpu bundle set up (vLLM 0.26.0 in /tmp/site, SmolLM2-135M-Instruct
# at $MODEL): each step is time-bounded, a failing step does not stop the next, and every
# step's figures are printed and kept under OUT_DIR.
#
#   1. the sample (configs/sample.yaml, 12 examples) in-process on $MODEL, rubrics given
#      (scripts/gpu_e2e.sh): the funnel, each stage's requests and failures, wall time with
#      engine start (target: under 90 s)
#   2. the judge benchmark (benchmarks/vllm_throughput.py --stage judge) on the 7B-shaped
#      random-weight model: the judge's schema requests against unconstrained LLM.chat on
#      the same prompts (target: constrained output tokens/s >= 0.8 x unconstrained), and
#      the same free requests under a grammar that allows any text (what vLLM's
#      structured-output path costs by itself), each twice, the median kept; then a few
#      requests with the bounded schemas the judge sent before
#   3. the sample again with rubrics generated (the rubric schema too)
#   4. the reference's size: 2,830 synthetic examples (benchmarks/scale.py's generator,
#      labelled synthetic; avoid_all as the reference, n=2) on the 7B-shaped model, stopped
#      after $T_REF s; each stage's answers and tokens per second from its cache
#      (scripts/gpu_stage_rates.py; chunks of 512 requests, so a stopped stage has stored
#      what it finished)
#
# usage (from the checkout root, after `source .gpu/kit/env.sh`):
#   bash scripts/gpu_check.sh [OUT_DIR]
# Environment: MODEL (the HF folder, default /root/smol), GGUF (SmolLM2's GGUF, for the
# 7B-shaped folder's tokenizer), DUMMY_MODEL (default /root/m7b, made if missing), KIT
# (default .gpu/kit), PYTHON, the step limits T_SAMPLE, T_JUDGE, T_GENERATED, T_REF
# (seconds), and REF_EXAMPLES (default 2830; a test makes it small). The exit status is 0 when every step finished in time, 1 otherwise.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
PY=${PYTHON:-python3}
OUT=${1:-outputs/gpu_check}
MODEL=${MODEL:-/root/smol}
GGUF=${GGUF:-/root/stage/x/SmolLM2-135M-Instruct.Q4_1.gguf}
DUMMY=${DUMMY_MODEL:-/root/m7b}
KIT=${KIT:-.gpu/kit}
T_SAMPLE=${T_SAMPLE:-110}
T_JUDGE=${T_JUDGE:-190}
T_GENERATED=${T_GENERATED:-80}
T_REF=${T_REF:-90}
REF_EXAMPLES=${REF_EXAMPLES:-2830}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
failed=0

step() {  # step NAME LIMIT_S COMMAND...: run it time-bounded, log it, note its time and status
  local name=$1 limit=$2
  shift 2
  echo "== [$name] (at most $limit s): $*"
  local start=$SECONDS
  timeout -k 15 "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | grep -v -E "it/s\]|s/it\]"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "$name: stopped at its limit after $took s" | tee -a "$SUMMARY"
  else
    echo "$name: exit $rc after $took s" | tee -a "$SUMMARY"
  fi
  # where the time went: each engine's start (vLLM's own line), each stage's closing line,
  # the judge benchmark's table and its split
  grep -o -E "init engine \(profile, create kv cache, warmup model\) took [0-9.]+ s( \(compilation: [0-9.]+ s\))?|^\[[a-z_]+\] done: .*|^(unconstrained_raw|any_text_raw|constrained_raw|backend@[0-9]+) .*|^split: .*" \
    "$OUT/$name.log" | sed 's/^/  /' >>"$SUMMARY"
  [ "$rc" = 0 ] || failed=1
  return 0
}

if [ ! -d "$MODEL" ]; then
  echo "gpu_check: model folder $MODEL does not exist (set MODEL; see ../shared/gpu)" >&2
  exit 2
fi
"$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')" \
  | tee -a "$SUMMARY"

# 1. the sample, rubrics given
step sample_given "$T_SAMPLE" bash scripts/gpu_e2e.sh "$MODEL" "$OUT/given"

# 2. the judge benchmark on the 7B-shaped model (random weights: the work per token is real)
if [ ! -f "$DUMMY/config.json" ]; then
  "$PY" "$KIT/make_dummy_7b.py" "$GGUF" "$DUMMY" 8 2>&1 | tail -n 2
fi
step judge_benchmark "$T_JUDGE" "$PY" benchmarks/vllm_throughput.py --stage judge \
  --model "$DUMMY" --load-format dummy --requests 512 --max-tokens 384 --repeats 2 \
  --chunk-sizes 4096 --bounded-requests 24 --max-model-len 4096 --out "$OUT/vllm_judge.json"

# 3. the sample, rubrics generated
step sample_generated "$T_GENERATED" bash scripts/gpu_e2e.sh "$MODEL" "$OUT/generated" -- \
  --set rubrics.source=generated

# 4. the reference's size, time-bounded
REF="$OUT/reference"
mkdir -p "$REF"
"$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from scale import write_synthetic_input; \
from pathlib import Path; print(write_synthetic_input(Path('$REF/input.jsonl'), $REF_EXAMPLES))" | tail -n 1
step reference_size "$T_REF" "$PY" -m pipeline.cli run configs/sample.yaml --no-progress \
  --set "input.path=$REF/input.jsonl" --set run.name=reference --set "run.output_dir=$REF" \
  --set "responses.strategies=[avoid_all]" --set backend.name=vllm \
  --set "backend.model=$DUMMY" --set backend.vllm.engine_args.load_format=dummy \
  --set backend.vllm.max_model_len=4096 --set backend.vllm.chunk_size=512
"$PY" scripts/gpu_stage_rates.py "$REF/reference" 2>&1 | tee -a "$SUMMARY"

echo "== summary ($OUT/summary.txt)"
cat "$SUMMARY"
exit $failed

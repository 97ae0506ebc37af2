#!/usr/bin/env bash
# A model's files carried to a GPU machine in pieces, back to back, and put together there
# (docs/vllm.md, "A 7B reasoning model on one visit"). A device call carries the working
# tree plus at most 64 MiB of ignored paths, so the model travels as pieces of at most
# PIECE_MIB (default 57) MiB, one a call, each kept on the machine's disk outside the
# working tree until the last one is in.
#
#   here:        bash scripts/gpu_stage_model.sh split GGUF HF_FOLDER [OUT_DIR]
#                  tars the GGUF and the Hugging Face folder made from its metadata
#                  (scripts/gguf_hf_folder.py) into pieces OUT_DIR/m000, m001, ... (default
#                  .gpu/model, which .git/info/exclude keeps out of git), with each piece's
#                  sha256 in OUT_DIR/pieces.sha256 and the whole tar's in OUT_DIR/model.sha256.
#                  About 1 minute for 4.5 GB on this machine's disk.
#   on the GPU:  bash scripts/gpu_stage_model.sh keep N [OUT_DIR]
#                  one call per piece, carrying OUT_DIR/mNNN and the two .sha256 files:
#                  checks the piece's sha256 and keeps it in $STAGE (default
#                  /root/stage/model). About 5 s a call when the machine is warm.
#   on the GPU:  bash scripts/gpu_stage_model.sh join [OUT_DIR]
#                  checks that every piece is kept, joins them, checks the whole tar's sha256
#                  and unpacks it into $MODEL_DIR (default /root/model): the GGUF and hf/.
#                  About 20 s for 4.5 GB (the sha256 of the whole, then tar).
#   anywhere:    bash scripts/gpu_stage_model.sh calls [OUT_DIR]
#                  prints the device calls to make, in order, with what each carries.
# Exit status: 0 when done, 2 on a usage error, 3 when a checksum does not match (the piece
# or the whole is named: send that piece again).
set -euo pipefail

usage() {
  echo "usage: bash scripts/gpu_stage_model.sh split GGUF HF_FOLDER [OUT_DIR] | keep N [OUT_DIR] | join [OUT_DIR] | calls [OUT_DIR]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
cmd=$1
shift
STAGE=${STAGE:-/root/stage/model}
MODEL_DIR=${MODEL_DIR:-/root/model}
PIECE_MIB=${PIECE_MIB:-57}

case "$cmd" in
split)
  [ $# -ge 2 ] || usage
  gguf=$1 hf=$2 out=${3:-.gpu/model}
  [ -f "$gguf" ] || { echo "gpu_stage_model: $gguf is not a file" >&2; exit 2; }
  [ -f "$hf/config.json" ] || { echo "gpu_stage_model: $hf has no config.json (make it with scripts/gguf_hf_folder.py)" >&2; exit 2; }
  mkdir -p "$out"
  rm -f "$out"/m[0-9][0-9][0-9] "$out/pieces.sha256" "$out/model.sha256"
  # one stream: the GGUF under its own name and the folder as hf/, split as it is written
  tar -cf - -C "$(dirname "$gguf")" "$(basename "$gguf")" -C "$(cd "$hf/.." && pwd)" \
    --exclude=header.gguf --transform "s|^$(basename "$hf")|hf|" "$(basename "$hf")" |
    split -d -a 3 -b "${PIECE_MIB}M" - "$out/m"
  (cd "$out" && sha256sum m[0-9][0-9][0-9] >pieces.sha256)
  (cd "$out" && cat m[0-9][0-9][0-9] | sha256sum | awk '{print $1"  model.tar"}' >model.sha256)
  n=$(wc -l <"$out/pieces.sha256")
  echo "gpu_stage_model: $n pieces of at most $PIECE_MIB MiB in $out ($(du -sh "$out" | cut -f1))"
  ;;
keep)
  [ $# -ge 1 ] || usage
  n=$(printf '%03d' "$((10#$1))") out=${2:-.gpu/model}
  piece="$out/m$n"
  [ -f "$piece" ] || { echo "gpu_stage_model: $piece is not in the working tree (carry it)" >&2; exit 2; }
  want=$(awk -v p="m$n" '$2 == p {print $1}' "$out/pieces.sha256")
  [ -n "$want" ] || { echo "gpu_stage_model: m$n is not in $out/pieces.sha256" >&2; exit 2; }
  got=$(sha256sum "$piece" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "gpu_stage_model: piece m$n arrived damaged (sha256 $got, want $want): send it again" >&2
    exit 3
  fi
  mkdir -p "$STAGE"
  cp "$piece" "$STAGE/m$n"
  cp "$out/pieces.sha256" "$out/model.sha256" "$STAGE/"
  echo "gpu_stage_model: kept m$n ($(stat -c %s "$piece") bytes); $(ls "$STAGE" | grep -c '^m[0-9]') of $(wc -l <"$out/pieces.sha256") pieces in $STAGE"
  ;;
join)
  out=${1:-.gpu/model}
  list="$STAGE/pieces.sha256"
  [ -f "$list" ] || list="$out/pieces.sha256"
  [ -f "$list" ] || { echo "gpu_stage_model: no pieces.sha256 in $STAGE or $out" >&2; exit 2; }
  missing=$(awk '{print $2}' "$list" | while read -r p; do [ -f "$STAGE/$p" ] || echo "$p"; done)
  if [ -n "$missing" ]; then
    echo "gpu_stage_model: pieces not kept yet: $(echo $missing)" >&2
    exit 3
  fi
  (cd "$STAGE" && sha256sum -c --quiet "$list") || { echo "gpu_stage_model: a kept piece is damaged" >&2; exit 3; }
  sums="$STAGE/model.sha256"
  [ -f "$sums" ] || sums="$out/model.sha256"
  want=$(awk '{print $1}' "$sums")
  pieces=$(awk '{print $2}' "$list" | sed "s|^|$STAGE/|")
  # shellcheck disable=SC2086  # the piece names have no spaces (m000...)
  got=$(cat $pieces | sha256sum | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "gpu_stage_model: the joined model's sha256 is $got, want $want" >&2
    exit 3
  fi
  mkdir -p "$MODEL_DIR"
  # shellcheck disable=SC2086
  cat $pieces | tar -xf - -C "$MODEL_DIR"
  awk '{print $2}' "$list" | sed "s|^|$STAGE/|" | xargs rm -f
  # the GGUF's sha256 now (remembered by path, size and time), not inside the visit's limit
  for g in "$MODEL_DIR"/*.gguf; do
    [ -f "$g" ] && ${PYTHON:-python3} -c "import sys; from pipeline.backends.identity import file_sha256; print('sha256', file_sha256(sys.argv[1]))" "$g" 2>/dev/null || true
  done
  echo "gpu_stage_model: joined and checked into $MODEL_DIR: $(cd "$MODEL_DIR" && ls)"
  ;;
calls)
  out=${1:-.gpu/model}
  [ -f "$out/pieces.sha256" ] || { echo "gpu_stage_model: no $out/pieces.sha256 (split first)" >&2; exit 2; }
  i=0
  while read -r _ p; do
    echo "run: bash scripts/gpu_stage_model.sh keep $((10#${p#m}))   carry: $out/$p $out/pieces.sha256 $out/model.sha256"
    i=$((i + 1))
  done <"$out/pieces.sha256"
  echo "run: bash scripts/gpu_stage_model.sh join   ($i pieces; then the visit: bash scripts/gpu_visit.sh)"
  ;;
*) usage ;;
esac

#!/usr/bin/env bash
# Three studies that each need many distillations, run side by side on one GPU (or, slowly, a CPU):
#
#   research/transfer_nv_inputs.sh OUT [PART...]     PART: transfer | nv | inputs (default: all three)
#
# transfer: cross-task transfer (the paper's transfer table). A compressor is distilled on each of
#           TASKS (k = 20, both stages); each is then carried to every other task with
#           `distill --init-from` (stage 2 only). One fidelity run per target task evaluates, on the
#           same held-out subsets, the native compressor, the three transferred ones and the three
#           source compressors used as they are (no stage 2): transfer-<task>.json.
# nv:       the number of virtual tokens n_v in NV at k = 50 on rotten_tomatoes and coin_flip, with
#           the control, one fidelity run per task: nv-<task>-k50.json.
# inputs:   what the SSM scans (--ssm-input embeddings | layer:l for l in LAYERS) on rotten_tomatoes
#           and coin_flip at k = 20 and 50, with the control of each setting, one fidelity run per
#           task and k: inputs-<task>-k<k>.json; then the flipped-label probe of each input choice
#           on rotten_tomatoes at k = 20: flipped-<name>.json.
#
# Environment: ICL (default: icl-ssm), PYTHON (default: python3), MODEL (default: smollm2-135m),
# SAMPLES (training episodes, default 128), SUBSETS and QUERIES (fidelity, default 30 x 32),
# TASKS (default: rotten_tomatoes cr coin_flip modular_addition), TWO (the tasks of nv and inputs,
# default: rotten_tomatoes coin_flip; the flipped-label probe runs when rotten_tomatoes is one),
# HUB (a task: transfers only to and from it, 2(n-1) runs instead of n(n-1)), NV (default: 4 16 64),
# LAYERS (default: 1 2 8),
# JOBS (runs at once in each of the two pipelines, default 8), KLO and KHI (the two k, default
# 20 and 50). Each run's wall time goes to OUT/times.tsv; finished runs are skipped on a rerun.
# Every step is a background job bounded by JOBS, so on one GPU the small teacher leaves room for
# many at once.
set -uo pipefail
OUT=${1:?usage: research/transfer_nv_inputs.sh OUT [transfer|nv|inputs ...]}
shift
PARTS=${*:-transfer nv inputs}
ICL=${ICL:-icl-ssm}
PYTHON=${PYTHON:-python3}
MODEL=${MODEL:-smollm2-135m}
SAMPLES=${SAMPLES:-128}
TASKS=${TASKS:-rotten_tomatoes cr coin_flip modular_addition}
NV=${NV:-4 16 64}
LAYERS=${LAYERS:-1 2 8}
HUB=${HUB:-}
JOBS=${JOBS:-8}
KLO=${KLO:-20}  # the two prompt sizes (smaller ones for a smoke run on a tiny model)
KHI=${KHI:-50}
FID="--model $MODEL --subsets ${SUBSETS:-30} --queries ${QUERIES:-32} --batch 8 --query-batch 64 --json"
TWO=${TWO:-"rotten_tomatoes coin_flip"}  # the tasks of nv and inputs
FLIP=${FLIP:-"--subsets 24 --queries 16"}  # the flipped-label probe's size
mkdir -p "$OUT"
here=$(cd "$(dirname "$0")" && pwd)

has() { [[ " $PARTS " == *" $1 "* ]]; }
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done; }
timed() {  # NAME cmd...: run, log to OUT/NAME.log, append "NAME seconds status" to OUT/times.tsv
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@" >> "$OUT/$name.log" 2>&1
  local rc=$?
  echo -e "$name\t$(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{print b-a}")\t$rc" >> "$OUT/times.tsv"
  return $rc
}
teacher() {  # flags: fill the teacher cache that the trainings with these flags share
  timed "teacher$(echo "$@" | tr -c 'a-z0-9' '-')" $ICL distill --model "$MODEL" --samples "$SAMPLES" "$@" --teacher-only
}
train() {  # NAME flags...
  local name=$1; shift
  [ -f "$OUT/$name/model.safetensors" ] && return 0
  local resume=""; [ -d "$OUT/$name/checkpoint" ] && resume=--resume
  timed "$name" $ICL distill --model "$MODEL" --samples "$SAMPLES" "$@" --out "$OUT/$name" $resume
}
pick() {  # NAME=DIR...: those whose compressor finished (a failed run leaves the others' report)
  local a; for a in "$@"; do [ -f "${a#*=}/model.safetensors" ] && echo "$a"; done
}
into() {  # FILE cmd...: the command's output written to FILE whole or not at all
  local file=$1; shift
  "$@" > "$file.tmp" && mv "$file.tmp" "$file"
}
fidelity() {  # REPORT flags...
  local report=$1; shift
  [ -f "$OUT/$report" ] && return 0
  timed "$report" into "$OUT/$report" $ICL fidelity $FID "$@"
}

# the teacher model is converted (GGUF) or built once, before anything runs beside it
$PYTHON -c "from icl_ssm.lm.models import load_model; load_model('$MODEL')" || exit 1

# Two pipelines run side by side, k = KLO (transfer, inputs at KLO) and k = KHI (nv, inputs at KHI);
# within each, the teacher caches come first (each is read by several trainings, so none may be
# built twice), then the trainings from scratch, then (KLO) the transfers, then the fidelity runs.
low() {
  for t in $( { has transfer && echo $TASKS; } || { has inputs && echo $TWO; } ); do throttle; teacher --task "$t" --k $KLO & done
  wait
  for t in $( { has transfer && echo $TASKS; } || { has inputs && echo $TWO; } ); do
    throttle; train "native-$t" --task "$t" --k $KLO &
  done
  if has inputs; then
    for t in $TWO; do
      throttle; train "control-$t-k$KLO" --task "$t" --k $KLO --control &
      for l in $LAYERS; do throttle; train "layer$l-$t-k$KLO" --task "$t" --k $KLO --ssm-input "layer:$l" & done
    done
  fi
  if has transfer; then
    for s in $TASKS; do for t in $TASKS; do
      [ "$s" = "$t" ] && continue
      [ -n "$HUB" ] && [ "$s" != "$HUB" ] && [ "$t" != "$HUB" ] && continue
      # a transfer starts once its source is trained
      until [ -f "$OUT/native-$s/model.safetensors" ] || ! jobs -rp | grep -q .; do sleep 2; done
      throttle; train "xfer-$s-to-$t" --task "$t" --k $KLO --init-from "$OUT/native-$s" &
    done; done
  fi
  wait
  if has transfer; then
    for t in $TASKS; do
      also=()
      for s in $TASKS; do
        [ "$s" = "$t" ] && continue
        also+=("from-$s=$OUT/xfer-$s-to-$t" "as-is-$s=$OUT/native-$s")
      done
      throttle; fidelity "transfer-$t.json" --task "$t" --k $KLO --compressor "$OUT/native-$t" --also $(pick "${also[@]}") &
    done
  fi
  if has inputs; then
    for t in $TWO; do
      also=()
      for l in $LAYERS; do also+=("layer$l=$OUT/layer$l-$t-k$KLO"); done
      throttle; fidelity "inputs-$t-k$KLO.json" --task "$t" --k $KLO --compressor "$OUT/native-$t" \
        --control "$OUT/control-$t-k$KLO" --also $(pick "${also[@]}") &
    done
  fi
  if has inputs && [[ " $TWO " == *" rotten_tomatoes "* ]]; then  # the flipped-label probe is on rotten_tomatoes
    for name in native-rotten_tomatoes $(for l in $LAYERS; do echo "layer$l-rotten_tomatoes-k$KLO"; done); do
      [ -f "$OUT/flipped-$name.json" ] && continue
      throttle
      timed "flipped-$name" into "$OUT/flipped-$name.json" $PYTHON "$here/flipped_labels.py" --model "$MODEL" \
        --k $KLO $FLIP --compressor "$OUT/$name" --control "$OUT/control-rotten_tomatoes-k$KLO" &
    done
  fi
  wait
}
high() {
  { has nv || has inputs; } || return 0
  local nvs=16; has nv && nvs=$NV
  for t in $TWO; do for nv in $nvs; do throttle; teacher --task "$t" --k $KHI --num-virtual "$nv" & done; done
  wait
  for t in $TWO; do
    throttle; train "control-$t-k$KHI" --task "$t" --k $KHI --control &
    throttle; train "emb-$t-k$KHI" --task "$t" --k $KHI &
    if has inputs; then
      for l in $LAYERS; do throttle; train "layer$l-$t-k$KHI" --task "$t" --k $KHI --ssm-input "layer:$l" & done
    fi
    if has nv; then
      for nv in $NV; do
        [ "$nv" = 16 ] && continue  # emb-<task>-k<KHI> is n_v = 16
        throttle; train "nv$nv-$t-k$KHI" --task "$t" --k $KHI --num-virtual "$nv" &
      done
    fi
  done
  wait
  for t in $TWO; do
    if has nv; then
      also=()
      for nv in $NV; do [ "$nv" = 16 ] || also+=("nv$nv=$OUT/nv$nv-$t-k$KHI"); done
      throttle; fidelity "nv-$t-k$KHI.json" --task "$t" --k $KHI --compressor "$OUT/emb-$t-k$KHI" \
        --control "$OUT/control-$t-k$KHI" --also $(pick "${also[@]}") &
    fi
    if has inputs; then
      also=()
      for l in $LAYERS; do also+=("layer$l=$OUT/layer$l-$t-k$KHI"); done
      throttle; fidelity "inputs-$t-k$KHI.json" --task "$t" --k $KHI --compressor "$OUT/emb-$t-k$KHI" \
        --control "$OUT/control-$t-k$KHI" --also $(pick "${also[@]}") &
    fi
  done
  wait
}
low &
high &
wait
echo "done: $OUT"

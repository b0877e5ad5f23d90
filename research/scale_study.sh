#!/usr/bin/env bash
# The GPU-scale measurements of BENCHMARKS.md ("At scale on one GPU"): G's recipe and its
# control with many more training episodes, k = 50, the n_v factor of the ablation and the
# other two ablation tasks, each evaluated on 100 held-out subsets x 32 queries (a Spearman
# interval of about +-0.15 instead of +-0.3 at 30 subsets).
#
#   research/scale_study.sh OUT PART        PART: scale | k50 | nv | tasks | open
#
# scale: rotten_tomatoes, k = 20, 128 and 2048 episodes (G and control), then fidelity and
#        the recency ceiling (research/recency.py) on the same subsets.
# k50:   rotten_tomatoes, k = 50, 1024 episodes (G and control) and fidelity.
# nv:    n_v in {2, 4, 32} at k = 20, 512 episodes each, beside G at 512, one fidelity run.
# tasks: coin_flip and modular_addition, k = 20, 512 episodes (G and control), fidelity each.
# open:  G at 2048 episodes with the gates opened (gate-init 0) and with rank weight 5, beside
#        the control and G of `scale` (run that part first).
#
# Every job runs in the background on the same GPU (the teacher is small; one process
# leaves most of the device idle). Finished runs are skipped on a rerun. ICL sets the
# command (default: icl-ssm), PYTHON the interpreter for research/recency.py (default: python3).
# A run stopped midway continues from its checkpoint on the next call.
set -euo pipefail
OUT=${1:?usage: research/scale_study.sh OUT PART}
PART=${2:?usage: research/scale_study.sh OUT PART}
ICL=${ICL:-icl-ssm}
PYTHON=${PYTHON:-python3}
G="--model smollm2-135m --queries 8 --group-size 4 --lambda-rank 1.0 --num-recent 16 --gate --gate-init -4
   --gate-lr 0.1 --stage2-lr 1e-3 --stage2-epochs 2 --checkpoint-every 200"
G=$(echo $G)
FID="--subsets 100 --queries 32 --batch 8 --query-batch 64 --json"
mkdir -p "$OUT"

teacher() {  # flags: fill the teacher cache those runs share
  $ICL distill $G "$@" --teacher-only > /dev/null
}
train() {  # NAME flags...: one run in the background, skipped when finished
  local name=$1; shift
  [ -f "$OUT/$name/model.safetensors" ] && return 0
  local resume=""; [ -d "$OUT/$name/checkpoint" ] && resume=--resume
  $ICL distill $G "$@" --out "$OUT/$name" $resume >> "$OUT/$name.log" 2>&1 &
}
fidelity() {  # REPORT flags...
  local report=$1; shift
  [ -f "$OUT/$report" ] && return 0
  $ICL fidelity --model smollm2-135m $FID "$@" > "$OUT/$report.tmp" 2> "$OUT/$report.log"
  mv "$OUT/$report.tmp" "$OUT/$report"
}

case $PART in
scale)
  rt="--task rotten_tomatoes --k 20"
  teacher $rt --samples 2048
  teacher $rt --samples 128
  train G128 $rt --samples 128; train control128 $rt --samples 128 --control
  train G2048 $rt --samples 2048; train control2048 $rt --samples 2048 --control
  wait
  fidelity scale-rotten_tomatoes-k20.json $rt --compressor "$OUT/G2048" --control "$OUT/control2048" \
    --also G128="$OUT/G128" control128="$OUT/control128"
  $PYTHON "$(dirname "$0")/recency.py" "$OUT/scale-rotten_tomatoes-k20.json" > "$OUT/recency-rotten_tomatoes-k20.md"
  ;;
k50)
  rt="--task rotten_tomatoes --k 50"
  teacher $rt --samples 1024
  train G50 $rt --samples 1024; train control50 $rt --samples 1024 --control
  wait
  fidelity scale-rotten_tomatoes-k50.json $rt --compressor "$OUT/G50" --control "$OUT/control50"
  ;;
nv)
  rt="--task rotten_tomatoes --k 20 --samples 512"
  for nv in 2 4 16 32; do teacher $rt --num-virtual $nv & done; wait
  for nv in 2 4 16 32; do train nv$nv $rt --num-virtual $nv; done
  train control512 $rt --control
  wait
  fidelity nv-rotten_tomatoes-k20.json --task rotten_tomatoes --k 20 --compressor "$OUT/nv16" \
    --control "$OUT/control512" --also nv2="$OUT/nv2" nv4="$OUT/nv4" nv32="$OUT/nv32"
  ;;
tasks)
  for task in coin_flip modular_addition; do teacher --task $task --k 20 --samples 512 & done; wait
  for task in coin_flip modular_addition; do
    train G-$task --task $task --k 20 --samples 512; train control-$task --task $task --k 20 --samples 512 --control
  done
  wait
  for task in coin_flip modular_addition; do
    fidelity scale-$task-k20.json --task $task --k 20 --compressor "$OUT/G-$task" --control "$OUT/control-$task" &
  done
  wait
  ;;
open)
  rt="--task rotten_tomatoes --k 20 --samples 2048"
  teacher $rt
  train open2048 $rt --gate-init 0
  train rank5-2048 $rt --lambda-rank 5
  wait
  fidelity open-rotten_tomatoes-k20.json --task rotten_tomatoes --k 20 --compressor "$OUT/open2048" --control "$OUT/control2048" \
    --also rank5="$OUT/rank5-2048" G2048="$OUT/G2048"
  ;;
*)
  echo "unknown PART $PART: expected scale, k50, nv, tasks or open" >&2; exit 2 ;;
esac

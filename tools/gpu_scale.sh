#!/usr/bin/env bash
# `icl-ssm bench scale` on one GPU: every paper shape (Qwen2.5-0.5B/1.5B/3B/7B, Llama-3.1-8B,
# Gemma-3-1B) at k = 20, 50, 200 and the longest prompt that fits (capped at MAX_PROMPT tokens),
# in bfloat16, batch sizes chosen from the free memory, within BUDGET_S seconds of measuring (the
# cases left when it is spent are listed as skipped, so the whole script stays under 8 minutes of
# a lent GPU). Writes OUT/scale.json and OUT/scale.md; a shape or k that would not fit is refused
# in them, in words.
#
#   tools/gpu_scale.sh OUT
#
# Environment (defaults for the GPU; the tests run it on the CPU with tiny shapes):
#   SHAPES="paper"  KS="20 50 200 max"  DEVICE=cuda  DTYPE=bfloat16  BUDGET_S=400  MAX_PROMPT=16384
#   SUBSETS=4 (measured subsets a case)  EXTRA="" (more flags)  ICL_SSM="icl-ssm" (the command)
#   PYTHON=python3 (the interpreter that imports torch, for the CUDA check)
set -euo pipefail

out=${1:?usage: tools/gpu_scale.sh OUT}
device=${DEVICE:-cuda}
icl_ssm=${ICL_SSM:-icl-ssm}
if [[ $device == cuda* ]] && ! "${PYTHON:-python3}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    2>/dev/null; then
    echo "tools/gpu_scale.sh: no CUDA device here (DEVICE=$device); run it where a GPU is, or DEVICE=cpu" >&2
    exit 2
fi
# shellcheck disable=SC2086  # word splitting of the lists is wanted
exec $icl_ssm bench scale --shapes ${SHAPES:-paper} --k ${KS:-20 50 200 max} --device "$device" \
    --dtype "${DTYPE:-bfloat16}" --batch 0 --subsets "${SUBSETS:-4}" --per-query-queries 1 \
    --per-query-max-k 200 --max-prompt-tokens "${MAX_PROMPT:-16384}" --time-budget-s "${BUDGET_S:-400}" \
    --out "$out" ${EXTRA:-}

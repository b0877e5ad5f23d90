#!/usr/bin/env bash
# Spread over training seeds: G's recipe and its control, each trained with several seeds
# (`distill --seed` draws other training subsets and queries and another initialisation), then
# one fidelity run evaluates all of them on the same held-out subsets and queries.
#
#   research/seeds.sh OUT_DIR [TASK] [SEEDS...]        e.g. research/seeds.sh seeds rotten_tomatoes 1 2
#
# K=50 sets the shot count (default 20), QUERIES the held-out queries per subset (default 32).
# Extra distill flags for every run (a recipe other than G) go in EXTRA="...". Two one-thread
# jobs at a time suit a 2-core machine: JOBS=2 (default). Finished runs are skipped on a rerun (a run trained elsewhere can be linked
# in as OUT/G-sS). KINDS="G" trains G only; the fidelity table then compares against the control
# in CONTROL=DIR (default OUT/control-sFIRST, FIRST the first seed).
set -euo pipefail
OUT=${1:?usage: research/seeds.sh OUT_DIR [TASK] [SEEDS...]}
TASK=${2:-rotten_tomatoes}
shift $(( $# >= 2 ? 2 : 1 ))
SEEDS=("$@")
[ ${#SEEDS[@]} -eq 0 ] && SEEDS=(1 2)
JOBS=${JOBS:-2}
KINDS=${KINDS:-G control}
K=${K:-20}
QUERIES=${QUERIES:-32}
ICL=${ICL:-icl-ssm}
BASE="--model smollm2-135m --task $TASK --k $K --samples 128 --queries 8 --group-size 4 --lambda-rank 1.0
      --num-recent 16 --gate --gate-init -4 --gate-lr 0.1 --stage2-lr 1e-3 --stage2-epochs 2 ${EXTRA:-}"
BASE=$(echo $BASE)  # one line: it is pasted into the `bash -c` command below
mkdir -p "$OUT"
# G first for every seed (each writes its seed's teacher cache), then the controls, which read it
for kind in $KINDS; do
  for s in "${SEEDS[@]}"; do
    [ -f "$OUT/$kind-s$s/model.safetensors" ] && continue
    flags="--seed $s"; [ $kind = control ] && flags="$flags --control"
    echo "$OUT/$kind-s$s $flags"
  done | xargs -r -P "$JOBS" -L 1 bash -c 'OMP_NUM_THREADS=1 '"$ICL"' distill '"$BASE"' ${@:1} --out $0 > $0.log 2>&1'
done
first=${SEEDS[0]}
CONTROL=${CONTROL:-$OUT/control-s$first}
ALSO=()
for s in "${SEEDS[@]:1}"; do
  for kind in $KINDS; do ALSO+=("$kind-s$s=$OUT/$kind-s$s"); done
done
$ICL fidelity --model smollm2-135m --task "$TASK" --k "$K" --compressor "$OUT/G-s$first" \
  --control "$CONTROL" --subsets 30 --queries "$QUERIES" ${ALSO[@]:+--also "${ALSO[@]}"} --json \
  > "$OUT/fidelity.json.tmp"
mv "$OUT/fidelity.json.tmp" "$OUT/fidelity.json"
python3 - "$OUT/fidelity.json" "$first" <<'PY'
import json, statistics, sys
r, first = json.load(open(sys.argv[1])), sys.argv[2]
paths = {f"G-s{first}": r, f"control-s{first}": {k[len("control_"):]: v for k, v in r.items() if k.startswith("control_")}}
paths[f"G-s{first}"] = {k: r[k] for k in ("rel_logit_err", "kl", "acc_compressed", "subset_loss_spearman",
                                          "subset_loss_spearman_ci95")}
paths[f"G-s{first}"]["acc"] = r["acc_compressed"]
paths.update(r.get("also", {}))
print(f"dense accuracy {r['acc_dense']:.3f}; window Spearman {r['window_subset_loss_spearman']:.2f}; "
      f"{r['subsets']} subsets x {r['queries']} queries, k = {r['k']}\n")
print("| run | rel logit err | KL | accuracy | subset-loss Spearman [95% CI] |\n|---|---:|---:|---:|---:|")
for name, m in paths.items():
    lo, hi = m["subset_loss_spearman_ci95"]
    print(f"| {name} | {m['rel_logit_err']:.3f} | {m['kl']:.3f} | {m['acc']:.3f} | "
          f"{m['subset_loss_spearman']:.2f} [{lo:.2f}, {hi:.2f}] |")
for kind in ("G", "control"):
    rho = [m["subset_loss_spearman"] for n, m in paths.items() if n.startswith(kind + "-s")]
    if len(rho) > 1:
        print(f"\n{kind}: Spearman {statistics.mean(rho):.2f} +- {statistics.stdev(rho):.2f} over {len(rho)} seeds")
PY

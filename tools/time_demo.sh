#!/usr/bin/env bash
# `make demo` as a new user meets it: a fresh clone of HEAD, empty pip and model caches, the
# install included. Writes a JSON record (date, machine, commit, seconds of the install and of
# the whole command, the report's handed-over prompt, every method's chosen indices) to the path given.
#   tools/time_demo.sh docs/results/demo-cold-$(date +%F).json
#   REV=abc1234 tools/time_demo.sh OUT.json     # a given commit (default HEAD), e.g. for a second run
set -euo pipefail
out=$(realpath -m "${1:?usage: tools/time_demo.sh OUT.json}")
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rev=$(git -C "$repo" rev-parse "${REV:-HEAD}")
git clone -q "$repo" "$work/clone"
git -C "$work/clone" checkout -q "$rev"
export PIP_CACHE_DIR="$work/pip-cache" ICL_SSM_CACHE="$work/model-cache"
cd "$work/clone"
start=$(date +%s.%N)
make install > "$work/install.log" 2>&1
installed=$(date +%s.%N)
make demo > "$work/demo.log" 2>&1
end=$(date +%s.%N)
versions=$(.venv/bin/python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')
python3 - "$out" "$start" "$installed" "$end" "$work/clone/demo/report.json" "$(git rev-parse HEAD)" $versions <<'PY'
import json, os, platform, sys, datetime
out, start, installed, end, report, commit, torch, transformers = sys.argv[1:]
rep = json.load(open(report))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
record = {"command": "tools/time_demo.sh", "what": "make demo from a fresh clone, empty pip and model caches",
          "commit": commit, "date": datetime.date.today().isoformat(),
          "machine": f"{platform.machine()}, {os.cpu_count()} cores, {cpu}",
          "install_seconds": float(installed) - float(start), "demo_seconds": float(end) - float(installed),
          "total_seconds": float(end) - float(start), "handed_over": rep["handed_over"]["name"],
          "handed_test_accuracy": rep["handed_over"].get("test_accuracy"),
          "handed_raw_test_accuracy": rep["handed_over"].get("raw_test_accuracy"),
          "calibration": (rep["handed_over"].get("calibration") or {}).get("method"),
          "calibrated": (rep.get("check") or {}).get("calibrated"),
          "headroom": {k: (rep.get("headroom") or {}).get(k) for k in ("search", "reliability", "why")},
          "search": {k: (rep.get("search") or {}).get(k) for k in ("screen", "budget_seconds", "wall_seconds",
                                                                   "screened", "screen_reliability")},
          "fidelity_verdict": (rep.get("fidelity_verdict") or {}).get("verdict"),
          "compressor_source": (rep.get("compressor") or {}).get("source"),
          "stage_seconds": rep.get("stage_seconds"),
          # what each method chose (pool indices in prompt order) and what was handed over: two runs select alike
          "selections": {s.get("name") or s.get("method"): s.get("indices") for s in rep.get("selections") or []},
          "handed_indices": rep["handed_over"].get("indices")}
record["provenance"] = {k: record[k] for k in ("command", "commit", "machine", "date")}
record["provenance"].update(torch=torch, transformers=transformers)
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(record, open(out + ".tmp", "w"), indent=1)
os.replace(out + ".tmp", out)
print(json.dumps(record, indent=1))
PY
cp "$work/clone/demo/report.md" "${out%.json}-report.md"
# the run's messages, each stage's progress lines with their seconds: where the time went
sed 's/\r/\n/g' "$work/demo.log" | grep -v '━\|^\s*$\|Loading weights\|it/s\]' > "${out%.json}-demo.log" || true

#!/usr/bin/env bash
# The long profile of the generated-input tests (at least 1,000 cases), stored as a record.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/results/fuzz-inputs-long.json}"
HYPOTHESIS_PROFILE=long ICL_SSM_FUZZ_RECORD="$out" OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q \
  tests/test_generated_inputs.py -p no:cacheprovider
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['total'], 'cases:', r['cases'])" "$out"

#!/usr/bin/env bash
# Device script for the same-machine-start validation (docs/validation/README.md, "Same machine start").
# Usage on the lent H200, from the repository root: bash docs/validation/same-start/device.sh CALL
# Each run is tarred into one file under $OUT (the device tool returns at most 8 files).
set -u
T=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
R=/tmp/runs; mkdir -p "$R" "$OUT"
pip install -q --target /tmp/site .whl/simpy-4.1.2-py3-none-any.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site
ident() { { date -u +%FT%TZ; hostname; cat /proc/sys/kernel/random/boot_id;
            nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader; } ; }
replay() {  # NAME ARGS...
  local name=$1; shift
  mkdir -p "$R/logs"
  ident > "$R/logs/$name.machine"
  { time python3 -m hwbackend.beyond.replay --trace $T --warmup-s 10 "$@" --out "$R/$name"; } > "$R/logs/$name.log" 2>&1
  echo "$name rc=$?"; tail -4 "$R/logs/$name.log"
  tar czf "$OUT/$name.tgz" -C "$R" "$name" "logs/$name.log" "logs/$name.machine"
}
case "$1" in
  1)
    ident | tee "$OUT/machine-call1.txt"
    python3 -m pytest -q -m gpu tests/test_hw_replay.py > "$OUT/gpu-tests.log" 2>&1; tail -2 "$OUT/gpu-tests.log"
    replay test-async --rate-scale 1.5 --num-requests 1000
    replay test-sync --rate-scale 1.5 --num-requests 1000 --sync-mapping
    replay train-b-x2-sync --rate-scale 2 --skip-requests 2000 --num-requests 1000 --sync-mapping
    ;;
  2)
    ident | tee "$OUT/machine-call2.txt"
    replay train-a-sync --rate-scale 1.5 --skip-requests 1000 --num-requests 1000 --sync-mapping
    replay train-c-x2-sync --rate-scale 2 --skip-requests 3000 --num-requests 800 --sync-mapping
    ;;
  3)
    ident | tee "$OUT/machine-call3.txt"
    replay test-async-x1 --rate-scale 1 --num-requests 1000
    replay test-sync-x1 --rate-scale 1 --num-requests 1000 --sync-mapping
    ;;
esac

#!/usr/bin/env bash
# Device script of the cross-workload validation (issue 19; PLAN.md beside this file, committed before any run).
# Usage on the lent H200, from the repository root: bash docs/validation/cross-workload/device.sh CALL
# The traces travel as shared/traces/... inside the checkout (ignored by git, never committed).
# Each run is tarred into one file under $OUT (the device tool returns few files per call).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
CODE=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv
ARXIV=shared/traces/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv
MOON=shared/traces/mooncake_fast25/conversation_trace.jsonl
CONV=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
R=/tmp/runs; mkdir -p "$R/logs" "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
ident() { { date -u +%FT%TZ; hostname; cat /proc/sys/kernel/random/boot_id;
            nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader; } ; }
replay() {  # NAME ARGS...
  local name=$1; shift
  ident > "$R/logs/$name.machine"
  { time python3 -m hwbackend.beyond.replay --warmup-s 10 "$@" --out "$R/$name"; } > "$R/logs/$name.log" 2>&1
  echo "$name rc=$?"; tail -3 "$R/logs/$name.log"
  tar czf "$OUT/$name.tgz" -C "$R" "$name" "logs/$name.log" "logs/$name.machine"
}
case "$1" in
  1)  # training: the grid and three sync replays of three workloads
    ident | tee "$OUT/machine-call1.txt"
    ident > "$R/logs/grid.machine"
    { time python3 -m hwbackend.calibration.grid --model llama-3.1-8b --max-context 65536 --out "$R/grid"; } > "$R/logs/grid.log" 2>&1
    echo "grid rc=$?"; tail -3 "$R/logs/grid.log"
    tar czf "$OUT/grid.tgz" -C "$R" grid logs/grid.log logs/grid.machine
    replay train-code-sync --trace $CODE --skip-requests 1000 --num-requests 1000 --rate-scale 3 --sync-mapping
    replay train-arxiv-sync --trace $ARXIV --arrival poisson:8 --skip-requests 600 --num-requests 400 --seed 1 --sync-mapping
    replay train-mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 100 \
        --num-requests 40 --rate-scale 0.3 --sync-mapping
    ;;
  2)  # held out: the code trace, first 1,000 requests at trace times (~525 s of serving)
    ident | tee "$OUT/machine-call2.txt"
    replay test-code-async --trace $CODE --num-requests 1000
    ;;
  3)  # held out: arXiv lengths at Poisson 8 req/s (async, sync), Mooncake long contexts (async)
    ident | tee "$OUT/machine-call3.txt"
    replay test-arxiv-async --trace $ARXIV --arrival poisson:8 --num-requests 600
    replay test-mooncake-async --trace $MOON --model llama-3.1-8b --max-context 131072 --num-requests 100 --rate-scale 0.3
    replay test-arxiv-sync --trace $ARXIV --arrival poisson:8 --num-requests 600 --sync-mapping
    ;;
  4)  # round 2 (PLAN.md): the long grid (training), then held out: Mooncake first 100 sync
    ident | tee "$OUT/machine-call4.txt"
    ident > "$R/logs/grid-long.machine"
    { time python3 -m hwbackend.calibration.grid --model llama-3.1-8b --max-context 131072 --points long \
        --out "$R/grid-long"; } > "$R/logs/grid-long.log" 2>&1
    echo "grid-long rc=$?"; tail -3 "$R/logs/grid-long.log"
    tar czf "$OUT/grid-long.tgz" -C "$R" grid-long logs/grid-long.log logs/grid-long.machine
    replay test-mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --num-requests 100 \
        --rate-scale 0.3 --sync-mapping
    ;;
  5)  # round 2, held out: arXiv sync, the conversation trace's first 1,000 at trace times (async)
    ident | tee "$OUT/machine-call5.txt"
    replay test-arxiv-sync --trace $ARXIV --arrival poisson:8 --num-requests 600 --sync-mapping
    replay test-conv-async --trace $CONV --num-requests 1000
    ;;
  6)  # round 2, held out: a fresh Mooncake slice (requests 200-299, x0.3, async)
    ident | tee "$OUT/machine-call6.txt"
    replay test-mooncake-b-async --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 200 \
        --num-requests 100 --rate-scale 0.3
    ;;
  7)  # round 2, the device time left after calls 4-6: held out code trace, first 1,000 at trace times, sync
    replay test-code-sync --trace $CODE --num-requests 1000 --sync-mapping
    ;;
esac

#!/usr/bin/env bash
# Device script of the engine profile (issue 30 items 2-3; PLAN.md beside this file, committed before any run).
# Usage on the lent H200, from the repository root (a copy of the branch's tracked files), with the traces
# copied to shared/traces/... (never committed): bash docs/validation/engine-profile/device.sh 1|2
# Every step has its own time limit, so that a slow step cannot lose the call's other results; each run is
# tarred into one file under $OUT (the device tool returns at most 8 files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
CODE=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv
CONV=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
ARXIV=shared/traces/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv
SHAREGPT=shared/traces/vidur_processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv
MOON=shared/traces/mooncake_fast25/conversation_trace.jsonl
R=/tmp/runs; mkdir -p "$R/logs" "$OUT"
ident() { date -u +%FT%TZ; hostname; cat /proc/sys/kernel/random/boot_id; uname -r
          nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
          python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; }
replay() {  # LIMIT_S NAME ARGS...: one engine replay, its log and machine identity tarred into $OUT/NAME.tgz
  local limit=$1 name=$2; shift 2
  ident > "$R/logs/$name.machine" 2>&1
  { time timeout "$limit" python3 -m hwbackend.replay.cli --compute engine --warmup-s 3 "$@" --out "$R/$name"; } \
      > "$R/logs/$name.log" 2>&1
  echo "$name rc=$? $(head -c 300 "$R/logs/$name.log" | head -1)"
  tar czf "$OUT/$name.tgz" -C "$R" "$name" "logs/$name.log" "logs/$name.machine" 2>/dev/null
}
case "$1" in
  1)  # training: decode tile tuning, the engine grid, two sync replays (code, Mooncake)
    ident | tee "$OUT/machine-call1.txt"
    timeout 90 python3 docs/validation/engine-profile/tune_decode.py --out "$R/tune" --budget-s 60 > "$R/logs/tune.log" 2>&1
    echo "tune rc=$?"; tail -1 "$R/logs/tune.log"
    [ -f "$R/tune/tile.env" ] && . "$R/tune/tile.env"; echo "KVSIM_DECODE_TILE=${KVSIM_DECODE_TILE:-default}"
    ident > "$R/logs/grid.machine" 2>&1
    { time timeout 170 python3 -m hwbackend.calibration.grid --compute engine --model llama-3.1-8b \
        --max-context 65536 --warmup-s 5 --out "$R/grid"; } > "$R/logs/grid.log" 2>&1
    echo "grid rc=$?"; tail -4 "$R/logs/grid.log"
    tar czf "$OUT/grid.tgz" -C "$R" grid tune logs/grid.log logs/grid.machine logs/tune.log
    replay 80 train-code-sync --trace $CODE --skip-requests 1000 --num-requests 250 --rate-scale 3 --sync-mapping
    replay 80 train-mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 100 \
        --num-requests 20 --rate-scale 0.3 --sync-mapping
    ;;
  2)  # held out, another machine start: five workloads, each replayed twice (a, b) back to back, packed per pair
    ident | tee "$OUT/machine-call2.txt"
    [ -f docs/validation/engine-profile/tile.env ] && . docs/validation/engine-profile/tile.env
    pair() {  # LIMIT_S WORKLOAD ARGS...
      local limit=$1 w=$2; shift 2
      replay "$limit" "test-$w-a" "$@"; replay "$limit" "test-$w-b" "$@"
      (cd "$OUT" && tar cf "test-$w.tar" "test-$w-a.tgz" "test-$w-b.tgz" 2>/dev/null; rm -f "test-$w-a.tgz" "test-$w-b.tgz")
    }
    pair 55 conv-async --trace $CONV --skip-requests 5000 --num-requests 300 --rate-scale 3
    pair 50 code-sync --trace $CODE --skip-requests 3000 --num-requests 300 --rate-scale 3 --sync-mapping
    pair 60 sharegpt-async --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 3000 --num-requests 180 --seed 3
    pair 60 mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 300 \
        --num-requests 12 --rate-scale 0.3 --sync-mapping
    pair 70 arxiv-async --trace $ARXIV --arrival poisson:22 --skip-requests 1000 --num-requests 200 --seed 2
    ;;
esac

#!/usr/bin/env bash
# Device calls of session 8 (2026-12-02), one lent H200, from the repository root, simpy carried as a wheel in .whl/
# and the traces copied to shared/traces/... (never committed):  bash docs/device/session8.sh A1|A2|C
#   A1, A2 (one start, back to back): issue 30 round 3's held-out replays (engine-profile/PLAN.md "Round 3"), each
#     twice: A1 conversation, code, Mooncake; A2 ShareGPT, arXiv.
#   C (a later start): per-phase bench of the engine replay, eager against piecewise CUDA graphs for mixed batches.
# Every step has its own time limit; results are tarred into a few files under $OUT (the tool returns at most 8).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
CONV=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
CODE=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv
ARXIV=shared/traces/vidur_processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv
SHAREGPT=shared/traces/vidur_processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv
MOON=shared/traces/mooncake_fast25/conversation_trace.jsonl
R=/tmp/runs; mkdir -p "$R/logs"
ident() { date -u +%FT%TZ; hostname; cat /proc/sys/kernel/random/boot_id; uname -r
          nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
          python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; }
replay() {  # LIMIT_S NAME ARGS...: one engine replay with its log and machine identity under $R
  local limit=$1 name=$2; shift 2
  ident > "$R/logs/$name.machine" 2>&1
  { time timeout "$limit" python3 -m hwbackend.replay.cli --compute engine --warmup-s 3 "$@" --out "$R/$name"; } \
      > "$R/logs/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$R/logs/$name.log")"
}
pair() {  # LIMIT_S WORKLOAD ARGS...: the workload twice on this start
  local limit=$1 w=$2; shift 2
  replay "$limit" "test3-$w-a" "$@"; replay "$limit" "test3-$w-b" "$@"
  tar czf "$OUT/test3-$w.tgz" -C "$R" "test3-$w-a" "test3-$w-b" logs/test3-$w-a.log logs/test3-$w-b.log \
      logs/test3-$w-a.machine logs/test3-$w-b.machine 2>/dev/null
}
ident | tee "$OUT/machine-call$1.txt"
case "$1" in
  A1)
    pair 80 conv-async --trace $CONV --skip-requests 15000 --num-requests 300 --rate-scale 3
    pair 70 code-sync --trace $CODE --skip-requests 7000 --num-requests 300 --rate-scale 3 --sync-mapping
    pair 60 mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 600 \
        --num-requests 12 --rate-scale 0.3 --sync-mapping
    ;;
  A2)
    pair 80 sharegpt-async --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 9000 --num-requests 180 --seed 7
    pair 75 arxiv-async --trace $ARXIV --arrival poisson:22 --skip-requests 5000 --num-requests 200 --seed 8
    ;;
esac

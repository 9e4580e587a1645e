#!/usr/bin/env bash
# Device calls of session 9 (2026-12-02), one lent H200, from the repository root, simpy carried as a wheel in .whl/
# and the traces copied to shared/traces/... (never committed; Mooncake: its first 1,000 lines):
#   bash docs/device/session9.sh E1|E2|E3
#   E1, E2, E3: issue 30 round 4's held-out replays (engine-profile/PLAN.md "Round 4", item 3), every replay with
#     --piecewise-graphs, each twice: E1 conversation, code, Mooncake; E2 ShareGPT, arXiv; E3 code again. E1's code
#     pair hit its 80 s limit (no output): code requests 8,000-8,299 span 477 s of the trace, 159 s at x3 (round 3's
#     7,000-7,299 span 23 s), so E3 replays the same slice with 200 s each.
# Every step has its own time limit (a little over session 8's A1/A2: piecewise capture adds start-up); results are
# tarred into a few files under $OUT (the tool returns at most 8).
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
replay() {  # LIMIT_S NAME ARGS...: one engine replay (piecewise CUDA graphs) with its log and machine identity under $R
  local limit=$1 name=$2; shift 2
  ident > "$R/logs/$name.machine" 2>&1
  { time timeout "$limit" python3 -m hwbackend.replay.cli --compute engine --piecewise-graphs --warmup-s 3 "$@" \
      --out "$R/$name"; } > "$R/logs/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$R/logs/$name.log")"
}
pair() {  # LIMIT_S WORKLOAD ARGS...: the workload twice on this start
  local limit=$1 w=$2; shift 2
  replay "$limit" "test4-$w-a" "$@"; replay "$limit" "test4-$w-b" "$@"
  (cd "$R" && tar czf "$OUT/test4-$w.tgz" "test4-$w-a" "test4-$w-b" logs/test4-$w-a.log logs/test4-$w-b.log \
      logs/test4-$w-a.machine logs/test4-$w-b.machine 2>/dev/null)
}
ident | tee "$OUT/machine-session9-$1.txt"
case "$1" in
  E1)  # 2 x (90 + 80 + 75) = 490 s of limits (the code pair timed out: see E3)
    pair 90 conv-async --trace $CONV --skip-requests 17000 --num-requests 300 --rate-scale 3
    pair 80 code-sync --trace $CODE --skip-requests 8000 --num-requests 300 --rate-scale 3 --sync-mapping
    pair 75 mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 700 \
        --num-requests 12 --rate-scale 0.3 --sync-mapping
    ;;
  E2)  # 2 x (85 + 85) = 340 s of limits
    pair 85 sharegpt-async --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 12000 --num-requests 180 --seed 9
    pair 85 arxiv-async --trace $ARXIV --arrival poisson:22 --skip-requests 7000 --num-requests 200 --seed 10
    ;;
  E3)  # 2 x 200 s: the code slice of E1 with a limit past its 159 s of serving
    pair 200 code-sync --trace $CODE --skip-requests 8000 --num-requests 300 --rate-scale 3 --sync-mapping
    ;;
esac

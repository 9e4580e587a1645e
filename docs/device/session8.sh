#!/usr/bin/env bash
# Device calls of session 8 (2026-12-02), one lent H200, from the repository root, simpy carried as a wheel in .whl/
# and the traces copied to shared/traces/... (never committed):  bash docs/device/session8.sh A1|A2|C|D
#   A1, A2 (one start, back to back): issue 30 round 3's held-out replays (engine-profile/PLAN.md "Round 3"), each
#     twice: A1 conversation, code, Mooncake; A2 ShareGPT, arXiv.
#   C (a later start): the engine GPU tests, the per-phase bench of the engine replay, eager against piecewise CUDA
#     graphs for batches with prefill chunks (<= 512 tokens), then two slices replayed eager and piecewise (their
#     logs were lost: the tar's glob ran outside $R).
#   D (a later start): round 4's training with piecewise graphs (engine-profile/PLAN.md, "Round 4").
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
  C)
    timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_hw_replay_engine.py -rs > "$R/logs/gpu-tests.log" 2>&1
    echo "gpu tests rc=$?"; tail -3 "$R/logs/gpu-tests.log"
    ident > "$R/logs/piecewise-bench.machine" 2>&1
    { time timeout 180 python3 -m hwbackend.replay.bench_engine --compute engine --piecewise --out "$R/piecewise"; } \
        > "$R/logs/piecewise-bench.log" 2>&1
    echo "piecewise bench rc=$?"; grep -E "^engine-piecewise|real" "$R/logs/piecewise-bench.log" | tail -16
    tar czf "$OUT/piecewise-bench.tgz" -C "$R" piecewise logs 2>/dev/null
    if [ -f "$R/piecewise/points-engine.csv" ]; then   # the same slices eager and piecewise, on this start
      replay 80 pw-sharegpt-eager --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 9000 --num-requests 180 --seed 7
      replay 80 pw-sharegpt-piecewise --piecewise-graphs --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 9000 \
          --num-requests 180 --seed 7
      replay 80 pw-conv-eager --trace $CONV --skip-requests 15000 --num-requests 300 --rate-scale 3
      replay 80 pw-conv-piecewise --piecewise-graphs --trace $CONV --skip-requests 15000 --num-requests 300 --rate-scale 3
      tar czf "$OUT/piecewise-replays.tgz" -C "$R" pw-sharegpt-eager pw-sharegpt-piecewise pw-conv-eager pw-conv-piecewise \
          logs/pw-*.log logs/pw-*.machine 2>/dev/null
    fi
    ;;
  D)  # round 4's training (engine-profile/PLAN.md "Round 4"): the grid and round 2's training slices, piecewise graphs
    ident > "$R/logs/grid-piecewise.machine" 2>&1
    { time timeout 110 python3 -m hwbackend.calibration.grid --compute engine --piecewise-graphs --model llama-3.1-8b \
        --max-context 65536 --warmup-s 5 --out "$R/grid-piecewise"; } > "$R/logs/grid-piecewise.log" 2>&1
    echo "grid rc=$?"; tail -2 "$R/logs/grid-piecewise.log"
    replay 60 train4-code-sync --piecewise-graphs --trace $CODE --skip-requests 1000 --num-requests 250 --rate-scale 3 --sync-mapping
    replay 60 train4-mooncake-sync --piecewise-graphs --trace $MOON --model llama-3.1-8b --max-context 131072 \
        --skip-requests 100 --num-requests 20 --rate-scale 0.3 --sync-mapping
    replay 60 train4-conv-async --piecewise-graphs --trace $CONV --skip-requests 1000 --num-requests 300 --rate-scale 3
    replay 75 train4-sharegpt-async --piecewise-graphs --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 1000 \
        --num-requests 180 --seed 4
    (cd "$R" && tar czf "$OUT/train4.tgz" grid-piecewise train4-code-sync train4-mooncake-sync train4-conv-async \
        train4-sharegpt-async logs 2>/dev/null)
    ;;
esac

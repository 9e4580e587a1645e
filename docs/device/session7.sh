#!/usr/bin/env bash
# Device calls of session 7 (2026-12-02), one lent H200, from the repository root, simpy carried as a wheel in .whl/
# and the traces copied to shared/traces/... (never committed):  bash docs/device/session7.sh A|B
#   A (one start): issue 34's co-located replay (session6.sh's runs, fixed by hwbackend.replay.kv.pin_base_pages,
#     with the co-location GPU test first), then issue 30 round 2's training (engine-profile/PLAN.md, "Round 2").
#   B (a later start): issue 30 round 2's held-out replays, each twice.
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
ident | tee "$OUT/machine-call$1.txt"
case "$1" in
  A)
    timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_colocate_replay.py -rs > "$R/logs/gpu-tests.log" 2>&1
    echo "gpu tests rc=$?"; tail -3 "$R/logs/gpu-tests.log"
    colocate() {  # limit_s name sharing num_requests
      { time timeout "$1" python3 -m hwbackend.replay.colocate --sharing "$3" --memory-util 0.3 --warmup-s 3 \
          --out "$R/$2" \
          --tenant "model=llama-3.1-8b,trace=$CONV,num-requests=$4,rate-scale=4" \
          --tenant "model=qwen2.5-7b,trace=$CODE,num-requests=$4,rate-scale=4"; } > "$R/logs/$2.log" 2>&1
      echo "$2 rc=$?"; tail -4 "$R/logs/$2.log"
    }
    colocate 140 elastic elastic 300
    colocate 80 static static 150
    tar czf "$OUT/colocate.tgz" -C "$R" elastic static logs/elastic.log logs/static.log logs/gpu-tests.log 2>/dev/null
    timeout 70 python3 docs/validation/engine-profile/tune_decode.py --out "$R/tune" --budget-s 50 > "$R/logs/tune.log" 2>&1
    echo "tune rc=$?"; tail -1 "$R/logs/tune.log"
    [ -f "$R/tune/tile.env" ] && . "$R/tune/tile.env"; echo "KVSIM_DECODE_TILE=${KVSIM_DECODE_TILE:-default}"
    if [ -f "$R/tune/tune.json" ] && python3 -c "import json,sys; t=json.load(open('$R/tune/tune.json')); sys.exit(t['chosen']==t['default'])"; then
      ident > "$R/logs/grid2.machine" 2>&1
      { time timeout 100 python3 -m hwbackend.calibration.grid --compute engine --model llama-3.1-8b \
          --max-context 65536 --warmup-s 5 --out "$R/grid2"; } > "$R/logs/grid2.log" 2>&1
      echo "grid2 rc=$?"
    fi
    replay 60 train2-conv-async --trace $CONV --skip-requests 1000 --num-requests 300 --rate-scale 3
    replay 65 train2-sharegpt-async --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 1000 --num-requests 180 --seed 4
    tar czf "$OUT/train2.tgz" -C "$R" tune train2-conv-async train2-sharegpt-async $( [ -d "$R/grid2" ] && echo grid2 ) logs 2>/dev/null
    ;;
  B)
    [ -f docs/validation/engine-profile/tile.env ] && . docs/validation/engine-profile/tile.env
    echo "KVSIM_DECODE_TILE=${KVSIM_DECODE_TILE:-default}"
    pair() {  # LIMIT_S WORKLOAD ARGS...
      local limit=$1 w=$2; shift 2
      replay "$limit" "test2-$w-a" "$@"; replay "$limit" "test2-$w-b" "$@"
    }
    pair 52 conv-async --trace $CONV --skip-requests 12000 --num-requests 300 --rate-scale 3
    pair 50 code-sync --trace $CODE --skip-requests 6000 --num-requests 300 --rate-scale 3 --sync-mapping
    pair 55 sharegpt-async --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 6000 --num-requests 180 --seed 5
    pair 55 mooncake-sync --trace $MOON --model llama-3.1-8b --max-context 131072 --skip-requests 500 \
        --num-requests 12 --rate-scale 0.3 --sync-mapping
    pair 62 arxiv-async --trace $ARXIV --arrival poisson:22 --skip-requests 3000 --num-requests 200 --seed 6
    for w in conv-async code-sync sharegpt-async mooncake-sync arxiv-async; do
      tar czf "$OUT/test2-$w.tgz" -C "$R" "test2-$w-a" "test2-$w-b" logs/test2-$w-a.log logs/test2-$w-b.log \
          logs/test2-$w-a.machine logs/test2-$w-b.machine 2>/dev/null
    done
    ;;
  C)  # call B's code pair and one ShareGPT replay ran past their limits (rc 124: the code slice 6,000-6,299 arrives
      # over ~41 s at x3): both pairs again on another start, with room
    pair() { local limit=$1 w=$2; shift 2; replay "$limit" "test2-$w-a" "$@"; replay "$limit" "test2-$w-b" "$@"; }
    pair 95 code-sync --trace $CODE --skip-requests 6000 --num-requests 300 --rate-scale 3 --sync-mapping
    pair 75 sharegpt-async --trace $SHAREGPT --arrival poisson:8.5 --skip-requests 6000 --num-requests 180 --seed 5
    for w in code-sync sharegpt-async; do
      tar czf "$OUT/test2-$w.tgz" -C "$R" "test2-$w-a" "test2-$w-b" logs/test2-$w-a.log logs/test2-$w-b.log \
          logs/test2-$w-a.machine logs/test2-$w-b.machine 2>/dev/null
    done
    ;;
  D)  # issue 34: static sharing on the same traffic as call A's elastic run (300 requests a tenant), so that the
      # hardware compares the two sharings like for like
    timeout 150 python3 -m hwbackend.replay.colocate --sharing static --memory-util 0.3 --warmup-s 3 --out "$R/static300" \
        --tenant "model=llama-3.1-8b,trace=$CONV,num-requests=300,rate-scale=4" \
        --tenant "model=qwen2.5-7b,trace=$CODE,num-requests=300,rate-scale=4" > "$R/logs/static300.log" 2>&1
    echo "static300 rc=$?"; tail -3 "$R/logs/static300.log"
    tar czf "$OUT/static300.tgz" -C "$R" static300 logs/static300.log 2>/dev/null
    ;;
esac

#!/usr/bin/env bash
# Issue 20: the TP=2 hardware replay on two H200s (kind nvidia-h200-x2), plan in docs/tp2/PLAN.md.
# From the repository root, three calls issued back to back on one held machine:
#   bash docs/tp2/device-replay.sh 1   # identity, GPU tests, all-reduce, smoke replay, training run a   (~340 s)
#   bash docs/tp2/device-replay.sh 2   # training run b, held-out async replay                          (~420 s)
#   bash docs/tp2/device-replay.sh 3   # held-out sync replay (and training run a if call 1 deferred it) (~270 s)
# Every command has a timeout; no call can pass 600 s (call 1 runs training run a only with 340 s or less used).
# run with carry [".whl"] (the simpy wheel); shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv must be
# in the working tree's shared/ (it travels; copy it from ../shared first). If call 1 decided to run decodes
# eagerly (see PLAN.md), issue calls 2 and 3 as `GRAPHS=off bash docs/tp2/device-replay.sh N`.
# Each run is tarred into one file under $OUT (at most 8 files come back per call).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
R=/tmp/tp2runs; mkdir -p "$R/logs" "$OUT"
pip install -q --target /tmp/site .whl/simpy-4.1.2-py3-none-any.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD
[ -f "$T" ] || { echo "missing $T: copy it into shared/ before the call"; exit 2; }
ident() { { date -u +%FT%TZ; hostname; cat /proc/sys/kernel/random/boot_id; git rev-parse HEAD 2>/dev/null;
            nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader;
            nvidia-smi topo -m; env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort; } 2>&1; }
graphs() { if [ "${GRAPHS:-on}" = off ] || [ -f "$R/no-graphs" ]; then echo --no-cuda-graphs; fi; }
replay() {  # NAME TIMEOUT_S ARGS...
  local name=$1 limit=$2; shift 2
  ident > "$R/logs/$name.machine"
  { time timeout "$limit" python3 -m hwbackend.replay.tp.cli --tp 2 --devices cuda:0,cuda:1 --trace "$T" \
      --warmup-s 10 $(graphs) "$@" --out "$R/$name"; } > "$R/logs/$name.log" 2>&1
  local rc=$?; echo "$name rc=$rc $(graphs)"; grep -E '^(wrote|replay: )' "$R/logs/$name.log" | tail -5; tail -3 "$R/logs/$name.log"
  tar czf "$OUT/$name.tgz" -C "$R" "$name" "logs/$name.log" "logs/$name.machine" 2>/dev/null
  return $rc
}
train_a() {  # in call 1 if the call has time left for it, else in call 3 (its directory then does not exist)
  replay tp2-train-a-sync 230 --skip-requests 1000 --num-requests 1000 --rate-scale 1.5 --sync-mapping
}
case "$1" in
  1)
    ident | tee "$OUT/machine-call1.txt"
    python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version())"
    timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_tp_replay_gpu.py tests/test_hw_tp_gpu.py -rs \
      > "$OUT/gpu-tests.log" 2>&1; tail -4 "$OUT/gpu-tests.log"
    timeout 90 python3 -m hwbackend.replay.tp.allreduce --devices cuda:0,cuda:1 --out "$OUT/allreduce.json" \
      > "$OUT/allreduce.log" 2>&1; echo "allreduce rc=$?"; cat "$OUT/allreduce.log"
    # the decision rule of PLAN.md: decode graphs stay on only if the smoke replay ran with them on both ranks
    if ! replay tp2-smoke 120 --rate-scale 4 --num-requests 60 --warmup-s 0 \
        || ! grep -q '"cuda_graphs": true' "$R/tp2-smoke/config.json" 2>/dev/null; then
      touch "$R/no-graphs"; echo "DECISION: decodes run eagerly from here on (GRAPHS=off for calls 2 and 3)" | tee "$OUT/no-graphs.txt"
    fi
    if [ "$SECONDS" -le 340 ]; then train_a; else echo "DEFERRED tp2-train-a-sync to call 3 ($SECONDS s used)"; fi
    ;;
  2)
    ident | tee "$OUT/machine-call2.txt"
    replay tp2-train-b-x2-sync 200 --skip-requests 2000 --num-requests 1000 --rate-scale 2 --sync-mapping
    replay tp2-test-async-x1 330 --num-requests 1000
    ;;
  3)
    ident | tee "$OUT/machine-call3.txt"
    replay tp2-test-sync-x1 330 --num-requests 1000 --sync-mapping
    [ -f "$R/tp2-train-a-sync/summary.json" ] || train_a
    ;;
  *) echo "usage: bash docs/tp2/device-replay.sh 1|2|3"; exit 2 ;;
esac

#!/usr/bin/env bash
# Device call of session 6 (2026-12-02), one lent H200, from the repository root, simpy carried as a wheel in .whl/
# and the first 1,000 requests of the two Azure traces copied to shared/traces/azure_llm_2023/ (never committed):
#   bash docs/device/session6.sh      (files under $OUT come back; committed in docs/validation/colocate/)
# First run 2026-12-02: both replays failed on Triton's pointer check (docs/device/session6/, docs/colocate.md);
# fixed by hwbackend.replay.kv.pin_base_pages, to be run again (with the GPU test added below) next session.
# The co-located replay of issue 34 item 4: the README's two tenants (Llama-3.1-8B on the Azure conversation trace,
# Qwen2.5-7B on the code trace, 4x their rate, --memory-util 0.3: a 13 GiB KV pool after both weights) served on
# one GPU with engine kernels, their KV pages from one physical pool (elastic), then the same tenants with static
# shares on 150 requests each. Each run has its own time limit so that a slow one cannot lose the other's results.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u +%FT%TZ; hostname; uname -r
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
# the co-located replay's GPU test first (2-layer decoders, real VMM, a short pool that reclaims slot 0), and the
# engine kernels' own GPU tests
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_colocate_replay.py tests/test_hw_replay_engine.py \
    -rs > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$?"; tail -4 "$OUT/gpu-tests.log"
CONV=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
CODE=shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv
colocate() {  # limit_s name sharing num_requests
  timeout "$1" python3 -m hwbackend.replay.colocate --sharing "$3" --memory-util 0.3 --warmup-s 3 --out "$OUT/$2" \
    --tenant "model=llama-3.1-8b,trace=$CONV,num-requests=$4,rate-scale=4" \
    --tenant "model=qwen2.5-7b,trace=$CODE,num-requests=$4,rate-scale=4" > "$OUT/$2.log" 2>&1
  echo "$2 rc=$?"; tail -4 "$OUT/$2.log"
}
colocate 150 elastic elastic 300
colocate 85 static static 150

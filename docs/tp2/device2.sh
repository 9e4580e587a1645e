#!/usr/bin/env bash
# Second two-GPU call (kind nvidia-h200-x2): workers as processes vs threads, from the repository root.
set -u
mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
pip install -q --target /tmp/site .whl/simpy-4.1.2-py3-none-any.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site
{ date -u +%FT%TZ; hostname; nvidia-smi -L; } > "$OUT/machine.txt" 2>&1; cat "$OUT/machine.txt"
for spec in "processes 0,1" "processes 0,0" "threads 0,1"; do
  set -- $spec
  script=bench/bench_tp_processes.py; [ "$1" = threads ] && script=bench/bench_tp.py
  name="$1-$(echo $2 | tr , -)"
  timeout 150 python3 $script --devices $2 --rounds 8 --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?"; grep -A3 both_over_alone "$OUT/$name.log"; tail -2 "$OUT/$name.log" | grep -i error
done

#!/usr/bin/env bash
# Prepared in session 23 for the next GPU session (not yet run). Where a request's ~0.48 ms "beyond its rounds" goes
# at batch 8 (session 18's churn run: its kernels add ~0.125 ms an admission, 50 us a round at 0.4 admissions a round,
# so most of it is the device waiting for the host): the churn loop's phases and kernels on main, the host cost of an
# admission + retirement alone (`admission_cost.py`), and the same under cProfile (which functions of the engine's
# host path it spends in), and (session 24) where the device idles in the churn loop and what the host does then
# (`device_gaps.py`). The `gpu` pair's shape with random weights: no training needed.
#   OUT=$OUT bash benchmarks/engine/h100_s24_a.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
timeout 150 python3 benchmarks/engine/churn_cost.py --configs dflash:15,ddtree:32 --new-tokens 20,128 --spread 0.5 \
    --prompt-tokens 80 --rounds 400 --top 20 > "$OUT/churn.txt" 2>&1
echo "churn rc=$?"; grep -E "new tokens|^ *(dflash|ddtree) +[0-9]|all [0-9]+ kernels" "$OUT/churn.txt"
timeout 120 python3 benchmarks/engine/device_gaps.py --configs dflash:15,ddtree:32 --new-tokens 20 --rounds 200 \
    > "$OUT/gaps.txt" 2>&1
echo "gaps rc=$?"; grep -v Warning "$OUT/gaps.txt" | grep -v warn_once
timeout 120 python3 benchmarks/engine/admission_cost.py --device cuda --shape gpu-pair --requests 64 --passes 5 \
    --methods ddtree,dflash --temperatures 0 > "$OUT/admission.txt" 2>&1
echo "admission rc=$?"; tail -8 "$OUT/admission.txt"
timeout 120 python3 -m cProfile -o /tmp/admission.prof benchmarks/engine/admission_cost.py --device cuda \
    --shape gpu-pair --requests 64 --passes 3 --methods ddtree --temperatures 0 > /dev/null 2>&1
echo "profile rc=$?"
python3 benchmarks/engine/print_profile.py /tmp/admission.prof > "$OUT/admission_profile.txt" 2>&1
head -70 "$OUT/admission_profile.txt"
true

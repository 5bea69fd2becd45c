#!/usr/bin/env bash
# Session 24's first call. Where a request's ~0.48 ms "beyond its rounds" goes at batch 8 (session 18's churn run: its
# kernels add ~0.125 ms an admission) and whether a second round in flight hides it (DDTREE_OVERLAP_DEPTH=2): the
# churn loop's cost and kernels at depth 1 (main) and 2, where the device idles and which host phase ran then
# (`device_gaps.py`) at both depths, the host cost of an admission + retirement alone (`admission_cost.py`) and the
# same under cProfile. The `gpu` pair's shape with random weights: no training needed.
#   OUT=$OUT bash benchmarks/engine/h100_s24_a.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/engine/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/versions.txt"
for depth in 1 2; do
    DDTREE_OVERLAP_DEPTH=$depth timeout 150 python3 benchmarks/engine/churn_cost.py --configs dflash:15,ddtree:32 \
        --new-tokens 20,128 --spread 0.5 --prompt-tokens 80 --rounds 400 --top 20 > "$OUT/churn_depth$depth.txt" 2>&1
    echo "churn depth $depth rc=$?"; grep -E "new tokens|^ *(dflash|ddtree) +[0-9]|all [0-9]+ kernels" "$OUT/churn_depth$depth.txt"
    DDTREE_OVERLAP_DEPTH=$depth timeout 90 python3 benchmarks/engine/device_gaps.py --configs dflash:15,ddtree:32 \
        --new-tokens 20 --rounds 200 > "$OUT/gaps_depth$depth.txt" 2>&1
    echo "gaps depth $depth rc=$?"; grep -E "^(gpu|dflash|ddtree)" "$OUT/gaps_depth$depth.txt"
done
timeout 90 python3 benchmarks/engine/admission_cost.py --device cuda --shape gpu-pair --requests 64 --passes 5 \
    --methods ddtree,dflash --temperatures 0 > "$OUT/admission.txt" 2>&1
echo "admission rc=$?"; tail -4 "$OUT/admission.txt"
timeout 90 python3 -m cProfile -o /tmp/admission.prof benchmarks/engine/admission_cost.py --device cuda \
    --shape gpu-pair --requests 64 --passes 3 --methods ddtree --temperatures 0 > /dev/null 2>&1
echo "profile rc=$?"
python3 benchmarks/engine/print_profile.py /tmp/admission.prof > "$OUT/admission_profile.txt" 2>&1
head -60 "$OUT/admission_profile.txt"
true

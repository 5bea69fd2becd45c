# Sourced by the GPU check scripts (gpu_build_check.sh, gpu_verify_check.sh) from the repository root:
# their common setup, and one timed, logged step.
# step NAME LIMIT_S CMD...: run CMD under a time limit, log to $OUT/NAME.log, print its rc and seconds,
# and set status=1 when it fails (the scripts go on and exit with $status).
status=0

step() {
    local name=$1 limit=$2 start rc
    shift 2
    echo "=== $name (limit ${limit} s): $*"
    start=$(date +%s)
    timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    echo "=== $name: rc=$rc after $(( $(date +%s) - start )) s"
    [ "$rc" -eq 0 ] || status=1
    return 0
}

# check_setup DEFAULT_OUT [--smoke]: SMOKE (1 with --smoke: CPU under the Triton interpreter), OUT (created;
# default DEFAULT_OUT), PYTHONPATH (default /tmp/site:src), all exported, and PY (niced under --smoke).
check_setup() {
    SMOKE=0
    if [ "${2:-}" = "--smoke" ]; then SMOKE=1; fi
    OUT=${OUT:-$1}
    mkdir -p "$OUT"
    export PYTHONPATH=${PYTHONPATH:-/tmp/site:src}
    export SMOKE OUT
    if [ "$SMOKE" = 1 ]; then
        export TRITON_INTERPRET=1
        PY="nice -n 19 python3"
    else
        PY="python3"
    fi
}

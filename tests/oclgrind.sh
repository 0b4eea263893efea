#!/usr/bin/env bash
# Runs the reduced kernel suite on Oclgrind's simulated device with its
# data-race, uninitialised-value and API checks, and fails on any report.
# Exit 77 (skipped) without oclgrind, unless CLATTN_REQUIRE_BACKENDS names
# oclgrind.   tests/oclgrind.sh BUILD/tests/clattn_tests BUILD/clattn
set -u
tests=$1 cli=$2
if ! command -v oclgrind >/dev/null; then
  case ",${CLATTN_REQUIRE_BACKENDS:-}," in
    *,oclgrind,*) echo "FAIL: oclgrind is required and not installed"; exit 1 ;;
  esac
  echo "SKIP: oclgrind is not installed"
  exit 77
fi
log=$(mktemp)
err=$(mktemp)
trap 'rm -f "$log" "$err"' EXIT
# After a run (its status $1, what it is $2): its stderr shown, and a
# failure on any report (reports go to the log; a simulation Oclgrind gives
# up on goes to stderr) or on the run's own failure.
checked() {
  cat "$err" >&2
  if [ -s "$log" ] || grep -q "OCLGRIND" "$err"; then
    echo "FAIL: Oclgrind reported ($2):"
    cat "$log"
    exit 1
  fi
  [ "$1" -eq 0 ] || exit "$1"
}
# Every variant as its device table shapes it (tiled's micro-tiles at these
# head_dims), then tiled's rows layout as a GPU runs it past head_dim 64
# (work-items sharing rows by columns and by tile rows, their partial
# scores meeting in local memory), forced by CLATTN_TILED at these small
# head_dims.
for pass in table split; do
  if [ $pass = split ]; then
    export CLATTN_TILED=16,8,2,4,0 CLATTN_TEST_VARIANT=tiled
  fi
  # The simulator is the only platform; its device is an OpenCL CPU device.
  CLATTN_REQUIRE_BACKENDS=opencl-cpu oclgrind --data-races --uninitialized --check-api \
    --log "$log" "$tests" --suite oclgrind --backend opencl-cpu 2>"$err"
  checked $? "$pass pass"
done
# The gradients summed over the pairs on the device (CLATTN_GRAD_BIAS=device:
# grad_bias__tree, grad_score_params__tree), through clattn bench on small
# shapes with dropout, softcap and GQA: races and API misuse, and the
# results against native's. Oclgrind's uninitialised-value plugin stops at
# a `freeze` that LLVM puts into grad_score_params__tree: left out here.
unset CLATTN_TILED CLATTN_TEST_VARIANT
dir=$(mktemp -d)
trap 'rm -f "$log" "$err"; rm -rf "$dir"' EXIT
python3 - "$dir/table.npy" <<'EOF'
import struct, sys
vals = [0.01 * ((7 * i) % 13 - 6) for i in range(4 * 65)]
head = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % len(vals)
head += " " * (-(10 + len(head) + 1) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
    f.write(struct.pack("<%df" % len(vals), *vals))
EOF
examples=$(dirname "$0")/../examples/programmable
for op in grad-bias grad-score-params; do
  set -- --op $op --q-seq 37 --heads 4 --kv-heads 2 --head-dim 16 --causal --dropout 0.2 \
    --seed 3 --softcap 20 --device cpu --reps 1 --json
  [ $op = grad-score-params ] &&
    set -- "$@" --score-fn "$examples/relative_bias.cl" --score-params "$dir/table.npy"
  CLATTN_GRAD_BIAS=device oclgrind --data-races --check-api --log "$log" "$cli" bench "$@" \
    >"$dir/out" 2>"$err"
  checked $? "$op on the device"
  # the device's kernel ran, and agrees with native's pass
  python3 -c "import json, sys
row = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][-1]
ok = '__tree' in row['kernels'] and row['max_error'] is not None and row['max_error'] < 1e-5
print('$op on the device: %s, max_error %s' % (row['kernels'], row['max_error']))
sys.exit(0 if ok else 'FAIL: want the device kernel and max_error < 1e-5')" "$dir/out" || exit 1
done

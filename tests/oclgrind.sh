#!/usr/bin/env bash
# Runs the reduced kernel suite on Oclgrind's simulated device with its
# data-race, uninitialised-value and API checks, and fails on any report.
# Exit 77 (skipped) without oclgrind, unless CLATTN_REQUIRE_BACKENDS names
# oclgrind.   tests/oclgrind.sh BUILD/tests/clattn_tests
set -u
tests=$1
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
  rc=$?
  cat "$err" >&2
  # Reports go to the log; a simulation it gives up on goes to stderr.
  if [ -s "$log" ] || grep -q "OCLGRIND" "$err"; then
    echo "FAIL: Oclgrind reported ($pass pass):"
    cat "$log"
    exit 1
  fi
  [ $rc -eq 0 ] || exit $rc
done

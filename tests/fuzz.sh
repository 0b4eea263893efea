#!/usr/bin/env bash
# Builds the libFuzzer targets with Clang (AddressSanitizer and UBSan on)
# and runs each for a bounded time from the seed corpus in tests/fuzz/corpus;
# any crash, leak or sanitizer report fails. Exit 77 (skipped) without
# clang, unless CLATTN_REQUIRE_BACKENDS names fuzz.
#   tests/fuzz.sh SOURCE_DIR WORK_DIR [SECONDS_PER_TARGET]
set -eu
src=$(realpath "$1") work=$(realpath -m "$2") seconds=${3:-20}
if ! command -v clang >/dev/null; then
  case ",${CLATTN_REQUIRE_BACKENDS:-}," in
    *,fuzz,*) echo "FAIL: clang is required for the fuzzers and not installed"; exit 1 ;;
  esac
  echo "SKIP: clang is not installed"
  exit 77
fi
CC=clang cmake -S "$src" -B "$work" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLATTN_FUZZ=ON \
  -DCLATTN_SANITIZE=address,undefined -DCLATTN_BUILD_TESTS=OFF -DCLATTN_BUILD_CLI=OFF \
  -DCLATTN_INSTALL=OFF >/dev/null
cmake --build "$work" -j2 --target fuzz_npy fuzz_shape fuzz_cli >/dev/null
export ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
for target in npy shape cli; do
  corpus="$work/corpus-$target"
  rm -rf "$corpus"
  mkdir -p "$corpus"
  echo "== fuzz_$target for ${seconds}s"
  set +e
  (cd "$work" && "./fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
     -close_fd_mask=3 -print_final_stats=1 "$corpus" "$src/tests/fuzz/corpus/$target" \
     >"$work/log-$target" 2>&1)
  rc=$?
  set -e
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|Done [0-9]+ runs" \
    "$work/log-$target" || true
  if [ $rc -ne 0 ] || ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* >/dev/null 2>&1; then
    tail -40 "$work/log-$target"
    echo "FAIL: fuzz_$target exited $rc; failing inputs are kept in $work"
    exit 1
  fi
done
echo "fuzz: clean"

#!/usr/bin/env bash
# Builds clattn's tests again under a checker and runs the suites that it
# can check, failing on any report.
#   tests/checkers.sh asan|tsan|valgrind SOURCE_DIR WORK_DIR
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer too),
#       on native, PoCL (when present) and everything host-side.
# tsan: ThreadSanitizer on the native path and the threaded API tests.
# valgrind: memcheck of the native suites, no errors and no leaks.
set -eu
mode=$1 src=$2 work=$3
build() {
  cmake -S "$src" -B "$work" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLATTN_SANITIZE="$1" >/dev/null
  cmake --build "$work" -j2 --target clattn_tests clattn_cli faultcl failrename >/dev/null
}
run_once() { # suite [backend]
  CLATTN_CLI="$work/clattn" CLATTN_FAILRENAME="$work/tests/libfailrename.so" \
    CLATTN_FAULTCL="$work/tests/libfaultcl.so" \
    "$work/tests/clattn_tests" --suite "$1" ${2:+--backend "$2"}
}
run() { # suite [backend]
  echo "== $mode: $*"
  [ "$mode" = asan ] || { run_once "$@"; return; }
  # LeakSanitizer's own tracer can crash while it stops PoCL's threads at
  # exit ("Tracer caught signal 11"): the checker failed, not the code, and
  # its verdict is unknown. Such a run alone is run once more; a finding
  # (a leak, an ASan or UBSan report) fails at once.
  local - log rc
  set +e
  log=$(mktemp)
  run_once "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] && grep -q 'LeakSanitizer has encountered a fatal error' "$log" &&
    ! grep -qE 'ERROR: (Address|Leak|UndefinedBehavior)Sanitizer|runtime error:' "$log"; then
    echo "== $mode: LeakSanitizer's tracer crashed, no finding: $* once more"
    rm -f "$log"
    run_once "$@"
    return
  fi
  rm -f "$log"
  return "$rc"
}
case $mode in
asan)
  build address,undefined
  # Suppressions for third-party drivers only (tests/lsan.supp): Mesa's
  # OpenCL libraries leak while the ICD loader enumerates platforms. Whole
  # allocation stacks, so that a leak inside a driver is told by its frames.
  # verify_asan_link_order=0: the CLI's tests load tests/failrename (not
  # instrumented) in front of it.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0:verify_asan_link_order=0"
  export LSAN_OPTIONS="suppressions=$src/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # PoCL compiles inside the instrumented process, its allocations unwound
  # in full: a cold build of a program takes minutes (clattn tune's test
  # builds several), so the suites' time limits are tripled here.
  export CK_TIMEOUT_MULTIPLIER=3
  # clattn's program cache on PoCL too, whose store has PoCL compile every
  # kernel when the program is built: left to PoCL's own cache (kernels
  # compiled at their first launch), a cold run beside the other suites saw
  # LeakSanitizer's tracer crash at the exit of 16-bit and dropout tests,
  # on both tries.
  export CLATTN_CACHE_POCL=1
  run api; run cli; run gradcheck; run kernels native; run buffers native; run train native
  if [ -n "${CLATTN_ASAN_OPENCL:-1}" ]; then
    for suite in kernels buffers cache faults inject; do
      set +e
      if [ $suite = inject ]; then
        # Every OpenCL call of each op failed in turn: no leak on any path.
        # The shim is not instrumented, so ASan need not come first.
        LD_PRELOAD="$work/tests/libfaultcl.so" \
          ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0" \
          CLATTN_REQUIRE_BACKENDS= run $suite opencl-cpu
      elif [ $suite = kernels ]; then
        # Half the float32 case's loop runs (every test function still
        # runs): ASan watches the host code, which each half reaches by the
        # same launch paths; kernels.opencl-cpu checks every run's numbers.
        # The caller's functions' host code is every variant's: tiled's alone.
        CLATTN_TEST_SHARD=0/2 CK_EXCLUDE_TAGS=programmable CLATTN_REQUIRE_BACKENDS= \
          run $suite opencl-cpu &&
          CK_RUN_CASE=programmable CLATTN_TEST_VARIANT=tiled CLATTN_REQUIRE_BACKENDS= \
            run $suite opencl-cpu
      else
        CLATTN_REQUIRE_BACKENDS= run $suite opencl-cpu
      fi
      rc=$?
      set -e
      [ $rc -eq 0 ] || [ $rc -eq 77 ] || exit $rc
    done
  fi
  ;;
tsan)
  build thread
  # Third-party drivers' own interceptor calls only (tests/tsan.supp).
  export TSAN_OPTIONS="halt_on_error=1:suppressions=$src/tests/tsan.supp"
  run api; run kernels native; run gradcheck
  ;;
valgrind)
  if ! command -v valgrind >/dev/null; then
    case ",${CLATTN_REQUIRE_BACKENDS:-}," in
      *,valgrind,*) echo "FAIL: valgrind is required and not installed"; exit 1 ;;
    esac
    echo "SKIP: valgrind is not installed"
    exit 77
  fi
  build ""
  vg() {
    echo "== valgrind: $*"
    valgrind -q --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect \
      --errors-for-leak-kinds=definite,indirect "$work/tests/clattn_tests" --suite "$1" \
      ${2:+--backend "$2"}
  }
  # check runs each test in a forked child, which valgrind follows. The
  # native path only: the ICD loader is shown no driver, so the API tests
  # that reach for OpenCL meet CLATTN_ERROR_NO_PLATFORM, as they expect.
  export OCL_ICD_VENDORS=/nonexistent/clattn-no-vendors
  vg api; vg gradcheck; vg kernels native; vg buffers native
  ;;
*) echo "usage: $0 asan|tsan|valgrind SOURCE_DIR WORK_DIR"; exit 2 ;;
esac
echo "$mode: clean"

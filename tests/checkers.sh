#!/usr/bin/env bash
# Builds clattn's tests again under a checker and runs the suites that it
# can check, failing on any report.
#   tests/checkers.sh asan|tsan|valgrind SOURCE_DIR WORK_DIR [PLAIN_TESTS [PLAIN_CLI]]
# asan: AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer too),
#       on native, PoCL (when present) and everything host-side. PLAIN_TESTS,
#       an uninstrumented clattn_tests, first runs each PoCL suite (the cli
#       suite by PLAIN_CLI, an uninstrumented clattn) to fill PoCL's kernel
#       cache: PoCL compiles inside the instrumented process,
#       where LLVM's allocations go through ASan's, and a cold build of the
#       score modifiers' programs alone took more than 15 minutes there.
# tsan: ThreadSanitizer on the native path and the threaded API tests.
# valgrind: memcheck of the native suites, no errors and no leaks.
set -eu
mode=$1 src=$2 work=$3 plain=${4:-} plain_cli=${5:-}
build() {
  cmake -S "$src" -B "$work" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLATTN_SANITIZE="$1" >/dev/null
  cmake --build "$work" -j2 --target clattn_tests clattn_cli faultcl failrename >/dev/null
}
with() { # TESTS suite [backend]: the suite by the test program TESTS (and CLI)
  CLATTN_CLI="${cli:-$work/clattn}" CLATTN_FAILRENAME="$work/tests/libfailrename.so" \
    CLATTN_FAULTCL="$work/tests/libfaultcl.so" "$1" --suite "$2" ${3:+--backend "$3"}
}
run() { # suite [backend]
  echo "== $mode: $*"
  with "$work/tests/clattn_tests" "$@"
}
# A suite on PoCL, first by PLAIN_TESTS (its output and status left aside:
# the suites' own tests judge it), then under the checker.
pocl() { # suite
  [ -z "$plain" ] || with "$plain" "$1" opencl-cpu >/dev/null 2>&1 || true
  run "$1" opencl-cpu
}
case $mode in
asan)
  build address,undefined
  # Suppressions for third-party drivers only (tests/lsan.supp): Mesa's
  # OpenCL libraries leak while the ICD loader enumerates platforms. Whole
  # allocation stacks, so that a leak inside a driver is told by its frames.
  # verify_asan_link_order=0: the CLI's tests load tests/failrename (not
  # instrumented) in front of it.
  # intercept_tls_get_addr=0: with it, the main thread's dynamic TLS
  # (that of libraries opened at run time) held a bad block in the forked
  # test children, and LeakSanitizer's tracer crashed on it at their exit
  # ("Tracer caught signal 11" after "DTLS 7 at 0x...1f77"). Static TLS and
  # the threads' stacks are still scanned.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0:verify_asan_link_order=0:intercept_tls_get_addr=0"
  export LSAN_OPTIONS="suppressions=$src/tests/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # Instrumented host code is slower: the suites' time limits tripled.
  export CK_TIMEOUT_MULTIPLIER=3
  # the cli suite's tune test builds programs on PoCL: warmed as pocl() does
  [ -z "$plain" ] || [ -z "$plain_cli" ] || cli=$plain_cli with "$plain" cli >/dev/null 2>&1 || true
  run api; run cli; run gradcheck; run kernels native; run buffers native; run train native
  if [ -n "${CLATTN_ASAN_OPENCL:-1}" ]; then
    export CLATTN_REQUIRE_BACKENDS=
    for suite in kernels buffers cache faults inject; do
      set +e
      if [ $suite = inject ]; then
        # Every OpenCL call of each op failed in turn: no leak on any path.
        # The shim is not instrumented, so ASan need not come first.
        LD_PRELOAD="$work/tests/libfaultcl.so" pocl $suite
      elif [ $suite = kernels ]; then
        # Half the float32 case's loop runs (every test function still
        # runs): ASan watches the host code, which each half reaches by the
        # same launch paths; kernels.opencl-cpu checks every run's numbers.
        # The caller's functions' host code is every variant's: tiled's alone.
        CLATTN_TEST_SHARD=0/2 CK_EXCLUDE_TAGS=programmable pocl $suite &&
          CK_RUN_CASE=programmable CLATTN_TEST_VARIANT=tiled pocl $suite
      else
        pocl $suite
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

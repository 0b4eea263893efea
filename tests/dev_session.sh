#!/usr/bin/env bash
# (untracked) this session's device calls
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SAVE_CACHE=0 bash tests/device_run.sh > "$OUT/build-stage.log" 2>&1 || { tail -30 "$OUT/build-stage.log"; exit 1; }
export CLATTN_CACHE_DIR=$PWD/.devcache
touch /tmp/marker
cli=build-dev/clattn
d64="--q-seq 4096 --heads 8 --head-dim 64 --causal"
d128="--q-seq 4096 --heads 32 --kv-heads 8 --head-dim 128 --causal"
b() { "$cli" bench --variant mma --dtype bf16 --reps 5 "$@" 2>&1 | tail -1; }
ab() {
  for shape in "$d64" "$d128"; do
    echo "== $shape"
    for r in 1 2; do
      echo "single:   $(b --op backward $shape)"
      echo "two-pass: $(CLATTN_MMA_SINGLE=0 b --op backward $shape)"
      echo "red.v2:   $(CLATTN_CL_OPTIONS=-DRED_V2 b --op backward $shape)"
    done
  done
}
shapes() {
  for c in "$@"; do
    echo "single $c d64: $(CLATTN_MMA_SINGLE=$c b --op backward $d64)"
    echo "single $c d128: $(CLATTN_MMA_SINGLE=$c b --op backward $d128)"
  done
}
suite() {
  CLATTN_TEST_VARIANT=mma timeout ${SUITE_T:-300} build-dev/tests/clattn_tests --suite kernels --backend opencl-gpu 2>&1 | grep -v 'warning generated' > "$OUT/kernels-mma.log"
  tail -n 3 "$OUT/kernels-mma.log"
}
exp2() {
  export CLATTN_CL_OPTIONS=-DRED_V2
  for r in 1 2; do
  echo "v2 default d64: $(b --op backward $d64)"
  echo "two-pass d64: $(CLATTN_MMA_SINGLE=0 b --op backward $d64)"
  echo "v2 no-red d64: $(CLATTN_CL_OPTIONS='-DRED_V2 -DNO_RED' b --op backward $d64)"
  echo "v2 default d128: $(b --op backward $d128)"
  echo "two-pass d128: $(CLATTN_MMA_SINGLE=0 b --op backward $d128)"
  echo "v2 no-red d128: $(CLATTN_CL_OPTIONS='-DRED_V2 -DNO_RED' b --op backward $d128)"
  done
  for c in 8,1,32,1 8,1,16,1 4,1,16,1 2,1,32,1; do echo "v2 $c d64: $(CLATTN_MMA_SINGLE=$c b --op backward $d64)"; done
  for c in 2,1,16,1 2,1,32,1 4,1,32,1; do echo "v2 $c d128: $(CLATTN_MMA_SINGLE=$c b --op backward $d128)"; done
  unset CLATTN_CL_OPTIONS
}
exp3() {
  export CLATTN_CL_OPTIONS=-DRED_V2
  for r in 1 2; do
  echo "v2 default d64: $(b --op backward $d64)"
  echo "two-pass d64: $(CLATTN_MMA_SINGLE=0 b --op backward $d64)"
  echo "v2 default d128: $(b --op backward $d128)"
  echo "two-pass d128: $(CLATTN_MMA_SINGLE=0 b --op backward $d128)"
  done
  echo "v1 default d64: $(CLATTN_CL_OPTIONS= b --op backward $d64)"
  echo "v1 default d128: $(CLATTN_CL_OPTIONS= b --op backward $d128)"
  for c in 4,1,16,1 8,1,16,1 2,1,32,1; do echo "v2 $c d64: $(CLATTN_MMA_SINGLE=$c b --op backward $d64)"; done
  for c in 2,1,16,1; do echo "v2 $c d128: $(CLATTN_MMA_SINGLE=$c b --op backward $d128)"; done
  for sh in "--q-seq 4096 --heads 32 --kv-heads 8 --head-dim 64" "--q-seq 16384 --heads 8 --head-dim 64 --causal" "--q-seq 4096 --heads 32 --kv-heads 8 --head-dim 128" "--q-seq 2048 --heads 16 --head-dim 96 --causal"; do
    echo "v2 $sh: $(b --op backward $sh)"
    echo "two-pass $sh: $(CLATTN_MMA_SINGLE=0 b --op backward $sh)"
  done
  unset CLATTN_CL_OPTIONS
}
final() {
  SUITE_T=260 suite
  ctest --test-dir build-dev -R 'train.opencl-gpu|ring.opencl-gpu' --output-on-failure 2>&1 | tee "$OUT/ctest-gpu.log" | grep -E 'Test #|tests passed|Failed'
  for r in 1 2; do
    echo "single d64: $(b --op backward $d64)"
    echo "two-pass d64: $(CLATTN_MMA_SINGLE=0 b --op backward $d64)"
    echo "single 4,1,16 d128: $(CLATTN_MMA_SINGLE=4,1,16,1 b --op backward $d128)"
    echo "two-pass d128: $(b --op backward $d128)"
  done
  python3 tests/torch_bench.py "$cli" --no-cpu --variant mma --dtype bf16 --reps 5 2>&1 | tee "$OUT/bench-bf16.log" | tail -30
  python3 tests/torch_bench.py "$cli" --no-cpu --variant mma --dtype f16 --reps 5 2>&1 | tee "$OUT/bench-f16.log" | tail -30
}
decide() {
  for r in 1 2; do
  for sh in "$d64" "--q-seq 4096 --heads 32 --kv-heads 8 --head-dim 64" "--q-seq 16384 --heads 8 --head-dim 64 --causal"; do
    echo "two-pass $sh: $(CLATTN_MMA_SINGLE=0 b --op backward $sh)"
    echo "4,1,16 $sh: $(b --op backward $sh)"
    echo "4,1,32 $sh: $(CLATTN_MMA_SINGLE=4,1,32,1 b --op backward $sh)"
  done
  done
}
last() {
  for v in mma tree; do
    CLATTN_TEST_VARIANT=$v timeout 300 build-dev/tests/clattn_tests --suite kernels --backend opencl-gpu 2>&1 | grep -v 'warning generated' > "$OUT/kernels-$v.log" &
  done
  CLATTN_MMA_SINGLE=4,1,16,1 CLATTN_TEST_VARIANT=mma timeout 300 build-dev/tests/clattn_tests --suite kernels --backend opencl-gpu 2>&1 | grep -v 'warning generated' > "$OUT/kernels-mma-single.log" &
  wait
  tail -n 2 "$OUT"/kernels-*.log
  ctest --test-dir build-dev -R 'train.opencl-gpu|ring.opencl-gpu' --output-on-failure 2>&1 | tee "$OUT/ctest-gpu.log" | grep -E 'Test #|tests passed|Failed'
  python3 tests/torch_bench.py "$cli" --no-cpu --variant mma --dtype bf16 --reps 5 2>&1 | tee "$OUT/bench-bf16.log" | tail -20
}
ptx() { mkdir -p "$OUT/new"; find .devcache -newer /tmp/marker -type f -size -3M -exec cp {} "$OUT/new/" \; ; ls -la "$OUT/new" | head; }
for f in "$@"; do echo "##### $f"; $f; done 2>&1 | tee -a "$OUT/session.log"

#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): build, then the stages
# named, logs under $OUT. Debian packages that machine lacks travel in
# .devdebs (docs/testing.md, "On a GPU machine").
#   bash tools/device_run.sh [suite] [compare] [bench] [tune]
#   suite    ctest's OpenCL GPU suites
#   kernels  the GPU kernels suite, one process per variant at once (mma's and
#            blocked's float32 and 16-bit tests apart, and mma's single-pass backward
#            forced; with KERNELS_VARIANT, its float32 case in KERNELS_SHARDS processes,
#            default 4, through CLATTN_TEST_SHARD), ctest's
#            train, ring and sm90a_probe GPU tests beside them; one summary,
#            kernels.log (KERNELS_S: the time limit, default 540 s; KERNELS_VARIANT:
#            that variant's tests alone, its modifiers' and programmable cases apart)
#   compare  tools/torch_compare.py --large on the GPU, tolerance 1e-5
#   compare16  tools/torch_compare.py --dtype bf16, then f16, on the GPU (12 cases; each
#            under COMPARE16_S, default 240 s)
#   bench    tools/torch_bench.py on the GPU shapes, with a plot (BENCH_VARIANT, BENCH_DTYPE,
#            BENCH_DIMS: variant, dtype and head_dims; defaults mma, f32, all)
#   tune     clattn bench per CLATTN_MMA shape (TUNE_D64, TUNE_D128, ... override the lists;
#            TUNE_DTYPE the tensors' dtype, default f32)
#   cpu      tools/torch_bench.py on the CPU shapes, native and PoCL blocked beside
#            torch, at the thread counts in CPU_THREADS (default 1,2,4,8,16),
#            CPU_ROUNDS rounds (default 1; medians over the rounds after them)
#   peak     tools/fmapeak.c's FMA peak at the thread counts in CPU_THREADS
#   ab       native old against new: clattn bench of the CPU shapes, interleaved, AB_ROUNDS
#            (default 2) rounds at each of AB_THREADS (default 16,1), the old build from
#            the source tree AB_OLD (carried; `git archive REV | tar x -C DIR`)
#   dtypes   float32 against bf16 and f16 on the CPU backends, old build against new: clattn
#            bench of DT_SHAPES (default the first three CPU shapes) on native and
#            PoCL blocked, forward and backward, at each of DT_THREADS (default 16,2),
#            interleaved, AB_ROUNDS rounds; the old build from AB_OLD as for ab (programs
#            compiled first, 8 at once)
#   gab      GPU kernels old against new: clattn bench of the GPU shapes (GAB_VARIANT, default
#            mma; GAB_DTYPE:
#            default bf16; GAB_DIMS: head_dims, default 64,128; GAB_OPS: default
#            "forward backward"), interleaved, AB_ROUNDS rounds, the old build from
#            AB_OLD as for ab; GAB_ARGS: more clattn bench arguments (a modifier)
#   wgmma    the 16-bit kernels with CLATTN_MMA_WGMMA=0 and 1 interleaved (AB_ROUNDS rounds,
#            bf16, d64 and d128 shapes; WGMMA_OPS: the ops, default forward), then the GPU
#            mma kernels suite's 16-bit tests (CK_RUN_CASE=grad_v-16) and the train
#            suite with it on, and
#            the wgmma programs' PTX scanned for local loads and stores (accumulators
#            spilled around a wgmma would be read before its wait), kept in $OUT where
#            WGMMA_PTX is set (a call brings back only a few files);
#            WGMMA_SUITE_S: the suite's time limit (default 400; 0 leaves it out)
#   regs     ptxas -v (sm_90) on every program in the cache: registers and spills a kernel,
#            with the program's source hash and options (REGS_GREP: only options matching)
#   tiled    clattn bench of tree and tiled at head_dims 64..256, and of tiled
#            per shape in TUNE_TILED (CLATTN_TILED, or FORWARD/BACKWARD: CLATTN_TILED and
#            CLATTN_TILED_BACKWARD; TILED_DIMS: the head_dims; TILED_OPS: default
#            "forward backward"; TILED_RUNS: default "tree tiled")
#   tunecli  clattn tune on the GPU per head_dim in TUNECLI_DIMS (default 64 128) on the
#            stage shapes above (TUNECLI_VARIANT, default tiled; TUNECLI_DTYPE, default f32;
#            each under TUNECLI_S, default 280 s), winners in $OUT/tuning; then, where
#            TUNECLI_BENCH=1, tools/torch_bench.py of that variant with the file and without
#   varlen   a packed batch (VARLEN_LENS: --random-seqlens, default 128,4096,1; VARLEN_COUNT
#            sequences, default 32; d128, 32 heads on 8 KV heads, causal) as packed, uniform
#            (as many pairs) and padded, forward and backward, in VARLEN_DTYPES (default
#            bf16 f32; VARLEN_OPS, default forward backward), then tools/torch_varlen.py on
#            the same lengths (bf16)
#   mods     the score modifiers' cost: clattn bench of the d64 and d128 GPU shapes (mma;
#            MODS_DTYPES, default bf16 f32; MODS_DIMS, default 64 128) plain, with
#            --softcap 30, --alibi (2^(-8 (i + 1) / heads)) and --dropout 0.1, interleaved,
#            AB_ROUNDS rounds; tools/torch_mods.py (bf16 SDPA plain, dropout_p, ALiBi
#            attn_mask) on the same shapes (with AB_OLD, the old build's GPU lines
#            beside each; MODS_TORCH=0 leaves PyTorch out; MODS_KINDS: the modifiers
#            timed, default "none softcap alibi dropout"); then native at MODS_THREADS
#            (default 16) on q 2048 8 heads d64 and d128 likewise, and a packed native batch (32 of 64-1024)
#            against its uniform batch (VARLEN's layouts); MODS_NATIVE=0 leaves native out
#   choose   the variants of the default's choice (CHOOSE_VARIANTS, default "mma tiled") on
#            every GPU shape (CHOOSE_DIMS: head_dims), dtype (CHOOSE_DTYPES, default
#            "f32 bf16") and op (CHOOSE_OPS, default "forward backward"), interleaved,
#            AB_ROUNDS rounds, with CHOOSE_ARGS more bench arguments; programs compiled
#            first, 12 at once (CHOOSE_WARM=0: not; only: nothing else)
#   prog     the caller's functions (docs/programmable.md): every variant's max_error, then a
#            document mask against packed sequences, softcap as a function against the
#            built-in, a relative-bias table, a bias tensor and the documents as a bool mask
#            (PROG_VARIANTS, default mma; PROG_DTYPES, PROG_OPS, PROG_SEQ, AB_ROUNDS;
#            PROG_ALL=0 leaves the max_error runs out)
#   dparams  the score parameters' gradient (a relative-bias table) on the GPU's kernel
#            against the host's pass and the backward, interleaved (DPARAMS_SEQS, default
#            1024 4096; PROG_DTYPES; with AB_OLD, the old build's kernel too), then the
#            GPU suite's programmable case (DPARAMS_VARIANT: one variant's; DPARAMS_TEST_S:
#            its time limit, default 400 s)
#   parts    the key side split into parts (CLATTN_MMA_KEY_PARTS): the backward of the GPU
#            shapes whose key side has fewer work-groups than the GPU has units (PARTS_SHAPES:
#            shapes.py lines, default the S 1024 ones and d80 GQA), on mma in one part, as
#            CLATTN_MMA_KEY_PARTS=auto splits it and in each of PARTS_COUNTS (default 4 8 16), and on
#            tiled, in PARTS_DTYPES (default f32 bf16), interleaved, AB_ROUNDS rounds;
#            then the GPU kernels suite's key_parts test (CK_RUN_CASE=key-parts; PARTS_TEST=0
#            leaves it out)
#   order    mma's launch order: a head's blocks side by side (CLATTN_MMA_ORDER=blocks)
#            against a block's heads (heads), on every GPU shape (ORDER_DIMS:
#            head_dims), in ORDER_DTYPES (default f32 bf16) and ORDER_OPS (default
#            forward backward), interleaved, AB_ROUNDS rounds
#   tensors  the bias tensor's and bool mask's cost, with AB_OLD the old build (as for ab)
#            beside this one: mma (PROG_VARIANTS) plain, with a float32 bias, with
#            documents of 512 as a bool mask, both [1][1][S][S], and with softcap built in
#            and as examples/programmable/softcap.cl, S = PROG_SEQ (default
#            8192), 8 heads, d64, causal, in PROG_DTYPES and PROG_OPS, interleaved,
#            AB_ROUNDS rounds; PROG_RUNS: the runs (default "plain bias bias16 bool_docs
#            softcap softcap_fn"; bias16: the bias as float16); then tools/torch_mods.py's
#            SDPA plain and with a bias [1][1][S][S] as attn_mask, in PROG_DTYPES
#   localmem tools/localmem.c: the local memory a work-group may have on each GPU, by
#            launches of growing size (what CL_DEVICE_LOCAL_MEM_SIZE says beside it)
#   ring     examples/ring_attention on 1 and then RING_RANKS (default 2) ranks, a GPU
#            each, RING_ARGS (default q_seq 131072, d128, 8 heads, causal); needs
#            Open MPI's Debian packages in .devdebs/mpi (unpacked under /opt/mpi)
# Shapes come from tools/shapes.py; the interleaved stages (ab, dtypes,
# gab, wgmma, mods) run through tools/interleave.py, which reads clattn
# bench's --json, and every run's figures go to $OUT/runs.jsonl as well.
# Compiled programs are kept in .devcache (CLATTN_CACHE_DIR); those the call
# used come back as $OUT/devcache.tgz: copied to .devcache.tgz here and
# carried, the next machine starts warm for them.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for f in .devdebs/*.deb; do dpkg -x "$f" /; done
ldconfig
export CLATTN_CACHE_DIR=$PWD/.devcache
mkdir -p "$CLATTN_CACHE_DIR"
[ -f .devcache.tgz ] && tar xzf .devcache.tgz -C "$CLATTN_CACHE_DIR"
# Only the programs this call loaded or stored come back (a load refreshes a
# program's time): the whole cache outgrows what a call may return.
touch "$CLATTN_CACHE_DIR/.since"
save_cache() {
  (cd "$CLATTN_CACHE_DIR" && find . -name '*.bin' -newer .since -print0 |
     tar czf "$OUT/devcache.tgz" --null -T -) 2>/dev/null
}
[ "${SAVE_CACHE:-1}" = 1 ] && trap save_cache EXIT
mpi_flags=()
if [ -d .devdebs/mpi ]; then
  # Open MPI from Debian, relocated (OPAL_PREFIX); only the libraries this
  # system lacks go on the library path.
  for f in .devdebs/mpi/*.deb; do dpkg -x "$f" /opt/mpi; done
  mkdir -p /opt/mpi/only
  for f in /opt/mpi/usr/lib/x86_64-linux-gnu/*.so.*; do
    ldconfig -p | grep -q " ${f##*/} " || ln -sf "$f" /opt/mpi/only/
  done
  export OPAL_PREFIX=/opt/mpi/usr PATH=/opt/mpi/usr/bin:$PATH
  export LD_LIBRARY_PATH=/opt/mpi/only:/opt/mpi/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 \
    OMPI_MCA_btl=self,vader OMPI_MCA_osc=^ucx PMIX_MCA_pcompress_base_silence_warning=1
  # mpirun handed the ranks OCL_ICD_FILENAMES cut at its first ':' (PoCL
  # alone, no NVIDIA): each rank gets it through env.
  mpi_flags=(-DMPI_C_COMPILER=/opt/mpi/usr/bin/mpicc.openmpi
             -DMPIEXEC_EXECUTABLE=/opt/mpi/usr/bin/mpirun.openmpi
             "-DMPIEXEC_PREFLAGS=env;OCL_ICD_FILENAMES=${OCL_ICD_FILENAMES:-}")
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv \
  > "$OUT/gpu.txt" 2>&1
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release "${mpi_flags[@]}" && cmake --build build-dev -j16; } \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
cli=build-dev/clattn
# The benchmark's shapes (tools/shapes.py), as HEAD_DIM:ARGS: one per
# head_dim class for the tune, tiled and mods stages.
mapfile -t shapes < <(python3 tools/shapes.py gpu --tag class)
export PYTHONUNBUFFERED=1
# The CLI of the source tree AB_OLD, for ab and gab, as build-old/clattn.
build_old() {
  { cmake -S "$AB_OLD" -B build-old -DCMAKE_BUILD_TYPE=Release && cmake --build build-old -j16 \
      --target clattn_cli; } > "$OUT/build-old.log" 2>&1 || { tail -20 "$OUT/build-old.log"; exit 1; }
}
# Interleaved runs (tools/interleave.py): LABEL, the arms, --, then
# `clattn bench` arguments; every run's figures also go to $OUT/runs.jsonl.
interleave() {
  local label=$1
  shift
  python3 tools/interleave.py --label "$label" --rounds "${AB_ROUNDS:-2}" --json "$OUT/runs.jsonl" "$@"
}
# The prog and tensors stages' arrays for a sequence of S: softcap's cap
# (cap.npy), a relative-bias table (table.npy), a bias over the heads and
# documents of 512 as a bool mask, both [1][1][S][S] (bias.npy, docs.npy),
# and the bias as float16 (bias16.npy).
prog_arrays() {
  python3 -c "import numpy as n; s = $1; i = n.arange(s) // 512
n.save('cap.npy', n.array([30.0], '<f4'))
n.save('table.npy', (n.sin(n.arange(8 * 65)) * 0.5).astype('<f4'))
n.save('bias.npy', (n.random.default_rng(0).random((1, 1, s, s), n.float32) - 0.5))
n.save('bias16.npy', n.load('bias.npy').astype('<f2'))
n.save('docs.npy', (i[:, None] == i[None, :])[None, None])"
}
# One line of an A/B: LABEL, then the old build (where AB_OLD) and this one
# on `clattn bench ARGS...`; AB_ARM: one more arm (tools/interleave.py's
# NAME=CLI[@VAR=VALUE...][+ARGS]).
ab_line() {
  local label=$1
  shift
  interleave "$label" ${AB_OLD:+--arm old=build-old/clattn} --arm dev=build-dev/clattn \
    ${AB_ARM:+--arm "$AB_ARM"} -- "$@"
}
for stage in "$@"; do
  case $stage in
  suite)
    ctest --test-dir build-dev -R 'opencl-gpu' --output-on-failure 2>&1 | tee "$OUT/suite.log" \
      | grep -E 'Test #|tests passed|Failed|Error' ;;
  kernels)
    # One process per variant at once, mma's float32 and 16-bit tests apart
    # (their builds are the slowest); check's per-test logs (CK_LOG_FILE_NAME)
    # say what passed even where KERNELS_S (default 540 s) cuts them off.
    logs=build-dev/klogs; rm -rf "$logs"; mkdir -p "$logs"
    suite() {
      local name=$1; shift
      env "$@" CK_LOG_FILE_NAME="$logs/$name.log" timeout "${KERNELS_S:-540}" \
        build-dev/tests/clattn_tests --suite kernels --backend opencl-gpu 2>&1 \
        | grep -v 'warning generated' > "$logs/$name.out"
    }
    if [ -n "${KERNELS_VARIANT:-}" ]; then # one variant alone: its float32 case in shards,
      n=${KERNELS_SHARDS:-4}               # the 16-bit and modifiers' cases apart
      for k in $(seq 0 $((n - 1))); do
        suite "$KERNELS_VARIANT-$k" CLATTN_TEST_VARIANT="$KERNELS_VARIANT" CK_RUN_CASE=grad_v \
          CLATTN_TEST_SHARD=$k/$n &
      done
      suite "$KERNELS_VARIANT-16" CLATTN_TEST_VARIANT="$KERNELS_VARIANT" CK_RUN_CASE=grad_v-16 &
      suite modifiers CLATTN_TEST_VARIANT="$KERNELS_VARIANT" CK_RUN_CASE=modifiers &
      suite programmable CLATTN_TEST_VARIANT="$KERNELS_VARIANT" CK_RUN_CASE=programmable &
    else
    suite mma CLATTN_TEST_VARIANT=mma CK_RUN_CASE=grad_v &
    suite mma-16 CLATTN_TEST_VARIANT=mma CK_RUN_CASE=grad_v-16 &
    # blocked (one work-item a work-group: slow on a GPU) split likewise; in
    # one process it was cut off at 430 s after 77 of 82 checks
    suite blocked CLATTN_TEST_VARIANT=blocked CK_RUN_CASE=grad_v &
    suite blocked-16 CLATTN_TEST_VARIANT=blocked CK_RUN_CASE=grad_v-16 &
    for v in tiled tree; do suite "$v" CLATTN_TEST_VARIANT=$v & done
    # the score modifiers, every variant
    suite modifiers CK_RUN_CASE=modifiers &
    # mma's single-pass backward, forced (it runs only where CLATTN_MMA_SINGLE asks)
    suite mma-single CLATTN_MMA_SINGLE=4,1,16,1 CLATTN_TEST_VARIANT=mma &
    timeout "${KERNELS_S:-540}" ctest --test-dir build-dev -R 'train.opencl-gpu|ring.opencl-gpu|sm90a_probe' \
      --output-on-failure > "$logs/ctest.out" 2>&1 &
    fi
    wait
    for f in "$logs"/*.log; do
      [ -f "$f" ] || continue
      printf '%s: %s passed, %s failed\n' "$(basename "$f" .log)" "$(grep -c ':P:' "$f")" \
        "$(grep -c ':[FE]:' "$f")"
      grep ':[FE]:' "$f" | head -10
    done 2>&1 | tee "$OUT/kernels.log"
    grep -h -a '^[0-9]*%' "$logs"/*.out | tee -a "$OUT/kernels.log"
    [ -f "$logs/ctest.out" ] && grep -E 'Test #|tests passed|Failed' "$logs/ctest.out" | tee -a "$OUT/kernels.log" ;;
  compare)
    python3 tools/torch_compare.py "$cli" --large --tolerance 1e-5 --backends gpu 2>&1 \
      | tee "$OUT/compare.log" ;;
  compare16)
    for dt in bf16 f16; do
      echo "== $dt"
      timeout "${COMPARE16_S:-240}" python3 tools/torch_compare.py "$cli" --backends gpu --dtype "$dt" 2>&1
      echo "rc $?"
    done 2>&1 | tee "$OUT/compare16.log" ;;
  bench)
    dtype=${BENCH_DTYPE:-f32}
    python3 tools/torch_bench.py "$cli" --no-cpu --variant "${BENCH_VARIANT:-mma}" --reps 5 \
      --dtype "$dtype" ${BENCH_DIMS:+--head-dims "$BENCH_DIMS"} --plot "$OUT/speed-$dtype.svg" \
      2>&1 | tee "$OUT/bench-$dtype.log" ;;
  tune)
    for entry in "${shapes[@]}"; do
      d=${entry%%:*}
      var=TUNE_D$d
      for cfg in ${!var:-}; do
        for op in forward backward; do
          printf 'd%s %s %s: ' "$d" "$cfg" "$op"
          CLATTN_MMA=$cfg $cli bench --op $op --head-dim "$d" ${entry#*:} --variant mma --reps 5 \
            --dtype "${TUNE_DTYPE:-f32}" 2>&1 | tail -1
        done
      done
    done 2>&1 | tee "$OUT/tune.log" ;;
  cpu)
    python3 tools/torch_bench.py "$cli" --no-gpu --variant blocked --reps 3 \
      --threads "${CPU_THREADS:-1,2,4,8,16}" --rounds "${CPU_ROUNDS:-1}" 2>&1 \
      | tee "$OUT/cpu.log" ;;
  peak)
    cc -O2 -march=native -o build-dev/fmapeak tools/fmapeak.c -lpthread
    threads=${CPU_THREADS:-1,2,4,8,16}
    for t in ${threads//,/ }; do
      printf 'fmapeak %s threads: %s GFLOP/s\n' "$t" "$(build-dev/fmapeak "$t")"
    done 2>&1 | tee "$OUT/peak.log" ;;
  ab)
    build_old
    mapfile -t cpu_shapes < <(python3 tools/shapes.py cpu)
    threads=${AB_THREADS:-16,1}
    for t in ${threads//,/ }; do
      for entry in "${cpu_shapes[@]}"; do
        for op in forward backward; do
          ab_line "t$t $op d${entry%%:*} ${entry#*:}" --op $op --head-dim "${entry%%:*}" \
            ${entry#*:} --device native --threads "$t" --reps 5
        done
      done
    done 2>&1 | tee "$OUT/ab.log" ;;
  dtypes)
    build_old
    mapfile -t dt_shapes < <(python3 tools/shapes.py cpu | head -3 | sed 's/^\([0-9]*\):/--head-dim \1 /')
    [ -n "${DT_SHAPES:-}" ] && IFS=';' read -r -a dt_shapes <<< "$DT_SHAPES"
    # PoCL's programs first, every build, dtype, head_dim and op, 8 at once
    for b in build-old build-dev; do for dt in f32 bf16 f16; do for sh in "${dt_shapes[@]}"; do
      for op in forward backward; do
        echo "$b/clattn bench --op $op $sh --device cpu --variant blocked --threads 2 --reps 1 --dtype $dt"
      done
    done; done; done | xargs -P 8 -I{} sh -c '{} > /dev/null 2>&1'
    threads=${DT_THREADS:-16,2}
    for t in ${threads//,/ }; do
      for sh in "${dt_shapes[@]}"; do
        for dev in native cpu; do
          var=()
          [ $dev = cpu ] && var=(--variant blocked)
          for op in forward backward; do
            arms=()
            for b in build-old build-dev; do for dt in f32 bf16 f16; do
              arms+=(--arm "${b#build-}-$dt=$b/clattn+--dtype $dt")
            done; done
            interleave "t$t $dev $op $sh" "${arms[@]}" -- --op $op $sh --device $dev "${var[@]}" \
              --threads "$t" --reps 5
          done
        done
      done
    done 2>&1 | tee "$OUT/dtypes.log" ;;
  gab)
    build_old
    mapfile -t gpu_shapes < <(python3 tools/shapes.py gpu --tag ab --dims "${GAB_DIMS:-64,128}")
    for entry in "${gpu_shapes[@]}"; do
      d=${entry%%:*}
      for op in ${GAB_OPS:-forward backward}; do
        ab_line "d$d $op ${entry#*:}" --op $op --head-dim "$d" ${entry#*:} --variant "${GAB_VARIANT:-mma}" \
          --reps 5 --dtype "${GAB_DTYPE:-bf16}" ${GAB_ARGS:-}
      done
    done 2>&1 | tee "$OUT/gab.log" ;;
  wgmma)
    # First one small call each way, whole lines (max_error against native).
    for w in 0 1; do
      CLATTN_MMA_WGMMA=$w timeout 120 $cli bench --op forward --head-dim 128 --q-seq 512 --heads 4 \
        --causal --variant mma --reps 1 --dtype bf16 2>&1 | tail -1
    done 2>&1 | tee "$OUT/wgmma-first.log"
    mapfile -t wg_shapes < <(python3 tools/shapes.py gpu --tag ab --dims 64,128 | grep -v 16384)
    for entry in "${wg_shapes[@]}"; do
      for op in ${WGMMA_OPS:-forward}; do
        interleave "d${entry%%:*} $op ${entry#*:}" --timeout 120 \
          --arm w0=$cli@CLATTN_MMA_WGMMA=0 --arm w1=$cli@CLATTN_MMA_WGMMA=1 -- \
          --op $op --head-dim "${entry%%:*}" ${entry#*:} --variant mma --reps 5 --dtype bf16
      done
    done 2>&1 | tee "$OUT/wgmma.log"
    if [ "${WGMMA_SUITE_S:-400}" -gt 0 ]; then
      # the log file gets each test's result as it ends (a suite cut off still tells)
      # its 16-bit tests (the float32 kernels do not change with it), then
      # the bf16 training run
      CK_LOG_FILE_NAME="$OUT/kernels-wgmma-tests.log" CLATTN_MMA_WGMMA=1 CLATTN_TEST_VARIANT=mma \
        CK_RUN_CASE=grad_v-16 timeout "${WGMMA_SUITE_S:-400}" build-dev/tests/clattn_tests \
        --suite kernels --backend opencl-gpu 2>&1 | grep -v 'warning generated' > "$OUT/kernels-wgmma.log"
      CLATTN_MMA_WGMMA=1 timeout 120 ctest --test-dir build-dev -R "^train.opencl-gpu$" --output-on-failure \
        2>&1 | grep -v 'warning generated' >> "$OUT/kernels-wgmma.log"
      grep -a '^[0-9]*%' "$OUT/kernels-wgmma.log"
    fi
    for f in "$CLATTN_CACHE_DIR"/*.bin; do
      head -c 600 "$f" | grep -aq 'WGMMA=1' || continue
      [ -n "${WGMMA_PTX:-}" ] && tr -d '\000' < "$f" > "$OUT/wgmma-$(basename "$f" .bin).ptx"
      printf '%s: %s local loads/stores, %s wgmma\n' "$(head -c 600 "$f" | grep -a -m1 '^options ' | grep -o 'HEAD_DIM=[0-9]*')" \
        "$(tr -d '\000' < "$f" | grep -c 'ld\.local\|st\.local')" "$(tr -d '\000' < "$f" | grep -c 'wgmma.mma_async')"
    done 2>&1 | tee -a "$OUT/wgmma.log" ;;
  regs)
    # A cached program: key lines, then the PTX the driver built (NUL-ended).
    ptxas=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
    for f in "$CLATTN_CACHE_DIR"/*.bin; do
      key=$(head -c 600 "$f" | grep -a -m2 -E '^(source|options) ' | tr '\n' ' ')
      case $key in *"${REGS_GREP:-}"*) ;; *) continue ;; esac
      tr -d '\000' < "$f" | awk 'f{print} /^\/\/ Generated by NVIDIA/{f=1; print}' \
        > build-dev/regs.ptx
      echo >> build-dev/regs.ptx
      echo "$key"
      "$ptxas" -arch=sm_90 -v build-dev/regs.ptx -o /dev/null 2>&1 | awk '
        /Compiling entry function/ {name = $(NF-2); gsub("\047", "", name)}
        /spill stores/ {spill = $5 "/" $9}
        /Used [0-9]+ registers/ {print "  " name, $5, "registers, spills " spill}'
    done 2>&1 | tee "$OUT/regs.log" ;;
  tiled)
    for entry in "${shapes[@]}"; do
      d=${entry%%:*}
      case " ${TILED_DIMS:-64 96 128 256} " in *" $d "*) ;; *) continue ;; esac
      for op in ${TILED_OPS:-forward backward}; do
        for run in ${TILED_RUNS-tree tiled} ${TUNE_TILED:-}; do
          v=$run cfg=
          case $run in tree | tiled) ;; *) v=tiled cfg=$run ;; esac
          printf 'd%s %s %s %s: ' "$d" "$op" "$v" "$cfg"
          fcfg=${cfg%%/*} bcfg=
          case $cfg in */*) bcfg=${cfg#*/} ;; esac
          CLATTN_TILED=$fcfg CLATTN_TILED_BACKWARD=$bcfg $cli bench --op $op --head-dim "$d" \
            ${entry#*:} --variant $v --reps 3 2>&1 | tail -1
        done
      done
    done 2>&1 | tee "$OUT/tiled.log" ;;
  tunecli)
    for entry in "${shapes[@]}"; do
      d=${entry%%:*}
      case " ${TUNECLI_DIMS:-64 128} " in *" $d "*) ;; *) continue ;; esac
      timeout "${TUNECLI_S:-280}" $cli tune --variant "${TUNECLI_VARIANT:-tiled}" \
        --dtype "${TUNECLI_DTYPE:-f32}" --head-dim "$d" ${entry#*:} --device gpu --reps 3 \
        --file "$OUT/tuning" > "$OUT/tune-d$d.log" 2>&1
      echo "d$d: exit $?"; grep -E '^tuning|^round|^best|^the table|^kept' "$OUT/tune-d$d.log"
    done
    if [ "${TUNECLI_BENCH:-0}" = 1 ]; then
      dims=$(echo ${TUNECLI_DIMS:-64 128} | tr ' ' ,)
      for f in off "$OUT/tuning"; do
        echo "== tuning file: $f"
        CLATTN_TUNING_FILE=$f python3 tools/torch_bench.py --variant "${TUNECLI_VARIANT:-tiled}" \
          --dtype "${TUNECLI_DTYPE:-f32}" --head-dims "$dims" 2>&1 | tail -8
      done
    fi 2>&1 | tee "$OUT/tunecli.log" ;;
  varlen)
    lens=${VARLEN_LENS:-128,4096,1} count=${VARLEN_COUNT:-32}
    # every variant on a small packed batch first: max_error against native
    # (VARLEN_CHECK=0 leaves it out)
    [ "${VARLEN_CHECK:-1}" = 0 ] || for dt in f32 bf16; do for op in forward backward; do
      $cli bench --op $op --random-seqlens 1,300,7 --batch 9 --heads 4 --kv-heads 2 --head-dim 64 \
        --causal --variant all --device gpu --reps 1 --dtype $dt 2>&1 | tail -4
    done; done 2>&1 | tee "$OUT/varlen-check.log"
    ctest --test-dir build-dev -R 'buffers.opencl-gpu|cache.opencl-gpu' --output-on-failure 2>&1 \
      | tee "$OUT/varlen-suite.log" | grep -E 'tests passed|Failed|Passed'
    for dt in ${VARLEN_DTYPES:-bf16 f32}; do
      for op in ${VARLEN_OPS:-forward backward}; do
        for layout in packed uniform padded; do
          printf '%s %s %s: ' "$dt" "$op" "$layout"
          $cli bench --op $op --random-seqlens "$lens" --batch "$count" --heads 32 --kv-heads 8 \
            --head-dim 128 --causal --dtype "$dt" --layout $layout --reps 5 --device gpu 2>&1 | tail -1
        done
      done
    done 2>&1 | tee "$OUT/varlen.log"
    python3 tools/torch_varlen.py --random-seqlens "$lens" --batch "$count" --heads 32 \
      --kv-heads 8 --head-dim 128 --dtype bf16 2>&1 | tee -a "$OUT/varlen.log" ;;
  mods)
    slopes() { python3 -c "import numpy as n,sys; h=int(sys.argv[1]); n.save(sys.argv[2], n.array([2**(-8*(i+1)/h) for i in range(h)],dtype='<f4'))" "$1" "$2"; }
    mods_of=()
    for m in "none:" "softcap:--softcap 30" "alibi:--alibi ALIBI" "dropout:--dropout 0.1 --seed 1"; do
      case " ${MODS_KINDS:-none softcap alibi dropout} " in *" ${m%%:*} "*) mods_of+=("$m") ;; esac
    done
    # With AB_OLD, the GPU lines of the old build (its CLI as for ab) beside
    # this one's, interleaved.
    mods_builds=(build-dev)
    [ -n "${AB_OLD:-}" ] && { build_old; mods_builds=(build-old build-dev); }
    run_mods() { # LABEL HEADS BUILDS then clattn bench args
      local label=$1 heads=$2 builds=$3 m b arms=()
      shift 3
      slopes "$heads" "$OUT/slopes$heads.npy"
      for b in $builds; do
        for m in "${mods_of[@]}"; do
          local args=${m#*:}
          arms+=(--arm "${b#build-}-${m%%:*}=$b/clattn${args:++${args//ALIBI/$OUT/slopes$heads.npy}}")
        done
      done
      interleave "$label" "${arms[@]}" -- "$@"
    }
    for dt in ${MODS_DTYPES:-bf16 f32}; do
      for s in "${shapes[@]}"; do
        d=${s%%:*}
        case " ${MODS_DIMS:-64 128} " in *" $d "*) ;; *) continue ;; esac
        heads=$(echo "${s#*:}" | sed 's/.*--heads \([0-9]*\).*/\1/')
        for op in forward backward; do
          run_mods "mma $dt d$d $op" "$heads" "${mods_builds[*]}" --op $op --head-dim "$d" \
            ${s#*:} --dtype "$dt" --device gpu --reps 5
        done
      done
    done 2>&1 | tee "$OUT/mods.log"
    [ "${MODS_TORCH:-1}" = 1 ] && for s in "${shapes[@]}"; do
      d=${s%%:*}
      case " ${MODS_DIMS:-64 128} " in *" $d "*) ;; *) continue ;; esac
      kvh=$(echo "${s#*:}" | sed -n 's/.*--kv-heads \([0-9]*\).*/\1/p')
      heads=$(echo "${s#*:}" | sed 's/.*--heads \([0-9]*\).*/\1/')
      python3 tools/torch_mods.py --q-seq 4096 --heads "$heads" ${kvh:+--kv-heads $kvh} \
        --head-dim "$d" --dtype bf16
    done 2>&1 | tee -a "$OUT/mods.log"
    [ "${MODS_NATIVE:-1}" = 1 ] && for d in 64 128; do
      for op in forward backward; do
        run_mods "native d$d $op" 8 build-dev --op $op --q-seq 2048 --heads 8 --kv-heads 2 \
          --head-dim $d --causal --device native --threads "${MODS_THREADS:-16}" --reps 5
      done
    done 2>&1 | tee -a "$OUT/mods.log"
    [ "${MODS_NATIVE:-1}" = 1 ] && for r in $(seq "${AB_ROUNDS:-2}"); do
      for op in forward backward; do
        for layout in packed uniform padded; do
          printf 'native r%s %s %s: ' "$r" "$op" "$layout"
          $cli bench --op $op --random-seqlens 64,1024,1 --batch 32 --heads 8 --kv-heads 2 \
            --head-dim 64 --causal --layout $layout --reps 5 --device native \
            --threads "${MODS_THREADS:-16}" 2>&1 | tail -1
        done
      done
    done 2>&1 | tee -a "$OUT/mods.log" ;;
  choose)
    mapfile -t all_shapes < <(python3 tools/shapes.py gpu ${CHOOSE_DIMS:+--dims "$CHOOSE_DIMS"})
    variants=${CHOOSE_VARIANTS:-mma tiled}
    dims=$(printf '%s\n' "${all_shapes[@]}" | cut -d: -f1 | sort -un)
    if [ "${CHOOSE_WARM:-1}" != 0 ]; then
      for v in $variants; do for dt in ${CHOOSE_DTYPES:-f32 bf16}; do for d in $dims; do
        for op in ${CHOOSE_OPS:-forward backward}; do
          echo "$cli bench --op $op --head-dim $d --q-seq 256 --heads 2 --kv-heads 1 --causal" \
            "--variant $v --dtype $dt --reps 1 ${CHOOSE_ARGS:-}"
        done
      done; done; done | xargs -P 12 -I{} sh -c '{} > /dev/null 2>&1'
    fi
    [ "${CHOOSE_WARM:-1}" = only ] && continue
    for entry in "${all_shapes[@]}"; do
      for dt in ${CHOOSE_DTYPES:-f32 bf16}; do for op in ${CHOOSE_OPS:-forward backward}; do
        arms=()
        for v in $variants; do arms+=(--arm "$v=$cli+--variant $v"); done
        interleave "d${entry%%:*} $dt $op ${entry#*:}" --timeout 120 "${arms[@]}" -- --op $op \
          --head-dim "${entry%%:*}" ${entry#*:} --reps 5 --dtype "$dt" ${CHOOSE_ARGS:-}
      done; done
    done 2>&1 | tee "$OUT/choose.log" ;;
  prog)
    # the caller's functions on the GPU: a document mask against the packed
    # batch of the same documents, softcap as a function against the
    # built-in and the plain call, a relative-bias table; every op's
    # max_error against native first (PROG_DTYPES, default f32 bf16;
    # PROG_SEQ, default 8192; documents of 512)
    ex=examples/programmable seq=${PROG_SEQ:-8192}
    prog_arrays "$seq"
    lens=$(python3 -c "print(','.join(['512'] * ($seq // 512)))")
    for dt in ${PROG_DTYPES:-f32 bf16}; do for op in ${PROG_OPS:-forward backward}; do
      [ "${PROG_ALL:-1}" = 1 ] &&
        $cli bench --op $op --q-seq 700 --heads 8 --head-dim 64 --causal --variant all --device gpu \
          --reps 1 --dtype $dt --mask-fn $ex/document.cl --score-fn $ex/softcap.cl --score-params cap.npy 2>&1 | tail -3
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for run in "packed:--seqlens $lens" "document:--q-seq $seq --mask-fn $ex/document.cl" \
                   "plain:--q-seq $seq" "softcap:--q-seq $seq --softcap 30" \
                   "softcap_fn:--q-seq $seq --score-fn $ex/softcap.cl --score-params cap.npy" \
                   "relbias_fn:--q-seq $seq --score-fn $ex/relative_bias.cl --score-params table.npy" \
                   "bias:--q-seq $seq --bias bias.npy" "bool_docs:--q-seq $seq --bias docs.npy"; do
          for pv in ${PROG_VARIANTS:-mma}; do
            printf '%s %s %s %s: ' "$pv" "$dt" "$op" "${run%%:*}"
            # shellcheck disable=SC2086
            $cli bench --op $op ${run#*:} --heads 8 --head-dim 64 --causal --dtype $dt \
              --device gpu --reps 5 --variant "$pv" 2>&1 | tail -1
          done
        done
      done
    done; done 2>&1 | tee "$OUT/prog.log" ;;
  dparams)
    # the score parameters' gradient (a relative-bias table of 65 entries a
    # head) on the device's kernel against the host's pass
    # (CLATTN_GRAD_BIAS=host) and the backward of the same call (GFLOP/s:
    # 4 FLOP a pair and head_dim element for the gradient, 10 for the
    # backward; ms in runs.jsonl), at DPARAMS_SEQS (default 1024 4096);
    # then the programmable case of the GPU suite
    prog_arrays 1024
    old_arm=()
    if [ -n "${AB_OLD:-}" ]; then
      build_old
      old_arm=(--arm "old=build-old/clattn+--op grad-score-params")
    fi
    for seq in ${DPARAMS_SEQS:-1024 4096}; do for dt in ${PROG_DTYPES:-f32 bf16}; do
      interleave "relbias $dt q$seq" --timeout 300 \
        --arm "backward=$cli+--op backward" --arm "device=$cli+--op grad-score-params" \
        "${old_arm[@]}" --arm "host=$cli@CLATTN_GRAD_BIAS=host+--op grad-score-params" \
        -- --q-seq "$seq" --heads 8 --head-dim 64 --causal --dtype "$dt" --device gpu --reps 3 \
        --score-fn examples/programmable/relative_bias.cl --score-params table.npy
    done; done 2>&1 | tee "$OUT/dparams.log"
    env CK_RUN_CASE=programmable ${DPARAMS_VARIANT:+CLATTN_TEST_VARIANT=$DPARAMS_VARIANT} \
      timeout "${DPARAMS_TEST_S:-400}" build-dev/tests/clattn_tests --suite kernels \
      --backend opencl-gpu 2>&1 | grep -v 'warning generated' | tail -8 | tee -a "$OUT/dparams.log" ;;
  parts)
    mapfile -t part_shapes < <(python3 tools/shapes.py gpu | grep -E "${PARTS_SHAPES:-q-seq 1024|kv-heads 4$}")
    [ "${CHOOSE_WARM:-1}" != 0 ] && for entry in "${part_shapes[@]}"; do
      for dt in ${PARTS_DTYPES:-f32 bf16}; do for v in mma tiled; do
        echo "$cli bench --op backward --head-dim ${entry%%:*} --q-seq 256 --heads 2 --kv-heads 1" \
          "--causal --variant $v --dtype $dt --reps 1"
      done; done
    done | xargs -P 12 -I{} sh -c '{} > /dev/null 2>&1'
    for entry in "${part_shapes[@]}"; do
      for dt in ${PARTS_DTYPES:-f32 bf16}; do
        arms=(--arm "one=$cli@CLATTN_MMA_KEY_PARTS=1+--variant mma" --arm "auto=$cli@CLATTN_MMA_KEY_PARTS=auto+--variant mma")
        for n in ${PARTS_COUNTS:-4 8 16}; do arms+=(--arm "p$n=$cli@CLATTN_MMA_KEY_PARTS=$n+--variant mma"); done
        arms+=(--arm "tiled=$cli+--variant tiled")
        interleave "d${entry%%:*} $dt backward ${entry#*:}" --timeout 120 "${arms[@]}" -- \
          --op backward --head-dim "${entry%%:*}" ${entry#*:} --reps 5 --dtype "$dt"
      done
    done 2>&1 | tee "$OUT/parts.log"
    [ "${PARTS_TEST:-1}" = 1 ] &&
      CK_RUN_CASE=key-parts timeout 300 build-dev/tests/clattn_tests \
        --suite kernels --backend opencl-gpu 2>&1 | grep -v 'warning generated' | tail -8 |
        tee -a "$OUT/parts.log" ;;
  order)
    mapfile -t all_shapes < <(python3 tools/shapes.py gpu ${ORDER_DIMS:+--dims "$ORDER_DIMS"})
    for entry in "${all_shapes[@]}"; do
      for dt in ${ORDER_DTYPES:-f32 bf16}; do for op in ${ORDER_OPS:-forward backward}; do
        interleave "d${entry%%:*} $dt $op ${entry#*:}" --timeout 120 \
          --arm "blocks=$cli@CLATTN_MMA_ORDER=blocks+--variant mma" \
          --arm "heads=$cli@CLATTN_MMA_ORDER=heads+--variant mma" \
          -- --op $op --head-dim "${entry%%:*}" ${entry#*:} --reps 5 --dtype "$dt"
      done; done
    done 2>&1 | tee "$OUT/order.log" ;;
  tensors)
    [ -n "${AB_OLD:-}" ] && build_old
    seq=${PROG_SEQ:-8192}
    prog_arrays "$seq"
    for dt in ${PROG_DTYPES:-f32 bf16}; do for op in ${PROG_OPS:-forward backward}; do
      for run in "plain:" "bias:--bias bias.npy" "bias16:--bias bias16.npy" \
                 "bool_docs:--bias docs.npy" "softcap:--softcap 30" \
                 "softcap_fn:--score-fn examples/programmable/softcap.cl --score-params cap.npy"; do
        [[ " ${PROG_RUNS:-plain bias bias16 bool_docs softcap softcap_fn} " == *" ${run%%:*} "* ]] || continue
        for pv in ${PROG_VARIANTS:-mma}; do
          # shellcheck disable=SC2086
          ab_line "$pv $dt $op ${run%%:*}" --op "$op" --q-seq "$seq" --heads 8 --head-dim 64 \
            --causal --dtype "$dt" --device gpu --reps 5 --variant "$pv" ${run#*:}
        done
      done
    done; done 2>&1 | tee "$OUT/tensors.log"
    # PyTorch's SDPA plain and with the bias as a float attn_mask, same shape
    for dt in ${PROG_DTYPES:-f32 bf16}; do
      python3 tools/torch_mods.py --q-seq "$seq" --heads 8 --head-dim 64 --dtype "$dt" \
        --modifiers none,bias
    done 2>&1 | tee -a "$OUT/tensors.log" ;;
  localmem)
    cc -O1 -o build-dev/localmem tools/localmem.c -lOpenCL &&
      build-dev/localmem 2>&1 | tee "$OUT/localmem.log" ;;
  ring)
    gpus=$($cli devices | sed -n 's/^[* ] \([0-9]*\):[0-9]* *opencl-gpu.*/\1/p' | head -1)
    for np in 1 ${RING_RANKS:-2}; do
      echo "== $np rank(s), platform $gpus"
      mpirun -np "$np" --bind-to none env OCL_ICD_FILENAMES="${OCL_ICD_FILENAMES:-}" \
        build-dev/ring_attention \
        ${RING_ARGS:---q-seq 131072 --heads 8 --head-dim 128 --causal --reps 2} \
        --device "$gpus:{rank}"
    done 2>&1 | tee "$OUT/ring.log" ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done

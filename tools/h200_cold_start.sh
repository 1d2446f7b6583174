#!/usr/bin/env bash
# Cold start on one GPU (written for the H200): first-call latency of a fresh process, and the
# time of an engine-style warmup(), without and with the precompiled kernel cache.
#
#   tools/h200_cold_start.sh            (no arguments; logs and a CSV under $OUT when set)
#
# 1. Precompiles, on this machine (its Python and Triton build are what the cache is keyed on),
#    the family measured below with the CMake `precompile` target (or the same Python CLI when
#    cmake is absent), into a scratch directory.
# 2. Runs fresh processes, each with an empty TRITON_CACHE_DIR:
#      cold         PAGED_MQA_LOGITS_KERNEL_CACHE=off
#      precompiled  PAGED_MQA_LOGITS_KERNEL_CACHE=<the scratch cache>
#    and, for reference, "user cache": a TRITON_CACHE_DIR a previous process already filled.
#    Each process times its first call (kernel(s) + sync), a second call, and the counts of
#    kernels Triton compiled vs loaded from disk; a second set of processes times warmup().
# Prints one table (median of REPEATS processes per row).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$(pwd)"
PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-}"
WORK="$(mktemp -d /tmp/cold_start.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# The family measured: DeepSeek-V3.2 indexer decode as vLLM calls it on NVIDIA.
HEADS=64 KV_BLOCK_SIZE=64 NEXT_N=1 MAX_MODEL_LEN=163840 CONTEXT=8192 BATCH=32
BATCHES="1,2,4,8,16,32,64,128,256"   # warmup()/precompile cover these (vLLM-style capture sizes)
REPEATS="${REPEATS:-3}"

log() { echo "$@" >&2; }
"$PY" - <<'EOF' >&2
import torch, triton, sys
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, "
      f"gpu {torch.cuda.get_device_name() if torch.cuda.is_available() else 'NONE'}")
EOF

# ---------------------------------------------------------------- 1. precompile (timed)
CACHE="$WORK/kernel_cache"
now() { "$PY" -c 'import time; print(time.time())'; }
t0=$(now)
if command -v cmake >/dev/null 2>&1; then
  cmake -S "$REPO" -B "$WORK/build" -DGPU_TARGETS=sm_90 -DPython3_EXECUTABLE="$(command -v "$PY")" \
    -DPAGED_MQA_LOGITS_KERNEL_CACHE_DIR="$CACHE" -DPAGED_MQA_LOGITS_MAX_MODEL_LEN=$MAX_MODEL_LEN \
    -DPAGED_MQA_LOGITS_BATCH_SIZES="$BATCHES" -DPAGED_MQA_LOGITS_LENS=2d -DPAGED_MQA_LOGITS_HEADS=$HEADS \
    -DPAGED_MQA_LOGITS_NEXT_N=$NEXT_N -DPAGED_MQA_LOGITS_KV_BLOCK_SIZE=$KV_BLOCK_SIZE -DPAGED_MQA_LOGITS_PRESHUFFLE=0 \
    -DPAGED_MQA_LOGITS_FAMILY=ON \
    > "$WORK/precompile.log" 2>&1
  TRITON_CACHE_DIR="$WORK/precompile_triton_cache" cmake --build "$WORK/build" --target precompile >> "$WORK/precompile.log" 2>&1
  HOW=cmake
else
  TRITON_CACHE_DIR="$WORK/precompile_triton_cache" "$PY" -m paged_mqa_logits precompile --arch sm_90 --out "$CACHE" \
    --max-model-len $MAX_MODEL_LEN --batch-sizes "$BATCHES" --lens 2d --heads $HEADS --next-n $NEXT_N \
    --kv-block-size $KV_BLOCK_SIZE --preshuffle 0 --family --verify --quiet > "$WORK/precompile.log" 2>&1
  HOW="python -m paged_mqa_logits precompile (no cmake)"
fi
t1=$(now)
PRECOMPILE_S=$("$PY" -c "print($t1 - $t0)")
grep -E "^precompiled|^verify|ERROR|skipped" "$WORK/precompile.log" >&2 || true

# ---------------------------------------------------------------- 2. fresh processes
cat > "$WORK/child.py" <<EOF
import json, os, sys, time
t_proc = time.perf_counter()
import torch
import triton
import paged_mqa_logits as pml
from paged_mqa_logits import kernel_cache
from paged_mqa_logits.aot import overlay
from paged_mqa_logits.reference import make_inputs

mode = sys.argv[1]
counts = {"compiled": 0, "from_disk": 0}
def listener(src, metadata, metadata_group, times, cache_hit):
    counts["from_disk" if cache_hit else "compiled"] += 1
triton.knobs.compilation.listener = listener
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t_ready = time.perf_counter()
# Does the package turn the precompiled cache on by itself? (backends.get calls activate())
import inspect, paged_mqa_logits.backends as be
self_activating = "overlay.activate" in inspect.getsource(be.get)
if not self_activating:
    kernel_cache.activate()
if mode == "call":
    inp = make_inputs($BATCH, $NEXT_N, $HEADS, $CONTEXT, kv_block_size=$KV_BLOCK_SIZE, lens_2d=True,
                      max_model_len=$MAX_MODEL_LEN, device="cuda", seed=0)
    workspace = torch.empty(($BATCH * $NEXT_N, $MAX_MODEL_LEN), dtype=torch.float32, device="cuda")  # vLLM-style
    args = (inp["q_fp8"], inp["kv_cache"], inp["weights"], workspace, inp["context_lens"], inp["kv_indices"], $MAX_MODEL_LEN)
    torch.cuda.synchronize()
    t0 = time.perf_counter(); pml.paged_mqa_logits(*args, False, $KV_BLOCK_SIZE); torch.cuda.synchronize(); t1 = time.perf_counter()
    pml.paged_mqa_logits(*args, False, $KV_BLOCK_SIZE); torch.cuda.synchronize(); t2 = time.perf_counter()
    result = {"first_ms": (t1 - t0) * 1e3, "second_us": (t2 - t1) * 1e6}
else:
    from paged_mqa_logits.aot.warmup import warmup
    t0 = time.perf_counter()
    s = warmup($HEADS, $KV_BLOCK_SIZE, False, next_n=$NEXT_N, batch_sizes=[$BATCHES], max_model_len=$MAX_MODEL_LEN, progress=False)
    torch.cuda.synchronize(); t1 = time.perf_counter()
    result = {"warmup_s": t1 - t0, "warmup_calls": s.calls_run, "kernels": s.kernels, "missing": len(s.missing)}
    print(s.describe(), file=sys.stderr)
result.update(counts, mode=mode, self_activating=self_activating, cache_dirs=overlay._ACTIVE or [],
              startup_s=t_ready - t_proc, process_s=time.perf_counter() - t_proc)
print("RESULT " + json.dumps(result))
EOF

run_child() {  # $1 variant, $2 mode, $3 triton cache dir, $4 kernel cache setting
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PAGED_MQA_LOGITS_KERNEL_CACHE="$4" TRITON_CACHE_DIR="$3" \
    "$PY" "$WORK/child.py" "$2" 2>>"$WORK/children.log" \
    | sed -n 's/^RESULT //p' | "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); d['variant']='$1'; print(json.dumps(d))"
}
: > "$WORK/results.jsonl"
for mode in call warmup; do
  for i in $(seq $REPEATS); do
    run_child cold "$mode" "$WORK/tc_cold_${mode}_$i" off >> "$WORK/results.jsonl"
    run_child precompiled "$mode" "$WORK/tc_pre_${mode}_$i" "$CACHE" >> "$WORK/results.jsonl"
  done
  # reference: Triton's own cache already filled by an earlier process on this machine
  run_child "user cache" "$mode" "$WORK/tc_user_$mode" off > /dev/null
  for i in $(seq $REPEATS); do run_child "user cache" "$mode" "$WORK/tc_user_$mode" off >> "$WORK/results.jsonl"; done
done

"$PY" - "$WORK/results.jsonl" "$PRECOMPILE_S" "$HOW" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda xs: statistics.median(xs) if xs else float("nan")
print(f"precompile for sm_90 via {sys.argv[3]}: {float(sys.argv[2]):.1f} s")
print(f"package activates the cache by itself: {all(r['self_activating'] for r in rows)}")
print(f"{'variant':12s} | {'first call ms':>13s} | {'2nd call us':>11s} | {'compiled':>8s} | {'from disk':>9s} | {'warmup() s':>10s} | {'warmup compiled':>15s}")
for variant in ("cold", "precompiled", "user cache"):
    call = [r for r in rows if r["variant"] == variant and r["mode"] == "call"]
    warm = [r for r in rows if r["variant"] == variant and r["mode"] == "warmup"]
    print(f"{variant:12s} | {med([r['first_ms'] for r in call]):13.1f} | {med([r['second_us'] for r in call]):11.1f} | "
          f"{med([r['compiled'] for r in call]):8.0f} | {med([r['from_disk'] for r in call]):9.0f} | "
          f"{med([r['warmup_s'] for r in warm]):10.2f} | {med([r['compiled'] for r in warm]):15.0f}")
print(f"(median of {sum(1 for r in rows if r['variant'] == 'cold' and r['mode'] == 'call')} fresh processes per cell; "
      "'compiled' = kernels Triton compiled in that process, 'from disk' = loaded from a cache)")
EOF

if [ -n "$OUT_DIR" ]; then
  mkdir -p "$OUT_DIR"
  cp "$WORK/results.jsonl" "$WORK/precompile.log" "$WORK/children.log" "$OUT_DIR/" 2>/dev/null || true
  if [ -f "$CACHE/manifest.json" ]; then cp "$CACHE/manifest.json" "$OUT_DIR/kernel_cache_manifest.json"; fi
fi

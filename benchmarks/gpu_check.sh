#!/usr/bin/env bash
# One script for a GPU machine: the versions, the repository's CUDA tests, the GPU benchmarks.
#
#   bash benchmarks/gpu_check.sh            (from anywhere; it works in the repository root)
#
# Uses the machine's python3 with its CUDA build of torch (NOT the Makefile's .venv, a CPU build),
# with PYTHONPATH=src; installs nothing and needs no network. Every step runs, whatever the one
# before it did: each step's exit status and seconds are printed and kept in $OUT/status.txt, its
# output in $OUT/<step>.log. Steps:
#   1. versions: python, torch (CUDA), triton, transformers, liger-kernel, flash-attn; nvidia-smi
#   2. cuda_tests: python3 -m pytest -m cuda tests (the tests marked `cuda`; skipped without pytest)
#   3. bench: python3 -m rotary bench --device cuda --markdown --progress --suites none
#      -> $OUT/bench_cuda.md: the RoPE groups (--progress also prints each group's table to the log as
#      it finishes, so a run stopped by its time budget still leaves the groups it finished)
#   4. fused: rotary bench --device cuda --shapes none --suites rotate_and_cache,rmsnorm_rotate
#      -> $OUT/fused_cuda.md (each fused op against its composition, eager and compiled by Inductor,
#      and the traffic limit)
#   5. generation: rotary bench --device cuda --shapes none --suites generation,generation_qk_norm
#      -> $OUT/generation_cuda.md (Decoder.generate and Hugging Face generate, patched and not, in
#      tokens/s; and a Qwen3, whose QK-norm hf.patch fuses into rmsnorm_rotate, patched and not)
#   (steps 4 and 5 also print each suite's tables to the log as it ends: --progress)
#
# Environment:
#   OUT           where the outputs go (default ./out)
#   PYTHON        the interpreter (default python3)
#   TEST_BUDGET   seconds for step 2 (default 150)
#   BENCH_BUDGET  seconds for step 3 (default 270; its RoPE groups were timed on an H100 before)
#   BENCH_ARGS    extra arguments for step 3 (e.g. "--quick", "--no-compile", "--repeats 5")
#   FUSED_BUDGET  seconds for step 4 (default 120)
#   GEN_BUDGET    seconds for step 5 (default 210; 0 skips it)
#   GEN_LOGS      TORCH_LOGS for step 5 (default cudagraphs,perf_hints,recompiles; empty: none)
set -u

cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-./out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
TEST_BUDGET="${TEST_BUDGET:-150}"
BENCH_BUDGET="${BENCH_BUDGET:-270}"
BENCH_ARGS="${BENCH_ARGS:-}"
FUSED_BUDGET="${FUSED_BUDGET:-120}"
GEN_BUDGET="${GEN_BUDGET:-210}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
: > "$OUT/status.txt"
began=$SECONDS

# step NAME BUDGET COMMAND...: run COMMAND under `timeout BUDGET`, output to the console and to
# $OUT/NAME.log; print and record its exit status (124: it ran out of its budget)
step() {
    local name=$1 budget=$2
    shift 2
    echo
    echo "=== $name (budget ${budget} s): $*"
    local start=$SECONDS
    timeout --kill-after=15 "$budget" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    echo "$name exit=$rc seconds=$((SECONDS - start))" >> "$OUT/status.txt"
}

versions() {
    "$PY" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
except Exception as exc:
    print("torch: import failed:", type(exc).__name__, exc)
for module in ("triton", "transformers", "liger_kernel", "flash_attn", "flash_attn.ops.triton.rotary", "pytest", "hypothesis"):
    try:
        m = importlib.import_module(module)
        print(module, getattr(m, "__version__", "importable"))
    except Exception as exc:
        print(module, "not importable:", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
EOF
    local rc=$?
    nvidia-smi || echo "nvidia-smi failed (exit $?)"
    return $rc
}

cuda_tests() {
    if ! "$PY" -c "import pytest" 2>/dev/null; then
        echo "pytest is not installed for $PY: the CUDA tests cannot run (step 3 still runs the benchmark)"
        return 3
    fi
    # --continue-on-collection-errors: a test file that cannot be imported here (a package this
    # machine lacks) must not stop the CUDA tests of the others
    "$PY" -m pytest -q -m cuda -p no:cacheprovider --continue-on-collection-errors tests
}

export PY OUT
export -f versions cuda_tests
step versions 60 bash -c versions
step cuda_tests "$TEST_BUDGET" bash -c cuda_tests
# shellcheck disable=SC2086  # BENCH_ARGS holds several arguments
step bench "$BENCH_BUDGET" "$PY" -m rotary bench --device cuda --markdown --progress --suites none $BENCH_ARGS -o "$OUT/bench_cuda.md"
step fused "$FUSED_BUDGET" "$PY" -m rotary bench --device cuda --markdown --progress --shapes none --suites rotate_and_cache,rmsnorm_rotate \
    -o "$OUT/fused_cuda.md"
if [ "$GEN_BUDGET" != 0 ]; then
    # TORCH_LOGS: why `rotary static + compile` ran slower than eager on an H100 (CUDA graphs skipped or
    # recorded again, recompiles) lands in generation.log with the tables
    step generation "$GEN_BUDGET" env TORCH_LOGS="${GEN_LOGS-cudagraphs,perf_hints,recompiles}" "$PY" -m rotary bench --device cuda --markdown --progress --shapes none --suites generation,generation_qk_norm --repeats 2 \
        -o "$OUT/generation_cuda.md"
fi

echo
echo "=== summary after $((SECONDS - began)) s (outputs in $OUT)"
cat "$OUT/status.txt"
for table in bench_cuda fused_cuda generation_cuda; do
    if [ -s "$OUT/$table.md" ]; then
        echo
        echo "=== $OUT/$table.md"
        cat "$OUT/$table.md"
    fi
done

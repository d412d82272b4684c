#!/usr/bin/env bash
# Every GPU test and measurement of pipert on a fresh GPU machine, in one command:
#
#   bash benchmarks/gpu_all.sh [OUT_DIR]        (default benchmarks/results)
#
# 1. builds pipert._C with its CUDA part in place (falls back to the CPU part, then to none, and says so);
# 2. benchmarks/gpu_checks.py: delays, overlap, emulation, links, training exactness on the GPU,
#    pipert train over NCCL in one process, the local transport's stream ordering with a slow
#    producer, P=1 against a plain loop, host time per step, back-to-back message gaps;
# 3. the GPU tests (Triton kernels, streams, links, pinned buffers, stream ordering, syncs per step);
# 4. benchmarks/bench_chunked_mlp.py: the Triton chunked MLP against PyTorch.
# Each step has its own time limit; OUT_DIR/gpu_all.log holds the whole output, and the CSVs and
# reports of steps 2 and 4 land in OUT_DIR as each finishes. Outside a git checkout, set
# PIPERT_SOURCE_COMMIT to the commit the tree was copied from. GPU_STEPS picks steps 2-4
# (default "checks tests mlp"; the build always runs).
set -u
out=${1:-benchmarks/results}
mkdir -p "$out"
log="$out/gpu_all.log"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
steps=" ${GPU_STEPS:-checks tests mlp} "
step() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
want() { [[ "$steps" == *" $1 "* ]]; }

step "machine"
{ nvidia-smi -L; nvcc --version | tail -1; "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } >>"$log" 2>&1

step "build pipert._C (CUDA) in place"
# In place, not through pip: a GPU machine may have no package index for pip's build requirements.
if ! PIPERT_CUDA=1 timeout 300 "$py" setup.py -q build_ext --inplace >>"$log" 2>&1; then
  step "CUDA build failed; building the CPU part only"
  PIPERT_CUDA=0 timeout 200 "$py" setup.py -q build_ext --inplace >>"$log" 2>&1 || step "no pipert._C"
fi
[ -e pipert/kernels ] || ln -s ../kernels pipert/kernels  # the package_dir mapping of setup.py, in place
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c "from pipert import _ext; print('pipert._C', _ext.HAVE_EXT, 'CUDA', _ext.HAVE_EXT_CUDA)" 2>&1 | tee -a "$log"

want checks && step "gpu_checks" &&
timeout 480 "$py" benchmarks/gpu_checks.py --out "$out" 2>&1 | tee -a "$log"

want tests && step "GPU tests" &&
timeout 300 "$py" -m pytest -q -p no:cacheprovider tests/kernels tests/unit/test_streams.py \
  tests/unit/test_links.py tests/unit/test_pinned.py tests/unit/test_linkframes.py \
  tests/unit/test_bench_overlap.py tests/unit/test_gpu_checks_plan.py tests/unit/test_local_order.py \
  tests/unit/test_linkframes_cuda.py tests/unit/test_gpu_syncs.py tests/unit/test_stream_chain.py \
  tests/unit/test_cpp_core.py -rfE --tb=short 2>&1 | tee -a "$log" | tail -25

want mlp && step "chunked MLP benchmark" &&
timeout 240 "$py" benchmarks/bench_chunked_mlp.py --out-dir "$out" 2>&1 | tee -a "$log" | tail -40
step "done"

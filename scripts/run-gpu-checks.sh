#!/usr/bin/env bash
# The GPU checks of docs/gpu.md in one run, for a machine with an NVIDIA GPU,
# nvcc, CMake, ninja and PyTorch (a CUDA wheel) but possibly no package
# registry. CI never runs this (it has no GPU); on a machine without a GPU
# every GPU test skips.
#
#   scripts/run-gpu-checks.sh [--debs DIR] [--out DIR] [--skip STEP,...]
#
# --debs DIR   Debian packages to unpack (dpkg -x) into a private prefix when
#              the machine lacks them: libgloo0, libgloo-dev, libhiredis0.14,
#              libhiredis-dev, libibverbs1, libibverbs-dev, libnl-3-200,
#              libnl-route-3-200, libgtest-dev, libgmock-dev, googletest.
#              Fetch them on a Debian 12 machine with `apt-get download ...`.
# --out DIR    where the logs go (default gpu-checks-out/)
# --skip LIST  steps to leave out: codecs, baseline, profile, python, staging, ddp
#
# Steps (each bounded by a timeout; a failing step is reported and the next
# one runs; the exit status is that of the first failure):
#   build     compcoll_gpu_tests, the interposer and the NCCL app (Release,
#             sm_90 unless CMAKE_CUDA_ARCHITECTURES is set), against the
#             NCCL of torch's wheel (nvidia/nccl) unless NCCL_HOME is set;
#             no NCCL library there fails it (the interposer's tests and
#             the ddp step need one)
#   codecs    compcoll_gpu_logic_tests (the GPU route's host logic), then
#             compcoll_gpu_tests: GpuCodecs.* (kernels against the CPU
#             codecs, bit for bit; the dgc encode throughput) and
#             GpuInterposer.* (the interposer over the real NCCL). A GPU
#             test skips where no device is usable (an old driver, say):
#             here any skipped test, or no GpuInterposer test, fails the
#             step, so that a run that tested nothing does not pass
#   baseline  integration/bench/gpu/topk_dgc_baseline.py (torch.topk DGC)
#   profile   ncu --set basic over the throughput test's encodes: each
#             kernel's time against the encode's wall time
#   python    the compcoll wheel built against this machine's torch, then
#             the GPU tests of tests/python/test_device_lane.py
#   staging   integration/bench/gpu/staging_cost.py with that wheel: what
#             host staging costs a cuda-lane allreduce against NCCL's own
#   ddp       integration/bench/gpu/ddp_step_time.py with that wheel and the
#             interposer: an unmodified DDP step on NCCL, with the interposer
#             (GPU codecs and staged) and on the cuda lane
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEBS=""
OUT_DIR=gpu-checks-out
SKIP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) DEBS=${2:?--debs needs a directory}; shift 2 ;;
    --out) OUT_DIR=${2:?--out needs a directory}; shift 2 ;;
    --skip) SKIP=${2:?--skip needs a list}; shift 2 ;;
    -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-gpu-checks: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
BUILD=${BUILD_DIR:-build-gpu}
PY=${PYTHON:-python3}
export BUILD PY OUT_DIR  # read by the steps, which run in child shells
status=0
skipped() { [[ ",$SKIP," == *",$1,"* ]]; }
step() {  # step NAME TIMEOUT_S COMMAND...: runs it, logs to OUT_DIR/NAME.log
  local name=$1 limit=$2; shift 2
  if skipped "$name"; then echo "run-gpu-checks: $name skipped"; return 0; fi
  local t0=$SECONDS
  echo "run-gpu-checks: === $name (limit ${limit} s)"
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT_DIR/$name.log"
  echo "run-gpu-checks: $name rc=$rc in $(( SECONDS - t0 )) s"
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then status=$rc; fi
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT_DIR/gpu.txt"

# Dependencies missing here, unpacked into a prefix of our own.
if [ -n "$DEBS" ]; then
  PREFIX=/tmp/compcoll-gpu-deps
  mkdir -p "$PREFIX"
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
  # Debian's Gloo package names its library by absolute path (/usr/lib/...).
  sed -i "s#\"/usr/lib/#\"$PREFIX/usr/lib/#g" "$PREFIX"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  export CMAKE_PREFIX_PATH=$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$PREFIX/usr/lib:$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export CPATH=$PREFIX/usr/include${CPATH:+:$CPATH}
fi
# NCCL: the one torch loads, so the interposer tests run against it.
if [ -z "${NCCL_HOME:-}" ]; then
  NCCL_HOME=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  export NCCL_HOME
fi
echo "run-gpu-checks: NCCL_HOME=${NCCL_HOME:-none}"
[ -n "${NCCL_HOME:-}" ] && export LD_LIBRARY_PATH=$NCCL_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# A plain system g++ for the host side: some images' default compiler links
# libstdc++ statically into shared objects (docs/gpu.md).
[ -x /usr/bin/g++ ] && export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++

# The interposer's GPU test links its NCCL program against this NCCL too
# (left to itself, CMake may find another libnccl.so.2 in the system's
# library directories first).
REAL_NCCL=""
[ -n "${NCCL_HOME:-}" ] && [ -e "$NCCL_HOME/lib/libnccl.so.2" ] && REAL_NCCL=$NCCL_HOME/lib/libnccl.so.2
export REAL_NCCL
build() {
  [ -n "$REAL_NCCL" ] || { echo "no libnccl.so.2 under NCCL_HOME=${NCCL_HOME:-} (torch's nvidia-nccl wheel, or set NCCL_HOME)"; return 1; }
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMPCOLL_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" \
    ${REAL_NCCL:+-DCOMPCOLL_REAL_NCCL_LIBRARY="$REAL_NCCL"} &&
  ninja -C "$BUILD" compcoll_gpu_tests compcoll_gpu_logic_tests
}
export -f build
step build 300 build || { echo "run-gpu-checks: the build failed; nothing else can run" >&2; exit 1; }

codecs() {
  "$BUILD/tests/gpu/compcoll_gpu_logic_tests" --gtest_output="xml:$OUT_DIR/gpu_logic_tests.xml" || return 1
  "$BUILD/tests/gpu/compcoll_gpu_tests" --gtest_output="xml:$OUT_DIR/gpu_tests.xml" || return 1
  local skipped
  skipped=$(grep -c 'result="skipped"' "$OUT_DIR/gpu_tests.xml")
  if [ "$skipped" -gt 0 ]; then
    echo "run-gpu-checks: $skipped GPU tests skipped (no usable device?); on a GPU machine that is a failure"
    return 1
  fi
  grep -q 'classname="GpuInterposer"' "$OUT_DIR/gpu_tests.xml" ||
    { echo "run-gpu-checks: no GpuInterposer test was built (the real NCCL or CUDA's driver library was not found)"; return 1; }
}
export -f codecs
step codecs 240 codecs
step baseline 60 "$PY" integration/bench/gpu/topk_dgc_baseline.py

# Each kernel's time inside the throughput test's encodes. --launch-skip
# passes the warm-up encode; --launch-count bounds the replays.
profile() {
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
  [ -n "$ncu" ] || { echo "ncu not found"; return 1; }
  "$ncu" --set basic --launch-skip 20 --launch-count 80 --print-summary per-kernel \
    "$BUILD/tests/gpu/compcoll_gpu_tests" --gtest_filter='*Throughput*'
}
export -f profile
step profile 150 profile

python_lane() {
  local site=/tmp/compcoll-site
  rm -rf "$site" build-python
  "$PY" -m pip install --no-build-isolation --no-deps --no-index --target "$site" . &&
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} "$PY" -m pytest -q tests/python/test_device_lane.py -k cuda
}
export -f python_lane
step python 300 python_lane

# What host staging costs a call on the cuda lane (needs the python step's wheel).
staging() {
  PYTHONPATH=/tmp/compcoll-site${PYTHONPATH:+:$PYTHONPATH} "$PY" integration/bench/gpu/staging_cost.py
}
export -f staging
step staging 300 staging

# An unmodified DDP step with each path (needs the python step's wheel).
ddp() {
  PYTHONPATH=/tmp/compcoll-site${PYTHONPATH:+:$PYTHONPATH} "$PY" integration/bench/gpu/ddp_step_time.py \
    --interposer "$BUILD/plugin/nccl_interposer/libcompcoll_nccl.so"
}
export -f ddp
step ddp 300 ddp
echo "run-gpu-checks: done, status $status (logs in $OUT_DIR)"
exit $status

#!/usr/bin/env bash
# Builds and runs the test suite under sanitizers. Must be clean.
#
#   scripts/run-sanitizers.sh [asan|tsan|python|all]      (default: all)
#
# 1. build-asan: the whole project and test suite with AddressSanitizer +
#    UndefinedBehaviorSanitizer (-fno-sanitize-recover=undefined, so UB fails
#    the test that hits it; LeakSanitizer on), then the whole ctest suite,
#    except the tests listed in run_asan below (each with its reason).
# 2. build-tsan: only the test binaries whose ranks are THREADS of one
#    process, built with ThreadSanitizer, and their tests (collectives,
#    transport, plugin communicator, reliability concurrency; see run_tsan):
#    TSan watches the threads of one process, so the tests whose ranks are
#    separate processes (multiprocess, reliability.FaultsAtScale) run under
#    ASan only.
# 3. build-python-san: the PyTorch extension (compcoll._C) built with
#    AddressSanitizer + UndefinedBehaviorSanitizer (setup.py honours
#    COMPCOLL_SANITIZE), installed into build-python-san/site, and the pytest
#    suite but its end-to-end jobs (-m 'not end_to_end': the examples, the
#    convergence suite, launchers, the wheel install, the long accuracy run;
#    tests/python/conftest.py says why) run against it (PYTHONPATH puts it before the regular
#    install; every rank process inherits it). Python and torch are not
#    instrumented, so the ASan runtime is preloaded (LD_PRELOAD) and leak
#    detection is off: the interpreter and torch keep allocations alive
#    until exit by design, which LeakSanitizer would report by the
#    thousand; compcoll's own code has its leak check in step 1.
#
# Third-party code is not instrumented (Debian's libgloo, libgtest); the only
# suppressions are for it, in .sanitizers/*.supp, each with its reason.
#
# Environment:
#   SAN_CXX / SAN_CC   compiler (default g++/gcc, the project's compiler:
#                      clang 14 cannot build the test suite, which captures
#                      structured bindings in lambdas, a C++20 feature that
#                      arrived in clang 16)
#   JOBS               build and ctest parallelism (default 2)
#   SAN_QUICK=1        also skip the remaining large cases under ASan (see
#                      run_asan)
#
# What CI runs (scripts/run-tests.sh -> "all") must fit its 90 minutes on
# two cores with the Release suite, pytest and the fuzzers: every exclusion
# below names the run that still covers what it leaves out.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# python3 is the project venv's (scripts/python-env.sh) once install-deps made it.
source scripts/python-env.sh
compcoll_venv_ok && compcoll_use_venv
MODE=${1:-all}
JOBS=${JOBS:-2}
case "$MODE" in asan|tsan|python|all) ;; *) echo "usage: $0 [asan|tsan|python|all]" >&2; exit 2 ;; esac

SAN_CXX=${SAN_CXX:-g++}
SAN_CC=${SAN_CC:-gcc}
echo "run-sanitizers: compiler $SAN_CXX ($("$SAN_CXX" --version | head -1))"

SUPP=$ROOT/.sanitizers
start_all=$(date +%s)

# Debug (assertions on) at -O1: fast enough for the multi-rank tests. -g1:
# line tables only, which is all a sanitizer report's stack needs (file and
# line of every frame) and compiles a fifth faster than -g; rebuild with -g
# for a debugger session. Sanitizer flags go to C and C++ and to every link.
# Targets after the flags: build only those (default: everything).
configure_and_build() {  # dir, sanitizer flags, [targets...]
  local dir=$1 flags=$2
  shift 2
  # A cache made with another compiler cannot be reconfigured: start over.
  if [ -f "$dir/CMakeCache.txt" ] &&
     ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$(command -v "$SAN_CXX")" "$dir/CMakeCache.txt" &&
     ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$SAN_CXX" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"
  fi
  cmake -S . -B "$dir" -G Ninja \
    -DCMAKE_C_COMPILER="$SAN_CC" -DCMAKE_CXX_COMPILER="$SAN_CXX" \
    -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
    >/dev/null || return 1
  # gtest_discover_tests lists each test binary right after linking it, so
  # the build itself already runs every binary once under the sanitizer.
  ninja -C "$dir" -j "$JOBS" "$@" || return 1
}

run_asan() {
  local t0 flags dir=build-asan
  t0=$(date +%s)
  flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=0:abort_on_error=0:halt_on_error=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:report_error_type=1:suppressions=$SUPP/ubsan.supp"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  configure_and_build "$dir" "$flags" || { echo "run-sanitizers: asan build FAILED"; return 1; }
  local build_s=$(( $(date +%s) - t0 ))

  # Excluded under ASan, with the reason:
  #  - install.ConsumerBuildsAndRunsAgainstTheInstalledTree: it builds
  #    outside consumers with the system's plain cc/c++ against the installed
  #    (here sanitized) libcompcoll.so; a non-sanitized executable cannot load
  #    a library that needs the ASan runtime. The library itself runs in every
  #    other test.
  #  - the collectives' 1,048,579-element cases at every world size but 4
  #    (_w1/2/3/7/8_n1048579): ~15-20 s each here, 35 of them. World 4 keeps
  #    the large-tensor paths of every algorithm under ASan; the 0/1/5/1000-
  #    element cases keep every world size; the Release suite runs them all.
  local exclude='^install\.ConsumerBuildsAndRunsAgainstTheInstalledTree$'
  exclude="$exclude|_w[12378]_n1048579( |$)"
  # SAN_QUICK=1: world 4's large cases too.
  if [ "${SAN_QUICK:-0}" = 1 ]; then exclude="$exclude|_n1048579( |$)"; fi
  local t1 rc=0
  t1=$(date +%s)
  ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$JOBS" -E "$exclude" || rc=$?
  echo "run-sanitizers: asan+ubsan build ${build_s} s, tests $(( $(date +%s) - t1 )) s, rc $rc"
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
  return $rc
}

run_tsan() {
  local t0 flags dir=build-tsan
  t0=$(date +%s)
  flags="-fsanitize=thread -fno-omit-frame-pointer"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4:suppressions=$SUPP/tsan.supp"
  # Only the binaries run below (their peer and rank helpers come along as
  # dependencies): the rest of the tree would take half the build for
  # nothing TSan runs.
  configure_and_build "$dir" "$flags" compcoll_collectives_tests compcoll_transport_tests \
    compcoll_plugin_tests compcoll_reliability_tests compcoll_unit_tests \
    compcoll_thread_collectives_tests ||
    { echo "run-sanitizers: tsan build FAILED"; return 1; }
  local build_s=$(( $(date +%s) - t0 ))

  # Ranks as threads, chosen by the test binary (ctest's JSON listing):
  #   compcoll_collectives_tests   every algorithm over the thread harness
  #   compcoll_transport_tests     GlooComm over threads; faults (a rank
  #                                leaving, a hung peer, bad options; the few
  #                                that spawn peer processes are instrumented
  #                                too and cost seconds)
  #   compcoll_plugin_tests        plugin.Communicator.* (the rest is
  #                                single-threaded configuration parsing)
  #   compcoll_reliability_tests   reliability.Concurrency.* (two
  #                                communicators driven from two threads; the
  #                                8-process fault test adds nothing here)
  #   compcoll_unit_tests          DgcThreads.* (dgc's encode pass over
  #                                threads, COMPCOLL_CODEC_THREADS; the rest
  #                                is single-threaded codec arithmetic)
  #   compcoll_thread_collectives_tests  every algorithm over the in-memory
  #                                Comm (tests/support/thread_comm.h)
  # Left out under TSan:
  #  - the collectives cases of 1,048,579 elements (_n1048579): ~20-30 s
  #    each under TSan, 40 of them; the 0/1/5/1000-element cases run the same
  #    code paths at every world size (1, 2, 3, 4, 7, 8); the Release suite
  #    runs them all, ASan world 4's;
  #  - the 200-step ErrorFeedbackTest (4 ranks x 409,600 elements): 90-140 s
  #    each under TSan, 7 of them, three quarters of the whole TSan run. Its
  #    200 calls repeat one call's thread interplay, and the Release and
  #    ASan suites run it; NonFiniteTest (every
  #    algorithm and pattern, state carried across calls), the transport's
  #    back-to-back calls and reliability.Concurrency keep multi-call runs
  #    under TSan.
  local numbers
  numbers=$(ctest --test-dir "$dir" --show-only=json-v1 | python3 -c '
import json, re, sys
keep = {"compcoll_collectives_tests": "", "compcoll_transport_tests": "",
        "compcoll_plugin_tests": "plugin.Communicator.",
        "compcoll_reliability_tests": "reliability.Concurrency.",
        "compcoll_unit_tests": "DgcThreads.",
        "compcoll_thread_collectives_tests": ""}
picked = []
for number, test in enumerate(json.load(sys.stdin)["tests"], 1):
    exe = test.get("command", [""])[0].rsplit("/", 1)[-1]
    name = test["name"]
    if exe not in keep or not name.startswith(keep[exe]):
        continue
    if re.search(r"_n1048579( |$)", name):  # names end in "  # GetParam() = ..."
        continue
    if "ErrorFeedbackTest." in name:
        continue
    picked.append(str(number))
print(",".join(picked))') || return 1
  [ -n "$numbers" ] || { echo "run-sanitizers: no multi-rank tests found in $dir"; return 1; }
  echo "run-sanitizers: tsan runs $(echo "$numbers" | tr ',' '\n' | wc -l) tests"
  local t1 rc=0
  t1=$(date +%s)
  ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$JOBS" -I "0,0,0,$numbers" || rc=$?
  echo "run-sanitizers: tsan build ${build_s} s, tests $(( $(date +%s) - t1 )) s, rc $rc"
  unset TSAN_OPTIONS
  return $rc
}

run_python() {
  local t0 dir=$ROOT/build-python-san rc=0
  t0=$(date +%s)
  rm -rf "$dir/site"
  # --target: a private install next to (not over) the regular one;
  # --no-deps: torch is the installed one.
  COMPCOLL_SANITIZE=address,undefined python3 -m pip install -q --root-user-action=ignore \
    --no-build-isolation --no-deps --target "$dir/site" ./ ||
    { echo "run-sanitizers: sanitized PyTorch extension build FAILED"; return 1; }
  local build_s=$(( $(date +%s) - t0 ))
  local asan_rt py
  # libstdc++ is preloaded right after the ASan runtime: python does not
  # link it, and ASan resolves its C++ exception interceptor (__cxa_throw)
  # when it starts; without libstdc++ loaded by then, the first exception
  # thrown in the extension stops the process with "CHECK failed ...
  # real___cxa_throw".
  asan_rt="$("$SAN_CXX" -print-file-name=libasan.so):$("$SAN_CXX" -print-file-name=libstdc++.so.6)"
  # The interpreter itself, not a wrapper script (pyenv's python3 is a bash
  # shim, which must not run with the ASan runtime preloaded).
  py=$(python3 -c 'import sys; print(sys.executable)')
  export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:report_error_type=1:suppressions=$SUPP/ubsan.supp"
  # The extension must be the one under test, not the regular install.
  PYTHONPATH="$dir/site" LD_PRELOAD="$asan_rt" "$py" - <<'PY' || return 1
import compcoll._C as c, sys
path = c.__file__
assert "build-python-san" in path, f"the sanitized extension is not the one imported: {path}"
assert "libasan" in open("/proc/self/maps").read(), "ASan runtime not loaded"
print("run-sanitizers: python imports", path)
PY
  local t1
  t1=$(date +%s)
  PYTHONPATH="$dir/site" LD_PRELOAD="$asan_rt" "$py" -m pytest -q -m "not end_to_end" tests/python ||
    rc=$?
  echo "run-sanitizers: python (asan+ubsan extension) build ${build_s} s, tests $(( $(date +%s) - t1 )) s, rc $rc"
  unset ASAN_OPTIONS UBSAN_OPTIONS
  return $rc
}

status=0
if [ "$MODE" = asan ] || [ "$MODE" = all ]; then run_asan || status=1; fi
if [ "$MODE" = tsan ] || [ "$MODE" = all ]; then run_tsan || status=1; fi
if [ "$MODE" = python ] || [ "$MODE" = all ]; then run_python || status=1; fi
echo "run-sanitizers: total $(( $(date +%s) - start_all )) s, $( [ $status = 0 ] && echo clean || echo FAILED )"
exit $status

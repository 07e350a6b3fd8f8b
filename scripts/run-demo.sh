#!/usr/bin/env bash
# README's main command: installs what is missing, builds, and prints the
# benchmark tables on a ResNet-50-sized gradient (25,557,032 float32):
#   1. every codec on one thread against memcpy of the same buffer;
#   2. dense vs every algorithm across 4 local ranks (processes) on loopback.
# Extra arguments go to the allreduce benchmark (e.g. --link 1gbit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# The venv's python3 for --plot (the benchmark runs `python3` for it).
source scripts/python-env.sh
compcoll_use_venv
bash scripts/build.sh
BENCH=${BUILD_DIR:-build}/integration/bench/compcoll-bench
COUNT=25557032
"$BENCH" codec --count "$COUNT"
echo
"$BENCH" codec --count "$COUNT" --algo dgc --momentum 0.9
echo
"$BENCH" allreduce --ranks 4 --count "$COUNT" --algo dense,dgc,sbc,sdagc,csc,onebit --iters 5 "$@"
# On loopback the ranks share this machine's cores and memory, and a dense
# ring moves its bytes at memory speed, so the table above says little about
# a network. Point a new user at the case compression is for.
case " $* " in
  *" --link "*|*" --link="*) ;;
  *) echo
     echo "# loopback: every rank on this machine, where moving bytes costs about as much as"
     echo "# compressing them; across a network the dense ring is bound by the link. The same table"
     echo "# over links shaped to 1 Gbit/s (network namespaces, needs root):"
     echo "#   bash scripts/run-demo.sh --link 1gbit      (README, \"Measured\"; docs/networks.md)" ;;
esac

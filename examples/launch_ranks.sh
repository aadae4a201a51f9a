#!/usr/bin/env bash
# The smallest launcher: starts N copies of a program on this machine as the ranks of one
# data-parallel job, each with RANK, WORLD_SIZE and LOCAL_RANK set (rank k on cuda:k), the way
# torchrun or a cluster scheduler does. Waits for every rank; exits non-zero if any failed.
#
#   examples/launch_ranks.sh N PROGRAM [ARGS...]
#   examples/launch_ranks.sh 2 target/release/examples/multi_gpu
set -u
if [ $# -lt 2 ] || ! [ "$1" -ge 1 ] 2>/dev/null; then
  echo "usage: $0 N PROGRAM [ARGS...]   (N ranks, one a GPU, on this machine)" >&2
  exit 2
fi
n=$1
shift
pids=()
for ((k = 0; k < n; k++)); do
  RANK=$k WORLD_SIZE=$n LOCAL_RANK=$k "$@" &
  pids+=($!)
done
failed=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}" || { echo "rank $k failed" >&2; failed=1; }
done
exit $failed

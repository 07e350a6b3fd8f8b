/* C consumer: allreduce of 100000 floats with the configured algorithm and
 * of 10 ints (dense), checked, then stats. Usage: consumer_c RENDEZVOUS RANK WORLD */
#include <compcoll/compcoll.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s RENDEZVOUS RANK WORLD\n", argv[0]);
    return 2;
  }
  const int rank = atoi(argv[2]), world = atoi(argv[3]);
  compcoll_comm_t* comm = NULL;
  compcoll_status_t s = compcoll_comm_create(argv[1], rank, world, &comm);
  if (s != COMPCOLL_SUCCESS) {
    fprintf(stderr, "create: %s: %s\n", compcoll_status_string(s), compcoll_last_error());
    return 1;
  }
  enum { N = 100000 };
  static float x[N];
  for (int i = 0; i < N; ++i) x[i] = (float)((i * 7 + rank) % 13) - 6.0f;
  s = compcoll_allreduce(comm, x, N, COMPCOLL_FLOAT32, COMPCOLL_SUM, "grad");
  if (s != COMPCOLL_SUCCESS) {
    fprintf(stderr, "allreduce: %s\n", compcoll_last_error());
    return 1;
  }
  int ints[10];
  for (int i = 0; i < 10; ++i) ints[i] = rank + i;
  s = compcoll_allreduce(comm, ints, 10, COMPCOLL_INT32, COMPCOLL_SUM, NULL);
  for (int i = 0; i < 10; ++i) {
    if (ints[i] != world * i + world * (world - 1) / 2) {
      fprintf(stderr, "int sum wrong at %d: %d\n", i, ints[i]);
      return 1;
    }
  }
  /* A bad dtype is refused with a status, not a crash. */
  if (compcoll_allreduce(comm, ints, 10, (compcoll_dtype_t)99, COMPCOLL_SUM, NULL) !=
      COMPCOLL_INVALID_ARGUMENT) {
    fprintf(stderr, "bad dtype accepted\n");
    return 1;
  }
  compcoll_stats_t st;
  compcoll_get_stats(comm, &st);
  printf("rank %d: calls %llu compressed %llu wire %llu dense %llu ratio %.1f\n", rank,
         (unsigned long long)st.calls, (unsigned long long)st.compressed_calls,
         (unsigned long long)st.wire_bytes, (unsigned long long)st.dense_bytes, st.ratio);
  compcoll_steady_stats_t steady;
  if (compcoll_get_steady_stats(comm, &steady) != COMPCOLL_SUCCESS ||
      steady.steady_calls > st.calls || steady.warmup_dense_calls > st.calls ||
      steady.steady_wire_bytes > st.wire_bytes || steady.steady_dense_bytes > st.dense_bytes ||
      (steady.steady_wire_bytes == 0) != (steady.steady_ratio == 0.0)) {
    fprintf(stderr, "steady stats inconsistent with the totals\n");
    return 1;
  }
  printf("rank %d: steady calls %llu ratio %.1f, warm-up dense calls %llu\n", rank,
         (unsigned long long)steady.steady_calls, steady.steady_ratio,
         (unsigned long long)steady.warmup_dense_calls);
  if (compcoll_get_steady_stats(comm, NULL) != COMPCOLL_INVALID_ARGUMENT) {
    fprintf(stderr, "a null stats pointer was accepted\n");
    return 1;
  }
  return compcoll_comm_destroy(comm) == COMPCOLL_SUCCESS ? 0 : 1;
}

/* A C program on the public API that creates two one-rank communicators in
 * turn (rendezvous file://ARGV1/a and file://ARGV1/b), one allreduce each,
 * and destroys them. The unknown-variable test runs it with a misspelt
 * COMPCOLL_* name and reads its stderr: one WARN per process, not one per
 * communicator. Exit 0 on success, 1 with the error on stderr.
 * `two_comms_app DIR alone` instead creates rank 0 of a 2-rank communicator
 * that no other rank joins: its rendezvous must time out (COMPCOLL_TIMEOUT_MS)
 * with the error on stderr, exit 1. */
#include <stdio.h>
#include <string.h>

#include "compcoll/compcoll.h"

static int one_comm(const char* dir, const char* sub, int world_size) {
  char rendezvous[4096];
  snprintf(rendezvous, sizeof rendezvous, "file://%s/%s", dir, sub);
  compcoll_comm_t* comm = NULL;
  compcoll_status_t s = compcoll_comm_create(rendezvous, 0, world_size, &comm);
  if (s != COMPCOLL_SUCCESS) {
    fprintf(stderr, "two_comms_app: create: %s\n", compcoll_last_error());
    return 1;
  }
  float x[4] = {1, 2, 3, 4};
  s = compcoll_allreduce(comm, x, 4, COMPCOLL_FLOAT32, COMPCOLL_SUM, NULL);
  if (s != COMPCOLL_SUCCESS) {
    fprintf(stderr, "two_comms_app: allreduce: %s\n", compcoll_last_error());
    compcoll_comm_destroy(comm);
    return 1;
  }
  return compcoll_comm_destroy(comm) == COMPCOLL_SUCCESS ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[2], "alone") == 0) return one_comm(argv[1], "alone", 2);
  if (argc != 2) {
    fprintf(stderr, "usage: two_comms_app DIR [alone]\n");
    return 2;
  }
  if (one_comm(argv[1], "a", 1) != 0 || one_comm(argv[1], "b", 1) != 0) return 1;
  printf("ok\n");
  return 0;
}

/* A C program on the public API that creates two one-rank communicators in
 * turn (rendezvous file://ARGV1/a and file://ARGV1/b), one allreduce each,
 * and destroys them. The unknown-variable test runs it with a misspelt
 * COMPCOLL_* name and reads its stderr: one WARN per process, not one per
 * communicator. Exit 0 on success, 1 with the error on stderr.
 * `two_comms_app DIR alone` instead creates rank 0 of a 2-rank communicator
 * that no other rank joins: its rendezvous must time out (COMPCOLL_TIMEOUT_MS)
 * with the error on stderr, exit 1.
 * `two_comms_app DIR kept` creates one one-rank communicator, makes one
 * allreduce, then forks a child that makes a communicator of its own and
 * exit()s, waits for it, and returns from main without destroying the
 * communicator: the exit hooks must write COMPCOLL_STATS_FILE (calls 2: one
 * before the fork, one after) in this process only, and the child's own
 * (DIR/child-stats.json) in the child. It prints "child left no stats file"
 * when the file was absent after the child's exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

static int kept_comm(const char* dir) {
  char rendezvous[4096];
  snprintf(rendezvous, sizeof rendezvous, "file://%s/kept", dir);
  compcoll_comm_t* comm = NULL;
  float x[4] = {1, 2, 3, 4};
  if (compcoll_comm_create(rendezvous, 0, 1, &comm) != COMPCOLL_SUCCESS ||
      compcoll_allreduce(comm, x, 4, COMPCOLL_FLOAT32, COMPCOLL_SUM, NULL) != COMPCOLL_SUCCESS) {
    fprintf(stderr, "two_comms_app: %s\n", compcoll_last_error());
    return 1;
  }
  const pid_t child = fork();
  if (child == 0) {
    /* A communicator of the child's own, alive at its exit(): its stats
     * are written (by the child's exit hook), its parent's are not. */
    char child_rendezvous[4096], child_stats[4096];
    compcoll_comm_t* own = NULL;
    snprintf(child_rendezvous, sizeof child_rendezvous, "file://%s/child", dir);
    snprintf(child_stats, sizeof child_stats, "%s/child-stats.json", dir);
    setenv("COMPCOLL_STATS_FILE", child_stats, 1);
    if (compcoll_comm_create(child_rendezvous, 0, 1, &own) != COMPCOLL_SUCCESS ||
        compcoll_allreduce(own, x, 4, COMPCOLL_FLOAT32, COMPCOLL_SUM, NULL) != COMPCOLL_SUCCESS) {
      exit(3);
    }
    exit(0); /* runs the exit hooks, in another process */
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return 1;
  }
  const char* stats = getenv("COMPCOLL_STATS_FILE");
  struct stat st;
  if (stats != NULL && stat(stats, &st) != 0) printf("child left no stats file\n");
  if (compcoll_allreduce(comm, x, 4, COMPCOLL_FLOAT32, COMPCOLL_SUM, NULL) != COMPCOLL_SUCCESS) {
    fprintf(stderr, "two_comms_app: %s\n", compcoll_last_error());
    return 1;
  }
  return 0; /* no compcoll_comm_destroy: the exit hook writes the stats */
}

/* `two_comms_app DIR late-destroy`: a communicator destroyed by a handler
 * that runs after compcoll's exit hook (registered before the first create,
 * as a static object's destructor is): the destroy must succeed, and prints
 * "late destroy: success". */
static compcoll_comm_t* g_late = NULL;

static void destroy_late(void) {
  const compcoll_status_t s = compcoll_comm_destroy(g_late);
  printf("late destroy: %s%s%s\n", compcoll_status_string(s), s ? " " : "",
         s ? compcoll_last_error() : "");
  fflush(stdout);
}

static int late_destroy(const char* dir) {
  char rendezvous[4096];
  snprintf(rendezvous, sizeof rendezvous, "file://%s/late", dir);
  atexit(destroy_late);
  if (compcoll_comm_create(rendezvous, 0, 1, &g_late) != COMPCOLL_SUCCESS) {
    fprintf(stderr, "%s\n", compcoll_last_error());
    return 1;
  }
  float x[4] = {1, 2, 3, 4};
  if (compcoll_allreduce(g_late, x, 4, COMPCOLL_FLOAT32, COMPCOLL_SUM, "x") != COMPCOLL_SUCCESS) {
    fprintf(stderr, "%s\n", compcoll_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[2], "late-destroy") == 0) return late_destroy(argv[1]);
  if (argc == 3 && strcmp(argv[2], "alone") == 0) return one_comm(argv[1], "alone", 2);
  if (argc == 3 && strcmp(argv[2], "kept") == 0) return kept_comm(argv[1]);
  if (argc != 2) {
    fprintf(stderr, "usage: two_comms_app DIR [alone|kept|late-destroy]\n");
    return 2;
  }
  if (one_comm(argv[1], "a", 1) != 0 || one_comm(argv[1], "b", 1) != 0) return 1;
  printf("ok\n");
  return 0;
}

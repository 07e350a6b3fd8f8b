/* compcoll public C API.
 *
 * A communicator compresses the allreduces it is given according to the
 * COMPCOLL_* configuration (see compcoll-info): float32/float16/bfloat16
 * SUM/AVG tensors of at least COMPCOLL_MIN_ELEMS elements go through the
 * configured algorithm (dgc, sbc, sdagc, csc, onebit), everything else
 * through the exact dense allreduce.
 *
 * Every function returns a status; nothing throws across this boundary.
 * After a failure, compcoll_last_error() (per thread) says what happened.
 * A communicator that failed in a collective refuses further calls and
 * must be destroyed and created again.
 *
 * A communicator's calls are collective: every rank makes them in the same
 * order, one at a time. A call made from another thread while one is
 * running on the same communicator fails at once with
 * COMPCOLL_INVALID_ARGUMENT and touches nothing (the running call goes on);
 * give each thread a communicator of its own instead. The stats getters are
 * the exception: any thread may call them at any time, and they answer as
 * of the last finished call.
 */
#ifndef COMPCOLL_COMPCOLL_H_
#define COMPCOLL_COMPCOLL_H_

#include <stddef.h>
#include <stdint.h>

#if defined(COMPCOLL_BUILDING_LIBRARY)
#define COMPCOLL_API __attribute__((visibility("default")))
#else
#define COMPCOLL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define COMPCOLL_VERSION_MAJOR 0
#define COMPCOLL_VERSION_MINOR 1

typedef enum {
  COMPCOLL_SUCCESS = 0,
  COMPCOLL_INVALID_ARGUMENT = 1, /* bad configuration or arguments */
  COMPCOLL_MALFORMED_PAYLOAD = 2, /* a peer sent bytes that do not decode */
  COMPCOLL_TRANSPORT_ERROR = 3,  /* dead peer, broken socket, timeout */
  COMPCOLL_MISMATCH = 4,         /* ranks disagree on configuration */
  COMPCOLL_UNSUPPORTED = 5,      /* not available on this build/machine */
  COMPCOLL_INTERNAL_ERROR = 6
} compcoll_status_t;

typedef enum {
  COMPCOLL_FLOAT32 = 0,
  COMPCOLL_FLOAT16 = 1,
  COMPCOLL_BFLOAT16 = 2,
  COMPCOLL_FLOAT64 = 3,
  COMPCOLL_INT32 = 4,
  COMPCOLL_INT64 = 5,
  COMPCOLL_UINT8 = 6,
  COMPCOLL_INT8 = 7
} compcoll_dtype_t;

typedef enum {
  COMPCOLL_SUM = 0,
  COMPCOLL_AVG = 1,
  COMPCOLL_MIN = 2,
  COMPCOLL_MAX = 3,
  COMPCOLL_PROD = 4
} compcoll_op_t;

typedef struct compcoll_comm compcoll_comm_t;

typedef struct {
  uint64_t calls;
  uint64_t compressed_calls;
  uint64_t dense_bytes; /* what a dense ring allreduce would have sent */
  uint64_t wire_bytes;  /* what this rank sent */
  double ratio;         /* dense_bytes / wire_bytes */
  double time_ms;       /* total time inside allreduce */
  uint64_t state_bytes; /* error-feedback memory held */
} compcoll_stats_t;

/* The calls after their tensor's warm-up (COMPCOLL_WARMUP_STEPS; dense
 * routes included): what compression sends in its steady state. A separate
 * struct, so that compcoll_stats_t keeps its layout for programs built
 * against an earlier header. */
typedef struct {
  uint64_t warmup_dense_calls; /* calls run dense because their tensor was in its warm-up */
  uint64_t steady_calls;
  uint64_t steady_dense_bytes;
  uint64_t steady_wire_bytes;
  double steady_ratio;         /* steady_dense_bytes / steady_wire_bytes; 0 before any */
} compcoll_steady_stats_t;

/* Connects using COMPCOLL_RENDEZVOUS, COMPCOLL_RANK, COMPCOLL_WORLD_SIZE
 * (or RANK, WORLD_SIZE) and the other COMPCOLL_* settings. Collective. */
COMPCOLL_API compcoll_status_t compcoll_comm_create_from_env(compcoll_comm_t** comm);

/* Same, with the rendezvous ("file://DIR", "redis://HOST:PORT" or
 * "redis://HOST:PORT/JOB", a job's own name on a shared server), rank and
 * world size given explicitly; other settings still come from COMPCOLL_*. */
COMPCOLL_API compcoll_status_t compcoll_comm_create(const char* rendezvous, int rank, int world_size,
                                       compcoll_comm_t** comm);

/* In-place allreduce of count elements. key names the tensor's
 * error-feedback state; NULL uses (buf, count, dtype), which holds only
 * while the buffer stays where it is and is not saved by COMPCOLL_STATE_DIR
 * (an address means nothing to the next process; a WARN says how many were
 * left out). A key reused for a tensor of another size starts a fresh state,
 * dropping what the old one had not sent yet (a WARN, once per key). A state
 * unused for 10,000 calls that use error-feedback state
 * (calls on the dense route do not count) is dropped, with a WARN the first
 * time one held anything not sent yet. Collective: every
 * rank passes the same count, dtype and op; a call where they differ is the
 * caller's error and is not reliably detected. Counts that differ fail
 * with COMPCOLL_MALFORMED_PAYLOAD on at least one rank of the sparse
 * algorithms (dgc, sdagc, sbc) and onebit while both counts take the same
 * route, its peers with that or COMPCOLL_TRANSPORT_ERROR; where one rank's
 * count is below COMPCOLL_MIN_ELEMS and the other's is not, the ranks run
 * different collectives and fail with COMPCOLL_TRANSPORT_ERROR at
 * COMPCOLL_TIMEOUT_MS. On the exact dense path and csc, whose bytes go
 * through Gloo's ring, Gloo may abort the process (as a plain Gloo
 * allreduce does), at once or at a later call, or time out. Dtypes or ops
 * that differ between ranks are not detected on the compressed routes: each
 * rank decodes its peers' values as its own dtype and applies its own op,
 * and the ranks' results differ. */
COMPCOLL_API compcoll_status_t compcoll_allreduce(compcoll_comm_t* comm, void* buf, size_t count,
                                     compcoll_dtype_t dtype, compcoll_op_t op, const char* key);

COMPCOLL_API compcoll_status_t compcoll_comm_rank(const compcoll_comm_t* comm, int* rank);
COMPCOLL_API compcoll_status_t compcoll_comm_size(const compcoll_comm_t* comm, int* size);
COMPCOLL_API compcoll_status_t compcoll_get_stats(const compcoll_comm_t* comm, compcoll_stats_t* stats);
COMPCOLL_API compcoll_status_t compcoll_get_steady_stats(const compcoll_comm_t* comm,
                                                         compcoll_steady_stats_t* stats);

/* Mixed precision. Under a loss scaler every gradient is S times the true
 * one, and so is what error feedback keeps for later. Both calls are this
 * rank's own (not collective) and go between allreduces: made during one
 * on another thread, they are refused as above.
 * compcoll_rescale_state: the scale changed by factor (new S / old S; finite
 * and > 0): every error-feedback state is multiplied by it, so that what it
 * sends later is in the new unit. *rescaled (if not NULL) receives how many
 * states were. Every rank's scaler changes S at the same step, so every rank
 * calls it there.
 * compcoll_set_loss_scaled: on != 0: from now on a compressed allreduce whose
 * result is not finite (an overflowed step, which the scaler skips) leaves
 * its state as it was before the call, as a skipped step leaves a dense
 * run. It costs a copy of the state per compressed call (into one buffer
 * kept from call to call). */
COMPCOLL_API compcoll_status_t compcoll_rescale_state(compcoll_comm_t* comm, double factor,
                                                      size_t* rescaled);
COMPCOLL_API compcoll_status_t compcoll_set_loss_scaled(compcoll_comm_t* comm, int on);

/* Writes COMPCOLL_STATS_FILE and saves the COMPCOLL_STATE_DIR checkpoint
 * (if set), logs a summary, frees everything. NULL is accepted. Made while
 * a call of the communicator runs on another thread, it fails at once with
 * COMPCOLL_INVALID_ARGUMENT and frees nothing (destroy it once that call has
 * returned); no other call on it (a stats getter either) may follow or
 * overlap a destroy that succeeded. A
 * communicator still alive when the process exits (exit() or a return from
 * main) writes both then, unless a call of it is running on another thread;
 * one whose process dies by a signal or _exit() writes neither. */
COMPCOLL_API compcoll_status_t compcoll_comm_destroy(compcoll_comm_t* comm);

COMPCOLL_API const char* compcoll_status_string(compcoll_status_t status);
/* Message of this thread's last compcoll call if it failed, "" if it
 * succeeded (every function but compcoll_status_string and this one sets
 * it). */
COMPCOLL_API const char* compcoll_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* COMPCOLL_COMPCOLL_H_ */

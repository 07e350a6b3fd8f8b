/* The NCCL interposer's own entry points (libcompcoll_nccl.so, preloaded
 * with LD_PRELOAD in front of the real NCCL; docs/gpu.md). They are not
 * NCCL's: a program finds them with dlsym(RTLD_DEFAULT, name), and where
 * they are absent the interposer is not preloaded (or older than them).
 * The compcoll Python package calls them from its torch.amp.GradScaler
 * wrappers; a program under another loss scaler calls them itself.
 *
 * Both return an ncclResult_t (0 = ncclSuccess); on failure
 * ncclGetLastError(NULL) says why. Both are process-wide: every NCCL
 * communicator of the process, live or created later. */
#ifndef COMPCOLL_NCCL_INTERPOSER_H_
#define COMPCOLL_NCCL_INTERPOSER_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A loss scaler is in charge: from now on a compressed allreduce whose
 * result is not finite (a step the scaler skips) leaves its error-feedback
 * state as it was before the call. Call it at the first scaled step. */
#define COMPCOLL_NCCL_NOTE_LOSS_SCALED "compcoll_nccl_note_loss_scaled"
typedef int (*compcoll_nccl_note_loss_scaled_fn)(void);

/* The loss scale changed by factor (new / old; finite and > 0, else
 * ncclInvalidArgument): every error-feedback state is multiplied by it.
 * *rescaled (when not NULL) receives how many states were. Call it between
 * steps, after the scaler's update. */
#define COMPCOLL_NCCL_LOSS_SCALE_CHANGED "compcoll_nccl_loss_scale_changed"
typedef int (*compcoll_nccl_loss_scale_changed_fn)(double factor, size_t* rescaled);

#ifdef __cplusplus
}
#endif

#endif /* COMPCOLL_NCCL_INTERPOSER_H_ */

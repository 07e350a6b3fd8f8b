"""torch.amp.GradScaler under compcoll: the error-feedback state follows the
loss scale.

Mixed-precision training multiplies the loss by a scale S, so the gradients
compcoll reduces are S times the true ones, and the scaler divides the
reduced result by S before the optimizer steps. Whatever compcoll keeps for
later (residuals, momenta: compression/state_scale.h) is in the unit of the
scale it was made at. GradScaler.update() halves S after a step whose
gradients overflowed (that step is skipped) and doubles it after
growth_interval good steps; at the start of training it may halve many times
in a row. Had the state kept its old unit, what it sent after a change would
be unscaled by the new S: up to 2^k times too large after k halvings (DDP
under GradScaler diverged this way with dgc, sbc and sdagc:
tests/python/test_loss_scale.py).

So while compcoll is loaded, two methods of GradScaler (torch.amp's, which
torch.cuda.amp's and torch.cpu.amp's inherit) are wrapped:
- update(): when the scale it leaves differs from the one it found, every
  live compcoll group rescales its state by new / old
  (compcoll._C.rescale_state, on each group's worker after everything
  submitted so far). The scale is the same on every rank (the reduced
  gradients are, and so is the overflow check on them), and the rescale is
  each rank's own: nothing is exchanged.
- scale(): its first call on an enabled scaler tells compcoll that a loss
  scaler is in charge (compcoll._C.note_loss_scaled). From then on a
  compressed call whose result holds a non-finite value (an overflowed
  step, which the scaler skips) leaves its error-feedback state exactly as
  it was before the call (plugin/communicator.h, set_discard_nonfinite), as
  a skipped step leaves a dense run's optimizer: kept, its finite part
  would be sent at later steps, and under DGC's momentum correction it
  would also stay in the velocity, about 1 / (1 - m) steps' worth of a
  gradient that dense training never applies (with the hand-over of SGD's
  momentum 0.9, the DDP test's dgc loss ended 34 % above the same run
  without a scaler, sbc's 2.6x; with both wrappers the gap is measured in
  tests/python/test_loss_scale.py). It costs a copy of the state per
  compressed call.

One scaler per process is assumed to scale every gradient compcoll sees: a
second scaler that changes its scale is reported once, at WARNING (each
rescales every group).

Under the NCCL interposer (LD_PRELOAD=libcompcoll_nccl.so, docs/gpu.md),
which compresses torch's own NCCL allreduces in C++ with no compcoll group
in Python, both wrappers tell it the same through its compcoll_nccl_*
entry points (plugin/nccl_interposer/interposer.h, "Mixed precision"),
found in the process as it is preloaded (follow_interposer, at `import
torch` through the autoload entry point).

Wrapped once per process, when the first compcoll group is built or, under
the interposer, when compcoll's autoload finds it.
"""
import ctypes
import functools
import threading
import weakref

import torch

from compcoll import _C

_lock = threading.Lock()
_changed = weakref.WeakSet()  # scalers whose scale changed
_warned_second = False
_noted = False  # a scaler's scale() has told compcoll (note_loss_scaled)
_interposer = None  # the preloaded NCCL interposer's entry points (follow_interposer)


class _Interposer:
    """libcompcoll_nccl.so's compcoll_nccl_* functions, as the process has them."""

    def __init__(self, lib):
        self._lib = lib
        self._changed = lib.compcoll_nccl_loss_scale_changed
        self._changed.argtypes = [ctypes.c_double, ctypes.POINTER(ctypes.c_size_t)]
        self._changed.restype = ctypes.c_int
        self._noted = lib.compcoll_nccl_note_loss_scaled
        self._noted.argtypes = []
        self._noted.restype = ctypes.c_int

    def _check(self, result, what):
        if result != 0:
            lib = self._lib
            lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
            lib.ncclGetLastError.restype = ctypes.c_char_p
            said = (lib.ncclGetLastError(None) or b"").decode(errors="replace")
            raise RuntimeError(f"compcoll: the NCCL interposer's {what} failed (ncclResult_t "
                               f"{result}): {said}")

    def loss_scale_changed(self, factor):
        rescaled = ctypes.c_size_t(0)
        self._check(self._changed(factor, ctypes.byref(rescaled)),
                    "compcoll_nccl_loss_scale_changed")
        return rescaled.value

    def note_loss_scaled(self):
        self._check(self._noted(), "compcoll_nccl_note_loss_scaled")


def follow_interposer():
    """The NCCL interposer is preloaded in this process: its error-feedback
    state follows GradScaler too. Returns False when this process has no
    interposer, or one without the entry points (older than compcoll's
    package: said once at WARNING, since its state then would not follow)."""
    global _interposer
    from compcoll import _notices

    if not _notices.interposer_loaded():
        return False
    lib = ctypes.CDLL(None)  # the process's global scope, where LD_PRELOAD put it
    try:
        found = _Interposer(lib)
    except AttributeError:
        _C.warn(_rank(), "the NCCL interposer preloaded in this process has no "
                         "compcoll_nccl_loss_scale_changed (it is older than this compcoll "
                         "package): under torch.amp.GradScaler its error-feedback state will not "
                         "follow the loss scale; use the libcompcoll_nccl.so of the same build")
        return False
    with _lock:
        if _interposer is not None:
            return True
        _interposer = found
        noted = _noted
    install()
    if noted:
        found.note_loss_scaled()
    return True


def _rank():
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _scale_of(scaler):
    """The scaler's current scale tensor, or None (disabled, or no scale()
    call yet)."""
    if not scaler.is_enabled():
        return None
    return getattr(scaler, "_scale", None)


def _follow(scaler, factor):
    global _warned_second
    with _lock:
        _changed.add(scaler)
        second = len(_changed) > 1 and not _warned_second
        _warned_second = _warned_second or second
    if second and _rank() == 0:
        _C.warn(0, "two torch.amp.GradScaler objects change their loss scale in this process; "
                   "compcoll rescales the error-feedback state of every group with each, which "
                   "is right only when one scale multiplies every gradient it reduces: use one "
                   "GradScaler for every model whose gradients compcoll compresses "
                   "(docs/pytorch.md, \"Mixed precision\")")
    _C.rescale_state(factor)
    if _interposer is not None:
        _interposer.loss_scale_changed(factor)


def _noting(scale):
    @functools.wraps(scale)
    def wrapper(self, outputs):
        global _noted
        if not _noted and self.is_enabled():
            _noted = True
            _C.note_loss_scaled()
            if _interposer is not None:
                _interposer.note_loss_scaled()
        return scale(self, outputs)
    wrapper.__compcoll_notes__ = True
    return wrapper


def _following(update):
    @functools.wraps(update)
    def wrapper(self, new_scale=None):
        scale = _scale_of(self)
        before = scale.detach().clone() if scale is not None else None
        result = update(self, new_scale)
        after = _scale_of(self)
        if before is not None and after is not None:
            factor = float((after.detach().double() / before.double()).item())
            if factor != 1.0 and factor > 0.0 and factor != float("inf"):
                _follow(self, factor)
        return result
    wrapper.__compcoll_follows__ = True
    return wrapper


@functools.cache
def install():
    """Wraps torch.amp.GradScaler.scale and .update, once per process."""
    from torch.amp import GradScaler

    if not getattr(GradScaler.scale, "__compcoll_notes__", False):
        GradScaler.scale = _noting(GradScaler.scale)
    if not getattr(GradScaler.update, "__compcoll_follows__", False):
        GradScaler.update = _following(GradScaler.update)

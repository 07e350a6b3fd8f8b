"""Mixed precision under compcoll: DDP with torch.amp.GradScaler as fp16
training meets it (workers/loss_scale.py: a gradient overflows when it
exceeds float16's range; the scale starts at 2^16, grows after good steps
and halves at each overflow, whose step the scaler skips).

compcoll's error-feedback state holds scaled gradients, so it follows the
scale (compcoll/_loss_scale.py: update() rescales it, compression/
state_scale.h), and a call whose result is not finite leaves it as it was
(scale() turns that on: plugin/communicator.h, set_discard_nonfinite), as a
skipped step leaves a dense run alone. Then a run under the scaler ends
where the same run without one does. Measured before (300 steps, loss over
the last 50, with / without the scaler): with neither, dgc 0.606 / 0.318,
sdagc 0.535 / 0.314, and sbc's skipped step poisoned its velocity, so that
its scale collapsed to 2^-129 (0.590 / 0.324); with the rescale alone, dgc
0.427, sbc 0.856, sdagc 0.479; now 0.325, 0.338, 0.309 (docs/pytorch.md,
"Mixed precision")."""
import os
import sys

import pytest

from conftest import REPO, launch, run_single, worker

SCRIPT = worker("loss_scale.py")
RANKS = 2
ENV = {"COMPCOLL_MIN_ELEMS": "1000", "COMPCOLL_DEBUG": "INFO"}
# dgc in every run; the other algorithms' calls are the same API calls, so
# the sanitized run leaves them out (conftest: end_to_end).
ALGOS = ["dgc"] + [pytest.param(a, marks=pytest.mark.end_to_end)
                   for a in ("sbc", "sdagc", "csc", "onebit")]


def train(algo, scaler):
    return launch([SCRIPT], RANKS, timeout=300,
                  env=dict(ENV, COMPCOLL_ALGO=algo, SCALER="1" if scaler else "0"))


@pytest.mark.parametrize("algo", ALGOS)
def test_a_run_under_gradscaler_trains_as_without_it(algo):
    scaled = train(algo, True)
    res = scaled[0].result
    assert all(r.result["finite"] for r in scaled), scaled[0].describe()
    assert scaled[0].result["params"] == scaled[1].result["params"]
    # The premise: the scale grew and halved again (an overflowed, skipped
    # step) more than once, and never collapsed.
    scales = res["scales"]
    halvings = sum(b < a for a, b in zip(scales, scales[1:]))
    assert halvings >= 2 and min(scales) >= 16, scales
    assert res["loss_scale_changes"] == sum(b != a for a, b in zip(scales, scales[1:])) + \
        (scales[0] != 16), res["loss_scale_changes"]
    log = scaled[0].stderr
    assert "the loss scale (torch.amp.GradScaler) changed by a factor of 2" in log, log
    assert "the loss scaler skips this step; its error-feedback state is left as it was" in log
    # Trained as the same algorithm does without a scaler.
    plain = train(algo, False)[0].result
    assert res["loss_last"] <= 1.1 * plain["loss_last"], (res["loss_last"], plain["loss_last"])
    assert res["loss_last"] < 0.5 * res["loss_first"], res


INTERPOSER = os.path.join(REPO, "build", "plugin", "nccl_interposer", "libcompcoll_nccl.so")
STANDIN = os.path.join(REPO, "build", "tests", "interposer", "standin")


@pytest.mark.skipif(not os.path.exists(os.path.join(STANDIN, "libnccl.so.2")),
                    reason="the NCCL interposer and its stand-in are not built (no nccl.h)")
def test_the_nccl_interposer_state_follows_the_scaler_too():
    """The NCCL interposer (LD_PRELOAD) compresses torch's NCCL allreduces in
    C++, with no compcoll group in Python: compcoll's autoload finds it at
    `import torch`, and GradScaler's wrappers tell it what they tell the
    groups (its compcoll_nccl_* entry points; on a GPU the calls they govern
    are tests/interposer's, here the stand-in NCCL only lets it load). One
    overflowed step halves the scale: the interposer hears that a scaler is
    in charge and that the scale changed by 0.5. Not preloaded, nothing of
    it is said."""
    env = {"COMPCOLL_ALGO": "dgc", "COMPCOLL_DEBUG": "INFO",
           "COMPCOLL_NCCL_LIBRARY": os.path.join(STANDIN, "libnccl.so.2"),
           "COMPCOLL_CUDA_LIBRARY": os.path.join(STANDIN, "libcuda.so.1")}
    # After whatever is preloaded already (the ASan runtime in the sanitizer run).
    preload = ":".join(p for p in (os.environ.get("LD_PRELOAD"), INTERPOSER) if p)
    r = run_single([sys.executable, worker("scaler_alone.py")], env=dict(env, LD_PRELOAD=preload),
                   timeout=120)
    assert r.result["scales"] == [512.0, 512.0], r.describe()
    assert "a loss scaler (torch.amp.GradScaler) is in charge" in r.stderr, r.describe()
    assert ("the loss scale (torch.amp.GradScaler) changed by a factor of 0.5: 0 error-feedback "
            "states") in r.stderr, r.describe()
    alone = run_single([sys.executable, worker("scaler_alone.py")], env=env, timeout=120)
    assert alone.result["scales"] == [512.0, 512.0], alone.describe()
    assert "GradScaler" not in alone.stderr, alone.describe()

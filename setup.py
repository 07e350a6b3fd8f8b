"""Build of the compcoll Python package: the torch.distributed backend.

Build it against the torch already installed (no build isolation, so pip does
not fetch a second torch):

    python3 -m pip install --no-build-isolation ./

The extension compiles compcoll's Gloo-free layers (compression/,
collectives/, the plugin's configuration, stats, state store and
communicator) together with the torch glue in integration/pytorch/csrc. It
does not link libgloo: every byte goes through the Gloo inside torch.
"""
import glob
import os
import re

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:
    # Most often pip's default build isolation: a fresh environment without
    # the torch the user has. Say so instead of a bare ModuleNotFoundError.
    raise SystemExit(
        f"compcoll: this build compiles against the torch it will run with, and sees none ({e}). "
        "pip builds in an isolated environment unless told otherwise, which hides the installed "
        "torch: run `python3 -m pip install --no-build-isolation ./` with the python that has "
        "torch (or `bash scripts/install-python-package.sh`, which uses .venv); install torch "
        "first where there is none.") from None

ROOT = os.path.dirname(os.path.abspath(__file__))
PKG_DIR = "integration/pytorch"

# Same optimisation flags as the CMake build: the codecs are hot loops, and
# no -ffast-math (NaN and Inf must behave as IEEE says).
CXX_FLAGS = ["-std=c++20", "-O3", "-fno-math-errno", "-DNDEBUG", "-Wall", "-Wno-unused-parameter",
             "-fvisibility=hidden", "-g0"]  # -g0: a 1 MB extension instead of 21 MB
LINK_FLAGS = []
BUILD_BASE = "build-python"


def torch_features():
    """-D flags for what the installed torch's c10d headers offer: the
    extension builds against older torch releases too (2.11 lacks both),
    and a probe of the headers is exact where a version table would guess."""
    import torch
    c10d = os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc", "distributed", "c10d")
    text = ""
    for name in ("Backend.hpp", "Work.hpp", "Types.hpp"):
        path = os.path.join(c10d, name)
        if os.path.exists(path):
            with open(path) as f:
                text += f.read()
    has = {
        # Backend::setBoundDeviceId became virtual (the backend forwards it to its inner groups).
        "COMPCOLL_TORCH_VIRTUAL_BOUND_DEVICE": re.search(r"virtual\s+void\s+setBoundDeviceId", text),
        # OpType names for the coalesced tensor collectives (labels of delegated works).
        "COMPCOLL_TORCH_COALESCED_OPTYPES": "ALLGATHER_INTO_TENSOR_COALESCED" in text,
    }
    return [f"-D{name}={1 if ok else 0}" for name, ok in has.items()]


CXX_FLAGS += torch_features()

# COMPCOLL_SANITIZE=address,undefined: an instrumented extension for the
# sanitizer run (scripts/run-sanitizers.sh python), built apart from the
# regular one; never for installs that users import without the ASan runtime.
SANITIZE = os.environ.get("COMPCOLL_SANITIZE", "").strip()
if SANITIZE:
    san = [f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer"]
    if "undefined" in SANITIZE:
        san.append("-fno-sanitize-recover=undefined")
    # -g1: line tables, all a sanitizer report's stack needs, and a fifth
    # faster to compile than -g (as in scripts/run-sanitizers.sh).
    CXX_FLAGS = [f for f in CXX_FLAGS if f not in ("-O3", "-DNDEBUG", "-g0")] + ["-O1", "-g1"] + san
    LINK_FLAGS = san
    BUILD_BASE = "build-python-san"


def compcoll_sources():
    rel = lambda pattern: sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))
    sources = rel("compression/*.cc") + rel("collectives/*.cc")
    # plugin/connect.cc, c_api.cc and info_main.cc need Gloo: not here.
    sources += [f"plugin/{name}.cc" for name in ("config", "config_diagnostics", "logging", "stats", "state_store", "state_file",
                                                   "writable_dir", "communicator", "communicator_state")]
    # The host hierarchy: shared memory, host and machine identity (no Gloo).
    sources += rel("transport/shm_*.cc") + ["transport/machine_cpus.cc", "transport/nonzero_pack.cc"]
    sources += rel(f"{PKG_DIR}/csrc/*.cc")
    return sources


def read_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(compcoll VERSION"):
                return line.split("VERSION")[1].split()[0]
    return "0.0.0"


setup(
    name="compcoll",
    version=read_version(),
    description="Compressed allreduce (DGC, SBC, SDAGC, CSC, 1-bit) as a torch.distributed backend",
    package_dir={"": PKG_DIR},
    packages=["compcoll"],
    py_modules=["compcoll_autoload", "compcoll_creators"],
    ext_modules=[
        CppExtension(
            name="compcoll._C",
            sources=compcoll_sources(),
            include_dirs=[ROOT, os.path.join(ROOT, "include")],
            extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=LINK_FLAGS,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    # setuptools' default build/ is CMake's build folder in this repository.
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": PKG_DIR}},
    entry_points={
        # torch >= 2.5 imports these at `import torch` (unless
        # TORCH_DEVICE_BACKEND_AUTOLOAD=0); it imports nothing of compcoll
        # unless COMPCOLL_* variables are set, then or when a group is made.
        "torch.backends": ["compcoll = compcoll_autoload:autoload"],
        # torch versions that resolve backend names lazily register
        # "compcoll" on first use of the name.
        "torch.distributed.backends": ["compcoll = compcoll_autoload:register_compcoll"],
    },
    python_requires=">=3.9",
    install_requires=["torch>=2.5"],
    zip_safe=False,
)

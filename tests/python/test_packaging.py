"""The wheel that scripts/install-python-package.sh builds (build-wheel/) is
a complete package: installed into a fresh virtual environment, away from
the source tree, it brings the extension, the launcher and the entry point
through which `import torch` activates compcoll."""
import glob
import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from conftest import REPO, base_env

pytestmark = pytest.mark.end_to_end  # conftest.py says what that means

WHEELS = sorted(glob.glob(os.path.join(os.environ.get("COMPCOLL_WHEEL_DIR", os.path.join(REPO, "build-wheel")),
                                       "compcoll-*.whl")))

CHECK = textwrap.dedent("""
    import os, sys, tempfile
    import torch  # the torch.backends entry point runs here (COMPCOLL_ALGO is set)
    import torch.distributed as dist
    import compcoll._C, compcoll.run  # the extension and the launcher
    here = os.path.realpath(compcoll._C.__file__)
    assert here.startswith(os.path.realpath(sys.prefix)), f"compcoll from {here}, not {sys.prefix}"
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    name = dist.group.WORLD._get_backend(torch.device("cpu")).name()
    dist.destroy_process_group()
    print("BACKEND", name, here)
""")


@pytest.mark.skipif(not WHEELS, reason="no wheel in build-wheel/ (scripts/install-python-package.sh builds it)")
def test_wheel_installs_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    # The interpreter this suite runs on (a venv's base if it is one), with
    # its site-packages; --without-pip: this interpreter's pip installs.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    py = str(venv / "bin" / "python")
    # torch may live in this suite's own venv rather than in the base
    # interpreter (Debian's python3): make this environment's packages
    # visible after the new venv's own, which come first on sys.path.
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "outer.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the compcoll that outer.pth (or the base
    # interpreter) makes visible must neither satisfy nor be uninstalled.
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps",
                          "--ignore-installed", "--disable-pip-version-check", "--root-user-action=ignore",
                          WHEELS[-1]],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = base_env({"COMPCOLL_ALGO": "dgc"})
    # The installed wheel, not a compcoll that PYTHONPATH puts first (the
    # sanitizer run puts its instrumented build there).
    env.pop("PYTHONPATH", None)
    r = subprocess.run([py, "-c", CHECK], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [x for x in r.stdout.splitlines() if x.startswith("BACKEND ")][-1]
    _, name, path = line.split(" ", 2)
    assert name == "compcoll", r.stdout + r.stderr
    assert path.startswith(os.path.realpath(str(venv))), path


def test_a_build_that_cannot_see_torch_says_how_to_build():
    """pip's default build isolation hides the installed torch from setup.py
    (`pip install ./`): the build stops with the command that works, not with
    a bare ModuleNotFoundError. Here torch is hidden from the interpreter
    that runs setup.py, as the isolated build environment hides it."""
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--version']; "
            "exec(compile(open('setup.py').read(), 'setup.py', 'exec'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "compcoll: this build compiles against the torch it will run with, and sees none" in r.stderr
    assert "python3 -m pip install --no-build-isolation ./" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_an_extension_that_cannot_load_says_to_rebuild(tmp_path):
    """An extension built against another torch (torch upgraded since) fails
    to load: `import compcoll`, and `import torch` with COMPCOLL_ALGO set
    (torch's autoload), say that it must be rebuilt and how, not only
    torch's "Failed to load the backend extension". The failure is made
    here by hiding compcoll._C from the interpreter."""
    hide = "import sys; sys.modules['compcoll._C'] = None; "
    for code, env in ((hide + "import compcoll", {}), (hide + "import torch", {"COMPCOLL_ALGO": "dgc"})):
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=base_env(env),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "compcoll: its extension compcoll._C cannot be loaded into torch" in r.stderr, r.stderr
        assert "rebuild it after installing or upgrading torch" in r.stderr, r.stderr

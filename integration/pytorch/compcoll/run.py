"""Run a training script with compcoll where torch's backend autoload cannot
reach (TORCH_DEVICE_BACKEND_AUTOLOAD=0, a torch without autoload):

    COMPCOLL_ALGO=dgc python -m compcoll.run train.py --epochs 3
    COMPCOLL_ALGO=dgc python -m compcoll.run -m mypackage.train --epochs 3

It installs the same hook as the autoload (init_process_group("gloo") gets
the compcoll backend) and runs the script as __main__. With COMPCOLL_ALGO
unset or "dense" it only runs the script. Processes the script starts with
the spawn method import torch afresh: they get the hook from the autoload
only, unless they are started through this launcher too.
"""
import os
import runpy
import sys

from compcoll_autoload import compression_requested

USAGE = "usage: python -m compcoll.run [-m module | script.py] [args ...]"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__.strip())
        return 0 if argv else 2
    if compression_requested():
        from compcoll import _backend

        _backend.install_gloo_hook()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())

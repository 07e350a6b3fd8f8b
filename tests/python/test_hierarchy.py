"""The host hierarchy (COMPCOLL_HIERARCHY) under the PyTorch backend: the
backend's communicator finds the hosts among the group's ranks, and every
rank gets the same bits, NaN included. Hosts are emulated with
COMPCOLL_HOST_ID; 5 ranks, 2 per host, so one host is uneven."""
import pytest

# Their workers allreduce outside a backward pass and expect compression.
from conftest import launch_direct as launch, worker


@pytest.mark.parametrize("algo", ["dgc", "csc", "onebit"])
def test_every_rank_gets_the_same_bits_through_the_hierarchy(compcoll_ext, algo):
    results = launch([worker("hierarchy.py"), "2"], 5, env={
        "COMPCOLL_ALGO": algo, "COMPCOLL_HIERARCHY": "host", "COMPCOLL_MIN_ELEMS": "1000",
        "COMPCOLL_DEBUG": "INFO", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    first = results[0].result["digests"]
    for r in results:
        assert r.result["digests"] == first, r.describe()
        assert r.result["nan"], r.describe()
        assert "host hierarchy on (COMPCOLL_HIERARCHY=host): 3 hosts: {0,1} {2,3} {4}" in r.stderr, \
            r.describe()
        leads = "this rank leads its host" in r.stderr
        assert leads == (r.rank in (0, 2, 4)), r.describe()


def test_shards_under_the_backend_runs_one_leader_per_host_and_says_why(compcoll_ext):
    """COMPCOLL_HIERARCHY=shards needs subgroups of its own, which the
    backend's inner group cannot connect: the leaders run it, same bits
    everywhere, and each rank says so once at WARN (the setting then changes
    nothing beyond host) rather than silently doing something else."""
    results = launch([worker("hierarchy.py"), "2"], 5, env={
        "COMPCOLL_ALGO": "dgc", "COMPCOLL_HIERARCHY": "shards", "COMPCOLL_MIN_ELEMS": "1000",
        "COMPCOLL_DEBUG": "INFO", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    first = results[0].result["digests"]
    for r in results:
        assert r.result["digests"] == first, r.describe()
        assert "host hierarchy on (COMPCOLL_HIERARCHY=shards): 3 hosts: {0,1} {2,3} {4}" in r.stderr, \
            r.describe()
        said = [ln for ln in r.stderr.splitlines()
                if "one leader per host, not slices: the transport cannot connect" in ln]
        assert len(said) == 1 and "compcoll WARN" in said[0], r.describe()
        assert "runs as host would" in said[0], said

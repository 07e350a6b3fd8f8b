"""compcoll's public Python API: `compcoll.__all__` names what the package
offers (every public function and constant, each with a docstring), and the
table in docs/pytorch.md ("The Python API") lists exactly those names."""
import json
import os
import re
import subprocess
import sys

from conftest import REPO, base_env

LIST = """
import inspect, json, types
import compcoll
public = sorted(n for n, v in vars(compcoll).items()
                if not n.startswith("_") and not isinstance(v, types.ModuleType))
undocumented = sorted(n for n in compcoll.__all__
                      if callable(getattr(compcoll, n)) and not inspect.getdoc(getattr(compcoll, n)))
print(json.dumps({"all": sorted(compcoll.__all__), "public": public, "undocumented": undocumented}))
"""


def api_table_names():
    with open(os.path.join(REPO, "docs", "pytorch.md")) as f:
        text = f.read()
    section = text.split("\n## The Python API\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            names.update(re.findall(r"`([A-Za-z_]+)(?:\(|`)", row.split(" | ")[0]))
    return sorted(names)


def test_all_is_the_public_api_and_the_docs_list_it():
    out = subprocess.run([sys.executable, "-c", LIST], env=base_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    api = json.loads(out.stdout.strip().splitlines()[-1])
    assert api["all"] == api["public"], api  # nothing public left out of __all__, nothing extra
    assert api["undocumented"] == [], api
    assert api_table_names() == api["all"], (api_table_names(), api["all"])

"""README's figures stay generated: every section that
scripts/update-readme-figures.py writes has exactly one marked block in its
file (a hand edit that removes or duplicates a marker fails here), and a
rewrite replaces only the block, keeping its indentation."""
import importlib.util
import os

from conftest import REPO

spec = importlib.util.spec_from_file_location(
    "update_readme_figures", os.path.join(REPO, "scripts", "update-readme-figures.py"))
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)


def test_every_section_has_one_marked_block():
    assert set(figures.SECTION_FILES) == set(figures.SECTIONS)
    for name, paths in figures.SECTION_FILES.items():
        for path in paths:
            with open(path) as f:
                text = f.read()
            begin = f"<!-- figures:{name} begin (scripts/update-readme-figures.py) -->"
            assert text.count(begin) == 1 and text.count(f"<!-- figures:{name} end -->") == 1, (name, path)
            figures.replace_section(text, name, "x", path)  # exits on a malformed block


def test_rewrite_replaces_only_the_block_and_keeps_its_indentation():
    text = ("before\n  <!-- figures:codec begin (scripts/update-readme-figures.py) -->\n  old 1\n"
            "  old 2\n  <!-- figures:codec end -->\nafter\n")
    out = figures.replace_section(text, "codec", "new 1\nnew 2", "README.md")
    assert out == ("before\n  <!-- figures:codec begin (scripts/update-readme-figures.py) -->\n  new 1\n"
                   "  new 2\n  <!-- figures:codec end -->\nafter\n")

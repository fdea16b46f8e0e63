"""The README's quick start and the links of every page (the code blocks: tests/test_docs.py)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_quick_start_is_two_make_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_every_image_and_doc_link_resolves():
    root = README.parent
    for doc in [README, *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"

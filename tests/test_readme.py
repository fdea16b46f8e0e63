"""The README's usage example runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_experiment_doc_python_blocks_run():
    doc = README.parent / "docs" / "experiment.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert blocks, "docs/experiment.md has no python example"
    for block in blocks:
        exec(compile(block, str(doc), "exec"), {})


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

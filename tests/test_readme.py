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


def test_installation_states_the_versions_pyproject_and_the_makefile_use():
    text = README.read_text()
    install = text[text.index("## Installation\n") : text.index("\n## ", text.index("## Installation\n") + 1)]
    pyproject = (README.parent / "pyproject.toml").read_text()
    python = re.search(r'requires-python = ">=(\d+\.\d+)"', pyproject).group(1)
    torch_floor = re.search(r'"torch>=(\d+\.\d+)"', pyproject).group(1)
    pinned = re.search(r"^TORCH\s*:=\s*torch==(\S+)", (README.parent / "Makefile").read_text(), flags=re.M).group(1)
    transformers = re.search(r'"transformers==(\S+)"', pyproject).group(1)
    assert f"Python {python} or newer" in install
    assert f"torch {torch_floor} and later" in install and f"torch {pinned}" in install
    assert f"transformers {transformers}" in install
    for extra in re.findall(
        r"^(\w+) = \[", pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0], flags=re.M
    ):
        assert f"`[{extra}]`" in install, f"the Installation section does not describe the [{extra}] extra"
    assert "rotary build" in install and "C++ compiler" in install and "pure-torch path" in install


def test_the_docs_speak_to_users_not_to_the_project_tracker():
    """Readers of the README and docs/ never saw the project's issues or seed notes: the docs cite
    papers and articles by title and state requirements as what the code does."""
    root = README.parent
    for doc in [README, *sorted((root / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            found = re.search(r"\bthe issue\b|\bissue \d+\b|\bseed 0\d\d\b", line, flags=re.I)
            assert not found, f"{doc.name}:{number} says {found.group(0)!r}; rephrase it for a user"

"""The README stays short and its links land; the site's pages exist (the strict build itself
runs as `make docs`, in CI)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# docs/hooks.py generates these at build time
GENERATED = {"reference/configuration.md", "reference/cli.md", "reference/odd-inputs.md"}


def test_the_readme_is_short_and_names_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make train" in text and "make test" in text


def test_every_relative_link_of_the_readme_lands_on_a_file():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links into the docs"
    assert [t for t in local if not (ROOT / t).is_file()] == []


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_of_the_nav_exists_or_is_generated():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = _nav_pages(config["nav"])
    assert {"results.md", "performance.md", *GENERATED} <= set(pages)
    assert [p for p in pages if p not in GENERATED and not (ROOT / "docs" / p).is_file()] == []


ABSOLUTE = re.compile(r"sqlite:////\S|(?<![\w.<])/(?:work|tmp|home|root|Users|private)/\w")


def test_no_page_names_a_path_of_the_machine_it_was_made_on():
    """Commands in the docs must run anywhere: relative paths or placeholders only."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}:{number}" for page in pages
             for number, line in enumerate(page.read_text().splitlines(), start=1)
             if ABSOLUTE.search(line)]
    assert found == []


def test_the_report_shows_a_store_relative_or_as_a_placeholder(tmp_path, monkeypatch):
    from rul.reporting.cli import shown

    monkeypatch.chdir(tmp_path)
    assert shown(f"sqlite:///{tmp_path}/runs/mlflow.db") == "sqlite:///runs/mlflow.db"
    assert shown("sqlite:////somewhere/else/mlflow.db") == "sqlite:///<folder>/mlflow.db"
    assert shown("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
    assert shown("http://host:5000") == "http://host:5000"
    assert shown("/data/out/") == "<folder>/out"
    assert ABSOLUTE.search("sqlite:////work/x.db") and ABSOLUTE.search("in /tmp/abc")
    assert not ABSOLUTE.search("sqlite:///<folder>/mlflow.db") and not ABSOLUTE.search(
        "rul/training/step.py")


def _layout_entries() -> dict[str, str]:
    """The layout page's code block: each entry's first word (a path) and its whole text."""
    page = (ROOT / "docs" / "reference" / "layout.md").read_text()
    block = page.split("```text\n", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    name = None
    for line in block.splitlines():
        if line and not line[0].isspace():
            name = line.split()[0]
            entries[name] = line
        elif name is not None:
            entries[name] += " " + line.strip()
    return entries


def test_the_layout_page_names_every_module_in_its_package():
    """A newcomer finds each module on docs/reference/layout.md, under its package."""
    entries = _layout_entries()
    block = " ".join(entries.values())
    missing = []
    for path in sorted((ROOT / "rul").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        relative = path.relative_to(ROOT).as_posix()
        if path.parent.name == "rul":  # a module of its own: its entry, or named in another's
            named = relative in entries or re.search(rf"\b{re.escape(path.name)}\b", block)
        else:
            package = relative.rsplit("/", 1)[0] + "/"
            named = re.search(rf"\b{re.escape(path.stem)}\b", entries.get(package, ""))
        if not named:
            missing.append(relative)
    assert missing == []

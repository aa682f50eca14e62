"""Every relative link in README.md and docs/*.md leads to a file of the repository, and an anchor to a heading."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks, where links are links."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def anchors(document: Path) -> set[str]:
    """Heading anchors as GitHub makes them: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6} (.+)$", prose(document.read_text()), flags=re.MULTILINE)}


def relative_links(document: Path) -> list[str]:
    return [target for target in LINK.findall(prose(document.read_text()))
            if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("heading, anchor", [
    ("## Metrics, alerts, dashboard", "metrics-alerts-dashboard"),
    ("## `risk_explainer`", "risk_explainer"),
    ("## Benchmark: legacy service against skill2triton", "benchmark-legacy-service-against-skill2triton"),
])
def test_anchors_are_made_as_github_makes_them(tmp_path, heading, anchor):
    document = tmp_path / "a.md"
    document.write_text(f"{heading}\n\n```sh\n# not a heading\n```\n")
    assert anchors(document) == {anchor}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_relative_link_resolves_to_a_file_and_heading(document):
    assert document.name != "README.md" or relative_links(document), "the README links to its documentation"
    for target in relative_links(document):
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        assert linked.exists(), f"{document.name}: {target} does not exist"
        assert ROOT in linked.parents or linked == ROOT, f"{document.name}: {target} leaves the repository"
        if anchor:
            assert linked.suffix == ".md" and anchor in anchors(linked), f"{document.name}: no heading for {target}"


def test_the_readme_is_what_a_newcomer_reads_in_one_sitting():
    """The two commands, scoring a record, migrating a model, a short tour, one table of figures, the layout and the
    docs index: the rest belongs in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_the_benchmarks_page_is_a_reference_not_a_history():
    """Current figures, how to reproduce them, what each mode measures, the fairness rules and the targets; earlier
    runs belong in docs/evidence.md."""
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) < 250

"""docs/contracts.md is the contract the code cites, and it cannot drift from the code: the columns,
statuses, file names, checkpoint levels and objectives it lists are the ones the code writes and
reads. Every citation of a doc section in the code resolves, and nothing cites a file outside the
repository (a clone has only the repository)."""
from __future__ import annotations

import re
from pathlib import Path

from dpo_sweep.config import CHECKPOINT_LEVELS, ObjectivesSpec
from dpo_sweep.core.levels import REFUSED_LEVELS
from dpo_sweep.core.status import Status
from dpo_sweep.records import RESULTS_COLUMNS, STEPS_COLUMNS
from dpo_sweep.results_dir import ResultsDir

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONTRACTS = DOCS / "contracts.md"
#: What a clone holds and a reader follows: the package, the tests, the benchmark scripts, the docs,
#: the README and the shipped space files.
CITING = sorted(p for p in [*(ROOT / "dpo_sweep").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *DOCS.glob("*.md"),
                            ROOT / "README.md", *(ROOT / "search_spaces").glob("*.yaml"),
                            *(p for p in (ROOT / "benchmarks").rglob("*") if p.suffix in (".py", ".sh", ".md"))]
                if p != Path(__file__).resolve())  # this file spells what it looks for
#: A file of the repository named in the package's text: benchmarks/results/sweep_overhead/README.md.
REPO_PATH = re.compile(r"(?<![\w/.<-])((?:benchmarks|docs|dpo_sweep|search_spaces|tests)/[\w./-]+\.(?:md|py|yaml|json))\b")
#: A doc section named in text: docs/contracts.md#resultscsv, benchmarks/README.md#memory-model.
CITATION = re.compile(r"((?:docs|benchmarks)/[\w./-]*?\.md)#([\w-]+)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)  # a '#' in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def section(heading: str) -> str:
    text = CONTRACTS.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def first_cells(heading: str) -> list[str]:
    """The names in backticks in the first cell of each row of the section's table, in order."""
    names = []
    for line in section(heading).splitlines():
        cells = line.split("|")
        if not line.startswith("|") or set(line) <= set("|- ") or not cells[1].strip().startswith("`"):
            continue
        names += re.findall(r"`([^`]+)`", cells[1])
    return names


def test_slug_is_github_s_anchor():
    assert slug("results.csv") == "resultscsv"
    assert slug("frontier.md and recommendation.json") == "frontiermd-and-recommendationjson"
    assert slug("Joining a cluster: `--address`") == "joining-a-cluster---address"


def test_the_table_reader_reads_first_cells_only():
    assert first_cells("Status values") == [s.value for s in Status]
    assert "nvml" not in first_cells("results.csv")  # a value named in a meaning cell is no column


def test_results_csv_columns_are_the_ones_the_writer_writes_in_order():
    assert first_cells("results.csv") == RESULTS_COLUMNS


def test_steps_csv_columns_are_the_ones_the_writer_writes_in_order():
    assert first_cells("steps.csv") == STEPS_COLUMNS


def test_statuses_are_the_code_s():
    assert first_cells("Status values") == [s.value for s in Status]


def test_the_results_folder_s_files_are_results_dir_s_names():
    names = [v for k, v in vars(ResultsDir).items() if k.isupper() and isinstance(v, str)]
    assert first_cells("The results folder") == names


def test_checkpoint_levels_are_the_code_s_and_the_refused_ones_are_named():
    assert first_cells("Activation-checkpoint levels") == list(CHECKPOINT_LEVELS)
    assert all(f"`{level}`" in section("Activation-checkpoint levels") for level in REFUSED_LEVELS)


def test_objectives_and_their_defaults_are_the_code_s():
    rows = [line.split("|")[1:4] for line in section("Objectives").splitlines()
            if line.startswith("| `")]
    defaults = {re.findall(r"`(\w+)`", name)[0]: default.strip().strip("`") for name, _, default in rows}
    documented = {name: None if default == "null" else default for name, default in defaults.items()}
    assert documented == {name: f.default for name, f in ObjectivesSpec.model_fields.items()}


def test_exit_codes_of_stop_signals_are_the_documented_ones():
    import signal

    from dpo_sweep.sweep.signals import exit_code

    table = section("Commands and exit codes")
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        assert exit_code(sig) == code and f"`{code}` {'Ctrl-C' if sig == signal.SIGINT else sig.name}" in table


def test_nothing_cites_a_file_outside_the_repository():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in CITING for n, line in enumerate(p.read_text().splitlines(), 1)
             if "../shared" in line or re.search(r"(?<![\w/])DESIGN\.md", line)]
    assert found == []


def test_every_cited_doc_section_exists():
    cited = {(p.relative_to(ROOT), m.group(1), m.group(2)) for p in CITING for m in CITATION.finditer(p.read_text())}
    assert any(doc == "docs/contracts.md" for _, doc, _ in cited), "the code cites docs/contracts.md by section"
    missing = [f"{where}: {doc}#{anchor}" for where, doc, anchor in sorted(cited)
               if not (ROOT / doc).is_file() or anchor not in anchors(ROOT / doc)]
    assert missing == []


def test_every_file_the_package_names_exists():
    """A docstring that sends the reader to a README or a doc names one that is there."""
    named = {(p.relative_to(ROOT), m.group(1)) for p in sorted((ROOT / "dpo_sweep").rglob("*.py"))
             for m in REPO_PATH.finditer(p.read_text())}
    assert named and [f"{where}: {path}" for where, path in sorted(named) if not (ROOT / path).exists()] == []


def test_the_contract_s_own_links_reach_their_sections():
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", CONTRACTS.read_text()):
        assert anchor in anchors(CONTRACTS.parent / target if target else CONTRACTS), f"{target}#{anchor}"


def test_recommendation_json_keys_and_the_frontier_header_are_the_code_s():
    import dataclasses

    from dpo_sweep.analysis.forecast import json_entry
    from dpo_sweep.analysis.recommend import Recommendation
    from dpo_sweep.analysis.tables import FRONTIER_HEADER

    text = section("frontier.md and recommendation.json")
    keys = [f.name for f in dataclasses.fields(Recommendation)] + ["trl", *json_entry(None, "")]
    assert [k for k in keys if f"`{k}`" not in text] == []
    assert f"`{' | '.join(FRONTIER_HEADER)}`" in " ".join(text.split())

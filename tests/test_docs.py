"""Every option is documented (the space-file reference moved from the README to docs/), and every
shipped space file validates."""
from pathlib import Path

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.config import (DataSpec, ModelSpec, ObjectivesSpec, ResourcesSpec, SamplerSpec, SyntheticData,
                              TrainSpec)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: The README and the topic documents under docs/ (a field may be documented in any of them; the
#: space file's own reference is docs/space-file.md).
REFERENCE = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


@pytest.mark.parametrize("model", [ModelSpec, DataSpec, SyntheticData, TrainSpec, ResourcesSpec, SamplerSpec,
                                   ObjectivesSpec])
def test_every_space_field_is_in_the_space_file_reference(model):
    missing = [name for name in model.model_fields if f"`{name}`" not in REFERENCE and f" {name}:" not in REFERENCE
               and f"{{{name}:" not in REFERENCE]
    assert not missing, f"{model.__name__} fields not documented in README.md or docs/*.md: {missing}"


def test_readme_links_resolve():
    """Every relative link of the README and of docs/*.md names a file that exists (the moved
    sections link to each other by file)."""
    import re

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)}: {target}"


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_spaces_validate_and_have_a_header(path):
    text = path.read_text()
    assert text.startswith("#") and "dpo-sweep" in text.split("\nname:")[0], "header with the command"
    sp = space_mod.load(path)
    assert sp.trials


def test_readme_is_read_in_minutes():
    """At most 3,500 words, the two set-up commands, no commit ids (history lives in docs/ and git)."""
    import re

    assert len(README.split()) <= 3500
    assert "    make quickstart   #" in README and "    make test         #" in README
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", README)
    assert (ROOT / "docs" / "images" / "quickstart-report.png").is_file()

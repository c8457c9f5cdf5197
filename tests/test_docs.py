"""Every option is documented in the README, and every shipped space file validates."""
from pathlib import Path

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.config import (DataSpec, ModelSpec, ObjectivesSpec, ResourcesSpec, SamplerSpec, SyntheticData,
                              TrainSpec)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: The README and the topic documents under docs/ (a field may be documented in either).
DOCS = README + "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


@pytest.mark.parametrize("model", [ModelSpec, DataSpec, SyntheticData, TrainSpec, ResourcesSpec, SamplerSpec,
                                   ObjectivesSpec])
def test_every_space_field_is_in_the_readme(model):
    missing = [name for name in model.model_fields if f"`{name}`" not in DOCS and f" {name}:" not in DOCS
               and f"{{{name}:" not in DOCS]
    assert not missing, f"{model.__name__} fields not documented in README.md or docs/*.md: {missing}"


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_spaces_validate_and_have_a_header(path):
    text = path.read_text()
    assert text.startswith("#") and "dpo-sweep" in text.split("\nname:")[0], "header with the command"
    sp = space_mod.load(path)
    assert sp.trials

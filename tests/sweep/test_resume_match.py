"""--resume matches the folder's rows to the new space by what they measured (sweep/resume.py): new
values run, reordered or dropped ones change nothing, a changed setting is refused with exit 2."""
from __future__ import annotations

import copy

import pytest
import yaml

from dpo_sweep import space as space_mod
from dpo_sweep.errors import UserError
from dpo_sweep.records import failed_result, write_results
from dpo_sweep.sweep.output_dir import finished_trial_ids, prepare_output
from dpo_sweep.sweep.resume import match_rows, renamed_ids

BASE = {"name": "r", "model": {"preset": "tiny-llama"},
        "data": {"synthetic": {"pairs": 8, "prompt_tokens": 8, "response_tokens": 8}},
        "train": {"steps": 3, "warmup_steps": 1, "lr": 1.0e-4},
        "search": {"micro_batch": [2, 4], "checkpoint_level": ["none", "L2"]}}


def folder(tmp_path, raw, ids=None):
    """A results folder as a sweep of ``raw`` leaves it: space.yaml and a row per trial."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "space.yaml").write_text(yaml.safe_dump(raw))
    sp = space_mod.parse(raw)
    rows = [failed_result(t, "ok", "") for t in sp.trials]
    if ids is not None:  # rows under other ids (an earlier version's)
        rows = [r.__class__(**{**r.__dict__, "trial_id": i}) for r, i in zip(rows, ids)]
    write_results(out, rows)
    return out, sp


def changed(**sections):
    raw = copy.deepcopy(BASE)
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


def test_a_value_inserted_at_the_front_runs_only_the_new_configurations(tmp_path):
    out, old = folder(tmp_path, BASE)
    new = space_mod.parse(changed(search={"micro_batch": [1, 2, 4], "checkpoint_level": ["L2", "none"]}))
    match = match_rows(out, new)
    assert match.renamed == {}
    done = renamed_ids(finished_trial_ids(out), match.renamed)
    assert done == {t.trial_id for t in old.trials}
    assert {t.trial_id for t in new.trials} - done == {t.trial_id for t in new.trials if t.micro_batch == 1}


def test_a_dropped_value_keeps_its_rows(tmp_path):
    out, _ = folder(tmp_path, BASE)
    assert match_rows(out, space_mod.parse(changed(search={"micro_batch": [4], "checkpoint_level": ["none"]}))).renamed == {}


@pytest.mark.parametrize("sections, named", [
    ({"train": {"steps": 4}}, "train.steps: the rows ran 3, the space now says 4"),
    ({"model": {"preset": "llama-3.2-1b"}}, "model.preset: the rows ran 'tiny-llama', the space now says 'llama-3.2-1b'"),
    ({"data": {"synthetic": {"pairs": 9, "prompt_tokens": 8, "response_tokens": 8}}}, "data.synthetic.pairs: the rows ran 8"),
    # lr newly swept, the rows' own value not among the new ones
    ({"search": {**BASE["search"], "lr": [1.0e-3]}}, "train.lr: the rows ran 0.0001, the space now says 0.001"),
])
def test_a_change_of_what_rows_measured_is_refused(tmp_path, sections, named):
    out, _ = folder(tmp_path, BASE)
    with pytest.raises(UserError, match="--resume: the space changes what 4 row") as err:
        match_rows(out, space_mod.parse(changed(**sections)))
    assert named in str(err.value) and "without --resume the earlier results move to previous-" in str(err.value)


def test_a_newly_swept_field_renames_rows_to_their_configuration(tmp_path):
    out, old = folder(tmp_path, BASE)
    new = space_mod.parse(changed(search={**BASE["search"], "lr": [1.0e-4, 1.0e-3]}))
    match = match_rows(out, new)
    assert len(match.renamed) == 4 and all(v.endswith("_lr-0.0001") for v in match.renamed.values())
    done = prepare_output(tmp_path / "none.yaml", out, resume=True, renamed=match.renamed, space_text="x")
    assert done == set(match.renamed.values())


def test_rows_of_an_earlier_version_are_matched_through_their_recorded_order(tmp_path):
    # Numbered by place in the recorded lists, mb [2, 4] x [none, L2]: t001 was mb2 / L2.
    out, old = folder(tmp_path, BASE, ids=[f"t{i:03d}_{t.trial_id.split('_', 1)[1]}"
                                           for i, t in enumerate(space_mod.parse(BASE).trials)])
    new = space_mod.parse(changed(search={"micro_batch": [4, 2], "checkpoint_level": ["L2", "none"]}))
    match = match_rows(out, new)
    assert match.renamed["t001_mb2_L2_ga1_b0.1"] == next(
        t.trial_id for t in new.trials if (t.micro_batch, t.checkpoint_level) == (2, "L2"))
    assert renamed_ids(finished_trial_ids(out), match.renamed) == {t.trial_id for t in new.trials}


def test_rows_without_their_space_are_not_resumed_unless_accepted(tmp_path):
    """`run --resume --set train.steps=9` on rows whose space.yaml is gone, for real: exit 2 before
    Ray starts, naming the fix; the rows and the folder as they were."""
    import subprocess
    import sys

    from sweep_cluster import REPO

    raw = changed(train={"steps": 6})
    out, sp = folder(tmp_path, raw)
    (out / "space.yaml").unlink()
    space = tmp_path / "r.yaml"
    space.write_text(yaml.safe_dump(raw))
    before = (out / "results.csv").read_bytes()
    done = subprocess.run([sys.executable, "-m", "dpo_sweep", "run", str(space), "--output", str(out), "--resume",
                           "--set", "train.steps=9", "--no-dashboard"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip()
    assert err.startswith(f"error: --resume: {out / 'results.csv'} holds 4 row(s) but no space.yaml") and "\n" not in err
    assert "add --accept-rows" in err and "Ray" not in done.stdout
    assert (out / "results.csv").read_bytes() == before and not (out / "space.yaml").exists()
    # The user's word: the rows are kept as this space's (their ids are its configurations').
    assert match_rows(out, sp, accept_rows=True).renamed == dict(sp.renamed)


def test_rows_that_their_space_yaml_does_not_name_are_not_resumed_unless_accepted(tmp_path):
    out, _ = folder(tmp_path, BASE)
    other = changed(search={"micro_batch": [8], "checkpoint_level": ["L1"]})
    (out / "space.yaml").write_text(yaml.safe_dump(other))  # another sweep's space file put there
    with pytest.raises(UserError, match="holds 4 row\\(s\\) that its space.yaml does not name") as err:
        match_rows(out, space_mod.parse(BASE))
    assert "--accept-rows" in str(err.value)
    assert match_rows(out, space_mod.parse(BASE), accept_rows=True).renamed == {}

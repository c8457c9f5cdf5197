"""dpo_sweep/migrate.py: earlier spellings of space files and results folders, read as today's."""
import pytest

from dpo_sweep import migrate


@pytest.mark.parametrize("env, expected", [
    ({"gpu_memory_gb": 80.0}, 80.0),
    ({"gpus": [{"name": "H200", "memory_total_bytes": 143_771_000_000}]}, 143.771),
    ({"gpus": [{"name": "H200", "memory_gb": 150.1}]}, 150.1),  # what environment.json holds today
    ({"gpu": None, "host": "cpu-box"}, None),
    (None, None),
])
def test_gpu_memory_from_environment(env, expected):
    got = migrate.gpu_memory_gb(env)
    assert got == (pytest.approx(expected) if expected else None)


def test_the_old_step_time_objective_reads_as_throughput_the_other_way_round():
    spec = {"memory": "min", "step_time": "min"}
    assert migrate.has_step_time(spec) and migrate.without_step_time(spec) == {"memory": "min"}
    assert migrate.objective_as_today("step_time", "min", spec) == ("throughput", "max",
                                                                    "read from the old step_time: min")
    assert migrate.objective_as_today("memory", "min", spec) == ("memory", "min", "")
    both = {"throughput": "max", "step_time": "min"}  # the current name wins: step_time is then unknown
    assert not migrate.has_step_time(both)
    assert migrate.objective_as_today("step_time", "min", both) == ("step_time", "min", "")


def test_a_space_file_with_step_time_is_refused_with_the_fix():
    assert "throughput: max" in migrate.step_time_refusal({"step_time": "min"})
    assert migrate.step_time_refusal({"throughput": "max"}) is None


def test_the_note_line_names_the_old_objective_and_how_it_is_read():
    _, _, note = migrate.objective_as_today("step_time", "min", {"step_time": "min"})
    assert migrate.objective_note_line(note, "throughput", "max") == (
        "note: objectives.step_time: min of DIR/space.yaml read as throughput: max (the time objective is "
        "throughput now)")


def test_the_ids_a_trial_had_when_ids_were_numbered_by_place():
    assert migrate.positional_trial_ids(3, "t9a0c_mb2_none_ga1_b0.1_lr-0.0001") == ["t003_mb2_none_ga1_b0.1_lr-0.0001"]
    assert migrate.positional_trial_ids(3, "t9a0c_tiny-llama-5d1e_mb2_none_ga1_b0.1", "tiny-llama-5d1e",
                                        "tiny-llama-1") == ["t003_tiny-llama-1_mb2_none_ga1_b0.1",
                                                            "t003_mb2_none_ga1_b0.1"]

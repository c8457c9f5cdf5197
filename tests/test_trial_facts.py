"""dpo_sweep/core/trial_facts.py: one decision per fact of where and how a trial runs, torch-free."""
import subprocess
import sys

import pytest

from dpo_sweep.core import trial_facts
from dpo_sweep.config import ResourcesSpec, TrainSpec
from dpo_sweep.errors import UserError


def test_it_imports_without_torch():
    code = "import sys; import dpo_sweep.core.trial_facts; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.parametrize("device, use_gpu, cuda, expected", [
    ("auto", "auto", True, "cuda"), ("auto", "auto", False, "cpu"), ("cpu", "auto", True, "cpu"),
    ("auto", False, True, "cpu"), ("cuda", "auto", True, "cuda"), ("auto", True, True, "cuda"),
])
def test_device(device, use_gpu, cuda, expected):
    train, resources = TrainSpec(device=device), ResourcesSpec(use_gpu=use_gpu)
    assert trial_facts.device_type(train, resources, cuda) == expected


@pytest.mark.parametrize("device, use_gpu", [("cuda", "auto"), ("auto", True)])
def test_a_gpu_asked_for_where_there_is_none_is_refused(device, use_gpu):
    with pytest.raises(UserError, match="set use_gpu: auto"):
        trial_facts.device_type(TrainSpec(device=device), ResourcesSpec(use_gpu=use_gpu), cuda_available=False)


def test_attention():
    assert trial_facts.attention("auto", "cuda", flash_attn=True) == "flash_attention_2"
    assert trial_facts.attention("auto", "cuda", flash_attn=False) == "sdpa"
    assert trial_facts.attention("auto", "cpu", flash_attn=True) == "sdpa"
    assert trial_facts.attention("eager", "cuda", flash_attn=True) == "eager"
    assert trial_facts.planned_attention("auto") == "sdpa"


def test_a_level_whose_attention_is_a_region_needs_a_one_op_kernel():
    assert trial_facts.refused_attention("L2", "eager") and not trial_facts.refused_attention("L1", "eager")
    assert trial_facts.refused_attention("L3", "sdpa") is None


def test_rows_are_padded_to_64_on_cuda_and_not_on_the_cpu():
    assert trial_facts.pad_multiple(TrainSpec(max_length=2048), "cuda") == 64
    assert trial_facts.pad_multiple(TrainSpec(max_length=2048), "cpu") == 1
    assert trial_facts.pad_multiple(TrainSpec(max_length=32), "cuda") == 32  # never past max_length
    assert trial_facts.pad_multiple(TrainSpec(max_length=2048, pad_to_multiple_of=8), "cpu") == 8
    assert trial_facts.pad_multiple(TrainSpec(max_length=2048, pad_to_multiple_of=1), "cuda") == 1
    assert trial_facts.pad_multiple(TrainSpec(max_length=2048, padding_free=True), "cuda") == 1  # packed: no padding


@pytest.mark.parametrize("value", [0, -8, 4096])
def test_a_pad_multiple_outside_1_to_max_length_is_refused(value):
    with pytest.raises(ValueError, match=r"train.pad_to_multiple_of \(%d\) must be auto or a whole number from 1" % value):
        TrainSpec(max_length=2048, pad_to_multiple_of=value)

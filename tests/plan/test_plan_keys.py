"""The plan's keys write each value as canonical JSON, the scalars by a fast path that must agree
with json.dumps exactly (keys of one configuration built either way compare equal)."""
from __future__ import annotations

import json

import pytest

from dpo_sweep.plan.keys import MeasurementKey, canonical_json


@pytest.mark.parametrize("value", ["a", "é\n\"\\", "", 1, -5, 10**30, 0, True, False, None, 0.1, 1e-7, -0.0, 1.0, 2.5e300, 1e16,
                                   float("nan"), float("inf"), [1, "x", None], {"b": 1, "a": [2.5]}, ("t",)])
def test_canonical_json_is_json_dumps_sorted(value):
    assert canonical_json(value) == json.dumps(value, sort_keys=True, default=str)


def test_keys_compare_by_content_and_type():
    a = MeasurementKey.of({("train", "max_length"): 128, ("model", "preset"): "tiny"})
    b = MeasurementKey.of({("model", "preset"): "tiny", ("train", "max_length"): 128})
    assert a == b and hash(a) == hash(b)
    assert a != MeasurementKey.of({("train", "max_length"): "128", ("model", "preset"): "tiny"})
    assert a != MeasurementKey.of({("train", "max_length"): True, ("model", "preset"): "tiny"})

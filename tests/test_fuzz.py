"""Property tests: arbitrary bytes, JSON and --set strings either load or raise vitlab's own error; no other
exception escapes. A longer bounded run of the same targets: benchmarks/fuzz.py."""

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from fuzz_targets import (
    CONFIG_DICTS,
    SET_STRINGS,
    check_checkpoint_bytes,
    check_config,
    check_image_bytes,
    check_set_string,
    checkpoint_seeds,
    image_seeds,
    mutated,
)

QUICK = settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@QUICK
@given(mutated(image_seeds()))
def test_any_image_bytes_load_or_raise_a_vitlab_error(data):
    with tempfile.TemporaryDirectory() as folder:
        check_image_bytes(data, Path(folder))


@QUICK
@given(mutated(checkpoint_seeds()))
def test_any_checkpoint_bytes_load_or_raise_a_vitlab_error(data):
    with tempfile.TemporaryDirectory() as folder:
        check_checkpoint_bytes(data, Path(folder))


@QUICK
@given(CONFIG_DICTS)
def test_any_config_json_validates_or_raises_a_config_error(data):
    check_config(data)


@QUICK
@given(SET_STRINGS)
def test_any_set_string_applies_or_raises_a_config_error(assignment):
    check_set_string(assignment)

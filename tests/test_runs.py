"""vitlab.runs: a run's folder and its files."""

import time

from vitlab.runs import default_run_name


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """Two short runs of a script, one after the other within a second, once met the first one's folder and were
    refused ("already holds a run"): the second gets <dataset>-<time>-2."""
    monkeypatch.setattr(time, "strftime", lambda _format: "20261129-180302")
    first = default_run_name("digits", tmp_path)
    assert first == "digits-20261129-180302"
    (tmp_path / first).mkdir()
    assert default_run_name("digits", tmp_path) == "digits-20261129-180302-2"
    (tmp_path / "digits-20261129-180302-2").mkdir()
    assert default_run_name("digits", tmp_path) == "digits-20261129-180302-3"
    assert default_run_name("mnist", tmp_path) == "mnist-20261129-180302"

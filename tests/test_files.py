"""files.py: an atomic write leaves the old file or the new one, never a partial one or a stray temporary."""

import os

import pytest

from vitlab.files import atomic_write_bytes


def test_failed_atomic_write_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.bin"
    atomic_write_bytes(target, b"good")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_bytes(target, b"new and bigger")
    assert target.read_bytes() == b"good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.bin"]

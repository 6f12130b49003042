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


def test_recording_a_checksum_leaves_no_lock_file_in_the_folder(tmp_path):
    """Issue 38: an empty `.checksums.json.lock` stayed in every run folder; the lock is now the folder's own."""
    from vitlab.files import read_checksums, record_checksum

    record_checksum(tmp_path, "model.safetensors", "a" * 64)
    record_checksum(tmp_path, "model.safetensors", "b" * 64)
    assert read_checksums(tmp_path)["model.safetensors"][-1] == "b" * 64
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checksums.json"]

"""Checkpoint integrity without megatron: integrity.json records every file; a damaged newest
checkpoint (truncated, emptied, missing, or changed in place) falls back to the newest intact one
with a warning naming the file, a named iteration is refused, and legacy folders load unchecked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vepo_mcore.training.checkpointing import (
    INTEGRITY_FILE,
    LATEST_FILE,
    check_integrity,
    iteration_dir,
    resolve_checkpoint,
    write_integrity,
)


def _fake_checkpoint(save: Path, iteration: int, integrity: bool = True) -> Path:
    path = iteration_dir(save, iteration)
    (path / "tokenizer").mkdir(parents=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (path / "__0_0.distcp").write_bytes(bytes(range(256)) * 40 + bytes([iteration]))
    (path / "common.pt").write_bytes(b"common" * 50)
    (path / "tokenizer" / "tokenizer.json").write_text("{}")
    if integrity:
        write_integrity(path, {})
    (save / LATEST_FILE).write_text(str(iteration))
    return path


@pytest.fixture
def save(tmp_path) -> Path:
    for it in (2, 4, 6):
        _fake_checkpoint(tmp_path, it)
    return tmp_path


def _resolve(save: Path, **kwargs) -> tuple[Path | None, list[str]]:
    warnings: list[str] = []
    return resolve_checkpoint(save, warn=warnings.append, **kwargs), warnings


def test_integrity_records_every_file_with_size_and_hash(save):
    files = json.loads((iteration_dir(save, 6) / INTEGRITY_FILE).read_text())["files"]
    assert sorted(files) == ["__0_0.distcp", "common.pt", "metadata.json", "tokenizer/tokenizer.json"]
    assert files["__0_0.distcp"]["size"] == 10241 and len(files["__0_0.distcp"]["sha256"]) == 64
    assert _resolve(save) == (iteration_dir(save, 6), [])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "100 bytes, 10241 recorded"),
        (lambda p: p.write_bytes(b""), "0 bytes, 10241 recorded"),
        (lambda p: p.unlink(), "missing"),
    ],
)
def test_damaged_newest_falls_back_to_newest_intact_and_names_the_file(save, damage, why):
    damage(iteration_dir(save, 6) / "__0_0.distcp")
    path, warnings = _resolve(save)
    assert path == iteration_dir(save, 4)
    assert len(warnings) == 1 and "iter_0000006/__0_0.distcp" in warnings[0] and why in warnings[0]
    assert warnings[0].endswith(f"instead: {iteration_dir(save, 4)}")


def test_changed_bytes_are_caught_by_hashes_only(save):
    shard = iteration_dir(save, 6) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0xFF  # same size, one bit pattern flipped
    shard.write_bytes(bytes(data))
    assert _resolve(save) == (iteration_dir(save, 6), [])  # sizes alone cannot tell
    path, warnings = _resolve(save, verify_hashes=True)
    assert (
        path == iteration_dir(save, 4) and "SHA-256 differs" in warnings[0] and "__0_0.distcp" in warnings[0]
    )


def test_a_named_iteration_that_is_damaged_is_refused(save):
    (iteration_dir(save, 4) / "common.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"iter_0000004 is damaged: .*common.pt: 0 bytes, 300 recorded"):
        resolve_checkpoint(iteration_dir(save, 4))
    with pytest.raises(ValueError, match="common.pt: 0 bytes"):
        resolve_checkpoint(save, iteration=4)
    with pytest.raises(FileNotFoundError, match="iter_0000005 is not a checkpoint"):
        resolve_checkpoint(save, iteration=5)


def test_several_damaged_fall_back_past_all_of_them_and_none_intact_is_an_error(save):
    (iteration_dir(save, 6) / "common.pt").write_bytes(b"")
    (iteration_dir(save, 4) / "tokenizer" / "tokenizer.json").unlink()
    path, warnings = _resolve(save)
    assert path == iteration_dir(save, 2)
    assert "iter_0000006/common.pt" in warnings[0] and "iter_0000004/tokenizer/tokenizer.json" in warnings[0]
    (iteration_dir(save, 2) / INTEGRITY_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"holds no intact checkpoint: .*integrity.json: unreadable"):
        resolve_checkpoint(save, warn=lambda text: None)


def test_latest_pointer_damage_falls_back_to_the_folders(save):
    (save / LATEST_FILE).write_text("")
    path, warnings = _resolve(save)
    assert path == iteration_dir(save, 6) and "expected an iteration number" in warnings[0]
    (save / LATEST_FILE).unlink()
    path, warnings = _resolve(save)
    assert path == iteration_dir(save, 6) and "is missing beside 3 checkpoint(s)" in warnings[0]


def test_newer_folder_than_latest_is_not_used_and_stale_tmp_is_ignored(save):
    _fake_checkpoint(save, 8)
    (save / LATEST_FILE).write_text("6")
    (save / "iter_0000010.tmp").mkdir()
    assert _resolve(save) == (iteration_dir(save, 6), [])


def test_folders_without_integrity_file_load_unchecked(tmp_path):
    path = _fake_checkpoint(tmp_path, 3, integrity=False)
    (path / "common.pt").write_bytes(b"")
    assert check_integrity(path) is None
    assert _resolve(tmp_path) == (path, [])
    assert _resolve(tmp_path / "empty") == (None, [])

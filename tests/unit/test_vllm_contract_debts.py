"""The contract's debts (plugin/vllm_contract/kinds.py): each write of ours to a
vLLM private attribute and each vLLM ``__init__`` we skip is an entry of its
own kind, every such entry is named in the allow-list below, and the list
only shrinks (we own what we change of vLLM through its public methods; none
is the goal).

An entry of a debt kind that is not in the list fails; a listed one that is
gone fails too, so that a paid debt leaves the list with the code. And a
write the contract does not declare fails: the scan below reads our modules
for assignments, deletions and in-place changes (append, pop, ``[k] = v``...)
of a vLLM private member the contract lists for that module, or of any
private attribute of an object other than ``self``. What it cannot see, a
change through a private method of vLLM's, must be declared by hand as a
write of the attribute that method changes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vllm_uma.plugin.vllm_contract import ENTRIES, entries_of
from vllm_uma.plugin.vllm_contract.kinds import InstanceAttribute, PrivateWrite, SkippedInit

ROOT = Path(__file__).resolve().parents[2]
MANAGER = "vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager"
OFF = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"

# Every debt there is, named: remove a line when its debt is paid. Never add
# one without the lead's say: a new debt is a design to discuss first.
ALLOWED = {
    ("private write", f"{OFF}.scheduler.OffloadingConnectorScheduler._req_status"),
    (
        "skipped __init__",
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector."
        "OffloadingConnector.__init__",
    ),
    ("skipped __init__", "vllm.v1.worker.cpu_worker.CPUWorker.__init__"),
}


def debts(entries=ENTRIES) -> set[tuple[str, str]]:
    # A Members entry takes no debt (kinds.members refuses one), so every debt is here.
    return {(entry.debt, entry.name) for entry in entries if entry.debt}


def test_no_debt_beyond_the_allow_list():
    assert debts() - ALLOWED == set()


def test_a_paid_debt_leaves_the_allow_list():
    assert ALLOWED - debts() == set()


def test_a_new_private_write_fails_the_allow_list():
    extra = PrivateWrite(MANAGER.replace(".CPU", ":CPU"), "_policy", ("x",), "x", upstream="x")
    assert debts((*ENTRIES, extra)) - ALLOWED == {("private write", f"{MANAGER}._policy")}


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.debt], ids=lambda e: e.name)
def test_each_debt_names_its_upstream_fix(entry):
    assert isinstance(entry, PrivateWrite | SkippedInit)
    assert len(entry.upstream) > 20, "say which vLLM change would give a public way"


# -- the scan: every write to vLLM's private state is declared ----------------

MUTATORS = {
    "append",
    "appendleft",
    "add",
    "clear",
    "discard",
    "extend",
    "insert",
    "pop",
    "popitem",
    "popleft",
    "remove",
    "setdefault",
    "update",
}


def _changed(node: ast.AST) -> list[ast.expr]:
    """The expressions ``node`` changes: assignment and deletion targets, the
    object of an in-place method call."""
    if isinstance(node, ast.Assign | ast.Delete):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target] if not isinstance(node, ast.AnnAssign) or node.value else []
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in MUTATORS
    ):
        return [node.func.value]
    return []


def _attributes(target: ast.expr):
    """(base, name) of each private attribute along ``a.b[k].c``: changing
    ``x._a[k]`` or ``x._a.b`` changes what ``x._a`` holds."""
    while isinstance(target, ast.Attribute | ast.Subscript | ast.Starred):
        if isinstance(target, ast.Attribute) and target.attr.startswith("_"):
            if not target.attr.startswith("__"):
                base = target.value.id if isinstance(target.value, ast.Name) else None
                yield base, target.attr
        target = target.value


def writes(source: str) -> set[tuple[str | None, str]]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        for target in _changed(node):
            if isinstance(target, ast.Tuple | ast.List):
                for element in target.elts:
                    found.update(_attributes(element))
            else:
                found.update(_attributes(target))
    return found


def undeclared(module: str, source: str, entries=ENTRIES) -> set[str]:
    """Private attributes ``module`` changes that are vLLM's (a contract
    member of one of its entries) or another object's, without a
    PrivateWrite (or, in a skipped ``__init__``, the SkippedInit) saying so."""
    mine = entries_of(module, entries)  # a Members entry's members one by one
    vllms = {e.member for e in mine if e.member.startswith("_")}
    declared = {e.member for e in mine if isinstance(e, PrivateWrite)}
    for entry in mine:
        if isinstance(entry, SkippedInit):
            vllms |= entry.assigns
            declared |= entry.assigns
    return {
        name
        for base, name in writes(source)
        if (name in vllms or base not in ("self", "cls")) and name not in declared
    }


def _modules():
    for path in sorted((ROOT / "vllm_uma").rglob("*.py")):
        yield ".".join(path.relative_to(ROOT).with_suffix("").parts), path


@pytest.mark.parametrize("module, path", list(_modules()), ids=lambda x: str(x))
def test_every_write_to_vllms_private_state_is_declared(module, path):
    assert undeclared(module, path.read_text(encoding="utf-8")) == set()


READ = ("_policy", "_num_chunks", "_free_list")


def test_the_scan_sees_each_kind_of_write():
    manager = MANAGER.replace(".CPU", ":CPU")
    plain = [InstanceAttribute(manager, name, ("m",), "read") for name in READ]
    # The same members, _free_list declared as written.
    declared = [*plain[:2], PrivateWrite(manager, "_free_list", ("m",), "x", upstream="x")]
    source = """
def f(m, self):
    m._policy = None
    self._num_chunks += 1
    del m._events[0]
    self._free_list.pop()
    other._mine[0] = 1
    self._mine = 2
"""
    found = undeclared("m", source, plain)
    assert found == {"_policy", "_num_chunks", "_events", "_free_list", "_mine"}
    assert undeclared("m", source, declared) == {"_policy", "_num_chunks", "_events", "_mine"}

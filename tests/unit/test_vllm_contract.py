"""The vLLM contract (plugin/vllm_contract/): it holds here, each kind of entry can fail,
a failure is one line naming the member. The report command and the check's
cost, from processes of their own: tests/integration/test_vllm_contract_processes.py.

Failures are shown with scratch entries naming members vLLM does not have,
never by changing vLLM.
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

from vllm_uma.commands import engine_watch
from vllm_uma.plugin import vllm_contract
from vllm_uma.plugin.vllm_contract import ENTRIES, ContractError, require
from vllm_uma.plugin.vllm_contract.__main__ import report
from vllm_uma.plugin.vllm_contract.kinds import (
    Attribute,
    Fields,
    InstanceAttribute,
    Method,
    PrivateWrite,
    PublicNames,
    ReplacedBody,
    Text,
)
from vllm_uma.plugin.vllm_contract.members import members
from vllm_uma.plugin.vllm_version import SUPPORTED_VLLM

ROOT = Path(__file__).resolve().parents[2]
MANAGER = "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager"
SCRATCH = ("tests.scratch",)


LEAVES = [leaf for entry in ENTRIES for leaf in entry.leaves()]


@pytest.mark.parametrize("entry", LEAVES, ids=lambda e: f"{e.name}:{type(e).__name__}")
def test_every_entry_holds_on_the_installed_vllm(entry):
    assert entry.problem() is None


def test_every_entry_of_a_members_entry_holds_and_the_members_entry_too():
    for entry in ENTRIES:
        assert entry.problem() is None, entry.name


BROKEN = [
    (InstanceAttribute(MANAGER, "_free_lst", SCRATCH, "scratch"), "CPUOffloadingManager._free_lst"),
    (Attribute(MANAGER, "_no_such_attr", SCRATCH, "scratch"), "CPUOffloadingManager._no_such_attr"),
    (Method(MANAGER, "_free_chunk", SCRATCH, "scratch", ("block",)), "_free_chunk"),
    (Method(MANAGER, "_free_chunks", SCRATCH, "scratch", ("chunk",)), "_free_chunks"),
    (Text("vllm.v1.engine.core_client", "", SCRATCH, "x", text="no such line"), "core_client"),
    (Text("vllm.v1.no_such_module", "", SCRATCH, "x", text="x"), "vllm.v1.no_such_module"),
    (Text(MANAGER, "prepare_store", SCRATCH, "x", text="no such step"), "prepare_store"),
    (
        ReplacedBody(MANAGER, "__init__", SCRATCH, "x", assigns=frozenset({"_free_list"})),
        "CPUOffloadingManager.__init__",
    ),
    (
        Fields("vllm.v1.kv_offload.base:OffloadingEvent", "", SCRATCH, "x", names=("keys",)),
        "OffloadingEvent",
    ),
    (
        PublicNames("vllm.v1.core.sched.scheduler:Scheduler", "", SCRATCH, "x", names=frozenset()),
        "Scheduler",
    ),
    (InstanceAttribute("vllm.v1.no_such:Thing", "x", SCRATCH, "scratch"), "vllm.v1.no_such"),
]


@pytest.mark.parametrize("entry, named", BROKEN, ids=lambda x: getattr(x, "name", x))
def test_a_missing_member_fails_in_one_line_naming_it(entry, named):
    with pytest.raises(ContractError) as failure:
        require(SCRATCH[0], entries=(entry,))
    message = str(failure.value)
    assert "\n" not in message
    assert named in message and entry.name in message
    assert f"written against vLLM {SUPPORTED_VLLM}; installed is vLLM " in message
    assert message.endswith("See docs/upgrading_vllm.md.")


def _manager_members(*parts):
    return members(
        MANAGER,
        InstanceAttribute(MANAGER, "_free_list", SCRATCH, "scratch"),
        Method(MANAGER, "_free_chunk", ("tests.other",), "scratch", ("chunk",)),
        *parts,
    )


@pytest.mark.parametrize(
    "part, named",
    [
        (InstanceAttribute(MANAGER, "_free_lst", SCRATCH, "x"), "CPUOffloadingManager._free_lst"),
        (Method(MANAGER, "_free_chunk", SCRATCH, "x", ("block",)), "parameters (chunk)"),
        (Text(MANAGER, "prepare_store", SCRATCH, "x", text="no such step"), "no such step"),
    ],
    ids=lambda x: getattr(x, "member", x),
)
def test_a_changed_member_of_a_members_entry_fails_in_one_line_naming_it(part, named):
    grouped = _manager_members(part)
    with pytest.raises(ContractError) as failure:
        require(SCRATCH[0], entries=(grouped,))
    message = str(failure.value)
    assert "\n" not in message
    assert named in message and f"{part.name} changed" in message
    assert part.expected() in message
    assert "vllm-uma's tests.scratch expects" in message
    assert message.endswith("See docs/upgrading_vllm.md.")
    # The whole entry's problem names the member, and what was found, too.
    assert part.member in grouped.problem() and part.problem() in grouped.problem()


def test_a_members_entry_checks_for_a_module_only_the_members_naming_it():
    broken = Method(MANAGER, "_free_chunk", ("tests.other",), "scratch", ("block",))
    grouped = _manager_members(broken)
    assert [e.member for e in vllm_contract.entries_of(SCRATCH[0], (grouped,))] == ["_free_list"]
    require(SCRATCH[0], entries=(grouped,))
    with pytest.raises(ContractError, match=r"_free_chunk changed: vllm-uma's tests.other"):
        require("tests.other", entries=(grouped,))
    assert grouped.users == (*SCRATCH, "tests.other")


def test_a_members_entry_takes_only_plain_members_of_its_owner():
    plain = InstanceAttribute(MANAGER, "_free_list", SCRATCH, "x")
    for wrong in (
        InstanceAttribute("vllm.v1.core.block_pool:BlockPool", "blocks", SCRATCH, "x"),
        PrivateWrite(MANAGER, "_policy", SCRATCH, "x", upstream="x"),
        _manager_members(),
    ):
        with pytest.raises(ValueError, match="cannot be a member"):
            members(MANAGER, plain, wrong)
    with pytest.raises(ValueError, match="two or more"):
        members(MANAGER, plain)


def test_the_report_prints_a_members_entry_once_and_each_failed_member():
    good = _manager_members(Attribute(MANAGER, "_free_chunk", SCRATCH, "x"))
    bad = _manager_members(
        InstanceAttribute(MANAGER, "_free_lst", SCRATCH, "x"),
        Attribute(MANAGER, "_no_such_attr", SCRATCH, "x"),
    )
    out = io.StringIO()
    assert report((good, bad), out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "OK    vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager: the members _free_list, "
        "_free_chunk(chunk), _free_chunk (tests.scratch, tests.other)"
    )
    assert lines[1].startswith("FAIL  vLLM internal ") and "._free_lst changed" in lines[1]
    assert lines[2].startswith("FAIL  vLLM internal ") and "._no_such_attr changed" in lines[2]
    assert lines[3].startswith("1 of 2 entries hold") and "1 failed" in lines[3]


def test_an_entry_for_another_module_is_not_checked_by_this_one():
    broken = InstanceAttribute(MANAGER, "_free_lst", ("tests.other",), "scratch")
    good = InstanceAttribute(MANAGER, "_free_list", SCRATCH, "scratch")
    assert vllm_contract.entries_of(SCRATCH[0], (broken, good)) == [good]
    require(SCRATCH[0], entries=(broken, good))
    with pytest.raises(ContractError, match="_free_lst"):  # its own module's check fails
        require("tests.other", entries=(broken, good))


def test_a_module_without_entries_is_told_so():
    with pytest.raises(ValueError, match="no entry names it"):
        require("vllm_uma.nothing_here")


def test_the_report_prints_each_entry_and_counts_failures():
    broken = InstanceAttribute(MANAGER, "_free_lst", SCRATCH, "scratch")
    good = InstanceAttribute(MANAGER, "_free_list", SCRATCH, "scratch")
    out = io.StringIO()
    assert report((good, broken), out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(
        "OK    vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager._free_list"
    )
    assert lines[1].startswith("FAIL  vLLM internal ") and "_free_lst" in lines[1]
    assert lines[2].startswith("1 of 2 entries hold") and "1 failed" in lines[2]


def _calls_require(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:  # top level: runs at import
        if isinstance(node, ast.Expr) and ast.unparse(node.value) == (
            "vllm_contract.require(__name__)"
        ):
            return True
    return False


def test_every_module_an_entry_names_checks_it_at_import():
    users = {user for entry in LEAVES for user in entry.users}
    missing = [u for u in sorted(users) if not _calls_require(ROOT / f"{u.replace('.', '/')}.py")]
    assert not missing


def test_every_module_that_checks_at_import_has_entries():
    callers = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "vllm_uma").rglob("*.py")
        if _calls_require(path)
    }
    assert callers == {user for entry in LEAVES for user in entry.users}


def test_engine_watchs_log_lines_are_the_contracts():
    texts = {e.text for e in vllm_contract.entries_of("vllm_uma.commands.engine_watch")}
    assert texts == {
        engine_watch.MONITOR_LINE,
        engine_watch.STOP_LINE,
        f"class {engine_watch.ENGINE_DEAD}(",
    }

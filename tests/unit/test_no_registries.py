"""No module-level mutable registry in vllm_uma/ (issue 45, item 3).

State that two pieces share is passed to them (the engine's context,
vllm_uma/plugin/engine_context.py), not left in a module for the other to find.
This reads every module of the package (``ast``, nothing imported) and
fails on state a module keeps at run time:

- a module-level name bound to a mutable container (a dict, list or set
  literal or comprehension, ``dict()``, ``defaultdict()``,
  ``WeakValueDictionary()``, a lock, a ``ContextVar``, ...) that is written
  anywhere in the package (an item set or deleted, a mutating method
  called), or whose name is not an UPPER_CASE constant's;
- a module-level instance of one of the project's own classes that is not
  frozen (a frozen dataclass, an enum, a str, tuple or NamedTuple subclass);
- a class attribute bound to a mutable container;
- a ``global`` statement (a module's name rebound at run time);
- a module-level ``functools.cache``/``lru_cache`` (a process-wide cache).

What remains is state a process has once by nature (its signal handlers,
its exit, the ports it handed out) and two tables of names built by a class;
each is allowed below, with why. A constant table is an UPPER_CASE literal
nothing writes. (A table handed out
and written by whoever receives it escapes this reading; none is today.)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_uma"

MUTABLE_LITERALS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
MUTABLE_CALLS = {
    "dict",
    "list",
    "set",
    "bytearray",
    "defaultdict",
    "OrderedDict",
    "Counter",
    "deque",
    "ChainMap",
    "WeakValueDictionary",
    "WeakKeyDictionary",
    "WeakSet",
    "Queue",
    "SimpleQueue",
    "Lock",
    "RLock",
    "Event",
    "Condition",
    "Semaphore",
    "BoundedSemaphore",
    "local",
    "ContextVar",
}
MUTATORS = {
    "append",
    "extend",
    "insert",
    "remove",
    "pop",
    "popitem",
    "clear",
    "update",
    "setdefault",
    "add",
    "discard",
    "difference_update",
    "intersection_update",
    "symmetric_difference_update",
    "sort",
    "reverse",
    "set",  # a ContextVar's
}
CACHES = {"cache", "lru_cache"}
FROZEN_BASES = {
    "str",
    "int",
    "float",
    "bytes",
    "tuple",
    "frozenset",
    "NamedTuple",
    "Enum",
    "IntEnum",
    "StrEnum",
    "Flag",
    "IntFlag",
}

# "module.py:name" -> why it is process state by nature, not a registry.
ALLOWED = {
    "exit_without_collection.py:_exit_status": (
        "the status this process exits with: the exit handler is registered with atexit, "
        "which is process-wide, once"
    ),
    "startup_stop.py:_armed": (
        "whether this process's SIGTERM/SIGINT handlers are installed: signal handlers "
        "are process-wide"
    ),
    "startup_stop.py:_cleanups": (
        "what the process-wide signal handler runs before it exits; the handler has no "
        "other way to be handed it"
    ),
    "lifeline.py:_watching": (
        "one watch thread per kind per process: what is watched (this process's "
        "supervisor, its API server) is the process's own"
    ),
    "server_process.py:_handed_out": (
        "ports this process handed out, never twice: a port is the machine's, so every "
        "caller in the process must see the same set"
    ),
    "kv_offload/network/reply_bounds.py:_CURRENT": (
        "a ContextVar, one value per thread and task, not shared: valkey-py builds the "
        "parser and the connection, so the bounds reach them no other way"
    ),
    "plugin/precision.py:has_bf16_arithmetic": (
        "a cache of what this CPU can do: the same answer for the process's life"
    ),
    "plugin/vllm_contract/kinds.py:body_of": (
        "a cache of a parsed vLLM function: vLLM's source does not change while running"
    ),
}


@dataclass(frozen=True)
class Finding:
    where: str  # "module.py:name"
    line: int
    what: str

    def __str__(self) -> str:
        return f"vllm_uma/{self.where.split(':')[0]}:{self.line}: {self.what}"


def modules(root: Path = PACKAGE) -> dict[str, ast.Module]:
    return {
        path.relative_to(root).as_posix(): ast.parse(path.read_text(), str(path))
        for path in sorted(root.rglob("*.py"))
    }


def _name(node: ast.AST) -> str | None:
    """``f`` and ``a.b.f`` -> "f"; anything else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _frozen(cls: ast.ClassDef) -> bool:
    for decorator in cls.decorator_list:
        if isinstance(decorator, ast.Call) and _name(decorator.func) == "dataclass":
            for keyword in decorator.keywords:
                if keyword.arg == "frozen" and getattr(keyword.value, "value", False) is True:
                    return True
    return any(_name(base) in FROZEN_BASES for base in cls.bases)


def project_classes(trees: dict[str, ast.Module]) -> dict[str, bool]:
    """Class name -> mutable (a name two modules define is mutable if either is)."""
    classes: dict[str, bool] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = classes.get(node.name, False) or not _frozen(node)
    return classes


def _mutable_value(value: ast.AST | None, classes: dict[str, bool]) -> str | None:
    if isinstance(value, MUTABLE_LITERALS):
        return f"a {type(value).__name__} literal"
    if isinstance(value, ast.Call):
        name = _name(value.func)
        if name in MUTABLE_CALLS:
            return f"{name}()"
        if classes.get(name):
            return f"an instance of the project's mutable class {name}"
    return None


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def written_names(trees: dict[str, ast.Module]) -> set[str]:
    """Names whose items are set or deleted, or whose mutating methods are
    called, anywhere in the package (``X[k] = v``, ``del X[k]``, ``X.add(v)``,
    ``module.X.update(...)``)."""
    written: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
                if name := _name(node.value):
                    written.add(name)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in MUTATORS and (name := _name(node.func.value)):
                    written.add(name)
    return written


def findings(trees: dict[str, ast.Module]) -> list[Finding]:
    classes = project_classes(trees)
    written = written_names(trees)
    out: list[Finding] = []
    for module, tree in trees.items():
        for node in tree.body:
            what = _mutable_value(getattr(node, "value", None), classes)
            for name in _targets(node):
                constant = name.isupper() or name.lstrip("_").isupper()
                if what is None or name.startswith("__"):
                    continue
                if isinstance(node.value, MUTABLE_LITERALS) and constant and name not in written:
                    continue  # a constant table: UPPER_CASE, never written
                where = f"{module}:{name}"
                out.append(Finding(where, node.lineno, f"module-level {name} = {what}"))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if _name(target) in CACHES:
                        what = f"a process-wide cache on {node.name}"
                        out.append(Finding(f"{module}:{node.name}", node.lineno, what))
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                for name in node.names:
                    where = f"{module}:{name}"
                    out.append(Finding(where, node.lineno, f"global {name}, rebound at run time"))
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    what = _mutable_value(getattr(item, "value", None), {})
                    for name in _targets(item) if what else []:
                        where = f"{module}:{node.name}.{name}"
                        out.append(Finding(where, item.lineno, f"class attribute = {what}"))
    # One finding per name: a module that writes a global twice is one state.
    unique = {f.where: f for f in reversed(out)}
    return sorted(unique.values(), key=lambda f: (f.where, f.line))


def test_no_module_level_mutable_registry():
    found = [f for f in findings(modules()) if f.where not in ALLOWED]
    assert not found, (
        "module-level state in vllm_uma/ (pass it to what needs it instead: what the "
        "scheduler and the worker share is the engine's context, plugin/engine_context.py; "
        "a true constant is an UPPER_CASE literal nothing writes, or goes in ALLOWED "
        "here with the reason):\n" + "\n".join(map(str, found))
    )


def test_every_allowed_entry_is_still_there():
    # An allowance whose state is gone must go too, or it would hide a new one.
    present = {f.where for f in findings(modules())}
    assert sorted(set(ALLOWED) - present) == []


@pytest.mark.parametrize(
    "source, name",
    [
        ("class Pools:\n    pass\nPOOLS = Pools()\n", "POOLS"),
        ("SIZES = {}\ndef record(k, v):\n    SIZES[k] = v\n", "SIZES"),
        ("from weakref import WeakValueDictionary\n_live = WeakValueDictionary()\n", "_live"),
        ("_seen = set()\n", "_seen"),
        ("import collections\nBY_ID = collections.defaultdict(list)\n", "BY_ID"),
        ("_n = 0\ndef bump():\n    global _n\n    _n += 1\n", "_n"),
        ("import functools\n@functools.lru_cache\ndef f(x):\n    return x\n", "f"),
        ("class A:\n    instances = []\n", "A.instances"),
        ("TABLE = {'a': 1}\ndef f():\n    TABLE.update(b=2)\n", "TABLE"),
    ],
)
def test_the_scan_finds_each_kind_of_registry(source, name):
    found = findings({"m.py": ast.parse(source)})
    assert [f.where for f in found] == [f"m.py:{name}"]


@pytest.mark.parametrize(
    "source",
    [
        "LIMITS = {'a': 1}\n",  # a constant table, never written
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass P:\n    x: int\n"
        "NONE = P(0)\n",
        "import enum\nclass K(enum.Enum):\n    A = 1\nDEFAULT = K.A\n",
        "__all__ = ['f']\n",
        "def f():\n    seen = set()\n    seen.add(1)\n",  # local state
    ],
)
def test_the_scan_lets_constants_and_locals_be(source):
    assert findings({"m.py": ast.parse(source)}) == []

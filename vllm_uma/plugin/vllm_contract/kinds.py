"""The kinds of contract entry, and how each is checked against the installed vLLM.

Every check looks at vLLM itself, never at a copy of its answer:

- a class or module attribute, a dataclass or NamedTuple field: found on
  the class (``inspect.getattr_static`` through the MRO, or the dataclass's
  own field list);
- an instance attribute: vLLM sets it in ``__init__`` (or another method),
  so it exists only on an instance. Building a real instance is not cheap
  for any of ours (a Scheduler needs a whole VllmConfig; a
  CPUOffloadingManager would do, but one rule for all is easier to trust),
  so the check parses the method's source (``ast``) and looks for an
  assignment to ``self.<name>`` in the class or one of its vLLM bases;
- a method: ``inspect.signature``, parameter names exactly as listed (a
  new parameter may be a behaviour we do not pass on);
- a text (a log line we match, a step we mirror): present in the vLLM
  module's file (read, not imported) or in one function's source;
- a replaced body (a method we skip and redo): the attributes it assigns
  and the functions it calls, exactly;
- a class's public names: exactly the reviewed ones.

``Members`` (members.py) gathers the entries of one vLLM class or module
into one: each member is still an entry of its own kind, users and why,
checked as such, and a failure names that member alone.

Two kinds are debts (we own what we change of a library: we subclass or
wrap it through its public methods, never write its private attributes or
skip its ``__init__``), each checked like its plain twin and marked
``debt`` so that the report shows it and a unit test
(tests/unit/test_vllm_contract_debts.py) fails when one appears beyond its
explicit, shrinking allow-list:

- ``PrivateWrite``: our code changes a private attribute vLLM set
  (assigns, deletes from, or mutates it in place, itself or through a
  private method of vLLM's); checked as an ``InstanceAttribute``;
- ``SkippedInit``: an ``__init__`` of vLLM's we do not call and redo
  instead; checked as a ``ReplacedBody``.

Each names the upstream change that would give a public way (``upstream``).

Each check returns None when vLLM matches, else what it found instead.
Nothing here imports vLLM until an entry is checked, and then only the
entry's own module (already imported by the module that relies on it).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar


def resolve(owner: str):
    """``"package.module:Qual.Name"`` -> the object; ``"package.module"`` -> the module."""
    module_name, _, qualname = owner.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def _static(cls, name: str):
    """``name`` as defined on ``cls`` or a base (no descriptor run), or a KeyError."""
    for klass in inspect.getmro(cls) if inspect.isclass(cls) else (cls,):
        if name in vars(klass):
            return vars(klass)[name]
    raise KeyError(name)


def _function(obj):
    for unwrap in (staticmethod, classmethod):
        if isinstance(obj, unwrap):
            return obj.__func__
    if isinstance(obj, property):
        return obj.fget
    return obj


def _dotted(node: ast.AST) -> str | None:
    """``self.a.b`` -> "self.a.b"; ``super().__init__`` -> "super().__init__"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, ast.Call):
        base = _dotted(node.func)
        return None if base is None else f"{base}()"
    return None


@dataclass(frozen=True)
class Body:
    assigns: frozenset[str]  # "x" for self.x = ..., "a.b" for self.a.b = ...
    calls: frozenset[str]  # dotted names of what it calls


@functools.cache
def body_of(function) -> Body:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    assigns, calls = set(), set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and (name := _dotted(node.func)):
            calls.add(name)
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif (name := _dotted(target)) and name.startswith("self."):
                assigns.add(name.removeprefix("self."))
    return Body(frozenset(assigns), frozenset(calls))


@dataclass(frozen=True)
class Entry:
    owner: str  # "vllm.module:Class" or "vllm.module"
    member: str
    users: tuple[str, ...]  # our modules that rely on it (each checks it at import)
    why: str
    # Set by the debt kinds (PrivateWrite, SkippedInit): what kind of debt.
    debt: ClassVar[str | None] = None

    @property
    def name(self) -> str:
        owner = self.owner.replace(":", ".")
        return f"{owner}.{self.member}" if self.member else owner

    def leaves(self) -> tuple[Entry, ...]:
        """The entries checked one by one: this one (a ``Members`` has several)."""
        return (self,)

    def expected(self) -> str:
        raise NotImplementedError

    def problem(self) -> str | None:
        """None when vLLM matches; else what was found instead."""
        try:
            return self._check()
        except (ImportError, AttributeError, KeyError, OSError, TypeError, ValueError) as exc:
            return " ".join(f"{type(exc).__name__}: {exc}".split())

    def _check(self) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Attribute(Entry):
    """A class attribute, property, dataclass/NamedTuple field, or module attribute."""

    def expected(self) -> str:
        return "an attribute of the class (or module)"

    def _check(self) -> str | None:
        owner = resolve(self.owner)
        if self.member in getattr(owner, "__dataclass_fields__", {}):
            return None
        try:
            _static(owner, self.member)
        except KeyError:
            return "no such attribute"
        return None


@dataclass(frozen=True)
class InstanceAttribute(Entry):
    """``self.<member>`` assigned by vLLM in ``method`` of the class or a vLLM base."""

    method: str = "__init__"

    def expected(self) -> str:
        return f"an instance attribute set in {self.method}"

    def _check(self) -> str | None:
        owner = resolve(self.owner)
        for klass in inspect.getmro(owner):
            if not klass.__module__.startswith("vllm.") or self.method not in vars(klass):
                continue
            if self.member in body_of(_function(vars(klass)[self.method])).assigns:
                return None
        return f"no assignment to self.{self.member} in any vLLM {self.method} of its MRO"


@dataclass(frozen=True)
class Method(Entry):
    """A method or function whose parameters (after self/cls) are exactly ``params``."""

    params: tuple[str, ...] = ()

    def expected(self) -> str:
        return f"a method with parameters ({', '.join(self.params)})"

    def _check(self) -> str | None:
        owner = resolve(self.owner)
        try:
            raw = _static(owner, self.member)
        except KeyError:
            return "no such method"
        function = _function(raw)
        if not callable(function):
            return f"not a method but {type(raw).__name__}"
        names = list(inspect.signature(function).parameters)
        if inspect.isclass(owner) and not isinstance(raw, staticmethod) and names:
            names = names[1:]  # self or cls
        if tuple(names) != self.params:
            return f"parameters ({', '.join(names)})"
        return None


@dataclass(frozen=True)
class Text(Entry):
    """``text`` in vLLM's source: the module's file (``member`` empty, read
    without importing it), or the source of ``owner``'s ``member``."""

    text: str = ""

    def expected(self) -> str:
        return f"the text {self.text!r} in its source"

    def _check(self) -> str | None:
        if self.member:
            source = inspect.getsource(_function(_static(resolve(self.owner), self.member)))
        else:
            path = module_file(self.owner)
            if path is None:
                return "no such module file"
            source = path.read_text(encoding="utf-8")
        return None if self.text in source else "the text is not there"


def module_file(module: str) -> Path | None:
    """The source file of ``module``, found without importing it or its packages
    (importing vllm.v1.engine alone takes seconds)."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations)), *parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class ReplacedBody(Entry):
    """A vLLM method we skip and redo ourselves: what it assigns and calls, exactly."""

    assigns: frozenset[str] = frozenset()
    calls: frozenset[str] = frozenset()

    def expected(self) -> str:
        return f"a body assigning self.{{{', '.join(sorted(self.assigns))}}} and calling " + (
            f"{{{', '.join(sorted(self.calls))}}}"
        )

    def _check(self) -> str | None:
        owner = resolve(self.owner)
        if self.member not in vars(owner):
            return f"{owner.__name__} no longer defines {self.member}"
        body = body_of(_function(vars(owner)[self.member]))
        changes = [
            f"{what} {sorted(names)}"
            for what, names in (
                ("now also assigns", body.assigns - self.assigns),
                ("no longer assigns", self.assigns - body.assigns),
                ("now also calls", body.calls - self.calls),
                ("no longer calls", self.calls - body.calls),
            )
            if names
        ]
        return "; ".join(changes) or None


@dataclass(frozen=True)
class Fields(Entry):
    """A dataclass whose fields are exactly ``names`` (we copy them one by one)."""

    names: tuple[str, ...] = ()

    def expected(self) -> str:
        return f"dataclass fields exactly ({', '.join(self.names)})"

    def _check(self) -> str | None:
        found = tuple(f.name for f in dataclasses.fields(resolve(self.owner)))
        return None if found == self.names else f"fields ({', '.join(found)})"


@dataclass(frozen=True)
class PublicNames(Entry):
    """A class whose public names (methods, properties) are exactly the reviewed ones."""

    names: frozenset[str] = frozenset()

    def expected(self) -> str:
        return f"exactly the {len(self.names)} reviewed public names"

    def _check(self) -> str | None:
        found = public_names(resolve(self.owner))
        changes = [
            f"{what} {sorted(names)}"
            for what, names in (
                ("new, not reviewed:", found - self.names),
                ("gone:", self.names - found),
            )
            if names
        ]
        return "; ".join(changes) or None


def public_names(cls) -> frozenset[str]:
    """Every public method and property of ``cls`` and its bases (not object's)."""
    return frozenset(
        name
        for klass in inspect.getmro(cls)
        if klass is not object
        for name, value in vars(klass).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    )


@dataclass(frozen=True)
class PrivateWrite(InstanceAttribute):
    """A private attribute vLLM sets (in ``method``) that our code changes: a
    debt. ``upstream`` names the vLLM change that would give a public way."""

    upstream: str = ""
    debt: ClassVar[str | None] = "private write"

    def expected(self) -> str:
        return f"{super().expected()}; a debt: we write it (upstream fix: {self.upstream})"


@dataclass(frozen=True)
class SkippedInit(ReplacedBody):
    """An ``__init__`` of vLLM's we skip and redo: a debt. ``upstream`` names
    the vLLM change that would let us call it."""

    upstream: str = ""
    debt: ClassVar[str | None] = "skipped __init__"

    def expected(self) -> str:
        return f"{super().expected()}; a debt: we skip it (upstream fix: {self.upstream})"

"""One entry for several members of one vLLM class or module.

The contract lists each member we rely on with its own shape, users and
why; a class we use a dozen members of is still one thing to re-read on an
upgrade. ``members(owner, ...)`` makes them one entry (one line of the
report) without making the check any weaker: each member is still checked
as the entry it is, only for the modules it names, and a failure names
that member, what we expect of it and which module of ours relies on it.
A debt (kinds.PrivateWrite, SkippedInit) stays an entry of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_uma.plugin.vllm_contract.kinds import Entry, Method, PublicNames, ReplacedBody, Text


@dataclass(frozen=True)
class Members(Entry):
    """Several members of one vLLM class or module, as one entry: each is an
    entry of its own (kind, users, why) and checked as such, so that a
    failure names the member, what we expect of it and which of our modules
    relies on it. Built by ``members``; never a debt (each debt stays an entry
    of its own, counted and on the allow-list)."""

    parts: tuple[Entry, ...] = ()

    def leaves(self) -> tuple[Entry, ...]:
        return self.parts

    def expected(self) -> str:
        return "the members " + ", ".join(_shape(part) for part in self.parts)

    def problem(self) -> str | None:
        found = [
            f"{_shape(part)}: {problem}"
            for part in self.parts
            if (problem := part.problem()) is not None
        ]
        return "; ".join(found) or None


def members(owner: str, *parts: Entry) -> Members:
    """One entry for ``parts``, every one a member of ``owner`` (no debt among
    them); its users are theirs."""
    for part in parts:
        if part.owner != owner or part.debt or isinstance(part, Members):
            raise ValueError(
                f"{part.name} cannot be a member of {owner}'s entry: a member has the same "
                f"owner and is no debt and no group; list it as an entry of its own."
            )
    if len(parts) < 2:
        raise ValueError(f"{owner}: a Members entry gathers two or more entries, not {len(parts)}")
    users = tuple(dict.fromkeys(user for part in parts for user in part.users))
    return Members(owner, "", users, "each member says why", parts=parts)


def _shape(part: Entry) -> str:
    """A member, short, in a Members entry's report line: ``name(params)``,
    ``name body``, ``text 'abc…'``, ``name``."""
    if isinstance(part, Method):
        return f"{part.member}({', '.join(part.params)})"
    if isinstance(part, Text):
        short = " ".join(part.text.split())
        short = short if len(short) <= 40 else short[:39] + "…"
        return f"{part.member + ' ' if part.member else ''}text {short!r}"
    if isinstance(part, ReplacedBody):
        return f"{part.member} body"
    if isinstance(part, PublicNames):
        return f"the {len(part.names)} reviewed public names"
    return part.member or part.expected()

"""``python -m vllm_uma.plugin.vllm_contract``: check every entry, print a report.

Exit status 0 when the installed vLLM matches every entry, 1 otherwise.
Run it first after changing the vLLM version (docs/upgrading_vllm.md).
"""

from __future__ import annotations

import sys

from vllm_uma.plugin.vllm_contract import DOC, ENTRIES, failure_line
from vllm_uma.plugin.vllm_version import SUPPORTED_VLLM, installed_vllm_version


def report(entries=ENTRIES, out=sys.stdout) -> int:
    """Print one line per entry; the number of failures. A debt (a private
    write, a skipped ``__init__``: kinds.py) is marked where it is listed and
    counted at the end."""
    failures = 0
    for entry in entries:
        # A Members entry's members are checked one by one: each failure is
        # its own line, naming the member.
        found = [(leaf, problem) for leaf in entry.leaves() if (problem := leaf.problem())]
        if not found:
            mark = f"[{entry.debt}] " if entry.debt else ""
            users = ", ".join(entry.users)
            print(f"OK    {mark}{entry.name}: {entry.expected()} ({users})", file=out)
        else:
            failures += 1
            for leaf, problem in found:
                print(f"FAIL  {failure_line(leaf, problem)}", file=out)
    debts = [entry.debt for entry in entries if entry.debt]
    if debts:
        kinds = ", ".join(f"{debts.count(d)} {d}" for d in sorted(set(debts)))
        print(f"Debts to vLLM's private state: {kinds} (each says its upstream fix).", file=out)
    # The count last: scripts read the last line.
    print(
        f"{len(entries) - failures} of {len(entries)} entries hold on vLLM "
        f"{installed_vllm_version()} (the contract is written against {SUPPORTED_VLLM})"
        + (f"; {failures} failed: see {DOC}." if failures else "."),
        file=out,
    )
    return failures


def main() -> int:
    return 1 if report() else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m vllm_uma.plugin.vllm_contract``: check every entry, print a report.

Exit status 0 when the installed vLLM matches every entry, 1 otherwise.
Run it first after changing the vLLM version (docs/upgrading_vllm.md).
"""

from __future__ import annotations

import sys

from vllm_uma.plugin.vllm_contract import DOC, ENTRIES, failure_line
from vllm_uma.plugin.vllm_version import SUPPORTED_VLLM, installed_vllm_version


def report(entries=ENTRIES, out=sys.stdout) -> int:
    """Print one line per entry; the number of failures."""
    failures = 0
    for entry in entries:
        found = entry.problem()
        if found is None:
            print(f"OK    {entry.name}: {entry.expected()} ({', '.join(entry.users)})", file=out)
        else:
            failures += 1
            print(f"FAIL  {failure_line(entry, found)}", file=out)
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

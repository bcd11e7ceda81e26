"""TLS to the KV server (``valkeys://``, ``rediss://``): the client's context,
and what a failed connection means.

Engine-core process (and ``vllm-uma kv-store``), on whichever thread opens
a connection (server_nodes.py's ``TlsConnection``). No valkey import here:
the settings (API-server process) load the files through ``client_context``
too, before the engine core starts.

- The KV server's certificate must verify against ``tls_ca_file`` (the
  system's CAs without it) and name the host as the url, or a cluster's
  map, names it. No setting turns either off: a certificate that is not
  checked lets anyone on the path read every prompt's KV and get the
  password, which is what TLS is asked for to prevent.
- A client certificate (``tls_cert_file``, ``tls_key_file``) for a KV server
  that asks for one: Redis and Valkey do by default (``tls-auth-clients yes``).
- The context is built at each connection, as the password is read
  (credentials.py): a renewed certificate needs no restart.

A failure is said with its reason and fix (``explain``). At start-up a
link that fails the way a wrong transport does is probed
(``wrong_transport``), so that a TLS url to a plain KV server, or a plain url
to a TLS port, refuses the start with the fix instead of a warning that
the KV server "did not answer" and a retry every 2 s forever.
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_uma.kv_offload.network.settings import NetworkTierSettings

# OpenSSL's verify codes for a certificate that does not name the host.
HOSTNAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


class NoHandshake(OSError):
    """The KV server accepted the connection but did not answer the TLS
    handshake within the connect timeout."""


def client_context(settings: NetworkTierSettings) -> ssl.SSLContext:
    """Verification on, TLS 1.2 or later (the default context's rules)."""
    context = ssl.create_default_context(cafile=settings.tls_ca_file)
    if settings.tls_cert_file is not None:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


def handshake(settings: NetworkTierSettings, sock: socket.socket, host: str) -> ssl.SSLSocket:
    """``sock`` (connected, its timeout the connect timeout) over TLS."""
    try:
        return client_context(settings).wrap_socket(sock, server_hostname=host)
    except TimeoutError:
        raise NoHandshake(
            f"no answer to the TLS handshake in {sock.gettimeout():g} s (connect_timeout_s)"
        ) from None


def _chain(exc: BaseException):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first(exc: BaseException, kind: type | tuple[type, ...]) -> BaseException | None:
    return next((e for e in _chain(exc) if isinstance(e, kind)), None)


def explain(exc: BaseException, settings: NetworkTierSettings, url: str) -> str | None:
    """What a TLS failure in ``exc``'s chain means, with the fix; None if
    the failure is not about TLS."""
    if not settings.tls:
        return None
    ca = settings.tls_ca_file or "the system's CAs"
    bad_cert = _first(exc, ssl.SSLCertVerificationError)
    if bad_cert is not None:
        why = bad_cert.verify_message or str(bad_cert)
        if bad_cert.verify_code in HOSTNAME_MISMATCH:
            return (
                f"the KV server at {url} presented a certificate not valid for the host it was "
                f"reached by ({why}): the certificate must name that host in its "
                f"subjectAltName (an IP: entry for an address, as a cluster's map gives them). "
                f"Reissue it, or name the KV server in the url as its certificate does."
            )
        return (
            f"the KV server at {url} presented a certificate that does not verify against "
            f"{ca} ({why}): set tls_ca_file to the PEM file of the CA that signed the "
            f"KV server's certificate."
        )
    if _first(exc, NoHandshake) is not None:
        return (
            f"the KV server at {url} did not answer the TLS handshake in "
            f"{settings.connect_timeout_s:g} s (connect_timeout_s): a plain KV server on that "
            f"port waits for a command and never answers one. Name its TLS port "
            f"(tls-port), or use valkey:// if it has no TLS."
        )
    tls_error = _first(exc, ssl.SSLError)
    if tls_error is None:
        return None
    reason = getattr(tls_error, "reason", None) or str(tls_error)
    if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason:
        return _needs_client_cert(url, reason)
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason:
        return (
            f"the KV server at {url} answered the TLS handshake with something that is not "
            f"TLS ({reason}): the port serves plain connections. Name its TLS port "
            f"(tls-port), or use valkey:// if it has no TLS."
        )
    maybe = ""
    if isinstance(tls_error, ssl.SSLEOFError) and settings.tls_cert_file is None:
        maybe = " (a KV server that asks for a client certificate closes so: tls_cert_file)"
    return (
        f"the TLS connection to the KV server at {url} failed ({reason}){maybe}: check the "
        f"KV server's TLS settings against tls_ca_file={settings.tls_ca_file!r} and "
        f"tls_cert_file={settings.tls_cert_file!r}."
    )


def _needs_client_cert(url: str, reason: str) -> str:
    return (
        f"the KV server at {url} refused the TLS connection ({reason}): it asks for a "
        f"client certificate (tls-auth-clients yes, the KV server's default). Set "
        f"tls_cert_file and tls_key_file to a certificate its tls-ca-cert-file signed."
    )


def wrong_transport(
    settings: NetworkTierSettings, host: str, port: int, url: str, exc: BaseException
) -> str | None:
    """At start-up, ``exc`` a failed link to ``host:port``: the reason to
    refuse the start, or None for a KV server that is merely gone (served
    without, retried)."""
    if settings.tls:
        if _first(exc, NoHandshake) is not None:
            if _speaks_plain(host, port, settings.connect_timeout_s):
                return (
                    f"the KV server at {url} serves plain connections on port {port}, not TLS "
                    f"(it answered a PING in the clear): name its TLS port (tls-port), or use "
                    f"valkey:// if it has no TLS."
                )
            return None  # no answer to either: slow or gone, not a wrong transport
        if _closed(exc) and _first(exc, ssl.SSLCertVerificationError) is None:
            alert = _alert_after_handshake(settings, host, port)
            if alert is not None and "CERTIFICATE_REQUIRED" in alert:
                return _needs_client_cert(url, alert)
        return explain(exc, settings, url)
    if _closed(exc) and _speaks_tls(host, port, settings.connect_timeout_s):
        scheme = "rediss" if settings.scheme == "redis" else "valkeys"
        return (
            f"the KV server at {url} closed the connection on the first command: its port "
            f"{port} serves TLS only (it answered a TLS handshake). Use {scheme}:// in the "
            f"url, with tls_ca_file naming the CA of its certificate."
        )
    return None


def _closed(exc: BaseException) -> bool:
    """The KV server closed the connection, rather than not answering."""
    kinds = (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError)
    return _first(exc, kinds) is not None or "closed by server" in str(exc)


def _alert_after_handshake(settings: NetworkTierSettings, host: str, port: int) -> str | None:
    """The TLS alert a KV server sends once the handshake is done, if any.
    TLS 1.3 refuses a missing client certificate only then, and a
    connection that had sent its first command may never read the alert
    (the KV server closes with bytes unread: a reset). This one sends nothing
    and reads, so the alert arrives before the close."""
    try:
        with socket.create_connection((host, port), timeout=settings.connect_timeout_s) as sock:
            with client_context(settings).wrap_socket(sock, server_hostname=host) as tls_sock:
                tls_sock.recv(1)
    except ssl.SSLError as exc:
        return exc.reason or str(exc)
    except OSError:
        return None
    return None


def _speaks_plain(host: str, port: int, timeout: float) -> bool:
    """A RESP reply to a PING in the clear. The PING carries nothing secret
    (no password, no key); it is sent only after the TLS handshake found no
    answer, to say which fix applies."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(16)
    except OSError:
        return False
    # Every RESP reply to it starts so (+PONG, -NOAUTH, -ERR); a TLS record never does.
    return reply[:1] in (b"+", b"-")


def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """A TLS handshake answered, its certificate not checked: nothing is
    sent over it, it only says that the port speaks TLS."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with context.wrap_socket(sock, server_hostname=host):
                return True
    except ssl.SSLError as exc:
        return "ALERT" in (exc.reason or "")  # the KV server answered with a TLS alert
    except OSError:
        return False

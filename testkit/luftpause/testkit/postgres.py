"""A throwaway PostgreSQL server for tests and benchmarks: Debian's `postgresql` binaries,
`initdb` on a temporary directory, `pg_ctl` on a free loopback port.

Shell module (processes and files). As root, the cluster belongs to the `postgres` system user
(PostgreSQL refuses to run as root) and every command runs as that user; otherwise as the caller.
`Postgres.url` is a `postgresql://` URL for the `luftpause` database; `restart` and `stop`
are `pg_ctl`'s, so a test can take the server away under load and bring it back on the same
port and data. Nothing is left behind: `close` stops the server and removes the directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from luftpause.testkit.procs import free_port

DATABASE = "luftpause"
_SYSTEM_USER = "postgres"
_START_SECONDS = 60


class PostgresMissing(RuntimeError):
    """Debian's postgresql is not installed (the Makefile's install path installs it)."""


def bin_dir() -> Path:
    """The newest installed PostgreSQL's bin directory."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_major)
    if not found:
        raise PostgresMissing("no /usr/lib/postgresql/*/bin/pg_ctl: apt-get install postgresql")
    return Path(found[-1]).parent


def _major(path: str) -> int:
    return int(Path(path).parent.parent.name)


@dataclass
class Postgres:
    """One cluster on a temporary directory; `start` it, `close` it."""

    port: int
    root: Path
    fsync: bool = True

    @classmethod
    def create(cls, *, fsync: bool = True) -> Postgres:
        """A new cluster (initdb'd, not started) on a free port."""
        root = Path(tempfile.mkdtemp(prefix="luftpause-pg-"))
        pg = cls(port=free_port(), root=root, fsync=fsync)
        try:
            pg._initdb()
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return pg

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://{_SYSTEM_USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(bin_dir() / argv[0]), *argv[1:]],
            check=check,
            capture_output=True,
            text=True,
            timeout=_START_SECONDS,
            user=_SYSTEM_USER if os.geteuid() == 0 else None,
        )

    def _initdb(self) -> None:
        if os.geteuid() == 0:
            owner = pwd.getpwnam(_SYSTEM_USER)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", _SYSTEM_USER, "-A", "trust", "-E", "UTF8", "-N"
        )
        conf = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.root}'",
            f"fsync = {'on' if self.fsync else 'off'}",
            "max_connections = 100",
            "shared_buffers = 64MB",
            "log_min_messages = warning",
        ]
        with (self.data / "postgresql.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")

    def start(self) -> Postgres:
        """Start the server and wait until it accepts connections; make the database once."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-t", str(_START_SECONDS), "start")  # fmt: skip
        exists = self._psql("SELECT 1 FROM pg_database WHERE datname = 'luftpause'")
        if exists.stdout.strip() != "1":
            self._psql(f"CREATE DATABASE {DATABASE}", database="postgres")
        return self

    def _psql(self, sql: str, database: str = "postgres") -> subprocess.CompletedProcess[str]:
        return self._run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", _SYSTEM_USER,
                         "-d", database, "-tAc", sql)  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`pg_ctl stop -m mode`): fast closes connections, immediate crashes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", mode, "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

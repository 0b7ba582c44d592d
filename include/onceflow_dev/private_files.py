"""Files that hold secrets (the stack's credential store, the TLS stores' password, a broker's configuration, the
embedded Airflow's admin password): readable by their owner only from the moment they exist."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, mode 0600 from creation (never briefly readable by others, whatever the umask), and
    atomically: a temporary file in the same directory, renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask, and a leftover file keeps its old mode
        with os.fdopen(fd, "w") as f:
            fd = -1
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise

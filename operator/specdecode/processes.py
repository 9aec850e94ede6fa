"""Whether a process still runs, for code that cleans up after processes that may be gone
(the operator's discovery cache files, the local stack's components)."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    # A zombie still answers signal 0 but is gone for every practical purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return False

"""Named crash points for `specdecode bench faults`: with SPECDECODE_CRASH_AT=<point> in its
environment the operator SIGKILLs itself the first time it reaches that point, so the
benchmark can kill it exactly between two writes (a decision in status but the Deployment not
yet changed; the Deployment changed but status not yet written). Unset, as always in
production, `reach` does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "SPECDECODE_CRASH_AT"
DECISION_IN_STATUS = "decision-in-status"
"""The evaluator wrote a decision into status and has not re-rendered the Deployment."""
DEPLOYMENT_APPLIED = "deployment-applied"
"""A reconcile applied a changed Deployment and has not written status."""
POINTS = (DECISION_IN_STATUS, DEPLOYMENT_APPLIED)


def reach(point: str) -> None:
    if os.environ.get(ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)

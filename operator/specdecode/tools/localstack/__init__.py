"""The local stack: a real Kubernetes control plane with fake GPU nodes, built from Go modules.

`build` compiles and caches the binaries, `manifests` renders the configuration (pure),
`cluster` starts and stops a cluster. Tests, `specdecode cluster` and the demo share them.
"""

from specdecode.tools.localstack.build import Binaries, BuildError, ensure_binaries
from specdecode.tools.localstack.cluster import ClusterError, ClusterInfo, ClusterStatus, LocalCluster
from specdecode.tools.localstack.manifests import (CRASH_BACKOFF_ANNOTATION, FAIL_AFTER_ANNOTATION,
                                             FAIL_CONTAINER_ANNOTATION, FAIL_STARTUP_ANNOTATION,
                                             READY_DELAY_ANNOTATION, ClusterSpec)

__all__ = [
    "Binaries", "BuildError", "ensure_binaries",
    "ClusterError", "ClusterInfo", "ClusterStatus", "LocalCluster", "ClusterSpec",
    "FAIL_STARTUP_ANNOTATION", "FAIL_CONTAINER_ANNOTATION", "READY_DELAY_ANNOTATION",
    "FAIL_AFTER_ANNOTATION", "CRASH_BACKOFF_ANNOTATION",
]

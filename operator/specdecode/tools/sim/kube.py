"""Watch the Kubernetes API for the vLLM pods the operator manages; feed the simulator.

`pod_info` turns a pod (the kubernetes client's V1Pod or its dict form) into a `PodInfo`:
pure, unit-tested. `PodWatcher` lists and then watches pods labelled
`app.kubernetes.io/managed-by=specdecode-operator` in the given namespaces (or all), sends
each full list to `Simulator.sync` and every event to `upsert`/`remove`, relists when the
watch expires (410 Gone) and backs off on API errors.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

from specdecode import constants as C
from specdecode.tools.sim.fleet import PodInfo

log = logging.getLogger(__name__)

LABEL_SELECTOR = f"{C.LABEL_MANAGED_BY}={C.LABEL_MANAGED_BY_VALUE}"
WATCH_TIMEOUT_S = 60
MAX_BACKOFF_S = 15.0


def pod_info(pod: Any) -> PodInfo | None:
    """A PodInfo from a V1Pod or a pod dict; None when the pod is not one of ours (no
    service label) or has no containers."""
    if not isinstance(pod, dict):
        pod = _to_dict(pod)
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    service = labels.get(C.LABEL_SERVICE)
    if not service:
        return None
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        return None
    container = next((c for c in containers if c.get("name") == C.VLLM_CONTAINER_NAME), containers[0])
    args = tuple(container.get("command") or ()) + tuple(container.get("args") or ())
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    restarts = 0
    for cs in status.get("containerStatuses") or status.get("container_statuses") or []:
        if cs.get("name") == container.get("name"):
            restarts = int(cs.get("restartCount", cs.get("restart_count", 0)) or 0)
    return PodInfo(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        service=service,
        config_hash=labels.get(C.LABEL_CONFIG_HASH, ""),
        args=args,
        ready=ready,
        restart_count=restarts,
        terminating=bool(meta.get("deletionTimestamp") or meta.get("deletion_timestamp")),
    )


def _to_dict(pod: Any) -> dict:
    """The API's camelCase dict of a kubernetes client model."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(pod)


class PodWatcher:
    """List + watch loop over one namespace (or all), on its own thread."""

    def __init__(
        self,
        api: Any,
        on_sync: Callable[[Iterable[PodInfo], str | None], None],
        on_upsert: Callable[[PodInfo], None],
        on_remove: Callable[[str, str], None],
        namespace: str | None = None,
    ) -> None:
        self.api = api  # kubernetes.client.CoreV1Api
        self.on_sync = on_sync
        self.on_upsert = on_upsert
        self.on_remove = on_remove
        self.namespace = namespace

    def _list(self) -> Any:
        if self.namespace is None:
            return self.api.list_pod_for_all_namespaces(label_selector=LABEL_SELECTOR)
        return self.api.list_namespaced_pod(self.namespace, label_selector=LABEL_SELECTOR)

    def _stream(self, watch: Any, resource_version: str) -> Iterable[dict]:
        kwargs = {
            "label_selector": LABEL_SELECTOR,
            "resource_version": resource_version,
            "timeout_seconds": WATCH_TIMEOUT_S,
            "allow_watch_bookmarks": True,
        }
        if self.namespace is None:
            return watch.stream(self.api.list_pod_for_all_namespaces, **kwargs)
        return watch.stream(self.api.list_namespaced_pod, self.namespace, **kwargs)

    def run(self, stop: threading.Event) -> None:
        from kubernetes import watch as kwatch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        backoff = 0.5
        while not stop.is_set():
            try:
                listed = self._list()
                pods = [p for p in (pod_info(item) for item in listed.items) if p is not None]
                self.on_sync(pods, self.namespace)
                version = listed.metadata.resource_version
                backoff = 0.5
                while not stop.is_set():
                    watch = kwatch.Watch()
                    for event in self._stream(watch, version):
                        if stop.is_set():
                            watch.stop()
                            break
                        obj = event["object"]
                        kind = event["type"]
                        if kind == "BOOKMARK":
                            version = _resource_version(obj) or version
                            continue
                        if kind == "ERROR":
                            raise _Expired()
                        info = pod_info(obj)
                        version = _resource_version(obj) or version
                        if info is None:
                            continue
                        if kind == "DELETED":
                            self.on_remove(info.namespace, info.name)
                        else:
                            self.on_upsert(info)
            except _Expired:
                log.info("pod watch expired; listing again")
            except ApiException as err:
                if err.status == 410:
                    log.info("pod watch expired (410); listing again")
                    continue
                log.warning("pod watch failed (%s); retrying in %.1fs", err.reason, backoff)
                stop.wait(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
            except (HTTPError, OSError) as err:
                log.warning("pod watch lost the API server (%s); retrying in %.1fs", err, backoff)
                stop.wait(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)


class _Expired(Exception):
    """The watch returned an ERROR event (typically 410 Gone): relist."""


def _resource_version(obj: Any) -> str | None:
    if isinstance(obj, dict):
        return (obj.get("metadata") or {}).get("resourceVersion")
    meta = getattr(obj, "metadata", None)
    return getattr(meta, "resource_version", None) if meta is not None else None


def start_watchers(
    kubeconfig: str,
    simulator: Any,
    namespaces: list[str] | None,
    stop: threading.Event,
) -> list[threading.Thread]:
    """One watcher thread per namespace (one for all when `namespaces` is empty)."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kubeconfig)
    api = client.CoreV1Api(api_client)
    threads = []
    for namespace in namespaces or [None]:
        watcher = PodWatcher(api, simulator.sync, simulator.upsert, simulator.remove, namespace)
        thread = threading.Thread(
            target=watcher.run, args=(stop,), name=f"watch-{namespace or 'all'}", daemon=True
        )
        thread.start()
        threads.append(thread)
    return threads

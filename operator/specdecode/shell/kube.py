"""Every call the operator makes to the Kubernetes API, in one place, with writes counted.

Reads return plain dicts (None when absent); writes are server-side apply with the
operator's field manager, JSON patches of status guarded by resourceVersion, and deletes.
Each write increments `specdecode_api_writes_total`, so steady state can be shown to cost
none.
"""

from __future__ import annotations

import atexit
import logging
import os
import tempfile
import threading
import time
from datetime import datetime
from typing import Any, Optional

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from .. import constants as C
from .. import processes
from .. import timestamps
from .bodies import ServiceBodies
from .instrumentation import API_WRITES
from ..redaction import redact

DISCOVERY_TTL_S = 300.0


class Conflict(Exception):
    """The object changed between our read and our write; the caller retries."""


API_CONNECTIONS = 48


def load_config(kubeconfig: Optional[str] = None) -> client.ApiClient:
    """An API client from a kubeconfig (the argument, else $KUBECONFIG read now, not at import
    time as the client library does) or from inside a pod."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        config.load_kube_config(config_file=path)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # One connection per thread that calls the API (kopf's reconciles, the evaluations, the
    # repairs): the library's default is 5 per CPU (10 here), and urllib3 opens and throws
    # away a new TLS connection for every request beyond it.
    configuration.connection_pool_maxsize = API_CONNECTIONS
    return client.ApiClient(configuration)


def _as_dict(_client: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The answer as the JSON it is: the dynamic client's default wraps every nested dict of it
    in a ResourceField, which `to_dict()` then unwraps again, 3 ms per Deployment read (6 times
    json.loads); a fleet's reconciles read thousands."""
    return data


def _pointer(key: str) -> str:
    """A key as a JSON pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


DISCOVERY_FILE_PREFIX = "specdecode-discovery-"


def discovery_cache_file(directory: str, pid: int, instance: int) -> str:
    return os.path.join(directory, f"{DISCOVERY_FILE_PREFIX}{pid}-{instance}.json")


def remove_orphaned_discovery_files(directory: str) -> list[str]:
    """Remove the discovery cache files of processes that are gone. Each process removes its
    own at exit; a killed one (SIGKILL, OOM) cannot, and its file stayed in the temporary
    directory."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(DISCOVERY_FILE_PREFIX) and name.endswith(".json")):
            continue
        pid = name[len(DISCOVERY_FILE_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not processes.alive(int(pid)):
            path = os.path.join(directory, name)
            _remove_quietly(path)
            removed.append(path)
    return removed


class Kube:
    """The operator's API access. Thread-safe: kopf runs sync handlers in a thread pool."""

    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client
        # The dynamic client's discovery cache is one mutable dict, replaced wholesale by
        # invalidate_cache(): read by one of kopf's threads while another invalidates it, it
        # raised KeyError 'apis' / 'resources'. Every use of it holds this lock, resolved
        # resources are kept here, and its cache file is this process's own (the library's
        # default, one file per apiserver in /tmp, is shared by every process on the machine).
        self._discovery_lock = threading.RLock()
        remove_orphaned_discovery_files(tempfile.gettempdir())
        cache_file = discovery_cache_file(tempfile.gettempdir(), os.getpid(), id(self))
        atexit.register(_remove_quietly, cache_file)
        with self._discovery_lock:
            self.dynamic = DynamicClient(api_client, cache_file=cache_file)
        self.core = client.CoreV1Api(api_client)
        self._resources: dict[tuple[str, str], Any] = {}
        self._served: dict[tuple[str, str], tuple[bool, float]] = {}
        self._lock = threading.Lock()
        # The newest body of each service this process knows (kopf's watch, our status writes).
        self.services = ServiceBodies()

    # ----------------------------------------------------------------------------------- reads

    def _resource(self, api_version: str, kind: str):
        key = (api_version, kind)
        resource = self._resources.get(key)
        if resource is None:
            with self._discovery_lock:
                resource = self._resources.get(key)
                if resource is None:
                    resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
                    self._resources[key] = resource
        return resource

    def get(self, api_version: str, kind: str, name: str, namespace: Optional[str]) -> Optional[dict[str, Any]]:
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace, serializer=_as_dict)
        except NotFoundError:
            return None

    def list(self, api_version: str, kind: str, namespace: Optional[str], label_selector: str = "") -> list[dict[str, Any]]:
        result = self._resource(api_version, kind).get(namespace=namespace, label_selector=label_selector,
                                                       serializer=_as_dict)
        return result.get("items") or []

    def pod_log(self, namespace: str, pod: str, container: Optional[str], previous: bool, tail_lines: int = 200) -> str:
        """The tail of a container's log; empty when the node cannot serve logs (the
        termination message still says why a vLLM container stopped)."""
        try:
            return self.core.read_namespaced_pod_log(
                pod, namespace, container=container, previous=previous, tail_lines=tail_lines
            )
        except ApiException as err:
            logging.getLogger("specdecode.shell.kube").info("log of %s/%s unavailable: %s %s", namespace, pod, err.status, err.reason)
            return ""

    def is_served(self, api_version: str, kind: str, now: Optional[float] = None) -> bool:
        """Whether the apiserver serves a kind (the PodMonitor CRD may be missing); cached."""
        now = time.monotonic() if now is None else now
        key = (api_version, kind)
        with self._lock:
            cached = self._served.get(key)
            if cached and now - cached[1] < DISCOVERY_TTL_S:
                return cached[0]
        try:
            self._resource(api_version, kind)
            served = True
        except ResourceNotFoundError:
            # Perhaps installed since discovery ran: discover again (under the lock), once:
            # the threads that found the same answer expired wait for the first one's.
            with self._discovery_lock:
                with self._lock:
                    cached = self._served.get(key)
                    if cached and now - cached[1] < DISCOVERY_TTL_S:
                        return cached[0]
                self.dynamic.resources.invalidate_cache()
                try:
                    self._resource(api_version, kind)
                    served = True
                except ResourceNotFoundError:
                    served = False
                with self._lock:
                    self._served[key] = (served, now)
                return served
        with self._lock:
            self._served[key] = (served, now)
        return served

    # ---------------------------------------------------------------------------------- writes

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's field manager, taking fields back from others."""
        meta = obj["metadata"]
        resource = self._resource(obj["apiVersion"], obj["kind"])
        API_WRITES.labels("apply", obj["kind"]).inc()
        result = resource.server_side_apply(
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=C.FIELD_MANAGER,
            force_conflicts=True,
            serializer=_as_dict,
        )
        return result

    def take_back(self, obj: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
        """Replace each top-level spec field we render with its rendered value (a JSON patch,
        guarded by resourceVersion, as the operator's field manager): for when a foreign edit
        made a server-side apply impossible (a hand-edited Service port left two ports named
        `http`: 422). Fields we do not render (a Service's clusterIP) stay as they are."""
        meta = live["metadata"]
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}]
        for key, value in obj.items():
            if key in ("apiVersion", "kind", "metadata", "status"):
                continue
            if isinstance(value, dict) and isinstance(live.get(key), dict):
                ops += [{"op": "add", "path": f"/{key}/{_pointer(sub)}", "value": v} for sub, v in value.items()]
            else:
                ops.append({"op": "add", "path": f"/{key}", "value": value})
        API_WRITES.labels("patch", obj["kind"]).inc()
        result = self._resource(obj["apiVersion"], obj["kind"]).patch(
            body=ops, name=meta["name"], namespace=meta.get("namespace"),
            content_type="application/json-patch+json", field_manager=C.FIELD_MANAGER, serializer=_as_dict,
        )
        return result

    def delete(self, api_version: str, kind: str, name: str, namespace: Optional[str]) -> bool:
        API_WRITES.labels("delete", kind).inc()
        try:
            self._resource(api_version, kind).delete(name=name, namespace=namespace)
        except NotFoundError:
            return False
        return True

    def replace_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Set `.status` of a SpecDecodeService, failing with Conflict if it changed since read."""
        meta = obj["metadata"]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {"op": "add", "path": "/status", "value": status},
        ]
        API_WRITES.labels("patch", C.KIND + "/status").inc()
        try:
            written = client.CustomObjectsApi(self.api_client).patch_namespaced_custom_object_status(
                C.GROUP, C.VERSION, meta["namespace"], C.PLURAL, meta["name"], patch,
                _content_type="application/json-patch+json",
            )
        except ApiException as err:
            if err.status in (409, 422):
                raise Conflict(f"{meta['namespace']}/{meta['name']} changed while its status was computed") from None
            raise
        self.services.wrote(written)
        return written

    def post_event(self, owner: dict[str, Any], type_: str, reason: str, message: str, now: datetime) -> None:
        """A core/v1 Event about a SpecDecodeService (what `kubectl describe sds` shows)."""
        meta = owner["metadata"]
        stamp = timestamps.rfc3339(now)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=C.API_VERSION,
                kind=C.KIND,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
                resource_version=meta.get("resourceVersion"),
            ),
            type=type_,
            reason=reason,
            message=redact(message)[:1024],
            source=client.V1EventSource(component=C.OPERATOR_NAME),
            reporting_component=C.OPERATOR_NAME,
            reporting_instance=C.OPERATOR_NAME,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
        )
        API_WRITES.labels("create", "Event").inc()
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as err:
            # Events are advisory: a terminating namespace or a rate limit must not fail the
            # reconcile that already did its work. Status carries the same facts.
            logging.getLogger("specdecode.shell.kube").warning(
                "event %s for %s/%s not posted: %s %s", reason, meta["namespace"], meta["name"], err.status, err.reason
            )


# How server-side apply matches the items of the lists we render (their merge keys); any
# other list is atomic: compared item by item, in order.
LIST_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "imagePullSecrets": ("name",),
    "volumeMounts": ("mountPath",),
    "ownerReferences": ("uid",),
}
# List fields whose merge key depends on where they sit: a Service's ports by port, a
# container's by containerPort (both with protocol, which defaults to TCP).
_PORT_KEYS = {"port": ("port", "protocol"), "containerPort": ("containerPort", "protocol")}


def _item_key(item: Any, field: str) -> Optional[tuple]:
    if not isinstance(item, dict):
        return None
    keys = LIST_MERGE_KEYS.get(field)
    if keys is None and field == "ports":
        keys = next((k for marker, k in _PORT_KEYS.items() if marker in item), None)
    if keys is None:
        return None
    return tuple(item.get(k, "TCP" if k == "protocol" else None) for k in keys)


def _scalar_equal(want: Any, have: Any) -> bool:
    if want == have:
        return True
    # The apiserver stores quantities as strings: a rendered `nvidia.com/gpu: 1` reads back "1".
    if isinstance(want, (int, float)) and not isinstance(want, bool) and isinstance(have, str):
        return str(want) == have
    return False


def content_drift(want: Any, have: Any, path: str = "") -> Optional[str]:
    """The first place where the live object `have` lacks what the rendered `want` says, or
    None when everything we would apply is already there.

    Compares content, not managedFields times: a `kubectl scale` (whose managedFields entry
    may carry no time) is drift, a foreign annotation beside ours is not (apply leaves it, so
    applying for it would repeat on every pass). Fields the apiserver defaults (present in
    `have` only) and items others added to merge-keyed lists are not drift.
    """
    if want is None:
        return None
    if want == {} or want == []:
        # `emptyDir: {}` must be there; what it holds (the apiserver's defaults) is not ours.
        return path if have is None else None
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return path or "."
        for key, value in want.items():
            found = content_drift(value, have.get(key), f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(have, list):
            return path
        field = path.rsplit(".", 1)[-1]
        keys = [_item_key(item, field) for item in want]
        if all(k is not None for k in keys):
            live_by_key = {_item_key(item, field): item for item in have}
            for key, item in zip(keys, want):
                found = content_drift(item, live_by_key.get(key), f"{path}[{'/'.join(map(str, key))}]")
                if found:
                    return found
            return None
        if len(want) != len(have):
            return path
        for index, (item, live_item) in enumerate(zip(want, have)):
            found = content_drift(item, live_item, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if _scalar_equal(want, have) else path

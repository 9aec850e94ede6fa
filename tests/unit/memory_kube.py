"""An in-memory stand-in for `specdecode.shell.kube.Kube`, the shell's one API boundary, for unit
tests of the shell's decisions (what it writes to status, which Events it posts, which
children it applies). It keeps objects as the apiserver would return them (with a
resourceVersion that moves on every write, and status writes guarded by it) and records
every write; the e2e suite runs the same shell against a real apiserver."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Optional

from specdecode import constants as C
from specdecode.shell.bodies import ServiceBodies
from specdecode.shell.kube import Conflict

Key = tuple[str, str, str, str]  # (apiVersion, kind, namespace, name)


@dataclass
class Writes:
    applied: list[str] = field(default_factory=list)  # kinds, in order
    deleted: list[str] = field(default_factory=list)
    status: list[dict[str, Any]] = field(default_factory=list)  # each status written
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)

    def count(self) -> int:
        return len(self.applied) + len(self.deleted) + len(self.status) + len(self.events)


class MemoryKube:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes = Writes()
        self.read_log: list[tuple[str, str]] = []  # (verb, kind) of every read, in order
        self._version = 0
        self.services = ServiceBodies()  # as Kube's: fed by status writes and kopf's views

    # ----------------------------------------------------------------------------- test setup

    @property
    def reads(self) -> int:
        return len(self.read_log)

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def create_service(self, spec: dict[str, Any], name: str = "llama", namespace: str = "team-a",
                       status: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        body = {"apiVersion": C.API_VERSION, "kind": C.KIND,
                "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1,
                             "resourceVersion": self._next_version()},
                "spec": copy.deepcopy(spec)}
        if status is not None:
            body["status"] = copy.deepcopy(status)
        self.objects[(C.API_VERSION, C.KIND, namespace, name)] = body
        return copy.deepcopy(body)

    def service(self, name: str = "llama", namespace: str = "team-a") -> dict[str, Any]:
        return copy.deepcopy(self.objects[(C.API_VERSION, C.KIND, namespace, name)])

    def edit_spec(self, change: dict[str, Any], name: str = "llama", namespace: str = "team-a") -> None:
        body = self.objects[(C.API_VERSION, C.KIND, namespace, name)]
        body["spec"].update(copy.deepcopy(change))
        body["metadata"]["generation"] += 1
        body["metadata"]["resourceVersion"] = self._next_version()

    def set_child_status(self, api_version: str, kind: str, name: str, namespace: str, status: dict[str, Any]) -> None:
        """What a controller of the cluster would write (a Deployment's rollout progress)."""
        obj = self.objects[(api_version, kind, namespace, name)]
        obj["status"] = copy.deepcopy(status)
        obj["metadata"]["resourceVersion"] = self._next_version()

    # ---------------------------------------------------------------------------- Kube's API

    def get(self, api_version: str, kind: str, name: str, namespace: Optional[str]) -> Optional[dict[str, Any]]:
        self.read_log.append(("get", kind))
        obj = self.objects.get((api_version, kind, namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: Optional[str], label_selector: str = "") -> list[dict[str, Any]]:
        self.read_log.append(("list", kind))
        terms = [term for term in label_selector.split(",") if term]
        wanted = dict(term.split("=", 1) for term in terms if not term.startswith("!"))
        absent = {term[1:] for term in terms if term.startswith("!")}
        return [copy.deepcopy(obj) for (v, k, ns, _), obj in self.objects.items()
                if (v, k, ns) == (api_version, kind, namespace)
                and wanted.items() <= (obj["metadata"].get("labels") or {}).items()
                and not absent & (obj["metadata"].get("labels") or {}).keys()]

    def pod_log(self, namespace: str, pod: str, container: Optional[str], previous: bool, tail_lines: int = 200) -> str:
        return ""

    def is_served(self, api_version: str, kind: str, now: Optional[float] = None) -> bool:
        return True

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        live = self.objects.get(key)
        stored = copy.deepcopy(obj)
        if live is not None:
            stored["metadata"] = {**live["metadata"], **stored["metadata"]}
            if "status" in live:
                stored["status"] = live["status"]
        if live is None or {k: v for k, v in stored.items()} != live:
            generation = (live or {}).get("metadata", {}).get("generation", 0) + 1
            stored["metadata"].update(resourceVersion=self._next_version(), generation=generation)
        self.objects[key] = stored
        self.writes.applied.append(obj["kind"])
        return copy.deepcopy(stored)

    def take_back(self, obj: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
        return self.apply(obj)

    def delete(self, api_version: str, kind: str, name: str, namespace: Optional[str]) -> bool:
        self.writes.deleted.append(kind)
        return self.objects.pop((api_version, kind, namespace or "", name), None) is not None

    def replace_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        live = self.objects.get((C.API_VERSION, C.KIND, meta["namespace"], meta["name"]))
        if live is None or live["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise Conflict(f"{meta['namespace']}/{meta['name']} changed while its status was computed")
        live["status"] = copy.deepcopy(status)
        live["metadata"]["resourceVersion"] = self._next_version()
        self.writes.status.append(copy.deepcopy(status))
        self.services.wrote(copy.deepcopy(live))
        return copy.deepcopy(live)

    def post_event(self, owner: dict[str, Any], type_: str, reason: str, message: str, now: datetime) -> None:
        self.writes.events.append((type_, reason, message))

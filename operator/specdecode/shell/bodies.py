"""The newest known version of each SpecDecodeService, so a pass need not read it from the API.

kopf keeps the latest body its watch delivered of every service (a view it swaps in place as
events arrive: the `body` its handlers receive once the service's timers are spawned); our own
status writes answer with a body newer than that until the watch catches up. Of the two, the
one with the higher resourceVersion is the newest this process knows, and acting on it never
goes back behind anything the operator has acted on before. A pass that finds it stale all the
same (someone else wrote since) fails its guarded status write with a Conflict and reads the
API (`Controller.reconcile`).

resourceVersions are compared as integers: Kubernetes documents them as comparable since 1.35
(KEP-5504), and the API servers before it already handed out etcd's revision. A version that is
not an integer is never taken for newer: the pass reads the API.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional

Key = tuple[str, str]


def version_order(body: Optional[Mapping[str, Any]]) -> Optional[int]:
    """The object's resourceVersion as an integer, or None when it has none or another form."""
    text = ((body or {}).get("metadata") or {}).get("resourceVersion")
    return int(text) if isinstance(text, str) and text.isdigit() else None


def newer(candidate: Optional[Mapping[str, Any]], than: Optional[Mapping[str, Any]]) -> bool:
    """Whether `candidate` is known to be at least as new as `than` (False when either
    version cannot be compared)."""
    mine, theirs = version_order(candidate), version_order(than)
    return mine is not None and theirs is not None and mine >= theirs


def consistent_copy(view: Mapping[str, Any], attempts: int = 3) -> Optional[dict[str, Any]]:
    """A top-level copy of one version of kopf's view: the event loop swaps the whole body
    while a handler thread copies it, and a copy mixing one version's metadata with another's
    status would pass the resourceVersion guard with a stale status. Two copies made of the
    same objects hold one version; None when the view kept changing."""
    for _ in range(attempts):
        first, second = dict(view), dict(view)
        if first.keys() == second.keys() and all(first[k] is second[k] for k in first):
            return first
    return None


class ServiceBodies:
    """Per service: kopf's live view of it and the answer to our newest status write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[Key, Mapping[str, Any]] = {}
        self._written: dict[Key, dict[str, Any]] = {}

    @staticmethod
    def _key(body: Mapping[str, Any]) -> Key:
        meta = body.get("metadata") or {}
        return meta.get("namespace", ""), meta.get("name", "")

    def follow(self, view: Mapping[str, Any]) -> None:
        """Remember kopf's view of a service (it follows the watch by itself), and drop our
        write's answer once the view has caught up with it (a full body per service, held
        otherwise until the service's next pass)."""
        key = self._key(view)
        if (view.get("metadata") or {}).get("deletionTimestamp"):
            # Being deleted: its pass reads the API and forgets it. Remembered after that
            # forget (a handler kopf started just before the deletion), the view would be kept
            # for the life of the process.
            self.forget(*key)
            return
        with self._lock:
            self._views[key] = view
            written = self._written.get(key)
        if written is not None:
            self._drop_if_caught_up(key, consistent_copy(view), written)

    def wrote(self, body: Optional[Mapping[str, Any]]) -> None:
        """Remember the API's answer to a write of the service, if newer than what is known."""
        if body is None or version_order(body) is None:
            return
        key = self._key(body)
        with self._lock:
            known = self._written.get(key)
            if known is None or not newer(known, body):
                self._written[key] = dict(body)

    def newest(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        """The newest version known without a read, or None (read the API). Only for a service
        kopf's watch follows: a write's answer alone would never learn of a later edit."""
        key = (namespace, name)
        with self._lock:
            view, written = self._views.get(key), self._written.get(key)
        watched = consistent_copy(view) if view is not None else None
        if watched is None or version_order(watched) is None:
            return None
        if written is None or self._drop_if_caught_up(key, watched, written):
            return watched
        return written  # both versions are integers: ours is the newer

    def _drop_if_caught_up(self, key: Key, watched: Optional[Mapping[str, Any]], written: dict[str, Any]) -> bool:
        """Forget our write's answer once kopf's view has it (kopf's copy is enough then)."""
        if not newer(watched, written):
            return False
        with self._lock:
            if self._written.get(key) is written:
                del self._written[key]
        return True

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._views.pop((namespace, name), None)
            self._written.pop((namespace, name), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._views.keys() | self._written.keys())

"""kopf registrations: each handler is one call into the controller or the evaluator.

`register` is the table of contents (which kopf event calls which handler, with the timer
intervals from the settings); the operator's per-process state (settings, API client,
controller, evaluator and its single-flight Prometheus cache) lives in kopf's memo
(`Memo`), filled once by `operator_startup`, never in module globals.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from .. import constants as C
from . import instrumentation, process_memory
from . import settings as settings_module
from .controller import EVERYTHING, Children, Controller
from .evaluator import Evaluator, ServiceMemory
from .kube import Conflict, Kube, load_config
from .settings import OperatorSettings

RESOURCE = (C.GROUP, C.VERSION, C.PLURAL)
OWNED_DEPLOYMENTS = {C.LABEL_MANAGED_BY: C.LABEL_MANAGED_BY_VALUE}
# Threads for the reconciles (kopf's executor) and, apart, for the evaluations: an evaluation
# waits for the tick's one Prometheus read, and in kopf's shared pool (6 threads on 2 cores)
# the waiting evaluations of a large fleet held every thread, so new services and rollouts
# waited minutes for a reconcile. A reconcile mostly waits for the API server (0.15-0.35 s a
# write at N=500 on 2 cores): 8 threads capped the operator at about 27 writes a second
# while the API server took three times that from the controllers.
RECONCILE_WORKERS = 24
EVALUATION_WORKERS = 4
# The periodic full pass (drift repair) has threads of its own too: at N=500 the timers of
# services created a minute earlier held all 8 reconcile threads while the Deployment events
# that turn new services Serving queued behind them (300 Deployments available, none Serving).
# A repair may wait; a new service should not.
TIMER_WORKERS = 2
# A deleted service waits for its timers to exit (see operator_startup): for a pass already
# running, this long at once (a pass takes well under a second unless the API server or
# Prometheus is slow); then kopf looks again this often (each look is a patch of the service).
TIMER_EXIT_WAIT_S = 3.0
TIMER_EXIT_POLL_S = 2.0
# kopf's name for its last-handled state (an annotation under our prefix until it was held in
# memory; the name still finds the annotation an older operator left, to remove it).
DIFFBASE_KEY = "last-handled-configuration"


def _kube_from_config() -> Kube:
    return Kube(load_config())


@dataclass
class Memo:
    """kopf's memo: given to `kopf.run` with the settings, completed by `operator_startup`.
    kopf hands every handler a shallow copy per object, so the controller and the evaluator
    are shared while `service` is each SpecDecodeService's own (and goes when it is deleted)."""

    settings: OperatorSettings
    kube_factory: Callable[[], Kube] = _kube_from_config
    controller: Optional[Controller] = None
    evaluator: Optional[Evaluator] = None
    evaluation_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
    timer_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
    service: Optional[ServiceMemory] = None

    def start(self) -> None:
        """Build the API client, the controller and the evaluator (once per process)."""
        kube = self.kube_factory()
        cache_root = Path(self.settings.model_cache_root) if self.settings.model_cache_root else None
        self.controller = Controller(kube, logger=logging.getLogger("specdecode.shell.controller"),
                                     model_cache_root=cache_root, max_replicas=self.settings.max_replicas)
        self.evaluator = Evaluator(kube, self.controller, self.settings)
        self.evaluation_pool = concurrent.futures.ThreadPoolExecutor(EVALUATION_WORKERS, thread_name_prefix="evaluate")
        self.timer_pool = concurrent.futures.ThreadPoolExecutor(TIMER_WORKERS, thread_name_prefix="repair")

    def running(self) -> tuple[Controller, Evaluator]:
        if self.controller is None or self.evaluator is None:
            raise kopf.TemporaryError("the operator is still starting", delay=2)
        return self.controller, self.evaluator

    def service_memory(self) -> ServiceMemory:
        """This object's evaluation memory (only on a per-object copy)."""
        if self.service is None:
            self.service = ServiceMemory()
        return self.service


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's last-handled state as a digest of the spec, labels and annotations, not a copy:
    the handlers never read kopf's diff (every pass reconciles the whole object), and a copy of
    a large spec overflowed the 256 KiB all annotations share, so kopf's own patch failed (422)
    and it retried forever.

    kopf builds the essence on every watch event of every service, from a deep copy of the
    whole body: status with its history, managedFields. That copy was 15 % of the operator's
    CPU while 500 new services came up (py-spy), taken from the API server on the same cores.
    It is given only what the essence keeps (spec, labels, annotations; kopf names its key
    after the owners): the same digest."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        if not extra_fields:
            meta = body.get("metadata") or {}
            slim = {key: value for key, value in body.items() if key not in ("metadata", "status")}
            slim["metadata"] = {key: meta[key] for key in ("labels", "annotations", "ownerReferences") if key in meta}
            body = kopf.Body(slim)
        essence = super().build(body=body, extra_fields=extra_fields)
        text = json.dumps(essence, sort_keys=True, separators=(",", ":"), default=str)
        return {"digest": hashlib.sha256(text.encode()).hexdigest()}


class HeldDiffBaseStorage(DigestDiffBaseStorage):
    """kopf's last-handled digest, held in this process, not written into the service.

    kopf patched it into the service after every handled change: a write per new service and
    per spec edit, and a watch event of the whole object back to every watcher of services.
    When 500 services were applied at once, those were 500 of the operator's 3,800 writes,
    while every write slowed the apiserver's ClusterIP allocations that set the fleet's pace.
    kopf needs the digest only to tell a new service from a changed one, and the handlers do
    the same for both (each pass reconciles the whole object). A restarted operator holds
    none: kopf takes every service for a new one, and `sds_create`, seeing its status,
    reconciles it in full as the resume handler would. The annotation an older operator
    left is removed with kopf's next write to the service.

    kopf calls `fetch` and `store` from its event loop only. A service is dropped when kopf
    first sees it being deleted (its finalizer is on it while the operator runs)."""

    def __init__(self, *, prefix: str, key: str) -> None:
        super().__init__(prefix=prefix, key=key)
        self._held: dict[str, Any] = {}

    def fetch(self, *, body: Any) -> Any:
        uid = body.metadata.uid
        if body.metadata.deletion_timestamp:
            return self._held.pop(uid, None)
        return self._held.get(uid)

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        if not body.metadata.deletion_timestamp:
            self._held[body.metadata.uid] = essence
        for key in self.make_keys(self.key, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None

    def held(self) -> int:
        """How many services' digests this process holds."""
        return len(self._held)


class UnbrandedProgressStorage(kopf.AnnotationsProgressStorage):
    """kopf's handler progress in annotations, as kopf keeps it (a failed handler's retries
    survive a restart), without the `kopf-managed` marker kopf adds with it: a handler that
    succeeds at once has its progress purged in the same patch, and the marker alone kept
    that patch, a write to every new service."""

    def _store_marker(self, prefix: str, patch: Any, body: Any) -> None:
        return None


def operator_startup(settings: kopf.OperatorSettings, memo: Memo, logger: logging.Logger, **_: Any) -> None:
    """Configure kopf once: bookkeeping under our annotation prefix, peering, posting level,
    the reconciles' threads; then build the operator's state in the memo."""
    process_memory.limit_arenas()
    ours = memo.settings
    settings.persistence.progress_storage = UnbrandedProgressStorage(prefix=C.ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = HeldDiffBaseStorage(prefix=C.ANNOTATION_PREFIX, key=DIFFBASE_KEY)
    settings.persistence.finalizer = C.KOPF_FINALIZER
    # At INFO kopf would turn every handler log line into an Event; ours are posted explicitly.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = RECONCILE_WORKERS
    settings.peering.name = ours.peering_name
    settings.peering.clusterwide = not ours.namespaces
    settings.peering.mandatory = not ours.standalone
    settings.peering.standalone = ours.standalone
    settings.peering.stealth = True
    # The newest process wins: a restarted operator does not pause for the record its killed
    # predecessor left behind (equal priorities pause each other until it expires, 60 s with
    # every service blank); a live older one pauses for it.
    settings.peering.priority = int(time.time())
    # A deleted service keeps kopf's finalizer (and its children, which the garbage collector
    # takes only after it) until its timers exit. A timer in the middle of a pass (a reconcile or
    # an evaluation in its thread) exits when the pass ends: wait a few seconds for it, then
    # look again every few seconds. kopf's defaults wait ten event-loop cycles, then a minute.
    settings.background.instant_exit_timeout = TIMER_EXIT_WAIT_S
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Ride out an API server outage instead of exiting (kopf's default gave up after ~80 s).
    settings.networking.error_backoffs = settings_module.api_retry_backoffs(ours.api_outage_tolerance)
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    memo.start()
    logger.info("specdecode-operator started")


# What an unreachable or failing API server raises through the kubernetes client.
TRANSIENT_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)


def _reconcile(memo: Memo, namespace: str, name: str, retry: int, children: Children = EVERYTHING) -> None:
    """Reconcile; a failure is retried soon with a growing delay (kopf.TemporaryError), not
    after kopf's default minute, and said in one WARNING line (kopf also posts it as an Event)."""
    delay = settings_module.retry_delay(retry)
    controller, _ = memo.running()
    try:
        result = controller.reconcile(namespace, name, children)
    except Conflict as err:
        raise kopf.TemporaryError(str(err), delay=1) from None
    except TRANSIENT_ERRORS as err:
        instrumentation.ERRORS.labels("reconcile_retry").inc()
        if isinstance(err, ApiException) and err.status in (401, 403):
            # Retrying will not grant a permission: that needs a human (the ClusterRole).
            logging.getLogger("specdecode.shell.handlers").error(
                "%s/%s: the operator may not do this (%s): check its ClusterRole against manifests/base/rbac.yaml",
                namespace, name, _describe(err))
        raise kopf.TemporaryError(f"reconcile failed ({_describe(err)}); retry {retry + 1} in {delay:.0f}s",
                                  delay=delay) from None
    if result == "error":
        raise kopf.TemporaryError(f"some children could not be written (see the Degraded condition); retry "
                                  f"{retry + 1} in {delay:.0f}s", delay=delay)


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {str(err)[:200]}"


# An exception nobody classified (a bug) is retried after 10 s, not kopf's default minute.
UNEXPECTED_ERROR_BACKOFF_S = 10


def _follow(memo: Memo, body: kopf.Body) -> None:
    """Passes read the service from kopf's view of it (which follows the watch), not the API."""
    controller, _ = memo.running()
    controller.follow(body)


def sds_create(body: kopf.Body, namespace: str, name: str, memo: Memo, retry: int, **_: Any) -> None:
    """A new service: apply its children without reading them first (there are none yet; a
    retry reads them). A service with a status is not new: a restarted operator holds no
    digests (`HeldDiffBaseStorage`), so kopf calls every service it finds new; it gets the
    full pass a resume would."""
    _follow(memo, body)
    new = retry == 0 and not body.get("status")
    _reconcile(memo, namespace, name, retry, Children.new_service() if new else EVERYTHING)


def sds_reconcile(body: kopf.Body, namespace: str, name: str, memo: Memo, retry: int, **_: Any) -> None:
    """Render and apply the service's children; report the rollout in status."""
    _follow(memo, body)
    _reconcile(memo, namespace, name, retry)


async def sds_timer(body: kopf.Body, namespace: str, name: str, memo: Memo, retry: int, **_: Any) -> None:
    """Level-triggered pass: repairs drift a watch event did not show, in the repairs' own
    threads. Returns None, so kopf writes nothing for it."""
    _follow(memo, body)
    await asyncio.get_running_loop().run_in_executor(
        memo.timer_pool, functools.partial(_reconcile, memo, namespace, name, retry))


async def sds_evaluate(body: kopf.Body, memo: Memo, retry: int, **_: Any) -> None:
    """Let the policy decide when the service's evaluationInterval has passed (one batched
    Prometheus read per tick serves every service), in the evaluations' own threads."""
    _, evaluator = memo.running()
    _follow(memo, body)
    service = memo.service_memory()
    if service.quiet((body.get("metadata") or {}).get("generation"), evaluator.clock().timestamp()):
        # Not due: most ticks of a fleet (every 5 s against an evaluationInterval of 30 s or
        # more), answered here without handing each to a thread and back.
        return
    await asyncio.get_running_loop().run_in_executor(
        memo.evaluation_pool, functools.partial(_evaluate, evaluator, body, service, retry))


def _evaluate(evaluator: Evaluator, body: kopf.Body, service: ServiceMemory, retry: int) -> None:
    try:
        evaluator.evaluate_if_due(body, service)
    except Conflict as err:
        raise kopf.TemporaryError(str(err), delay=1) from None
    except TRANSIENT_ERRORS as err:
        delay = settings_module.retry_delay(retry)
        raise kopf.TemporaryError(f"evaluation failed ({_describe(err)}); retry {retry + 1} in {delay:.0f}s",
                                  delay=delay) from None


def deployment_event(type: str, body: kopf.Body, namespace: str, labels: dict[str, str], memo: Memo,
                     **_: Any) -> None:
    """A child Deployment changed (rollout progress) or vanished: reconcile its service's
    Deployments and status (the other children did not change: the timer looks at them). The
    canary of an experiment is one of them: deleted or edited while its experiment runs, it is
    applied again; left over after it, deleted; its pods failing to start cancel the experiment."""
    owner = labels.get(C.LABEL_SERVICE)
    if owner and type in ("MODIFIED", "DELETED", None):
        try:
            # The event's Deployment stands for a read unless it is deleted (or older than one seen).
            seen = dict(body) if type != "DELETED" else None
            _reconcile(memo, namespace, owner, retry=0, children=Children.deployment(seen))
        except kopf.TemporaryError as err:
            # Event handlers are not retried: the service's own handlers and timer repair it.
            logging.getLogger("specdecode.shell.handlers").warning("%s/%s: %s", namespace, owner, err)


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> kopf.OperatorRegistry:
    """Which kopf event calls which handler. The timers' intervals are the settings' (kopf
    reads them at registration), so the settings are an argument, not an import-time global."""
    # A registry of our own has none of the logins kopf's default one brings: log in as the
    # kubernetes client does (in the pod: its service account; else $KUBECONFIG), like `Kube`.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(operator_startup)
    kopf.on.create(*RESOURCE, registry=registry, backoff=UNEXPECTED_ERROR_BACKOFF_S)(sds_create)
    for on in (kopf.on.update, kopf.on.resume):
        on(*RESOURCE, registry=registry, backoff=UNEXPECTED_ERROR_BACKOFF_S)(sds_reconcile)
    kopf.timer(*RESOURCE, registry=registry, interval=settings.reconcile_interval,
               initial_delay=settings.reconcile_interval)(sds_timer)
    kopf.timer(*RESOURCE, registry=registry, interval=settings.evaluation_tick,
               initial_delay=settings.evaluation_tick)(sds_evaluate)
    kopf.on.event("apps", "v1", "deployments", registry=registry, labels=OWNED_DEPLOYMENTS)(deployment_event)
    return registry

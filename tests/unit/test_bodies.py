"""The newest known version of a service: kopf's view of it or our newer write's answer."""

from __future__ import annotations

from collections.abc import Mapping

from specdecode.shell.bodies import ServiceBodies, consistent_copy


def _body(version, phase="Progressing", name="llama"):
    return {"metadata": {"namespace": "team-a", "name": name, "resourceVersion": version},
            "status": {"phase": phase}}


def test_a_write_newer_than_the_watch_is_the_newest_until_the_watch_catches_up():
    bodies = ServiceBodies()
    view = dict(_body("10"))
    bodies.follow(view)
    assert bodies.newest("team-a", "llama")["metadata"]["resourceVersion"] == "10"
    bodies.wrote(_body("12", "Serving"))
    assert bodies.newest("team-a", "llama")["status"]["phase"] == "Serving"
    bodies.wrote(_body("11", "Progressing"))  # an older answer arriving late changes nothing
    assert bodies.newest("team-a", "llama")["metadata"]["resourceVersion"] == "12"
    view.update(_body("13", "Serving"))  # the watch delivers our write and one more change
    assert bodies.newest("team-a", "llama")["metadata"]["resourceVersion"] == "13"
    assert len(bodies) == 1


def test_a_writes_answer_is_not_held_once_the_watch_has_it():
    bodies = ServiceBodies()
    view = dict(_body("10"))
    bodies.follow(view)
    bodies.wrote(_body("12", "Serving"))
    view.update(_body("12", "Serving"))
    bodies.follow(view)  # kopf's next call for the service (its evaluation tick)
    assert bodies._written == {}


def test_nothing_is_known_without_the_watch_or_with_versions_that_do_not_compare():
    bodies = ServiceBodies()
    bodies.wrote(_body("12"))
    assert bodies.newest("team-a", "llama") is None  # a write alone would never see a later edit
    bodies.follow(_body("opaque"))
    assert bodies.newest("team-a", "llama") is None
    bodies.forget("team-a", "llama")
    assert len(bodies) == 0


def test_a_service_being_deleted_is_not_remembered_after_its_pass_forgot_it():
    """A handler kopf started just before the deletion follows the service after the pass that
    saw the deletion forgot it: nothing of the deleted service stays in the process."""
    bodies = ServiceBodies()
    view = dict(_body("10"))
    bodies.follow(view)
    bodies.wrote(_body("11", "Serving"))
    view["metadata"] = {**view["metadata"], "resourceVersion": "12", "deletionTimestamp": "2026-12-02T12:00:00Z"}
    bodies.forget("team-a", "llama")  # the pass that saw the deletion
    bodies.follow(view)  # the late handler
    assert len(bodies) == 0 and bodies.newest("team-a", "llama") is None


class _Swapping(Mapping):
    """A view whose body the watch swaps on every key read (the worst case of kopf's)."""

    def __init__(self):
        self.version = 0

    def __getitem__(self, key):
        self.version += 1
        return _body(str(self.version))[key]

    def __iter__(self):
        return iter(("metadata", "status"))

    def __len__(self):
        return 2


def test_a_copy_mixing_two_versions_is_never_used():
    assert consistent_copy(_Swapping()) is None
    steady = _body("5")
    assert consistent_copy(steady) == steady

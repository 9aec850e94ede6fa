"""The kubernetes client's discovery cache file: one per process, and a killed process's file
does not stay behind (the fault bench SIGKILLs the operator 20 times a run; 60 files had piled
up in /tmp on the CI machine)."""

from __future__ import annotations

import os
import subprocess
import sys

from specdecode.shell import kube


def test_the_files_of_processes_that_are_gone_are_removed_and_the_others_kept(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(gone.stdout)
    dead = kube.discovery_cache_file(str(tmp_path), dead_pid, 1234)
    live = kube.discovery_cache_file(str(tmp_path), os.getpid(), 5678)
    unrelated = tmp_path / "specdecode-discovery-notes.txt"
    for path in (dead, live, unrelated):
        with open(path, "w") as f:
            f.write("{}")

    assert kube.remove_orphaned_discovery_files(str(tmp_path)) == [dead]
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(live), unrelated.name])


def test_a_missing_directory_removes_nothing(tmp_path):
    assert kube.remove_orphaned_discovery_files(str(tmp_path / "absent")) == []

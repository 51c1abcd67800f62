"""Checks that every test leaves the machine as it found it: no shared-memory segment and no
child process left behind."""
import glob
import multiprocessing
import os
import time
from pathlib import Path

import pytest

import appo


def processes_tagged(tag: str) -> list[int]:
    """Processes whose environment holds `tag`: a run started with it, its children, their envs.
    Not this test process's own multiprocessing resource tracker: a run in this process may be the
    first to spawn and so start it, but it serves the whole session and exits with it."""
    from multiprocessing import resource_tracker

    found = []
    for environ in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(environ, "rb") as f:
                if tag.encode() in f.read():
                    found.append(int(environ.split("/")[2]))
        except OSError:
            pass
    return [pid for pid in found if pid != resource_tracker._resource_tracker._pid]


def processes_still_tagged(tag: str, seconds: float = 15.0) -> list[int]:
    """processes_tagged(tag) once they had `seconds` to finish exiting (a multiprocessing resource
    tracker outlives its run by a moment)."""
    deadline = time.monotonic() + seconds
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_tagged(tag)


def vizdoom_processes() -> dict[int, str]:
    """pid -> VizDoom instance id, for each vizdoom process that this test process started."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        parent_pid = int(stat.rsplit(")", 1)[1].split()[1])
        if parent_pid == os.getpid() and b"+viz_instance_id" in args:
            found[int(entry)] = args[args.index(b"+viz_instance_id") + 1].decode()
    return found


def shm_entries():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    before = shm_entries()
    yield
    # a process's own CUDA IPC files live as long as it does (the runner removes its own at exit)
    own = {os.path.basename(path) for path in appo.cuda_ipc_files([os.getpid()])}
    leaked = shm_entries() - before - own
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
    children = multiprocessing.active_children()
    assert not children, f"child processes still running: {children}"


@pytest.fixture
def spawn():
    return multiprocessing.get_context("spawn")

"""conftest.py's leak check: it reports what this test run leaves in /dev/shm, and not what
another run on the same machine has there meanwhile."""
import os
import subprocess
import sys
import uuid

import conftest

# a file it keeps open, and a semaphore as multiprocessing makes them (mapped under another name)
HOLDS_SEGMENTS = """
import multiprocessing, sys
held = open('/dev/shm/' + sys.argv[1], 'w'), multiprocessing.get_context('spawn').Lock()
print(sys.argv[1], 'sem.' + held[1]._semlock.name.lstrip('/'), flush=True)
sys.stdin.read()  # until the test is done with it
"""


def start_holding(name: str, env: dict) -> tuple[subprocess.Popen, list[str]]:
    """A process that makes two /dev/shm entries and holds them until its stdin closes; returned once
    they exist, with their names."""
    process = subprocess.Popen([sys.executable, "-c", HOLDS_SEGMENTS, name], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().split()


def test_the_leak_check_reports_this_runs_segments_and_not_another_runs():
    """Another run's process stands in as one started without this run's tag in its environment."""
    another_run = {key: value for key, value in os.environ.items() if key != "APPO_TEST_RUN"}
    before = conftest.shm_entries()
    theirs, their_names = start_holding(f"appo_leak_check_{uuid.uuid4().hex}", another_run)
    child, child_names = start_holding(f"appo_leak_check_{uuid.uuid4().hex}", dict(os.environ))
    left = f"appo_leak_check_{uuid.uuid4().hex}"
    try:
        open(f"/dev/shm/{left}", "w").close()  # made by this process, held by none
        assert len(their_names) == len(child_names) == 2
        assert conftest.shm_left_by_this_run(before) == sorted(child_names + [left])
    finally:
        for process in (theirs, child):
            process.stdin.close()  # it exits, and multiprocessing removes its semaphore
            process.wait(timeout=30)
        for name in (their_names[0], child_names[0], left):  # the files: the semaphores went with their makers
            os.unlink(f"/dev/shm/{name}")

"""conftest.py's leak check: it reports what this test run leaves in /dev/shm, and not what
another run on the same machine has there meanwhile."""
import os
import subprocess
import sys
import uuid

import conftest

HOLDS_A_SEGMENT = "import sys, time; f = open('/dev/shm/' + sys.argv[1], 'w'); print(flush=True); time.sleep(60)"


def start_holding(name: str, env: dict) -> subprocess.Popen:
    """A process that makes /dev/shm/`name` and keeps it open, started once the file exists."""
    process = subprocess.Popen([sys.executable, "-c", HOLDS_A_SEGMENT, name], env=env, stdout=subprocess.PIPE)
    process.stdout.readline()
    return process


def test_the_leak_check_reports_this_runs_segments_and_not_another_runs():
    """Another run's process stands in as one started without this run's tag in its environment."""
    names = {who: f"appo_leak_check_{who}_{uuid.uuid4().hex}" for who in ("theirs", "child", "left")}
    another_run = {key: value for key, value in os.environ.items() if key != "APPO_TEST_RUN"}
    before = conftest.shm_entries()
    processes = [start_holding(names["theirs"], another_run), start_holding(names["child"], dict(os.environ))]
    try:
        open(f"/dev/shm/{names['left']}", "w").close()  # made by this process, held by none
        assert conftest.shm_left_by_this_run(before) == sorted([names["child"], names["left"]])
    finally:
        for process in processes:
            process.kill()
            process.wait()
        for name in names.values():
            os.unlink(f"/dev/shm/{name}")

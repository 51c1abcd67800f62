"""Checks that every test leaves the machine as it found it: no shared-memory segment and no
child process left behind."""
import multiprocessing
import os

import pytest


def shm_entries():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    before = shm_entries()
    yield
    leaked = shm_entries() - before
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
    children = multiprocessing.active_children()
    assert not children, f"child processes still running: {children}"


@pytest.fixture
def spawn():
    return multiprocessing.get_context("spawn")

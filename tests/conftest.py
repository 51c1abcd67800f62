"""Checks that every test leaves the machine as it found it: no shared-memory segment and no
child process left behind."""
import contextlib
import glob
import multiprocessing
import os
import time
import types
import uuid
from pathlib import Path

import pytest
import torch

import appo

# Every process this test run starts inherits it: how the leak check tells this run's processes
# from those of another run on the same machine.
RUN_TAG = "APPO_TEST_RUN=" + os.environ.setdefault("APPO_TEST_RUN", uuid.uuid4().hex)


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


def process_running(pid: int) -> bool:
    """Whether `pid` is alive (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system, all its threads) that process `pid` has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


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


def shm_holders(names: set[str]) -> dict[str, set[int]]:
    """For each of `names` in /dev/shm, the live processes that map it or hold it open. Matched by
    inode: the process that makes a POSIX semaphore maps it under the temporary name glibc made it as."""
    names_of = {}
    for name in names:
        with contextlib.suppress(OSError):  # removed meanwhile
            names_of[os.stat(f"/dev/shm/{name}").st_ino] = name
    holders = {name: set() for name in names}
    for proc in glob.glob("/proc/[0-9]*"):
        inodes = set()
        try:
            with open(f"{proc}/maps") as f:
                inodes |= {int(line.split()[4]) for line in f if " /dev/shm/" in line}
            for fd in glob.glob(f"{proc}/fd/*"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(fd).startswith("/dev/shm/"):
                        inodes.add(os.stat(fd).st_ino)
        except OSError:
            continue  # exited meanwhile, or not ours to read
        for inode in inodes & names_of.keys():
            holders[names_of[inode]].add(int(proc.rsplit("/", 1)[1]))
    return holders


def shm_left_by_this_run(before: set[str]) -> list[str]:
    """What this test run added to /dev/shm since `before`, leaving out this process's CUDA IPC
    files (they live as long as it does; the runner removes its own at exit) and what a live
    process of another run holds. The machine is shared: another appo run's segments come and go
    meanwhile. One that such a run made and then left without a process holding it cannot be told
    apart from this run's, and counts."""
    own_cuda = {os.path.basename(path) for path in appo.cuda_ipc_files([os.getpid()])}
    new = shm_entries() - before - own_cuda
    if not new:
        return []
    this_run = {os.getpid(), *processes_tagged(RUN_TAG)}
    holders = shm_holders(new)
    others = {name for name, pids in holders.items() if pids and not pids & this_run}
    return sorted((new & shm_entries()) - others)  # and not those gone meanwhile


def outside_a_run(cfg, spaces_pair, **fields):
    """What a Learner built alone (no runner) reads of a run's shared state: its policy's published
    weights, version 0, which it starts from (on the GPU with --device cuda, as create_shared
    makes them), and any other `fields` given (slots, run, ...)."""
    device = torch.device(cfg.device)
    weights = appo.SharedWeights(appo.ActorCritic(*spaces_pair, cfg), device if device.type == "cuda" else None)
    return types.SimpleNamespace(weights=[weights], **fields)


def gather_slots(slots: appo.RolloutSlots, slot_indices: list[int]) -> dict[str, torch.Tensor]:
    """Copies whole trajectories out of the slots, as a test reads them (the learner copies with
    BatchBuffers): name -> [T+1, len(slot_indices), ...], time first, as views of trajectory-major
    copies (see appo.trajectory_major)."""
    index = torch.as_tensor(slot_indices, dtype=torch.long)
    return {name: tensor.index_select(0, index).transpose(0, 1) for name, tensor in slots.tensors.items()}


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    before = shm_entries()
    yield
    leaked = shm_left_by_this_run(before)
    assert not leaked, f"left in /dev/shm: {leaked}"
    children = multiprocessing.active_children()
    assert not children, f"child processes still running: {children}"


@pytest.fixture
def spawn():
    return multiprocessing.get_context("spawn")

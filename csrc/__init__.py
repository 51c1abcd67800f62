"""appo_ipc: the shared memory the trainer's processes talk through. The C++ module (_native: ipc.h,
ipc.cpp, module.cpp) supplies the queue, the shared buffers and the slots' control; this face lays
out torch and numpy views over those buffers and does the copies in and out of them:

    RolloutSlots       the trajectory slots: every field of every step, and the slots' free list
    SharedCounters     named int64 counters in one buffer (appo.py's RunState names them)
    SharedWeights      one policy's latest weights under a seqlock, on the host or on a GPU
    InProcessQueue     --serial_mode's stand-in for Queue; drain() empties either
    BatchBuffers       the learner's copy of a batch out of the slots
    ActionRequests     a policy worker's batch of requests, and ActionStaging, its copies between
                       the slots and the model

It knows the slots' field names (rnn_state, done, the policy worker's outputs), not what fills
them: appo.py declares the fields (rollout_buffer_specs) and decides the sizes (create_shared).
It never imports appo.py; what appo.py knows and this does not (whether host reads stall) comes
in as an argument.
"""

from __future__ import annotations

import array
import contextlib
import copy
import glob
import os
import queue
import time
from collections import deque

import numpy as np
import torch

from ._native import CRASH_POINTS, Closed, Queue, SharedBuffer, SlotControl, _arm_crash_point  # noqa: F401


# ---------------------------------------------------------------------------------------------
# Trajectory slots and shared counters
# ---------------------------------------------------------------------------------------------

class RolloutSlots:
    """num_slots trajectories of T+1 steps in one shared buffer, viewed per field as numpy arrays
    [num_slots, T+1, *shape] and torch tensors over the same memory, plus the slots' free list
    and the per-(worker, split) action counters (appo_ipc.SlotControl).

    `specs` (name -> (shape, dtype)) may be a list of them, one per group of agents whose spaces
    differ (appo.py's groups): a field is stored once per distinct (name, shape, dtype), so the
    groups share the fields they declare alike (rewards, dones, RNN states) and each has its own
    observations and actions. A slot holds one group's trajectory at a time, and fields(specs) are
    the views a group reads; arrays and tensors are the first group's."""

    def __init__(self, specs, num_slots: int, rollout: int, num_workers: int, num_splits: int):
        self.group_specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
        self.specs, self.num_slots, self.rollout = self.group_specs[0], num_slots, rollout
        self.buffer = SharedBuffer(self._layout()[1])
        self.control = SlotControl(num_slots, num_workers, num_splits)
        self._make_views()

    def _fields(self) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        """Every stored field, each distinct (name, shape, dtype) of the groups' specs once."""
        return list(dict.fromkeys((name, tuple(shape), dtype) for specs in self.group_specs
                                  for name, (shape, dtype) in specs.items()))

    def _layout(self):
        offsets, total = {}, 0
        for field in self._fields():
            _, shape, dtype = field
            offsets[field] = total
            nbytes = self.num_slots * (self.rollout + 1) * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            total += (nbytes + 63) // 64 * 64  # cache-line aligned fields
        return offsets, total

    def _make_views(self):
        raw = np.frombuffer(self.buffer, dtype=np.uint8)
        offsets, _ = self._layout()
        self._stored = {}
        for field in self._fields():
            _, shape, dtype = field
            full_shape = (self.num_slots, self.rollout + 1, *shape)
            nbytes = int(np.prod(full_shape, dtype=np.int64)) * dtype.itemsize
            array = raw[offsets[field]:offsets[field] + nbytes].view(dtype).reshape(full_shape)
            self._stored[field] = (array, torch.from_numpy(array))
        self.arrays, self.tensors = self.fields(self.specs)

    def fields(self, specs) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """The numpy and torch views of the fields one group's `specs` name (one of those given)."""
        stored = [self._stored[(name, tuple(shape), dtype)] for name, (shape, dtype) in specs.items()]
        return ({name: array for name, (array, _) in zip(specs, stored)},
                {name: tensor for name, (_, tensor) in zip(specs, stored)})

    def __getstate__(self):
        return {"group_specs": self.group_specs, "specs": self.specs, "num_slots": self.num_slots,
                "rollout": self.rollout, "buffer": self.buffer, "control": self.control}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_views()


class SharedCounters:
    """Small shared counters every process reads or writes without messages: one int64 array
    attribute per name in `sizes` (name -> length), all in one shared buffer."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = sizes
        self.buffer = SharedBuffer(8 * sum(self.sizes.values()))
        self._make_views()

    def _make_views(self):
        flat = np.frombuffer(self.buffer, dtype=np.int64)
        offset = 0
        for name, size in self.sizes.items():
            setattr(self, name, flat[offset:offset + size])
            offset += size

    def __getstate__(self):
        return {"sizes": self.sizes, "buffer": self.buffer}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_views()


# ---------------------------------------------------------------------------------------------
# Published weights, and what handing them over CUDA IPC leaves in /dev/shm
# ---------------------------------------------------------------------------------------------

class SharedWeights:
    """The latest weights of one policy, guarded by a version counter.

    The learner writes them after every SGD step; policy workers copy them when the version
    moved. A seqlock (odd sequence = write in progress) lets readers never block the learner.
    On CPU the weights live in a shared host buffer. Given a `device` (--device cuda) they live
    in that device's memory, allocated by the runner and handed to every process through torch's
    CUDA IPC (its pickling of CUDA tensors), so the learner and the policy workers copy them
    device to device and never through the host.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device | None = None):
        self.num_params = sum(p.numel() for p in acting_state(model))
        self.buffer = SharedBuffer(8 * 2 + (4 * self.num_params if device is None else 0))
        self.device_flat = None if device is None else torch.zeros(self.num_params, device=device)
        self._make_views()
        self.publish(model, version=0)

    def _make_views(self):
        raw = np.frombuffer(self.buffer, dtype=np.uint8)
        self.sequence = raw[:8].view(np.int64)          # seqlock counter
        self.version_array = raw[8:16].view(np.int64)   # policy version of the weights
        self.flat = torch.from_numpy(raw[16:].view(np.float32)) if self.device_flat is None else self.device_flat

    @property
    def version(self) -> int:
        return int(self.version_array[0])

    def publish(self, model: torch.nn.Module, version: int):
        self.sequence[0] += 1
        offset = 0
        for tensor in acting_state(model):
            n = tensor.numel()
            self.flat[offset:offset + n].copy_(tensor.detach().reshape(-1))
            offset += n
        wait_for_copies(self.flat)  # GPU copies run asynchronously: done before readers see the version
        self.version_array[0] = version
        self.sequence[0] += 1

    def load_into(self, model: torch.nn.Module) -> int | None:
        """Copies the weights into `model`; returns their version, or None if a write got in the way."""
        before = int(self.sequence[0])
        if before % 2:
            return None
        version, offset = self.version, 0
        with torch.no_grad():
            for tensor in acting_state(model):
                n = tensor.numel()
                tensor.copy_(self.flat[offset:offset + n].view_as(tensor))
                offset += n
        wait_for_copies(self.flat)  # a write that began during an unfinished copy must be noticed below
        return version if int(self.sequence[0]) == before else None

    def release(self):
        """Before a process that received GPU weights exits: drop its handle on the runner's memory,
        so that PyTorch's count of the runner's shared tensors reaches zero (else the runner warns
        at exit: 'Producer process has been terminated before all shared CUDA tensors released')."""
        if self.device_flat is not None:
            self.device_flat = self.flat = None

    def __getstate__(self):
        return {"num_params": self.num_params, "buffer": self.buffer, "device_flat": self.device_flat}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_views()


def acting_state(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors of the model's state that acting needs, in state_dict order: all but those of
    the submodules it names in `learner_only` (an RND predictor, a world model: the learner's
    alone), which policy workers then never load (checkpoints keep the whole state)."""
    skipped = tuple(f"{name}." for name in getattr(model, "learner_only", ()))
    return [tensor for key, tensor in model.state_dict().items() if not key.startswith(skipped)]


def wait_for_copies(tensor: torch.Tensor):
    """Waits, asleep, for the work queued so far on `tensor`'s device (its current stream)."""
    if tensor.is_cuda:
        done = sleeping_event()
        done.record(torch.cuda.current_stream(tensor.device))
        done.synchronize()


def sleeping_event() -> "torch.cuda.Event":
    """A CUDA event whose synchronize() sleeps: the default one spins a core until the GPU is done,
    and on a GPU machine the cores run the envs."""
    return torch.cuda.Event(blocking=True)


def cuda_ipc_files(pids, reference_counters: bool = True) -> list[str]:
    """The /dev/shm files that handing CUDA tensors to other processes (SharedWeights on a GPU)
    leaves behind: the CUDA driver's `cuda.shm.<n>.<pid in hex>.<n>`, which it never removes, and
    PyTorch's reference counters `torch_<pid>_<n>_<n>`, which stay when their process dies before
    the processes it shared with. Remove them only for processes that are gone, or, without the
    counters (PyTorch removes those at exit), for the calling process once those it shared with
    are gone."""
    hex_pids, dec_pids = {f"{pid:x}" for pid in pids}, {str(pid) for pid in pids}
    found = []
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        parts = name.split(".")
        if (name.startswith("cuda.shm.") and len(parts) == 5 and parts[3] in hex_pids) or \
                (reference_counters and name.startswith("torch_") and name.split("_")[1] in dec_pids):
            found.append(os.path.join("/dev/shm", name))
    return found


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def shm_holders(names) -> dict[str, set[int]]:
    """For each of `names` in /dev/shm, the live processes that map it or hold it open: how a leak
    check on a shared machine tells another run's live segments from what its own run left (the
    tests' leak check, bench/chaos.py). Matched by inode, since the process that makes a POSIX
    semaphore maps it under the temporary name glibc made it as."""
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


def shm_left_since(before: set[str], own_pids=(), grace_s: float = 10.0) -> list[str]:
    """/dev/shm entries made since `before` and still there that no live process holds, or that
    one of `own_pids` holds: what a run left, told apart from the segments of other runs that come
    and go on a shared machine meanwhile. An entry no one holds is looked at again until it goes or
    `grace_s` has passed: a VizDoom game being started makes its segments a moment before it maps
    them, and a run whose worker was killed removes what its games left only once they have exited
    (kill_process_group waits up to 5 s), which on a loaded machine took more than a second."""
    own, deadline = set(own_pids), time.monotonic() + grace_s
    left = shm_entries() - before
    while True:
        holders = shm_holders(left)
        left = {name for name in left & shm_entries() if not holders[name] or holders[name] & own}
        if not any(not holders[name] for name in left) or time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.25)


def remove_files(paths: list[str]):
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# ---------------------------------------------------------------------------------------------
# Queues
# ---------------------------------------------------------------------------------------------

class InProcessQueue:
    """--serial_mode's queue: appo_ipc.Queue's calls on a deque, for producers and consumers that
    all live in this process and take turns (so nothing ever waits)."""

    def __init__(self):
        self.messages: deque = deque()

    def put(self, message, block: bool = True, timeout: float | None = None):
        self.messages.append(message)

    def get_many(self, max_messages: int = 1 << 30, block: bool = True, timeout: float | None = None) -> list:
        if not self.messages:
            raise queue.Empty
        return [self.messages.popleft() for _ in range(min(max_messages, len(self.messages)))]

    def close(self):
        self.messages.clear()


def drain(ipc_queue: Queue | InProcessQueue) -> list:
    """Every message waiting in `ipc_queue`, without waiting for more."""
    try:
        return ipc_queue.get_many(block=False)
    except queue.Empty:
        return []


# ---------------------------------------------------------------------------------------------
# The learner's copy of a batch out of the slots
# ---------------------------------------------------------------------------------------------

class BatchBuffers:
    """One batch's trajectory-major [trajectories, steps, ...] buffers for every field of the slots
    (two steps of "rnn_state": the first and the last). On a GPU: pinned host buffers, device
    buffers, and the event that marks the copies between them done.

    With `dones_on_host` (the learner's choice where host reads stall: a GPU), the batch also
    carries "done_host": the dones [T+1, B] as a numpy array of its own (the pinned buffers are
    reused), from which the learner plans its RNN's episode segments without reading the device."""

    def __init__(self, slot_tensors: dict[str, torch.Tensor], trajectories: int, device: torch.device,
                 dones_on_host: bool):
        on_gpu = device.type == "cuda"
        self.host, self.device, self.copied = {}, {} if on_gpu else None, None
        self.dones_on_host = dones_on_host
        for name, tensor in slot_tensors.items():
            shape = (trajectories, 2 if name == "rnn_state" else tensor.shape[1], *tensor.shape[2:])
            self.host[name] = torch.empty(shape, dtype=tensor.dtype, pin_memory=on_gpu)
            if on_gpu:
                self.device[name] = torch.empty(shape, dtype=tensor.dtype, device=device)

    def fill(self, slot_tensors: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Copies the slots `index` in; returns the batch (on the device if there is one), time first."""
        if self.copied is not None:
            self.copied.synchronize()  # the last copies to the GPU have left the pinned buffers
        for name, tensor in slot_tensors.items():
            if name == "rnn_state":
                torch.stack([tensor[index, 0], tensor[index, -1]], dim=1, out=self.host[name])
            else:
                torch.index_select(tensor, 0, index, out=self.host[name])
        batch = self.host
        if self.device is not None:
            batch = {name: self.device[name].copy_(value, non_blocking=True) for name, value in batch.items()}
            self.copied = sleeping_event()
            self.copied.record()
        batch = {name: value.transpose(0, 1) for name, value in batch.items()}
        if self.dones_on_host:
            batch["done_host"] = self.host["done"].numpy().T.copy()
        return batch


# ---------------------------------------------------------------------------------------------
# The policy worker's requests, and its copies between the slots and the model
# ---------------------------------------------------------------------------------------------

class ActionRequests:
    """A batch of action_request messages: per message its (worker, split, generation) and how many
    of its actors are in the batch; per actor its worker, split, generation and slot, and its row
    in the slot fields viewed as rows [num_slots * (T+1), ...]. Python lists, not arrays: a batch is
    tens of actors, and each numpy call costs more than a list comprehension over them."""

    def __init__(self, messages: list[tuple[int, ...]], steps_per_slot: int):
        self.heads = [message[:3] for message in messages]
        self.counts = [(len(message) - 3) // 2 for message in messages]
        self.workers, self.splits, self.generations = (
            [head[i] for head, count in zip(self.heads, self.counts) for _ in range(count)] for i in range(3))
        self.slots = [slot for message in messages for slot in message[3::2]]
        rows = array.array("q", [slot * steps_per_slot + step for message in messages
                                 for slot, step in zip(message[3::2], message[4::2])])
        # frombuffer: cheaper than torch.tensor(list); it refuses an empty buffer
        self.rows = torch.frombuffer(rows, dtype=torch.long) if rows else torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.slots)

    def without(self, stale: list[int]) -> tuple["ActionRequests", torch.Tensor]:
        """These requests less the `stale` ones (indices), and the indices of those kept."""
        dropped = set(stale)
        kept = [i for i in range(len(self)) if i not in dropped]
        subset = copy.copy(self)
        for name in ("workers", "splits", "generations", "slots"):
            setattr(subset, name, [getattr(self, name)[i] for i in kept])
        message = [index for index, count in enumerate(self.counts) for _ in range(count)]
        subset.counts = [0] * len(self.counts)
        for i in kept:
            subset.counts[message[i]] += 1
        kept = torch.tensor(kept, dtype=torch.long)
        subset.rows = self.rows[kept]
        return subset, kept


class ActionStaging:
    """A policy worker's copies between the slots and its model: gather() takes a batch's inputs
    (the observations `obs_keys` and the RNN states) into staging buffers made once, to_host()
    brings the outputs back from a GPU, scatter() writes them into the slots. On a GPU the host
    staging buffers are pinned and the outputs travel packed in one buffer."""

    def __init__(self, slots: RolloutSlots, obs_keys: list[str], fields: list[str], device: torch.device,
                 specs: dict | None = None):
        """`fields`: the slot fields the model's outputs go to, in order; the next RNN states follow
        them. `specs`: the policy's group's fields (RolloutSlots.fields), if not the first group's."""
        self.device, self.on_gpu, self.obs_keys, self.fields = device, device.type == "cuda", obs_keys, fields
        self.outputs = [*fields, "rnn_state"]  # the outputs' rows: the next states go to the row after the step
        # every slot field as rows [num_slots * (T+1), ...]: a request is one row, so a batch is one index
        tensors = slots.tensors if specs is None else slots.fields(specs)[1]
        self.rows = {name: tensor.flatten(0, 1) for name, tensor in tensors.items()}
        self.next_states = self.rows["rnn_state"][1:]  # row i here is row i + 1 there: the state after row i
        self.make_buffers(slots.num_slots)  # a slot has one standing request at most

    def make_buffers(self, capacity: int):
        self.capacity = capacity
        self.host_inputs = {key: torch.empty((capacity, *self.rows[key].shape[1:]), dtype=self.rows[key].dtype,
                                             pin_memory=self.on_gpu) for key in self.obs_keys + ["rnn_state"]}
        self.inputs = self.host_inputs  # on the CPU the model reads the staging buffers themselves
        self.batch_views = {}  # batch size -> (field rows, host staging, device input) per input
        if self.on_gpu:
            self.inputs = {key: torch.empty_like(tensor, device=self.device) for key, tensor in self.host_inputs.items()}
            self.device_outputs, self.device_output_views = self.packed_outputs(capacity, self.device)
            self.host_outputs, self.host_output_views = self.packed_outputs(capacity, torch.device("cpu"), pin=True)
            self.outputs_copied = sleeping_event()

    def packed_outputs(self, capacity: int, device: torch.device, pin: bool = False):
        """One byte buffer [capacity, bytes a row] for all of act()'s outputs, and a view of it per
        output in that output's dtype and shape. Each output's columns start at a multiple of 8
        bytes, which view(dtype) needs."""
        widths = [self.rows[name][0].numel() * self.rows[name].element_size() for name in self.outputs]
        starts = np.cumsum([0] + [(width + 7) // 8 * 8 for width in widths]).tolist()
        packed = torch.empty((capacity, starts[-1]), dtype=torch.uint8, device=device, pin_memory=pin)
        fields = [self.rows[name] for name in self.outputs]
        return packed, [packed[:, start:start + width].view(field.dtype).view(capacity, *field.shape[1:])
                        for field, start, width in zip(fields, starts, widths)]

    def gather(self, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The batch's observations and RNN states, in staging buffers on the model's device."""
        n = len(rows)
        if n > self.capacity:  # never in a run (see __init__); a bound kept by code, not by trust
            self.make_buffers(n)
        if n not in self.batch_views:  # slicing is a torch call too: once per batch size, not per batch
            self.batch_views[n] = [(self.rows[key], host[:n], self.inputs[key][:n])
                                   for key, host in self.host_inputs.items()]
        inputs = []
        for field_rows, host, device in self.batch_views[n]:
            torch.index_select(field_rows, 0, rows, out=host)
            if device is not host:
                device.copy_(host, non_blocking=True)
            inputs.append(device)
        *obs, rnn_state = inputs
        return dict(zip(self.obs_keys, obs)), rnn_state

    def to_host(self, outputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """act()'s outputs, from the GPU to host memory: packed into one buffer there, one
        non-blocking copy into pinned memory, one wait (a copy and a wait per output cost a
        synchronisation each). The staging buffers are free again once it returns."""
        n = len(outputs[0])
        for view, output in zip(self.device_output_views, outputs):
            view[:n].copy_(output)
        self.host_outputs[:n].copy_(self.device_outputs[:n], non_blocking=True)
        self.outputs_copied.record()
        self.outputs_copied.synchronize()
        return [view[:n] for view in self.host_output_views]

    def scatter(self, rows: torch.Tensor, outputs: list[torch.Tensor], version: int):
        """Writes each row's outputs (in `outputs`' order) into their fields, the version of the
        weights that computed them, and the next RNN state into the row after it."""
        *step_outputs, next_state = outputs
        for name, output in zip(self.fields, step_outputs, strict=True):
            self.rows[name].index_copy_(0, rows, output)
        self.rows["policy_version"].index_fill_(0, rows, version)
        self.next_states.index_copy_(0, rows, next_state)

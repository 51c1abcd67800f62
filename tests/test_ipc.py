"""The shared-memory core (csrc/): queue, shared buffers and slot control, across real processes
started as the runner starts its children (forked by a server process)."""
import os
import pickle
import queue
import random
import signal
import threading
import time

import numpy as np
import pytest

import appo_ipc


# ---------------------------------------------------------------------------------------------
# Process bodies (module level so that a child can unpickle them)

def produce(q, producer_id, num_messages, batch):
    for start in range(0, num_messages, batch):
        q.put_many([(producer_id, seq, seq * 7 + producer_id) for seq in range(start, min(start + batch, num_messages))])


def drain_until_closed(q, results):
    received = []
    while True:
        try:
            received.extend(q.get_many(max_messages=1000, timeout=0.2))
        except queue.Empty:
            continue
        except appo_ipc.Closed:
            break
    results.put(pickle.dumps(received))


def hold_lock_forever(shared_object, ready_path):
    shared_object._hold_lock_forever(ready_path)


def wait_until(condition, what: str, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


def wait_for_file(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def produce_checked_forever(q, producer_id, started):
    seq = 0
    while True:
        q.put((producer_id, seq, (producer_id * 1_000_003 + seq * 7919) % 2_147_483_647))
        if seq == 0:
            started.set()
        seq += 1


def write_buffer(buffer, value):
    np.frombuffer(buffer, dtype=np.float32)[:] = value


def acquire_slots_and_die(slots, owner, count, done):
    for _ in range(count):
        slots.acquire(owner)
    done.set()
    time.sleep(60)


def answer_split(slots, worker, split, generation, num_requests):
    for _ in range(num_requests):
        time.sleep(0.01)
        slots.complete(worker, split, generation, 1)


# ---------------------------------------------------------------------------------------------
# Queue

def test_put_get_round_trip_of_int_tuples_and_pickled_objects():
    q = appo_ipc.Queue()
    messages = [(1, 2, 3), (), (-5, 2**62), {"slot": 3}, "text", (1, "mixed"), (2**70,), [1, 2]]
    for message in messages:
        q.put(message)
    assert q.qsize() == len(messages)
    assert q.get_many() == messages
    assert q.empty()


def test_get_many_respects_max_messages():
    q = appo_ipc.Queue()
    q.put_many([(i,) for i in range(10)])
    assert q.get_many(max_messages=3) == [(0,), (1,), (2,)]
    assert q.get_many(max_messages=100) == [(i,) for i in range(3, 10)]


def test_every_message_arrives_exactly_once_in_producer_order(processes):
    num_producers, num_consumers, per_producer = 8, 2, 12_500  # 100k messages
    q = appo_ipc.Queue(max_size_bytes=64 * 1024)  # small ring: producers really block on full
    results = processes.Queue()
    consumers = [processes.Process(target=drain_until_closed, args=(q, results)) for _ in range(num_consumers)]
    producers = [processes.Process(target=produce, args=(q, p, per_producer, 50)) for p in range(num_producers)]
    for process in consumers + producers:
        process.start()
    for process in producers:
        process.join(timeout=120)
        assert process.exitcode == 0
    deadline = time.monotonic() + 60
    while q.qsize() > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    q.close()
    received = [pickle.loads(results.get(timeout=60)) for _ in range(num_consumers)]
    for process in consumers:
        process.join(timeout=30)
    all_messages = [m for part in received for m in part]
    assert len(all_messages) == num_producers * per_producer
    assert len(set(all_messages)) == len(all_messages)
    assert all(check == seq * 7 + producer for producer, seq, check in all_messages)
    for part in received:  # within each consumer, each producer's messages keep their order
        for producer in range(num_producers):
            seqs = [seq for p, seq, _ in part if p == producer]
            assert seqs == sorted(seqs)


def test_get_times_out_with_empty_and_put_with_full():
    q = appo_ipc.Queue(max_size_bytes=64)
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.3)
    assert time.monotonic() - start >= 0.29
    with pytest.raises(queue.Empty):
        q.get(block=False)
    q.put((1, 2, 3))  # 4 + 1 + 24 = 29 bytes
    q.put((1, 2, 3))
    with pytest.raises(queue.Full):
        q.put((1, 2, 3), timeout=0.2)
    with pytest.raises(queue.Full):
        q.put_nowait((1,))
    assert q.get() == (1, 2, 3)


def test_put_many_is_all_or_nothing():
    q = appo_ipc.Queue(max_size_bytes=100)
    q.put((1, 2, 3))  # 4 + 1 + 24 = 29 bytes
    with pytest.raises(queue.Full):
        q.put_many([(i, i) for i in range(4)], block=False)  # 4 x 21 = 84 > 71 bytes left
    assert q.get_many() == [(1, 2, 3)]
    q.put_many([(i, i) for i in range(4)], block=False)
    assert q.qsize() == 4


def test_close_wakes_a_blocked_getter_and_later_calls_raise():
    q = appo_ipc.Queue()
    outcome = []

    def blocked_get():
        try:
            q.get()  # timeout=None: blocks until something happens
        except appo_ipc.Closed as error:
            outcome.append(error)

    getter = threading.Thread(target=blocked_get)
    getter.start()
    wait_until(lambda: q.sleepers == 1, "the getter sleeps")  # it really blocks, and releases the GIL while it does
    q.close()
    getter.join(timeout=5)
    assert not getter.is_alive() and len(outcome) == 1
    assert q.closed
    with pytest.raises(appo_ipc.Closed):
        q.put((1,))
    with pytest.raises(appo_ipc.Closed):
        q.get_many(block=False)


def test_close_wakes_a_getter_in_another_process(processes):
    q = appo_ipc.Queue()
    results = processes.Queue()
    process = processes.Process(target=drain_until_closed, args=(q, results))
    process.start()
    q.put((7,))
    deadline = time.monotonic() + 60
    while q.qsize() and time.monotonic() < deadline:  # the getter took it: it runs and waits again
        time.sleep(0.01)
    wait_until(lambda: q.sleepers == 1, "the other process's getter sleeps")
    q.close()
    assert pickle.loads(results.get(timeout=20)) == [(7,)]
    process.join(timeout=10)
    assert process.exitcode == 0


def test_oversize_message_raises_at_once_naming_both_sizes():
    q = appo_ipc.Queue(max_size_bytes=1000)
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"message of \d+ bytes .* ring of 1000 bytes"):
        q.put(b"x" * 5000)  # block=True, timeout=None: must not hang
    with pytest.raises(ValueError, match="1000 bytes"):
        q.put_many([(i,) * 8 for i in range(20)])
    assert time.monotonic() - start < 1.0
    q.put((1,))
    assert q.get() == (1,)


def test_a_process_killed_while_holding_the_lock_does_not_deadlock_others(processes, tmp_path):
    q = appo_ipc.Queue()
    q.put((1,))
    ready_path = str(tmp_path / "locked")
    holder = processes.Process(target=hold_lock_forever, args=(q, ready_path))
    holder.start()
    wait_for_file(ready_path)
    with pytest.raises(queue.Empty):  # the lock is held: a get cannot proceed
        q.get_many(timeout=0.3)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(timeout=10)
    assert q.get(timeout=5) == (1,)
    assert q.recoveries == 1
    q.put((2,))
    assert q.get() == (2,)


def test_producers_killed_at_random_moments_never_corrupt_the_ring(processes):
    q = appo_ipc.Queue(max_size_bytes=4096)
    rng = random.Random(0)
    received = []
    for round_index in range(12):
        started = [processes.Event() for _ in range(3)]
        producers = [processes.Process(target=produce_checked_forever, args=(q, round_index * 10 + p, started[p]))
                     for p in range(3)]
        for process in producers:
            process.start()
        start_deadline = time.monotonic() + 120
        for event in started:  # start-up is slow under load: kill only producers that run
            while not event.is_set():
                assert time.monotonic() < start_deadline, "a producer never started"
                try:
                    received.extend(q.get_many(max_messages=200, timeout=0.1))
                except queue.Empty:
                    pass
        deadline = time.monotonic() + rng.uniform(0.1, 0.5)
        while time.monotonic() < deadline:
            try:
                received.extend(q.get_many(max_messages=200, timeout=0.1))
            except queue.Empty:
                pass
        for process in producers:
            os.kill(process.pid, signal.SIGKILL)
        for process in producers:
            process.join(timeout=10)
    while True:
        try:
            received.extend(q.get_many(timeout=0.2))
        except queue.Empty:
            break
    assert len(received) > 1000
    for producer_id, seq, check in received:
        assert check == (producer_id * 1_000_003 + seq * 7919) % 2_147_483_647
    by_producer = {}
    for producer_id, seq, _ in received:
        by_producer.setdefault(producer_id, []).append(seq)
    for seqs in by_producer.values():  # exactly once and in order, with at most a lost tail
        assert seqs == list(range(len(seqs)))


def test_pickled_queue_reattaches_in_another_process(processes):
    q = appo_ipc.Queue()
    process = processes.Process(target=produce, args=(q, 3, 10, 4))
    process.start()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert q.get_many() == [(3, seq, seq * 7 + 3) for seq in range(10)]


# ---------------------------------------------------------------------------------------------
# Shared buffers and slot control

def test_a_buffer_written_in_one_process_is_read_in_another(processes):
    buffer = appo_ipc.SharedBuffer(4 * 1000)
    view = np.frombuffer(buffer, dtype=np.float32)
    assert view.shape == (1000,) and not view.any()
    process = processes.Process(target=write_buffer, args=(buffer, 2.5))
    process.start()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert (view == 2.5).all()


def test_slots_are_handed_out_once_and_returned():
    slots = appo_ipc.SlotControl(num_slots=4, num_workers=1, num_splits=1)
    taken = [slots.acquire(owner=7) for _ in range(4)]
    assert sorted(taken) == [0, 1, 2, 3]
    assert slots.free_count == 0
    assert slots.acquire(owner=7, timeout=0.1) is None
    assert slots.acquire(owner=7, block=False) is None
    assert slots.transfer(taken[0], 7, slots.generation(taken[0]), 100)
    assert slots.owner(taken[0]) == 100
    slots.release([taken[0]])
    with pytest.raises(ValueError, match="twice"):
        slots.release([taken[0]])
    with pytest.raises(IndexError):
        slots.release([99])
    assert slots.acquire(owner=1) == taken[0]


def test_reclaim_returns_the_slots_of_a_dead_worker(processes):
    slots = appo_ipc.SlotControl(num_slots=10, num_workers=2, num_splits=2)
    done = processes.Event()
    worker = processes.Process(target=acquire_slots_and_die, args=(slots, 5, 6, done))
    worker.start()
    assert done.wait(20)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=10)
    assert slots.free_count == 4
    assert slots.reclaim(5) == 6
    assert slots.free_count == 10


def test_slots_survive_a_process_killed_while_holding_their_lock(processes, tmp_path):
    slots = appo_ipc.SlotControl(num_slots=3, num_workers=1, num_splits=1)
    first = slots.acquire(owner=0)
    ready_path = str(tmp_path / "locked")
    holder = processes.Process(target=hold_lock_forever, args=(slots, ready_path))
    holder.start()
    wait_for_file(ready_path)
    assert slots.acquire(owner=0, timeout=0.2) is None  # the lock is held: nobody gets in
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(timeout=10)
    assert slots.acquire(owner=0, timeout=5) is not None
    assert slots.recoveries == 1
    assert slots.free_count == 1 and slots.owner(first) == 0


def test_a_blocked_acquire_wakes_when_a_slot_is_released():
    slots = appo_ipc.SlotControl(num_slots=1, num_workers=1, num_splits=1)
    held = slots.acquire(owner=0)
    got = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire(owner=1, timeout=10)))
    waiter.start()
    wait_until(lambda: slots.sleepers == 1, "the acquirer sleeps")
    slots.release([held])
    waiter.join(timeout=5)
    assert got == [held]


def test_split_flags_report_the_split_whose_actions_all_arrived(processes):
    slots = appo_ipc.SlotControl(num_slots=1, num_workers=2, num_splits=2)
    assert slots.wait_any(worker=0, timeout=0.05) is None  # every split idle: nothing to wait for
    generation = slots.set_pending(worker=0, split=1, num_requests=3)
    slots.complete(worker=0, split=1, generation=generation, num_done=2)
    assert slots.pending(0, 1) == 1
    assert slots.wait_any(worker=0, timeout=0.05) is None
    slots.complete(worker=0, split=1, generation=generation)
    assert slots.wait_any(worker=0, timeout=0) == 1
    assert slots.pending(0, 1) == -1  # claimed: idle again
    # Answers from another process wake a sleeping rollout worker.
    generation = slots.set_pending(worker=1, split=0, num_requests=5)
    answerer = processes.Process(target=answer_split, args=(slots, 1, 0, generation, 5))
    answerer.start()
    assert slots.wait_any(worker=1, timeout=30) == 0
    answerer.join(timeout=10)
    assert slots.wait_any(worker=1, timeout=0.05) is None


def test_close_wakes_waiters_on_slots():
    """Both kinds of sleeper: a worker in wait_any (no split ready) and an acquirer (no slot free)."""
    slots = appo_ipc.SlotControl(num_slots=1, num_workers=1, num_splits=1)
    slots.acquire(owner=0)
    slots.set_pending(0, 0, 1)
    results = []

    def acquire():
        try:
            results.append(("acquired", slots.acquire(owner=1)))
        except appo_ipc.Closed:
            results.append("acquire: Closed")

    waiters = [threading.Thread(target=lambda: results.append(slots.wait_any(0))), threading.Thread(target=acquire)]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: slots.sleepers == 2, "wait_any and acquire sleep")
    slots.close()
    for waiter in waiters:
        waiter.join(timeout=5)
    assert not any(waiter.is_alive() for waiter in waiters)
    assert sorted(results, key=str) == sorted([None, "acquire: Closed"], key=str)
    with pytest.raises(appo_ipc.Closed):
        slots.acquire(owner=1)


def test_the_slot_api_refuses_what_would_corrupt_the_free_list():
    """Each of these once went through: release([s, s]) handed one slot to two owners, reclaim(-1)
    pushed every free slot again, set_owner (now transfer) on a free slot left it on the free stack too."""
    slots = appo_ipc.SlotControl(num_slots=4, num_workers=1, num_splits=1)
    a, b = slots.acquire(owner=0), slots.acquire(owner=0)
    with pytest.raises(ValueError, match="listed twice"):
        slots.release([a, a])
    with pytest.raises(ValueError, match="free already"):
        slots.release([a, 3])  # 3 is free: nothing is released, a included
    assert slots.free_count == 2 and slots.owner(a) == 0
    with pytest.raises(ValueError, match="owners are >= 0"):
        slots.reclaim(-1)
    with pytest.raises(ValueError, match="owners are >= 0"):
        slots.transfer(a, 0, slots.generation(a), -1)
    assert not slots.transfer(3, 0, slots.generation(3), 0)  # free: nobody's to hand over
    assert slots.free_count == 2 and slots.owner(3) == -1
    assert slots.transfer(a, 0, slots.generation(a), 5)
    assert slots.owner(a) == 5
    slots.release([a, b])
    assert slots.free_count == 4
    assert sorted(slots.acquire(owner=1) for _ in range(4)) == [0, 1, 2, 3]  # each slot once


def test_timeouts_are_none_or_non_negative_and_sizes_are_checked():
    """A negative or NaN timeout waited for ever; queue.Queue raises ValueError, and so do we."""
    q, slots = appo_ipc.Queue(), appo_ipc.SlotControl(num_slots=1, num_workers=1, num_splits=1)
    for call in (lambda: q.get(timeout=-0.01), lambda: q.get_many(timeout=float("nan")),
                 lambda: q.put((1,), timeout=-1.0), lambda: slots.acquire(owner=0, timeout=-1.0),
                 lambda: slots.wait_any(0, timeout=-1.0)):
        with pytest.raises(ValueError, match="timeout"):
            call()
    assert q.qsize() == 0 and slots.free_count == 1  # none of them did anything
    with pytest.raises(ValueError, match="max_messages"):
        q.get_many(max_messages=0)
    with pytest.raises(ValueError, match="max_size_bytes"):
        appo_ipc.Queue(2**64 - 1)


def explode_on_load():
    raise RuntimeError("this message cannot be loaded")


class LoadsBadly:
    def __reduce__(self):
        return explode_on_load, ()


class PutsWhilePickled:
    """Pickling it puts another message on the same queue, in the same thread."""

    def __init__(self, q):
        self.q = q

    def __reduce__(self):
        self.q.put(("nested", 1))
        return str, ("outer",)


def test_a_message_that_cannot_be_unpickled_loses_only_itself():
    """get_many used to drop its whole batch when one message raised in pickle.loads."""
    q = appo_ipc.Queue()
    q.put((1,))
    q.put(LoadsBadly())
    q.put((2,))
    q.put((3,))
    assert q.get_many() == [(1,)]  # the ones before it
    with pytest.raises(RuntimeError, match="cannot be loaded"):
        q.get_many()  # then its own error, once
    assert q.qsize() == 2
    assert q.get_many(max_messages=1) == [(2,)] and q.get_many() == [(3,)]  # and the ones after it


def test_a_tuple_of_ints_of_any_length_travels_as_int64s_not_as_a_pickle():
    """A policy worker's request carries a whole split's actors: past 64 ints it used to be pickled."""
    message = tuple(2**62 + i for i in range(200))  # each pickles to more than 8 bytes
    q = appo_ipc.Queue(max_size_bytes=4 + 1 + 8 * len(message))  # room for it as int64s, not as a pickle
    q.put(message)
    assert q.get_many() == [message]


def test_a_put_from_inside_pickling_does_not_tear_the_outer_message():
    q = appo_ipc.Queue()
    q.put(PutsWhilePickled(q))
    assert q.get_many() == [("nested", 1), "outer"]  # the nested put finished first; both whole


# ---------------------------------------------------------------------------------------------
# Faults at any instant (../shared/notes/ipc-review.md): generations, the slot hand-off, deaths
# inside critical sections, lock waits, stale handles

def test_a_late_or_duplicated_answer_never_completes_a_split():
    """Review row 1: a request sent again after a policy worker died, answered twice, drove the
    counter to -n; wait_any then never reported the split and half a worker's envs stopped."""
    slots = appo_ipc.SlotControl(num_slots=1, num_workers=1, num_splits=2)
    first = slots.set_pending(worker=0, split=1, num_requests=2)
    assert slots.complete(0, 1, first, 1)  # one answer arrived, the other was lost with its worker
    again = slots.set_pending(worker=0, split=1, num_requests=2)  # resend: a new generation
    assert again != first and slots.split_generation(0, 1) == again
    assert not slots.complete(0, 1, first, 1)  # the late answer to the lost request counts for nothing
    assert slots.pending(0, 1) == 2
    assert slots.complete(0, 1, again, 2)
    assert not slots.complete(0, 1, again, 1)  # a duplicate would take the counter below 0
    assert slots.wait_any(worker=0, timeout=0) == 1
    assert slots.pending(0, 1) == -1
    assert not slots.complete(0, 1, again, 1)  # nor can anything count once the worker holds the split
    assert slots.wait_any(worker=0, timeout=0) is None
    # A restarted rollout worker: what was asked for the dead process no longer counts.
    dead = slots.set_pending(worker=0, split=0, num_requests=1)
    slots.reset_splits(worker=0)
    assert slots.pending(0, 0) == -1 and not slots.complete(0, 0, dead, 1)
    assert slots.wait_any(worker=0, timeout=0) is None


def test_stale_names_the_requests_whose_slot_changed_owner_or_whose_split_was_asked_again():
    """The policy worker's one call for a batch: owner() and split_generation() of each request."""
    slots = appo_ipc.SlotControl(num_slots=4, num_workers=2, num_splits=2)
    mine, theirs, handed = slots.acquire(owner=0), slots.acquire(owner=1), slots.acquire(owner=0)
    asked = slots.set_pending(worker=0, split=1, num_requests=3)
    assert slots.stale([0, 0, 0], [1, 1, 1], [asked] * 3, [mine, theirs, handed]) == [1]
    assert slots.transfer(handed, 0, slots.generation(handed), 2)  # to a learner
    asked_again = slots.set_pending(worker=0, split=0, num_requests=1)
    assert slots.stale([0, 0, 0, 0], [1, 1, 0, 0], [asked, asked, asked_again, asked_again + 1],
                       [mine, handed, mine, mine]) == [1, 3]
    assert slots.stale([], [], [], []) == []
    with pytest.raises(IndexError):
        slots.stale([0], [1], [asked], [4])
    with pytest.raises(IndexError):
        slots.stale([2], [0], [asked], [mine])
    with pytest.raises(ValueError):
        slots.stale([0, 0], [1], [asked], [mine])


def test_a_slot_handed_off_by_a_worker_that_died_is_reclaimed_not_lost():
    """Review row 2: a worker killed between handing a slot to the learner and the message left it
    owned by the learner with no message for it, lost for good. Now the slot stays the worker's
    until the learner takes it, by the (slot, generation) the message names."""
    slots = appo_ipc.SlotControl(num_slots=2, num_workers=1, num_splits=1)
    learner = 1
    slot = slots.acquire(owner=0)
    message = (slot, slots.generation(slot), 0)  # on its way to the learner when the worker dies
    assert slots.reclaim(0) == 1 and slots.free_count == 2  # the runner frees what the dead worker held
    again = slots.acquire(owner=0)  # the restarted worker (same id) may get the same slot back
    assert again == slot and slots.generation(slot) == message[1] + 1
    assert not slots.transfer(message[0], message[2], message[1], learner)  # not its life any more
    assert slots.owner(slot) == 0
    assert slots.transfer(slot, 0, slots.generation(slot), learner)  # a current hand-off goes through
    assert slots.owner(slot) == learner and not slots.transfer(slot, 0, slots.generation(slot), learner)


def crash_at(shared_object, point, operation, args):
    appo_ipc._arm_crash_point(point)
    getattr(shared_object, operation)(*args)
    os._exit(3)  # the crash point was never reached


def die_at(processes, shared_object, point, operation, *args):
    process = processes.Process(target=crash_at, args=(shared_object, point, operation, args))
    process.start()
    process.join(timeout=60)
    assert process.exitcode == -signal.SIGKILL, f"{operation} never reached {point} (exit code {process.exitcode})"


def ring_with_wrapped_messages():
    """A small ring holding two messages, its free space wrapping around its end."""
    q = appo_ipc.Queue(max_size_bytes=160)
    for index in range(5):
        q.put((index, index))
    for _ in range(4):
        q.get()
    q.put((5, 5))  # head near the end: the next message wraps
    return q, [(4, 4), (5, 5)]


# After a death at each point: is the interrupted call's effect there (True) or not (False)?
PUT_EFFECT = {"put_after_bytes": False, "commit_after_journal": False, "commit_after_valid": True,
              "commit_after_state": True}
GET_EFFECT = {"commit_after_journal": False, "commit_after_valid": True, "commit_after_state": True}


@pytest.mark.parametrize("operation,point", [("put", p) for p in PUT_EFFECT] + [("get", p) for p in GET_EFFECT])
def test_a_queue_user_killed_inside_its_critical_section_leaves_the_old_ring_or_the_new_one(processes, operation, point):
    """Review row 3: a kill at each store of a put or a get (crash points compiled into the module)
    leaves the ring before or after the call, never a mix, and the ring works on."""
    q, model = ring_with_wrapped_messages()
    new_message = (6, 6, 6)
    if operation == "put":
        die_at(processes, q, point, "put", new_message)
        expected = model + [new_message] if PUT_EFFECT[point] else model
    else:
        die_at(processes, q, point, "get_many")  # takes both: lost with the getter, or never taken
        expected = [] if GET_EFFECT[point] else model
    if expected:
        assert q.get_many(block=False) == expected
    else:
        with pytest.raises(queue.Empty):
            q.get_many(block=False)
    assert q.recoveries == 1 and q.qsize() == 0
    for round_index in range(20):  # the ring's accounting is whole: it fills and empties as before
        q.put_many([(round_index, 1), (round_index, 2)])
        assert q.get_many() == [(round_index, 1), (round_index, 2)]


def test_a_recoverer_killed_while_it_repairs_is_itself_recovered(processes):
    """Review row 3: the repair cleared the journal before it restored the state (as GCC -O2
    compiled it), so a recoverer killed in between left the next one a torn ring."""
    q, model = ring_with_wrapped_messages()
    die_at(processes, q, "commit_after_valid", "put", (6, 6, 6))  # leaves a journal to replay
    die_at(processes, q, "repair_after_state", "get_many")  # the recoverer dies inside the repair
    assert q.get_many(block=False) == model + [(6, 6, 6)]
    q.put((7,))
    assert q.get() == (7,)


def all_slots_once(slots, held):
    """Every free slot can be taken exactly once, and together with `held` they are all the slots."""
    taken = []
    while (slot := slots.acquire(owner=9, block=False)) is not None:
        taken.append(slot)
    assert sorted(taken + held) == list(range(slots.num_slots))
    slots.release(taken)


@pytest.mark.parametrize("point", ["acquire_after_owner", "release_after_marks", "release_after_push",
                                   "reclaim_after_push"])
def test_a_slot_user_killed_inside_its_critical_section_loses_no_slot(processes, point):
    """Review rows 4/5: the free stack and the owner table stay one account through a death at
    each store of acquire, release and reclaim."""
    slots = appo_ipc.SlotControl(num_slots=6, num_workers=1, num_splits=1)
    mine = [slots.acquire(owner=0) for _ in range(3)]
    if point == "acquire_after_owner":
        die_at(processes, slots, point, "acquire", 5)
        assert slots.reclaim(5) == 1  # the dead acquirer owned it: the runner's reclaim returns it
    elif point.startswith("release"):
        die_at(processes, slots, point, "release", mine[:2])
        mine = mine[2:]
    else:
        die_at(processes, slots, point, "reclaim", 0)
        assert slots.reclaim(0) == 2  # the dead reclaimer had freed the first; the rest are still 0's
        mine = []
    all_slots_once(slots, mine)
    assert slots.recoveries >= 1


def kill_after(pid, seconds):
    time.sleep(seconds)
    os.kill(pid, signal.SIGKILL)


def test_waiting_for_a_lock_another_process_holds_lets_python_run(processes, tmp_path):
    """Review row 8: release() held the GIL while it waited for the slots' lock, so every thread of
    the learner stopped while any process held it; a non-blocking get waited for the lock for as
    long as its holder lived (for ever, if that process was frozen)."""
    slots, q = appo_ipc.SlotControl(num_slots=2, num_workers=1, num_splits=1), appo_ipc.Queue()
    slot = slots.acquire(owner=0)
    q.put((1,))
    holders = []
    for index, shared_object in enumerate((slots, q)):
        ready_path = str(tmp_path / f"locked{index}")
        holders.append(processes.Process(target=hold_lock_forever, args=(shared_object, ready_path)))
        holders[-1].start()
        wait_for_file(ready_path)
    killer = processes.Process(target=kill_after, args=(holders[0].pid, 3.0))  # ends the test either way
    killer.start()
    releaser = threading.Thread(target=slots.release, args=([slot],))
    releaser.start()
    time.sleep(0.5)  # the releaser is in release() by now, waiting for the lock that holders[0] keeps
    # this thread woke while the releaser still waited (one that kept the GIL would have let it run
    # only after holders[0]'s death at 3 s, with the release done)
    assert releaser.is_alive() and holders[0].is_alive()
    gave_up = []

    def get_nowait():
        started = time.monotonic()
        with pytest.raises(queue.Empty):
            q.get_nowait()  # gives up on the held lock instead of waiting for its holder
        gave_up.append(time.monotonic() - started)

    getter = threading.Thread(target=get_nowait, daemon=True)
    getter.start()
    getter.join(timeout=10)  # a get that waited for the holder would still be waiting: fail, not hang
    try:
        assert gave_up and 0.2 <= gave_up[0] < 2.0, gave_up  # architecture.md: it gives up after 0.25 s
    finally:
        if not gave_up:
            os.kill(holders[1].pid, signal.SIGKILL)
    assert holders[1].is_alive()
    releaser.join(timeout=30)
    killer.join(timeout=30)
    assert slots.free_count == 2  # the release went through once the holder died
    os.kill(holders[1].pid, signal.SIGKILL)
    holders[1].join(timeout=10)
    assert q.get(timeout=5) == (1,)


def test_a_stale_handle_is_refused_not_attached_to_whatever_now_has_its_fd():
    """Review row 13: a handle was (pid, fd, size); once its object was freed, the fd number went
    to the next object, and unpickling the old handle mapped that one."""
    q = appo_ipc.Queue()
    stale = pickle.dumps(q)
    fd = q.__getstate__()[1]
    del q
    others = [appo_ipc.SlotControl(num_slots=4, num_workers=1, num_splits=1) for _ in range(8)]
    assert fd in [other.__getstate__()[1] for other in others]  # the number was reused
    with pytest.raises(RuntimeError, match="stale shared-memory handle"):
        pickle.loads(stale)
    live = appo_ipc.Queue()
    pid, fd, size, token = live.__getstate__()
    forged = appo_ipc.Queue.__new__(appo_ipc.Queue)
    with pytest.raises(RuntimeError, match="stale"):
        forged.__setstate__((pid, fd, size, token + 1))
    with pytest.raises(RuntimeError, match="stale"):  # a queue's handle does not open slots
        appo_ipc.SlotControl.__new__(appo_ipc.SlotControl).__setstate__((pid, fd, size, token))

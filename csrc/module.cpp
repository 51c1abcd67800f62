// Python binding of ipc.h: the module `appo_ipc`.
//
// Python owns shapes and dtypes; this file only moves bytes. Every object pickles as
// (owner pid, owner fd, size, token) and re-attaches in the receiving process, so it can be
// handed to processes started with the spawn method.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <errno.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "ipc.h"

namespace py = pybind11;

namespace {

struct ClosedError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

py::handle queue_empty_type, queue_full_type, pickle_dumps, pickle_loads;

[[noreturn]] void raise_python(py::handle type) {
    PyErr_SetNone(type.ptr());
    throw py::error_already_set();
}

[[noreturn]] void raise_os_error(const std::string& what) {
    throw std::runtime_error(what + ": " + strerror(errno));
}

// A timeout is None (wait as long as it takes) or a number of seconds >= 0, as for queue.Queue;
// a negative or NaN one used to mean "for ever".
std::optional<double> checked_timeout(std::optional<double> timeout) {
    if (timeout && !(*timeout >= 0.0))
        throw py::value_error("timeout must be None or a non-negative number of seconds");
    return timeout;
}

void check_owner(int32_t owner) {
    if (owner < 0) throw py::value_error("owner " + std::to_string(owner) + ": owners are >= 0 (-1 means free)");
}

const double SLICE_S = 0.25;

// Runs call(block, timeout, lock_mode) once without releasing the GIL and without waiting for
// the lock (the common case), then, if it has to wait, in short slices with the GIL released so
// that other threads run and Ctrl-C is noticed between slices. A non-blocking call waits for a
// lock another process holds one slice at most, then returns would_block: a frozen holder
// (SIGSTOP, a debugger) cannot hang it.
template <typename Call>
int call_maybe_waiting(bool block, std::optional<double> timeout, int would_block, Call call) {
    timeout = checked_timeout(timeout);
    int rc = call(false, 0.0, ipc::TRY);
    if (rc != ipc::BUSY && (rc != would_block || !block)) return rc;
    if (!block) {
        {
            py::gil_scoped_release release;
            rc = call(false, SLICE_S, ipc::WAIT);
        }
        return rc == ipc::TIMEOUT ? would_block : rc;
    }
    const double slice = SLICE_S;
    double left = timeout.value_or(-1.0);
    for (;;) {
        double wait = left < 0 ? slice : std::min(slice, left);
        {
            py::gil_scoped_release release;
            rc = call(true, wait, ipc::WAIT);
        }
        if (rc != ipc::TIMEOUT) return rc;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        if (left >= 0) {
            left -= wait;
            if (left <= 0) return ipc::TIMEOUT;
        }
    }
}

// A call that takes an object's lock and never waits for anything else (release, reclaim,
// transfer): at once when the lock is free, else in slices with the GIL released, so that the
// learner's other thread runs while some process holds the lock.
template <typename Call>
int call_locked(Call call) {
    return call_maybe_waiting(true, std::nullopt, ipc::TIMEOUT, [&](bool, double t, ipc::LockMode mode) {
        return call(t, mode);
    });
}

// The segment every object lives in, created here or attached from another process.
struct Shared {
    ipc::Segment segment;
    int owner_fd = -1;

    Shared() = default;
    Shared(const Shared&) = delete;  // a copy would unmap and close twice
    Shared& operator=(const Shared&) = delete;

    void create(size_t data_size, uint32_t kind, const char* name) {
        if (ipc::segment_create(&segment, data_size, kind, name) != ipc::OK)
            raise_os_error("cannot create a shared segment of " + std::to_string(data_size) + " bytes");
        owner_fd = segment.fd;
    }
    void attach(py::tuple handle, uint32_t kind) {
        if (handle.size() != 4) throw py::value_error("a shared-memory handle is (pid, fd, size, token)");
        pid_t pid = handle[0].cast<int>();
        int fd = handle[1].cast<int>();
        std::string where = "fd " + std::to_string(fd) + " of process " + std::to_string(pid);
        errno = 0;
        int rc = ipc::segment_attach(&segment, pid, fd, kind, handle[2].cast<size_t>(), handle[3].cast<uint64_t>());
        if (rc == ipc::STALE)
            throw std::runtime_error("stale shared-memory handle: " + where + " now holds another object "
                                     "(the one the handle named was freed)");
        if (rc != ipc::OK && (errno == EACCES || errno == EPERM))
            raise_os_error("not allowed to open /proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd) +
                           " (another user, a non-dumpable process or another PID namespace)");
        if (rc != ipc::OK)
            raise_os_error("cannot attach to shared memory at " + where +
                           " (has the process that created it exited?)");
        owner_fd = fd;
    }
    py::tuple handle() const {
        return py::make_tuple((int)segment.owner_pid, owner_fd, segment.size, segment.header()->token);
    }
    ~Shared() { ipc::segment_detach(&segment); }
};

// ---------------------------------------------------------------------------------------------
// SharedBuffer: plain bytes for numpy/torch views (trajectory slots, published weights).

struct SharedBuffer : Shared {
    size_t size() const { return segment.size - ipc::SEGMENT_DATA_OFFSET; }
};

// ---------------------------------------------------------------------------------------------
// Queue

// Message encoding: a tag byte, then either int64 values (a tuple of ints: the trainer's hot
// path, no pickle) or a pickle.
const char TAG_INTS = 'i', TAG_PICKLE = 'p';

void encode(py::handle message, std::string& out) {
    PyObject* obj = message.ptr();
    if (PyTuple_CheckExact(obj)) {  // any length: a request carries a whole split's actors
        size_t start = out.size();
        out.push_back(TAG_INTS);
        bool all_ints = true;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj) && all_ints; i++) {
            PyObject* item = PyTuple_GET_ITEM(obj, i);
            int overflow = 0;
            all_ints = PyLong_CheckExact(item);
            int64_t value = all_ints ? PyLong_AsLongLongAndOverflow(item, &overflow) : 0;
            all_ints = all_ints && !overflow;
            out.append((const char*)&value, sizeof(value));
        }
        if (all_ints) return;
        out.resize(start);
    }
    py::bytes pickled = pickle_dumps(message, -1);
    out.push_back(TAG_PICKLE);
    out.append(PyBytes_AS_STRING(pickled.ptr()), PyBytes_GET_SIZE(pickled.ptr()));
}

py::object decode(const char* data, size_t size) {
    if (size >= 1 && data[0] == TAG_INTS) {
        size_t n = (size - 1) / sizeof(int64_t);
        py::tuple values(n);
        for (size_t i = 0; i < n; i++) {
            int64_t value;
            memcpy(&value, data + 1 + i * sizeof(int64_t), sizeof(value));
            PyTuple_SET_ITEM(values.ptr(), i, PyLong_FromLongLong(value));
        }
        return std::move(values);
    }
    return pickle_loads(py::memoryview::from_memory(data + 1, size - 1));
}

struct Queue : Shared {
    // Messages taken from the ring by this handle but not yet returned, because one before them
    // failed to unpickle: they go out first on the next get (this process only).
    std::deque<std::string> undelivered;

    ipc::QueueHeader* header() const { return (ipc::QueueHeader*)segment.data(); }

    void check_result(int rc, size_t message_bytes, py::handle would_block_type) const {
        switch (rc) {
            case ipc::OK: return;
            case ipc::EMPTY: case ipc::FULL: case ipc::TIMEOUT: raise_python(would_block_type);
            case ipc::CLOSED: throw ClosedError("the queue was closed");
            case ipc::TOO_BIG:
                throw py::value_error("message of " + std::to_string(message_bytes) +
                                      " bytes (with its 4-byte length prefix) does not fit in the "
                                      "queue's ring of " + std::to_string(header()->capacity) +
                                      " bytes; create the Queue with a larger max_size_bytes");
            default: throw std::runtime_error("queue: a system call failed");
        }
    }

    void put_encoded(const std::string& data, const std::vector<uint32_t>& sizes, bool block,
                     std::optional<double> timeout) {
        int rc = call_maybe_waiting(block, timeout, ipc::FULL, [&](bool b, double t, ipc::LockMode mode) {
            return ipc::queue_put(header(), data.data(), sizes.data(), sizes.size(), b, t, mode);
        });
        check_result(rc, data.size() + sizeof(uint32_t) * sizes.size(), queue_full_type);
    }

    // A message's length prefix is 32 bits: a larger one would be cut (and never fits anyway).
    static uint32_t message_size(size_t bytes) {
        if (bytes > UINT32_MAX - sizeof(uint32_t))
            throw py::value_error("message of " + std::to_string(bytes) + " bytes: the limit is 4 GiB");
        return (uint32_t)bytes;
    }

    void put(py::handle message, bool block, std::optional<double> timeout) {
        std::string data;  // per call: pickling can run Python code that puts too (a thread_local was overwritten)
        encode(message, data);
        put_encoded(data, {message_size(data.size())}, block, timeout);
    }

    void put_many(py::iterable messages, bool block, std::optional<double> timeout) {
        std::string data;
        std::vector<uint32_t> sizes;
        for (py::handle message : messages) {
            size_t before = data.size();
            encode(message, data);
            sizes.push_back(message_size(data.size() - before));
        }
        if (!sizes.empty()) put_encoded(data, sizes, block, timeout);
    }

    py::list get_many(size_t max_messages, bool block, std::optional<double> timeout) {
        if (max_messages == 0) throw py::value_error("max_messages must be at least 1");
        py::list messages;
        if (undelivered.empty()) {
            thread_local std::vector<char> buffer;
            if (buffer.size() < header()->capacity) buffer.resize(header()->capacity);
            size_t num = 0, bytes = 0;
            int rc = call_maybe_waiting(block, timeout, ipc::EMPTY, [&](bool b, double t, ipc::LockMode mode) {
                return ipc::queue_get(header(), buffer.data(), buffer.size(), max_messages, b, t, mode,
                                      &num, &bytes);
            });
            check_result(rc, 0, queue_empty_type);
            // Tuples of ints decode straight from the buffer (the hot path). From the first pickle
            // on, messages are copied out first: unpickling can run Python code that gets again
            // and would overwrite the thread_local buffer.
            size_t offset = 0;
            for (size_t i = 0; i < num; i++) {
                uint32_t size;
                memcpy(&size, buffer.data() + offset, sizeof(size));
                const char* data = buffer.data() + offset + sizeof(size);
                if (undelivered.empty() && size >= 1 && data[0] == TAG_INTS)
                    messages.append(decode(data, size));
                else
                    undelivered.emplace_back(data, size);
                offset += sizeof(size) + size;
            }
        }
        // A message that cannot be unpickled raises once and is dropped. Those decoded before it
        // are returned first, and those after it stay for the next call, so no good message is lost.
        while (!undelivered.empty() && messages.size() < max_messages) {
            py::object message;
            try {
                message = decode(undelivered.front().data(), undelivered.front().size());
            } catch (py::error_already_set&) {
                if (messages.size() > 0) return messages;  // the bad one raises on the next call
                undelivered.pop_front();
                throw;
            }
            undelivered.pop_front();
            messages.append(message);
        }
        return messages;
    }
};

// ---------------------------------------------------------------------------------------------
// SlotControl

struct SlotControl : Shared {
    ipc::SlotsHeader* header() const { return (ipc::SlotsHeader*)segment.data(); }

    void check_slot(int64_t slot) const {
        if (slot < 0 || slot >= (int64_t)header()->num_slots)
            throw py::index_error("slot " + std::to_string(slot) + " out of range [0, " +
                                  std::to_string(header()->num_slots) + ")");
    }
    void check_split(int64_t worker, int64_t split) const {
        if (worker < 0 || split < 0 || worker >= header()->num_workers || split >= header()->num_splits)
            throw py::index_error("(worker " + std::to_string(worker) + ", split " +
                                  std::to_string(split) + ") out of range");
    }
};

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "Shared-memory IPC for the APPO trainer: a message queue, shared buffers and "
              "trajectory-slot control, all in memfd segments that vanish with their last user.";
    py::module_ queue_module = py::module_::import("queue");
    py::module_ pickle_module = py::module_::import("pickle");
    queue_empty_type = py::object(queue_module.attr("Empty")).release();
    queue_full_type = py::object(queue_module.attr("Full")).release();
    pickle_dumps = py::object(pickle_module.attr("dumps")).release();
    pickle_loads = py::object(pickle_module.attr("loads")).release();
    py::register_exception<ClosedError>(m, "Closed", PyExc_RuntimeError);

    py::class_<SharedBuffer>(m, "SharedBuffer", py::buffer_protocol(),
                             "Bytes in shared memory; wrap with numpy.frombuffer for views.")
        .def(py::init([](size_t size) {
                 auto buffer = std::make_unique<SharedBuffer>();
                 buffer->create(size == 0 ? 1 : size, ipc::KIND_BUFFER, "appo-buffer");
                 return buffer;
             }),
             py::arg("size"))
        .def_property_readonly("size", &SharedBuffer::size)
        .def_buffer([](SharedBuffer& b) {
            return py::buffer_info(b.segment.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                                   {b.size()}, {1});
        })
        .def(py::pickle([](const SharedBuffer& b) { return b.handle(); },
                        [](py::tuple h) {
                            auto buffer = std::make_unique<SharedBuffer>();
                            buffer->attach(h, ipc::KIND_BUFFER);
                            return buffer;
                        }));

    py::class_<Queue>(m, "Queue", "Multi-producer, multi-consumer FIFO in a shared-memory ring.")
        .def(py::init([](size_t max_size_bytes) {
                 if (max_size_bytes < 64 || max_size_bytes > (size_t(1) << 40))
                     throw py::value_error("max_size_bytes must be between 64 and 2**40");
                 auto q = std::make_unique<Queue>();
                 q->create(ipc::queue_segment_size(max_size_bytes), ipc::KIND_QUEUE, "appo-queue");
                 if (ipc::queue_init(q->segment.data(), max_size_bytes) != ipc::OK)
                     throw std::runtime_error("cannot initialise the queue's mutex");
                 return q;
             }),
             py::arg("max_size_bytes") = 1 << 20)
        .def("put", &Queue::put, py::arg("message"), py::arg("block") = true,
             py::arg("timeout") = py::none(),
             "Puts one message; raises queue.Full when it cannot within the timeout.")
        .def("put_nowait", [](Queue& q, py::handle message) { q.put(message, false, {}); })
        .def("put_many", &Queue::put_many, py::arg("messages"), py::arg("block") = true,
             py::arg("timeout") = py::none(), "Puts all messages atomically, or none.")
        .def("get",
             [](Queue& q, bool block, std::optional<double> timeout) {
                 return py::object(q.get_many(1, block, timeout)[0]);
             },
             py::arg("block") = true, py::arg("timeout") = py::none(),
             "Takes one message; raises queue.Empty when none comes within the timeout.")
        .def("get_nowait", [](Queue& q) { return py::object(q.get_many(1, false, {})[0]); })
        .def("get_many", &Queue::get_many, py::arg("max_messages") = 1 << 30,
             py::arg("block") = true, py::arg("timeout") = py::none(),
             "Takes every waiting message up to max_messages (at least one) as a list.")
        .def("qsize", [](const Queue& q) { return q.header()->state.count + q.undelivered.size(); },
             "Messages in the ring, plus those this handle took but has not returned yet.")
        .def("empty", [](const Queue& q) { return q.header()->state.count == 0 && q.undelivered.empty(); })
        .def("close", [](Queue& q) { ipc::queue_close(q.header()); },
             "Wakes every waiter; every later call raises appo_ipc.Closed.")
        .def_property_readonly("closed", [](const Queue& q) { return q.header()->closed != 0; })
        .def_property_readonly("max_size_bytes", [](const Queue& q) { return q.header()->capacity; })
        .def_property_readonly("sleepers",
                               [](const Queue& q) {
                                   return __atomic_load_n(&q.header()->waiting_getters, __ATOMIC_SEQ_CST) +
                                          __atomic_load_n(&q.header()->waiting_putters, __ATOMIC_SEQ_CST);
                               },
                               "Callers asleep in get or put, in any process (tests check that a waiter "
                               "really blocked).")
        .def_property_readonly("recoveries", [](const Queue& q) { return q.header()->recoveries; },
                               "How often a process died holding the lock and the ring was repaired.")
        .def("_hold_lock_forever",
             [](Queue& q, const std::string& ready_path) {
                 py::gil_scoped_release release;
                 pthread_mutex_lock(&q.header()->mutex);
                 close(open(ready_path.c_str(), O_CREAT | O_WRONLY, 0600));
                 for (;;) pause();
             },
             py::arg("ready_path"),
             "Test hook: takes the lock, creates the file ready_path, and never lets go, so a "
             "test can kill the holder.")
        .def(py::pickle([](const Queue& q) { return q.handle(); },
                        [](py::tuple h) {
                            auto q = std::make_unique<Queue>();
                            q->attach(h, ipc::KIND_QUEUE);
                            return q;
                        }));

    py::class_<SlotControl>(m, "SlotControl",
                            "Free list and owners of trajectory slots, and per-(worker, split) "
                            "counters of requests still waiting for actions.")
        .def(py::init([](uint32_t num_slots, uint32_t num_workers, uint32_t num_splits) {
                 if (num_slots == 0 || num_workers == 0 || num_splits == 0)
                     throw py::value_error("num_slots, num_workers and num_splits must be > 0");
                 auto s = std::make_unique<SlotControl>();
                 s->create(ipc::slots_segment_size(num_slots, num_workers, num_splits), ipc::KIND_SLOTS, "appo-slots");
                 if (ipc::slots_init(s->segment.data(), num_slots, num_workers, num_splits) != ipc::OK)
                     throw std::runtime_error("cannot initialise the slots' mutex");
                 return s;
             }),
             py::arg("num_slots"), py::arg("num_workers"), py::arg("num_splits"))
        .def("acquire",
             [](SlotControl& s, int32_t owner, bool block,
                std::optional<double> timeout) -> std::optional<int32_t> {
                 int32_t slot = -1;
                 check_owner(owner);
                 int rc = call_maybe_waiting(block, timeout, ipc::EMPTY, [&](bool b, double t, ipc::LockMode mode) {
                     return ipc::slots_acquire(s.header(), owner, b, t, mode, &slot);
                 });
                 if (rc == ipc::CLOSED) throw ClosedError("the slots were closed");
                 if (rc != ipc::OK) return std::nullopt;
                 return slot;
             },
             py::arg("owner"), py::arg("block") = true, py::arg("timeout") = py::none(),
             "Takes a free slot for `owner`; None when none frees up within the timeout. Each "
             "acquire raises the slot's generation by one.")
        .def("release",
             [](SlotControl& s, const std::vector<int32_t>& slots) {
                 int rc = call_locked([&](double t, ipc::LockMode mode) {
                     return ipc::slots_release(s.header(), slots.data(), slots.size(), t, mode);
                 });
                 if (rc == ipc::TOO_BIG) throw py::index_error("slot index out of range");
                 if (rc == ipc::FULL)
                     throw py::value_error("a slot is free already or listed twice; nothing was released");
                 if (rc != ipc::OK) throw std::runtime_error("slots: a system call failed");
             },
             py::arg("slots"), "Returns slots to the free list.")
        .def("transfer",
             [](SlotControl& s, int32_t slot, int32_t from_owner, uint32_t generation, int32_t to_owner) {
                 s.check_slot(slot);
                 check_owner(from_owner);
                 check_owner(to_owner);
                 int rc = call_locked([&](double t, ipc::LockMode mode) {
                     return ipc::slots_transfer(s.header(), slot, from_owner, generation, to_owner, t, mode);
                 });
                 if (rc != ipc::OK && rc != ipc::STALE) throw std::runtime_error("slots: a system call failed");
                 return rc == ipc::OK;
             },
             py::arg("slot"), py::arg("from_owner"), py::arg("generation"), py::arg("to_owner"),
             "Hands the slot to to_owner if from_owner still holds it in that generation (True); "
             "False, changing nothing, if it was freed since, or freed and taken again.")
        .def("owner",
             [](SlotControl& s, int32_t slot) {
                 s.check_slot(slot);
                 return ipc::slots_owner(s.header(), slot);
             },
             py::arg("slot"))
        .def("generation",
             [](SlotControl& s, int32_t slot) {
                 s.check_slot(slot);
                 return ipc::slots_generation(s.header(), slot);
             },
             py::arg("slot"), "How often the slot was acquired: names one life of it in a hand-off.")
        .def("reclaim",
             [](SlotControl& s, int32_t owner) {
                 check_owner(owner);
                 size_t reclaimed = 0;
                 int rc = call_locked([&](double t, ipc::LockMode mode) {
                     return ipc::slots_reclaim(s.header(), owner, t, mode, &reclaimed);
                 });
                 if (rc != ipc::OK) throw std::runtime_error("slots: a system call failed");
                 return reclaimed;
             },
             py::arg("owner"), "Frees every slot `owner` holds (its process died); returns how many.")
        .def_property_readonly("free_count", [](SlotControl& s) { return ipc::slots_free_count(s.header()); })
        .def_property_readonly("num_slots", [](SlotControl& s) { return s.header()->num_slots; })
        .def_property_readonly("recoveries", [](SlotControl& s) { return s.header()->recoveries; })
        .def_property_readonly("sleepers", [](SlotControl& s) { return ipc::slots_sleepers(s.header()); },
                               "Callers asleep in acquire or wait_any, in any process.")
        .def("close", [](SlotControl& s) { ipc::slots_close(s.header()); })
        .def("set_pending",
             [](SlotControl& s, uint32_t worker, uint32_t split, int32_t num_requests) {
                 s.check_split(worker, split);
                 if (num_requests < 0) throw py::value_error("num_requests must be >= 0");
                 return ipc::split_set_pending(s.header(), worker, split, num_requests);
             },
             py::arg("worker"), py::arg("split"), py::arg("num_requests"),
             "Rollout worker: this many requests of the split now wait for actions. Returns their "
             "generation, which the requests carry and complete() checks.")
        .def("complete",
             [](SlotControl& s, uint32_t worker, uint32_t split, uint32_t generation, int32_t num_done) {
                 s.check_split(worker, split);
                 return ipc::split_complete(s.header(), worker, split, generation, num_done) == ipc::OK;
             },
             py::arg("worker"), py::arg("split"), py::arg("generation"), py::arg("num_done") = 1,
             "Policy worker: this many requests of the split's generation `generation` have their "
             "actions. False, counting nothing, for an answer that is stale (the split was asked "
             "again since) or one too many.")
        .def("pending",
             [](SlotControl& s, uint32_t worker, uint32_t split) {
                 s.check_split(worker, split);
                 return ipc::split_pending(s.header(), worker, split);
             },
             py::arg("worker"), py::arg("split"), "Requests still waiting, or -1 while the worker holds the split.")
        .def("split_generation",
             [](SlotControl& s, uint32_t worker, uint32_t split) {
                 s.check_split(worker, split);
                 return ipc::split_generation(s.header(), worker, split);
             },
             py::arg("worker"), py::arg("split"))
        .def("stale",
             [](SlotControl& s, const std::vector<int64_t>& workers, const std::vector<int64_t>& splits,
                const std::vector<int64_t>& generations, const std::vector<int64_t>& slots) {
                 size_t n = workers.size();
                 if (splits.size() != n || generations.size() != n || slots.size() != n)
                     throw py::value_error("workers, splits, generations and slots must have one length");
                 for (size_t i = 0; i < n; i++) {
                     s.check_split(workers[i], splits[i]);
                     s.check_slot(slots[i]);
                 }
                 std::vector<int64_t> stale;
                 for (size_t i = 0; i < n; i++)
                     if (ipc::slots_owner(s.header(), (int32_t)slots[i]) != workers[i] ||
                         ipc::split_generation(s.header(), (uint32_t)workers[i], (uint32_t)splits[i]) != generations[i])
                         stale.push_back((int64_t)i);
                 return stale;
             },
             py::arg("workers"), py::arg("splits"), py::arg("generations"), py::arg("slots"),
             "Policy worker, a batch of requests in one call: the indices of those that no longer "
             "stand, their worker no longer owning the slot (owner()) or their split asked again "
             "(split_generation()). Usually none: an empty list costs nothing to test.")
        .def("reset_splits",
             [](SlotControl& s, uint32_t worker) {
                 s.check_split(worker, 0);
                 ipc::split_reset_worker(s.header(), worker);
             },
             py::arg("worker"),
             "A restarted rollout worker's splits: idle, in a new generation, so no answer meant "
             "for the dead process counts.")
        .def("wait_any",
             [](SlotControl& s, uint32_t worker, std::optional<double> timeout) -> std::optional<int32_t> {
                 s.check_split(worker, 0);
                 int32_t split = -1;
                 call_maybe_waiting(true, timeout, ipc::TIMEOUT, [&](bool b, double t, ipc::LockMode) {
                     split = ipc::split_wait_any(s.header(), worker, b ? t : 0.0);
                     return split >= 0 || s.header()->closed ? ipc::OK : ipc::TIMEOUT;
                 });
                 if (split < 0) return std::nullopt;
                 return split;
             },
             py::arg("worker"), py::arg("timeout") = py::none(),
             "Rollout worker: a split whose actions all arrived (now marked idle), or None on "
             "timeout or close. Costs no system call when one is already ready.")
        .def("_hold_lock_forever",
             [](SlotControl& s, const std::string& ready_path) {
                 py::gil_scoped_release release;
                 pthread_mutex_lock(&s.header()->mutex);
                 close(open(ready_path.c_str(), O_CREAT | O_WRONLY, 0600));
                 for (;;) pause();
             },
             py::arg("ready_path"),
             "Test hook: takes the lock, creates the file ready_path, and never lets go, so a "
             "test can kill the holder.")
        .def(py::pickle([](const SlotControl& s) { return s.handle(); },
                        [](py::tuple h) {
                            auto s = std::make_unique<SlotControl>();
                            s->attach(h, ipc::KIND_SLOTS);
                            return s;
                        }));

    // Test hook (see ipc.h): the calling process SIGKILLs itself at the named point. The names are
    // ipc::CrashPoint's, in its order.
    static_assert(ipc::CRASH_NUM_POINTS == 10, "name every crash point");
    py::list crash_points;
    for (const char* name : {"put_after_bytes", "commit_after_journal", "commit_after_valid",
                             "commit_after_state", "repair_after_state", "acquire_after_owner",
                             "release_after_marks", "release_after_push", "reclaim_after_push"})
        crash_points.append(name);
    m.attr("CRASH_POINTS") = crash_points;
    m.def("_arm_crash_point",
          [crash_points](const std::string& name) {
              for (size_t i = 0; i < crash_points.size(); i++)
                  if (crash_points[i].cast<std::string>() == name) return ipc::crash_point_arm((int)i + 1);
              throw py::value_error("no crash point named " + name);
          },
          py::arg("name"), "Test hook: this process SIGKILLs itself when it reaches that point.");
}

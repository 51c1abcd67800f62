// Implementation of ipc.h. Read the header first: it says what each object is for.
#include "ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <vector>

namespace ipc {

// ---------------------------------------------------------------------------------------------
// Small helpers: time, futexes, robust mutexes.

static double now_seconds() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double deadline_after(double timeout) { return timeout < 0 ? -1.0 : now_seconds() + timeout; }

static bool past(double deadline) { return deadline >= 0 && now_seconds() >= deadline; }

// A call's deadline, read off the clock only when the call may wait (the clock is not free in
// every VM, and a TRY call that must not wait is the hot path of every put and get).
static double deadline_if_waiting(bool block, LockMode mode, double timeout) {
    return block || mode == WAIT ? deadline_after(timeout) : -1.0;
}

// Sleeps while *word == seen, until woken or the deadline (deadline < 0: no deadline).
// Spurious returns are fine: every caller re-checks its condition.
static void futex_wait(uint32_t* word, uint32_t seen, double deadline) {
    struct timespec rel, *rel_ptr = nullptr;
    if (deadline >= 0) {
        double left = deadline - now_seconds();
        if (left <= 0) return;
        rel.tv_sec = (time_t)left;
        rel.tv_nsec = (long)((left - (double)rel.tv_sec) * 1e9);
        rel_ptr = &rel;
    }
    syscall(SYS_futex, word, FUTEX_WAIT, seen, rel_ptr, nullptr, 0);
}

static void futex_wake_all(uint32_t* word) {
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Bumps a futex word and wakes everyone sleeping on it. Atomic, because close() bumps the same
// words without the lock (a plain ++ under the lock could lose its increment).
static void bump_and_wake(uint32_t* word) {
    __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
    futex_wake_all(word);
}

static uint32_t load_seq(uint32_t* word) { return __atomic_load_n(word, __ATOMIC_SEQ_CST); }

static int armed_crash_point = CRASH_NONE;  // this process only

void crash_point_arm(int point) { __atomic_store_n(&armed_crash_point, point, __ATOMIC_SEQ_CST); }

static inline void crash_point(int point) {
    if (__builtin_expect(__atomic_load_n(&armed_crash_point, __ATOMIC_RELAXED) == point, 0)) raise(SIGKILL);
}

static int robust_mutex_init(pthread_mutex_t* mutex) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    return rc == 0 ? OK : SYS_ERROR;
}

// Locks (TRY: at once or BUSY; WAIT: until the deadline, deadline < 0 for ever). If the previous
// holder died inside its critical section, `repair` makes the protected state consistent again
// before anyone else sees it (and wakes every sleeper: the dead holder may have owed a wake-up).
template <typename Header>
static int lock(Header* header, void (*repair)(Header*), LockMode mode = WAIT, double deadline = -1) {
    int rc;
    if (mode == TRY) {
        rc = pthread_mutex_trylock(&header->mutex);
        if (rc == EBUSY) return BUSY;
    } else if (deadline < 0) {
        rc = pthread_mutex_lock(&header->mutex);
    } else {
        struct timespec until;
        until.tv_sec = (time_t)deadline;
        until.tv_nsec = (long)((deadline - (double)until.tv_sec) * 1e9);
        rc = pthread_mutex_clocklock(&header->mutex, CLOCK_MONOTONIC, &until);
        if (rc == ETIMEDOUT) return TIMEOUT;
    }
    if (rc == EOWNERDEAD) {
        repair(header);
        pthread_mutex_consistent(&header->mutex);
        return OK;
    }
    return rc == 0 ? OK : SYS_ERROR;
}

template <typename Header>
static void unlock(Header* header) {
    pthread_mutex_unlock(&header->mutex);
}

// ---------------------------------------------------------------------------------------------
// Segment

int segment_create(Segment* seg, size_t data_size, uint32_t kind, const char* debug_name) {
    size_t size = SEGMENT_DATA_OFFSET + data_size;
    uint64_t token = 0;
    if (getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token)) return SYS_ERROR;
    int fd = memfd_create(debug_name, MFD_CLOEXEC);
    if (fd < 0) return SYS_ERROR;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return SYS_ERROR;
    }
    void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        close(fd);
        return SYS_ERROR;
    }
    SegmentHeader* header = (SegmentHeader*)addr;
    header->magic = SEGMENT_MAGIC;
    header->kind = kind;
    header->size = size;
    header->token = token;
    seg->addr = addr;
    seg->size = size;
    seg->fd = fd;
    seg->owner_pid = getpid();
    return OK;
}

int segment_attach(Segment* seg, pid_t owner_pid, int owner_fd, uint32_t kind, size_t size, uint64_t token) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)owner_pid, owner_fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return SYS_ERROR;
    // The fd number may now name another file (the object was freed and the number reused):
    // check the size before mapping (a shorter file would SIGBUS) and the header after.
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != size || size < SEGMENT_DATA_OFFSET) {
        close(fd);
        return STALE;
    }
    void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        close(fd);
        return SYS_ERROR;
    }
    const SegmentHeader* header = (const SegmentHeader*)addr;
    if (header->magic != SEGMENT_MAGIC || header->kind != kind || header->size != size || header->token != token) {
        munmap(addr, size);
        close(fd);
        return STALE;
    }
    seg->addr = addr;
    seg->size = size;
    seg->fd = fd;
    seg->owner_pid = owner_pid;
    return OK;
}

void segment_detach(Segment* seg) {
    if (seg->addr) munmap(seg->addr, seg->size);
    if (seg->fd >= 0) close(seg->fd);
    seg->addr = nullptr;
    seg->fd = -1;
}

// ---------------------------------------------------------------------------------------------
// Queue

static char* ring(QueueHeader* q) { return (char*)(q + 1); }

static void ring_write(QueueHeader* q, uint64_t offset, const char* src, uint64_t n) {
    uint64_t first = q->capacity - offset < n ? q->capacity - offset : n;
    memcpy(ring(q) + offset, src, first);
    memcpy(ring(q), src + first, n - first);
}

static void ring_read(QueueHeader* q, uint64_t offset, char* dst, uint64_t n) {
    uint64_t first = q->capacity - offset < n ? q->capacity - offset : n;
    memcpy(dst, ring(q) + offset, first);
    memcpy(dst + first, ring(q), n - first);
}

// A state change is journaled so that a holder killed half-way through leaves either the old
// state or the new one, never a mix. Message bytes are written before the journal entry.
static void commit(QueueHeader* q, RingState next) {
    q->pending = next;
    crash_point(CRASH_COMMIT_AFTER_JOURNAL);
    __atomic_store_n(&q->pending_valid, 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    crash_point(CRASH_COMMIT_AFTER_VALID);
    q->state = next;
    crash_point(CRASH_COMMIT_AFTER_STATE);
    __atomic_store_n(&q->pending_valid, 0, __ATOMIC_RELEASE);
}

// Replays the journal. The release store keeps the compiler and the CPU from clearing the journal
// before the state is written (with plain stores GCC -O2 cleared it first, so a recoverer killed
// in between left a torn state for the next one): a recoverer that dies here is itself recovered.
static void queue_repair(QueueHeader* q) {
    if (__atomic_load_n(&q->pending_valid, __ATOMIC_ACQUIRE)) {
        q->state = q->pending;
        crash_point(CRASH_REPAIR_AFTER_STATE);
        __atomic_store_n(&q->pending_valid, 0, __ATOMIC_RELEASE);
    }
    q->recoveries++;
    bump_and_wake(&q->not_empty_seq);
    bump_and_wake(&q->not_full_seq);
}

size_t queue_segment_size(size_t capacity) { return sizeof(QueueHeader) + capacity; }

// The wait shared by put, get and acquire, entered with the lock held and the condition false:
// counts itself as a sleeper, sleeps until `seq` moves on from `seen` (read under the lock
// before the condition was checked, so a close() or a wake-up after that check is never missed)
// or the deadline, and takes the lock again (by the same deadline). OK with the lock held, else
// the status, without it.
template <typename Header>
static int sleep_unlocked(Header* header, void (*repair)(Header*), uint32_t* seq, uint32_t seen,
                          uint32_t* waiting, double deadline) {
    __atomic_add_fetch(waiting, 1, __ATOMIC_SEQ_CST);
    unlock(header);
    futex_wait(seq, seen, deadline);
    int rc = lock(header, repair, WAIT, deadline);
    __atomic_sub_fetch(waiting, 1, __ATOMIC_SEQ_CST);
    return rc;
}

int queue_init(void* addr, size_t capacity) {
    QueueHeader* q = (QueueHeader*)addr;
    memset(q, 0, sizeof(*q));
    q->capacity = capacity;
    return robust_mutex_init(&q->mutex);
}

int queue_put(QueueHeader* q, const char* data, const uint32_t* sizes, size_t num, bool block,
              double timeout, LockMode mode) {
    uint64_t total = 0;
    for (size_t i = 0; i < num; i++) total += sizeof(uint32_t) + sizes[i];
    if (total > q->capacity) return TOO_BIG;
    double deadline = deadline_if_waiting(block, mode, timeout);
    int rc = lock(q, queue_repair, mode, deadline);
    if (rc != OK) return rc;
    for (;;) {
        uint32_t seen = load_seq(&q->not_full_seq);
        if (__atomic_load_n(&q->closed, __ATOMIC_SEQ_CST)) {
            unlock(q);
            return CLOSED;
        }
        if (q->capacity - q->state.used >= total) break;
        if (!block || past(deadline)) {
            unlock(q);
            return block ? TIMEOUT : FULL;
        }
        rc = sleep_unlocked(q, queue_repair, &q->not_full_seq, seen, &q->waiting_putters, deadline);
        if (rc != OK) return rc;
    }
    RingState next = q->state;
    uint64_t tail = (next.head + next.used) % q->capacity;
    for (size_t i = 0; i < num; i++) {
        ring_write(q, tail, (const char*)&sizes[i], sizeof(uint32_t));
        tail = (tail + sizeof(uint32_t)) % q->capacity;
        ring_write(q, tail, data, sizes[i]);
        tail = (tail + sizes[i]) % q->capacity;
        data += sizes[i];
    }
    crash_point(CRASH_PUT_AFTER_BYTES);
    next.used += total;
    next.count += num;
    commit(q, next);
    bool wake = __atomic_load_n(&q->waiting_getters, __ATOMIC_SEQ_CST) > 0;
    if (wake) __atomic_add_fetch(&q->not_empty_seq, 1, __ATOMIC_SEQ_CST);
    unlock(q);
    if (wake) futex_wake_all(&q->not_empty_seq);
    return OK;
}

int queue_get(QueueHeader* q, char* out, size_t out_capacity, size_t max_messages, bool block,
              double timeout, LockMode mode, size_t* num_taken, size_t* bytes_taken) {
    *num_taken = 0;
    *bytes_taken = 0;
    double deadline = deadline_if_waiting(block, mode, timeout);
    int rc = lock(q, queue_repair, mode, deadline);
    if (rc != OK) return rc;
    for (;;) {
        uint32_t seen = load_seq(&q->not_empty_seq);
        if (__atomic_load_n(&q->closed, __ATOMIC_SEQ_CST)) {
            unlock(q);
            return CLOSED;
        }
        if (q->state.count > 0) break;
        if (!block || past(deadline)) {
            unlock(q);
            return block ? TIMEOUT : EMPTY;
        }
        rc = sleep_unlocked(q, queue_repair, &q->not_empty_seq, seen, &q->waiting_getters, deadline);
        if (rc != OK) return rc;
    }
    RingState next = q->state;
    size_t written = 0, taken = 0;
    while (taken < max_messages && next.count > 0) {
        uint32_t size;
        ring_read(q, next.head, (char*)&size, sizeof(size));
        size_t need = sizeof(uint32_t) + size;
        if (written + need > out_capacity) break;
        ring_read(q, next.head, out + written, need);
        written += need;
        taken++;
        next.head = (next.head + need) % q->capacity;
        next.used -= need;
        next.count--;
    }
    if (taken == 0) {  // the caller's buffer cannot hold the next message
        unlock(q);
        return TOO_BIG;
    }
    commit(q, next);
    bool wake = __atomic_load_n(&q->waiting_putters, __ATOMIC_SEQ_CST) > 0;
    if (wake) __atomic_add_fetch(&q->not_full_seq, 1, __ATOMIC_SEQ_CST);
    unlock(q);
    if (wake) futex_wake_all(&q->not_full_seq);
    *num_taken = taken;
    *bytes_taken = written;
    return OK;
}

// No lock: close() must work while a dead or frozen process holds it. A waiter reads the seq
// before `closed`, so it either sees closed or sleeps on a seq that this bump has moved on.
void queue_close(QueueHeader* q) {
    __atomic_store_n(&q->closed, 1, __ATOMIC_SEQ_CST);
    bump_and_wake(&q->not_empty_seq);
    bump_and_wake(&q->not_full_seq);
}

// ---------------------------------------------------------------------------------------------
// Slot control

// A split's state in one 64-bit word, so that an answer's generation check and its count
// update are one compare-and-swap: the generation in the high half, the requests still waiting
// in the low half (SPLIT_IDLE while the rollout worker holds the split).
const uint32_t SPLIT_IDLE = 0xffffffffu;
static uint64_t split_word(uint32_t generation, uint32_t count) { return (uint64_t)generation << 32 | count; }
static uint32_t word_generation(uint64_t word) { return (uint32_t)(word >> 32); }
static uint32_t word_count(uint64_t word) { return (uint32_t)word; }

static uint64_t* split_state(SlotsHeader* s) { return (uint64_t*)(s + 1); }
static int32_t* free_stack(SlotsHeader* s) {
    return (int32_t*)(split_state(s) + (size_t)s->num_workers * s->num_splits);
}
static int32_t* owners(SlotsHeader* s) { return free_stack(s) + s->num_slots; }
static uint32_t* slot_generation(SlotsHeader* s) { return (uint32_t*)(owners(s) + s->num_slots); }
static uint32_t* wake_seq(SlotsHeader* s) { return slot_generation(s) + s->num_slots; }
static uint32_t* sleeping(SlotsHeader* s) { return wake_seq(s) + s->num_workers; }

size_t slots_segment_size(uint32_t num_slots, uint32_t num_workers, uint32_t num_splits) {
    static_assert(sizeof(SlotsHeader) % 8 == 0, "split_state must be 8-byte aligned");
    return sizeof(SlotsHeader) + sizeof(uint64_t) * (size_t)num_workers * num_splits +
           sizeof(int32_t) * 3 * (size_t)num_slots + sizeof(uint32_t) * 2 * (size_t)num_workers;
}

// The owner table is the truth; the free stack is rebuilt from it after a holder died.
static void slots_repair(SlotsHeader* s) {
    uint32_t count = 0;
    for (uint32_t slot = 0; slot < s->num_slots; slot++)
        if (owners(s)[slot] == FREE) free_stack(s)[count++] = (int32_t)slot;
    s->free_count = count;
    s->recoveries++;
    bump_and_wake(&s->free_seq);
}

int slots_init(void* addr, uint32_t num_slots, uint32_t num_workers, uint32_t num_splits) {
    SlotsHeader* s = (SlotsHeader*)addr;
    memset(s, 0, slots_segment_size(num_slots, num_workers, num_splits));
    s->num_slots = num_slots;
    s->num_workers = num_workers;
    s->num_splits = num_splits;
    for (uint32_t slot = 0; slot < num_slots; slot++) {
        // Handed out from the top of the stack: lowest index first.
        free_stack(s)[slot] = (int32_t)(num_slots - 1 - slot);
        owners(s)[slot] = FREE;
    }
    s->free_count = num_slots;
    for (uint32_t i = 0; i < num_workers * num_splits; i++) split_state(s)[i] = split_word(0, SPLIT_IDLE);
    return robust_mutex_init(&s->mutex);
}

int slots_acquire(SlotsHeader* s, int32_t owner, bool block, double timeout, LockMode mode,
                  int32_t* slot) {
    double deadline = deadline_if_waiting(block, mode, timeout);
    int rc = lock(s, slots_repair, mode, deadline);
    if (rc != OK) return rc;
    for (;;) {
        uint32_t seen = load_seq(&s->free_seq);
        if (__atomic_load_n(&s->closed, __ATOMIC_SEQ_CST)) {
            unlock(s);
            return CLOSED;
        }
        if (s->free_count > 0) break;
        if (!block || past(deadline)) {
            unlock(s);
            return block ? TIMEOUT : EMPTY;
        }
        rc = sleep_unlocked(s, slots_repair, &s->free_seq, seen, &s->waiting, deadline);
        if (rc != OK) return rc;
    }
    int32_t taken = free_stack(s)[s->free_count - 1];
    slot_generation(s)[taken]++;
    // Owner first: a death before the count goes down leaves the slot owned by the dead worker,
    // which reclaim returns, and repair leaves off the free stack.
    __atomic_store_n(&owners(s)[taken], owner, __ATOMIC_RELEASE);
    crash_point(CRASH_ACQUIRE_AFTER_OWNER);
    __atomic_store_n(&s->free_count, s->free_count - 1, __ATOMIC_RELEASE);
    unlock(s);
    *slot = taken;
    return OK;
}

// After slots went back on the stack, under the lock: wakes acquirers once it is released.
static bool note_freed(SlotsHeader* s) {
    bool wake = __atomic_load_n(&s->waiting, __ATOMIC_SEQ_CST) > 0;
    if (wake) __atomic_add_fetch(&s->free_seq, 1, __ATOMIC_SEQ_CST);
    return wake;
}

// Pushes a slot marked FREE. The bound keeps a corrupted owner table from overrunning the stack.
static void push_free(SlotsHeader* s, int32_t slot) {
    if (s->free_count >= s->num_slots) return;
    free_stack(s)[s->free_count] = slot;
    __atomic_store_n(&s->free_count, s->free_count + 1, __ATOMIC_RELEASE);
}

int slots_release(SlotsHeader* s, const int32_t* slots, size_t num, double timeout, LockMode mode) {
    for (size_t i = 0; i < num; i++)
        if (slots[i] < 0 || (uint32_t)slots[i] >= s->num_slots) return TOO_BIG;
    int rc = lock(s, slots_repair, mode, deadline_if_waiting(false, mode, timeout));
    if (rc != OK) return rc;
    // Each slot is marked free as it is checked, so a slot listed twice fails its second check
    // (pushed twice, it would go to two owners, and past num_slots the stack overruns owners[]).
    // On failure the marks are undone and nothing is pushed. A death after the marks leaves slots
    // FREE and off the stack, which repair rebuilds from the owner table.
    std::vector<int32_t> previous_owners(num);
    for (size_t i = 0; i < num; i++) {
        previous_owners[i] = owners(s)[slots[i]];
        if (previous_owners[i] == FREE) {
            while (i-- > 0) owners(s)[slots[i]] = previous_owners[i];
            unlock(s);
            return FULL;
        }
        __atomic_store_n(&owners(s)[slots[i]], FREE, __ATOMIC_RELEASE);
    }
    crash_point(CRASH_RELEASE_AFTER_MARKS);
    for (size_t i = 0; i < num; i++) {
        push_free(s, slots[i]);
        crash_point(CRASH_RELEASE_AFTER_PUSH);
    }
    bool wake = note_freed(s);
    unlock(s);
    if (wake) futex_wake_all(&s->free_seq);
    return OK;
}

int slots_transfer(SlotsHeader* s, int32_t slot, int32_t from, uint32_t generation, int32_t to,
                   double timeout, LockMode mode) {
    if (slot < 0 || (uint32_t)slot >= s->num_slots) return TOO_BIG;
    if (from < 0 || to < 0) return FULL;
    // Under the lock: reclaim and release read the owner and push the slot in one critical
    // section, which a compare-and-swap from outside could land in the middle of.
    int rc = lock(s, slots_repair, mode, deadline_if_waiting(false, mode, timeout));
    if (rc != OK) return rc;
    bool current = owners(s)[slot] == from && slot_generation(s)[slot] == generation;
    if (current) __atomic_store_n(&owners(s)[slot], to, __ATOMIC_RELEASE);
    unlock(s);
    return current ? OK : STALE;
}

int32_t slots_owner(SlotsHeader* s, int32_t slot) {
    return __atomic_load_n(&owners(s)[slot], __ATOMIC_ACQUIRE);
}

uint32_t slots_generation(SlotsHeader* s, int32_t slot) {
    return __atomic_load_n(&slot_generation(s)[slot], __ATOMIC_ACQUIRE);
}

uint32_t slots_free_count(SlotsHeader* s) { return __atomic_load_n(&s->free_count, __ATOMIC_ACQUIRE); }

uint32_t slots_sleepers(SlotsHeader* s) {
    uint32_t count = __atomic_load_n(&s->waiting, __ATOMIC_SEQ_CST);
    for (uint32_t w = 0; w < s->num_workers; w++) count += __atomic_load_n(&sleeping(s)[w], __ATOMIC_SEQ_CST);
    return count;
}

int slots_reclaim(SlotsHeader* s, int32_t owner, double timeout, LockMode mode, size_t* num_reclaimed) {
    *num_reclaimed = 0;
    if (owner < 0) return FULL;  // FREE: the free slots would be pushed a second time
    int rc = lock(s, slots_repair, mode, deadline_if_waiting(false, mode, timeout));
    if (rc != OK) return rc;
    for (uint32_t slot = 0; slot < s->num_slots; slot++) {
        if (owners(s)[slot] != owner) continue;
        __atomic_store_n(&owners(s)[slot], FREE, __ATOMIC_RELEASE);
        push_free(s, (int32_t)slot);
        crash_point(CRASH_RECLAIM_AFTER_PUSH);
        (*num_reclaimed)++;
    }
    bool wake = *num_reclaimed > 0 && note_freed(s);
    unlock(s);
    if (wake) futex_wake_all(&s->free_seq);
    return OK;
}

void slots_close(SlotsHeader* s) {
    __atomic_store_n(&s->closed, 1, __ATOMIC_SEQ_CST);
    bump_and_wake(&s->free_seq);
    for (uint32_t w = 0; w < s->num_workers; w++) bump_and_wake(&wake_seq(s)[w]);
}

static uint64_t* split_word_of(SlotsHeader* s, uint32_t worker, uint32_t split) {
    return &split_state(s)[(size_t)worker * s->num_splits + split];
}

uint32_t split_set_pending(SlotsHeader* s, uint32_t worker, uint32_t split, int32_t num_requests) {
    uint64_t* word = split_word_of(s, worker, split);
    uint64_t old = __atomic_load_n(word, __ATOMIC_SEQ_CST), next;
    do {
        next = split_word(word_generation(old) + 1, (uint32_t)num_requests);
    } while (!__atomic_compare_exchange_n(word, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return word_generation(next);
}

int split_complete(SlotsHeader* s, uint32_t worker, uint32_t split, uint32_t generation, int32_t num_done) {
    uint64_t* word = split_word_of(s, worker, split);
    uint64_t old = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    uint32_t left;
    do {
        uint32_t count = word_count(old);
        if (word_generation(old) != generation || count == SPLIT_IDLE || num_done <= 0 || count < (uint32_t)num_done)
            return STALE;
        left = count - (uint32_t)num_done;
    } while (!__atomic_compare_exchange_n(word, &old, split_word(generation, left), false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    if (left != 0) return OK;
    __atomic_add_fetch(&wake_seq(s)[worker], 1, __ATOMIC_SEQ_CST);
    // The syscall only when the rollout worker sleeps: the common case costs two atomics.
    if (__atomic_load_n(&sleeping(s)[worker], __ATOMIC_SEQ_CST)) futex_wake_all(&wake_seq(s)[worker]);
    return OK;
}

int32_t split_pending(SlotsHeader* s, uint32_t worker, uint32_t split) {
    uint32_t count = word_count(__atomic_load_n(split_word_of(s, worker, split), __ATOMIC_SEQ_CST));
    return count == SPLIT_IDLE ? IDLE : (int32_t)count;
}

uint32_t split_generation(SlotsHeader* s, uint32_t worker, uint32_t split) {
    return word_generation(__atomic_load_n(split_word_of(s, worker, split), __ATOMIC_SEQ_CST));
}

void split_reset_worker(SlotsHeader* s, uint32_t worker) {
    for (uint32_t split = 0; split < s->num_splits; split++) {
        uint64_t* word = split_word_of(s, worker, split);
        uint64_t old = __atomic_load_n(word, __ATOMIC_SEQ_CST);
        while (!__atomic_compare_exchange_n(word, &old, split_word(word_generation(old) + 1, SPLIT_IDLE), false,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        }
    }
}

int32_t split_wait_any(SlotsHeader* s, uint32_t worker, double timeout) {
    double deadline = deadline_after(timeout);
    for (;;) {
        uint32_t seen = __atomic_load_n(&wake_seq(s)[worker], __ATOMIC_SEQ_CST);
        for (uint32_t split = 0; split < s->num_splits; split++) {
            uint64_t* word = split_word_of(s, worker, split);
            uint64_t old = __atomic_load_n(word, __ATOMIC_SEQ_CST);
            if (word_count(old) == 0 &&
                __atomic_compare_exchange_n(word, &old, split_word(word_generation(old), SPLIT_IDLE), false,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                return (int32_t)split;
        }
        if (__atomic_load_n(&s->closed, __ATOMIC_SEQ_CST) || past(deadline)) return -1;
        __atomic_store_n(&sleeping(s)[worker], 1, __ATOMIC_SEQ_CST);
        futex_wait(&wake_seq(s)[worker], seen, deadline);
        __atomic_store_n(&sleeping(s)[worker], 0, __ATOMIC_SEQ_CST);
    }
}

}  // namespace ipc

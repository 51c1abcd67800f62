// Implementation of ipc.h. Read the header first: it says what each object is for.
#include "ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
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
// before anyone else sees it.
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

int segment_create(Segment* seg, size_t size, const char* debug_name) {
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
    seg->addr = addr;
    seg->size = size;
    seg->fd = fd;
    seg->owner_pid = getpid();
    return OK;
}

int segment_attach(Segment* seg, pid_t owner_pid, int owner_fd, size_t size) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)owner_pid, owner_fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return SYS_ERROR;
    void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        close(fd);
        return SYS_ERROR;
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
    __atomic_store_n(&q->pending_valid, 1, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    q->state = next;
    __atomic_store_n(&q->pending_valid, 0, __ATOMIC_RELEASE);
}

static void queue_repair(QueueHeader* q) {
    if (q->pending_valid) {
        q->state = q->pending;
        q->pending_valid = 0;
    }
    q->recoveries++;
}

size_t queue_segment_size(size_t capacity) { return sizeof(QueueHeader) + capacity; }

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
    double deadline = block ? deadline_after(timeout) : -1;
    int rc = lock(q, queue_repair, mode, deadline);
    if (rc != OK) return rc;
    for (;;) {
        if (q->closed) {
            unlock(q);
            return CLOSED;
        }
        if (q->capacity - q->state.used >= total) break;
        if (!block || past(deadline)) {
            unlock(q);
            return block ? TIMEOUT : FULL;
        }
        uint32_t seen = q->not_full_seq;
        q->waiting_putters++;
        unlock(q);
        futex_wait(&q->not_full_seq, seen, deadline);
        if (lock(q, queue_repair) != OK) return SYS_ERROR;  // short: holders never sleep in it
        q->waiting_putters--;
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
    next.used += total;
    next.count += num;
    commit(q, next);
    bool wake = q->waiting_getters > 0;
    if (wake) q->not_empty_seq++;
    unlock(q);
    if (wake) futex_wake_all(&q->not_empty_seq);
    return OK;
}

int queue_get(QueueHeader* q, char* out, size_t out_capacity, size_t max_messages, bool block,
              double timeout, LockMode mode, size_t* num_taken, size_t* bytes_taken) {
    *num_taken = 0;
    *bytes_taken = 0;
    double deadline = block ? deadline_after(timeout) : -1;
    int rc = lock(q, queue_repair, mode, deadline);
    if (rc != OK) return rc;
    for (;;) {
        if (q->closed) {
            unlock(q);
            return CLOSED;
        }
        if (q->state.count > 0) break;
        if (!block || past(deadline)) {
            unlock(q);
            return block ? TIMEOUT : EMPTY;
        }
        uint32_t seen = q->not_empty_seq;
        q->waiting_getters++;
        unlock(q);
        futex_wait(&q->not_empty_seq, seen, deadline);
        if (lock(q, queue_repair) != OK) return SYS_ERROR;
        q->waiting_getters--;
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
    bool wake = q->waiting_putters > 0;
    if (wake) q->not_full_seq++;
    unlock(q);
    if (wake) futex_wake_all(&q->not_full_seq);
    *num_taken = taken;
    *bytes_taken = written;
    return OK;
}

void queue_close(QueueHeader* q) {
    __atomic_store_n(&q->closed, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&q->not_empty_seq, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&q->not_full_seq, 1, __ATOMIC_SEQ_CST);
    futex_wake_all(&q->not_empty_seq);
    futex_wake_all(&q->not_full_seq);
}

// ---------------------------------------------------------------------------------------------
// Slot control

static int32_t* free_stack(SlotsHeader* s) { return (int32_t*)(s + 1); }
static int32_t* owners(SlotsHeader* s) { return free_stack(s) + s->num_slots; }
static int32_t* pending(SlotsHeader* s) { return owners(s) + s->num_slots; }
static uint32_t* wake_seq(SlotsHeader* s) {
    return (uint32_t*)(pending(s) + s->num_workers * s->num_splits);
}
static uint32_t* sleeping(SlotsHeader* s) { return wake_seq(s) + s->num_workers; }

size_t slots_segment_size(uint32_t num_slots, uint32_t num_workers, uint32_t num_splits) {
    return sizeof(SlotsHeader) + sizeof(int32_t) * (2 * (size_t)num_slots) +
           sizeof(int32_t) * (size_t)num_workers * num_splits +
           sizeof(uint32_t) * 2 * (size_t)num_workers;
}

// The owner table is the truth; the free stack is rebuilt from it after a holder died.
static void slots_repair(SlotsHeader* s) {
    uint32_t count = 0;
    for (uint32_t slot = 0; slot < s->num_slots; slot++)
        if (owners(s)[slot] == FREE) free_stack(s)[count++] = (int32_t)slot;
    s->free_count = count;
    s->recoveries++;
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
    for (uint32_t i = 0; i < num_workers * num_splits; i++) pending(s)[i] = IDLE;
    return robust_mutex_init(&s->mutex);
}

int slots_acquire(SlotsHeader* s, int32_t owner, bool block, double timeout, LockMode mode,
                  int32_t* slot) {
    double deadline = block ? deadline_after(timeout) : -1;
    int rc = lock(s, slots_repair, mode, deadline);
    if (rc != OK) return rc;
    for (;;) {
        if (s->closed) {
            unlock(s);
            return CLOSED;
        }
        if (s->free_count > 0) break;
        if (!block || past(deadline)) {
            unlock(s);
            return block ? TIMEOUT : EMPTY;
        }
        uint32_t seen = s->free_seq;
        s->waiting++;
        unlock(s);
        futex_wait(&s->free_seq, seen, deadline);
        if (lock(s, slots_repair) != OK) return SYS_ERROR;
        s->waiting--;
    }
    int32_t taken = free_stack(s)[s->free_count - 1];
    owners(s)[taken] = owner;  // owner first: repair then leaves the slot off the free stack
    __atomic_thread_fence(__ATOMIC_RELEASE);
    s->free_count--;
    unlock(s);
    *slot = taken;
    return OK;
}

static void wake_acquirers(SlotsHeader* s, bool wake) {
    if (wake) futex_wake_all(&s->free_seq);
}

int slots_release(SlotsHeader* s, const int32_t* slots, size_t num) {
    for (size_t i = 0; i < num; i++)
        if (slots[i] < 0 || (uint32_t)slots[i] >= s->num_slots) return TOO_BIG;
    if (lock(s, slots_repair) != OK) return SYS_ERROR;
    // Each slot is marked free as it is checked, so a slot listed twice fails its second check
    // (pushed twice, it would go to two owners, and past num_slots the stack overruns owners[]).
    // On failure the marks are undone and nothing is pushed.
    std::vector<int32_t> previous_owners(num);
    for (size_t i = 0; i < num; i++) {
        previous_owners[i] = owners(s)[slots[i]];
        if (previous_owners[i] == FREE) {
            while (i-- > 0) owners(s)[slots[i]] = previous_owners[i];
            unlock(s);
            return FULL;
        }
        owners(s)[slots[i]] = FREE;
    }
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (size_t i = 0; i < num; i++) {
        free_stack(s)[s->free_count] = slots[i];
        __atomic_thread_fence(__ATOMIC_RELEASE);
        s->free_count++;
    }
    bool wake = s->waiting > 0;
    if (wake) s->free_seq++;
    unlock(s);
    wake_acquirers(s, wake);
    return OK;
}

int slots_set_owner(SlotsHeader* s, int32_t slot, int32_t owner) {
    if (slot < 0 || (uint32_t)slot >= s->num_slots) return TOO_BIG;
    if (owner < 0) return FULL;
    // Only a taken slot changes hands: a free one given an owner would stay on the free stack too.
    int32_t current = __atomic_load_n(&owners(s)[slot], __ATOMIC_ACQUIRE);
    do {
        if (current == FREE) return EMPTY;
    } while (!__atomic_compare_exchange_n(&owners(s)[slot], &current, owner, false, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return OK;
}

int32_t slots_owner(SlotsHeader* s, int32_t slot) {
    return __atomic_load_n(&owners(s)[slot], __ATOMIC_ACQUIRE);
}

uint32_t slots_free_count(SlotsHeader* s) { return __atomic_load_n(&s->free_count, __ATOMIC_ACQUIRE); }

size_t slots_reclaim(SlotsHeader* s, int32_t owner) {
    if (owner < 0) return 0;  // FREE: the free slots would be pushed a second time
    if (lock(s, slots_repair) != OK) return 0;
    size_t reclaimed = 0;
    for (uint32_t slot = 0; slot < s->num_slots; slot++) {
        if (owners(s)[slot] != owner) continue;
        free_stack(s)[s->free_count] = (int32_t)slot;
        owners(s)[slot] = FREE;
        __atomic_thread_fence(__ATOMIC_RELEASE);
        s->free_count++;
        reclaimed++;
    }
    bool wake = reclaimed > 0 && s->waiting > 0;
    if (wake) s->free_seq++;
    unlock(s);
    wake_acquirers(s, wake);
    return reclaimed;
}

void slots_close(SlotsHeader* s) {
    __atomic_store_n(&s->closed, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&s->free_seq, 1, __ATOMIC_SEQ_CST);
    futex_wake_all(&s->free_seq);
    for (uint32_t w = 0; w < s->num_workers; w++) {
        __atomic_add_fetch(&wake_seq(s)[w], 1, __ATOMIC_SEQ_CST);
        futex_wake_all(&wake_seq(s)[w]);
    }
}

void split_set_pending(SlotsHeader* s, uint32_t worker, uint32_t split, int32_t num_requests) {
    __atomic_store_n(&pending(s)[worker * s->num_splits + split], num_requests, __ATOMIC_SEQ_CST);
}

void split_complete(SlotsHeader* s, uint32_t worker, uint32_t split, int32_t num_done) {
    int32_t left = __atomic_sub_fetch(&pending(s)[worker * s->num_splits + split], num_done,
                                      __ATOMIC_SEQ_CST);
    if (left != 0) return;
    __atomic_add_fetch(&wake_seq(s)[worker], 1, __ATOMIC_SEQ_CST);
    // The syscall only when the rollout worker sleeps: the common case costs two atomics.
    if (__atomic_load_n(&sleeping(s)[worker], __ATOMIC_SEQ_CST)) futex_wake_all(&wake_seq(s)[worker]);
}

int32_t split_pending(SlotsHeader* s, uint32_t worker, uint32_t split) {
    return __atomic_load_n(&pending(s)[worker * s->num_splits + split], __ATOMIC_SEQ_CST);
}

int32_t split_wait_any(SlotsHeader* s, uint32_t worker, double timeout) {
    double deadline = deadline_after(timeout);
    int32_t* counters = pending(s) + worker * s->num_splits;
    for (;;) {
        uint32_t seen = __atomic_load_n(&wake_seq(s)[worker], __ATOMIC_SEQ_CST);
        for (uint32_t split = 0; split < s->num_splits; split++) {
            if (__atomic_load_n(&counters[split], __ATOMIC_SEQ_CST) == 0) {
                __atomic_store_n(&counters[split], IDLE, __ATOMIC_SEQ_CST);
                return (int32_t)split;
            }
        }
        if (__atomic_load_n(&s->closed, __ATOMIC_SEQ_CST) || past(deadline)) return -1;
        __atomic_store_n(&sleeping(s)[worker], 1, __ATOMIC_SEQ_CST);
        futex_wait(&wake_seq(s)[worker], seen, deadline);
        __atomic_store_n(&sleeping(s)[worker], 0, __ATOMIC_SEQ_CST);
    }
}

}  // namespace ipc

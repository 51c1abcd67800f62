// The shared-memory core of the trainer: C-like, torch-free, Python-free.
//
// Every shared object lives in an anonymous memfd segment, never in /dev/shm: the kernel frees
// it when the last process that maps it exits, however that process ends. Another process
// attaches through /proc/<owner pid>/fd/<fd>, so a handle is three integers and pickles freely.
//
// Cross-process locking uses robust pthread mutexes: when a process dies holding one, the next
// locker repairs the protected state (see each object's recover step) instead of deadlocking.
// Sleeping uses plain futexes on counters in the segment, which a dead sleeper cannot corrupt.
#pragma once

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

namespace ipc {

// Status codes shared by every call.
enum Status { OK = 0, EMPTY = 1, FULL = 2, TIMEOUT = 3, CLOSED = 4, TOO_BIG = 5, SYS_ERROR = 6, BUSY = 7 };

// How a call takes an object's lock. TRY returns BUSY at once when another process holds it, so
// a caller holding Python's GIL never waits on another process; WAIT gives up at the deadline.
enum LockMode { TRY = 0, WAIT = 1 };

// ---------------------------------------------------------------------------------------------
// Segment: a block of shared memory.
struct Segment {
    void* addr = nullptr;
    size_t size = 0;
    int fd = -1;
    pid_t owner_pid = 0;  // the process whose fd table holds the memfd others attach through
};

int segment_create(Segment* seg, size_t size, const char* debug_name);
int segment_attach(Segment* seg, pid_t owner_pid, int owner_fd, size_t size);
void segment_detach(Segment* seg);

// ---------------------------------------------------------------------------------------------
// Queue: a ring of length-prefixed messages, many producers and many consumers.
struct RingState {
    uint64_t head;   // byte offset of the oldest message
    uint64_t used;   // bytes in use, length prefixes included
    uint64_t count;  // messages in the ring
};

struct QueueHeader {
    pthread_mutex_t mutex;
    RingState state;
    RingState pending;          // journal: a state being committed, replayed by recovery
    uint32_t pending_valid;
    uint32_t closed;
    uint32_t not_empty_seq;     // futex words, bumped to wake sleepers
    uint32_t not_full_seq;
    uint32_t waiting_getters;
    uint32_t waiting_putters;
    uint64_t capacity;          // bytes of ring after the header
    uint64_t recoveries;        // how often a dead lock holder was cleaned up after
};

size_t queue_segment_size(size_t capacity);
int queue_init(void* addr, size_t capacity);
// Puts `num` messages, all or none; `sizes[i]` bytes each, concatenated in `data`.
// timeout < 0 waits forever.
int queue_put(QueueHeader* q, const char* data, const uint32_t* sizes, size_t num, bool block,
              double timeout, LockMode mode);
// Takes up to `max_messages` messages into `out` (each prefixed by its uint32 length) without
// exceeding `out_capacity` bytes; at least one message unless it fails.
int queue_get(QueueHeader* q, char* out, size_t out_capacity, size_t max_messages, bool block,
              double timeout, LockMode mode, size_t* num_taken, size_t* bytes_taken);
void queue_close(QueueHeader* q);

// ---------------------------------------------------------------------------------------------
// Slot control: the free list and owners of trajectory slots, and the per-(worker, split)
// counters that tell a rollout worker which of its env groups has all its actions.
const int32_t FREE = -1;  // owner of a slot on the free list
const int32_t IDLE = -1;  // split counter: the rollout worker holds this split

struct SlotsHeader {
    pthread_mutex_t mutex;
    uint32_t num_slots;
    uint32_t num_workers;
    uint32_t num_splits;
    uint32_t free_count;
    uint32_t free_seq;     // futex word: bumped when slots return while someone waits
    uint32_t waiting;
    uint32_t closed;
    uint32_t recoveries;
    // followed by: int32 free_stack[num_slots], int32 owner[num_slots],
    // int32 pending[num_workers * num_splits], uint32 wake_seq[num_workers],
    // uint32 sleeping[num_workers]
};

size_t slots_segment_size(uint32_t num_slots, uint32_t num_workers, uint32_t num_splits);
int slots_init(void* addr, uint32_t num_slots, uint32_t num_workers, uint32_t num_splits);
int slots_acquire(SlotsHeader* s, int32_t owner, bool block, double timeout, LockMode mode,
                  int32_t* slot);
// FULL (and nothing released) if a slot is free already or listed twice.
int slots_release(SlotsHeader* s, const int32_t* slots, size_t num);
// Hands a taken slot to another owner (>= 0): EMPTY if the slot is free, FULL for a negative owner.
int slots_set_owner(SlotsHeader* s, int32_t slot, int32_t owner);
int32_t slots_owner(SlotsHeader* s, int32_t slot);
uint32_t slots_free_count(SlotsHeader* s);
size_t slots_reclaim(SlotsHeader* s, int32_t owner);
void slots_close(SlotsHeader* s);

void split_set_pending(SlotsHeader* s, uint32_t worker, uint32_t split, int32_t num_requests);
void split_complete(SlotsHeader* s, uint32_t worker, uint32_t split, int32_t num_done);
int32_t split_pending(SlotsHeader* s, uint32_t worker, uint32_t split);
// Returns a split whose requests are all answered (and marks it IDLE), or -1 on timeout/close.
int32_t split_wait_any(SlotsHeader* s, uint32_t worker, double timeout);

}  // namespace ipc

// The shared-memory core of the trainer: C-like, torch-free, Python-free.
//
// Every shared object lives in an anonymous memfd segment, never in /dev/shm: the kernel frees
// it when the last process that maps it exits, however that process ends. Another process
// attaches through /proc/<owner pid>/fd/<fd>, so a handle is a few integers and pickles freely.
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

// Status codes shared by every call. STALE: a handle or an answer that no longer matches what
// it refers to (a segment now holding something else, a split asked again since).
enum Status { OK = 0, EMPTY = 1, FULL = 2, TIMEOUT = 3, CLOSED = 4, TOO_BIG = 5, SYS_ERROR = 6, BUSY = 7,
              STALE = 8 };

// How a call takes an object's lock. TRY returns BUSY at once when another process holds it, so
// a caller holding Python's GIL never waits on another process; WAIT gives up at the call's
// deadline (timeout < 0: none), the lock and the wait for messages or slots alike.
enum LockMode { TRY = 0, WAIT = 1 };

// Crash points: with one armed (crash_point_arm, a test hook), the process SIGKILLs itself when it
// reaches that point, inside a critical section, so a test can check the recovery of every state
// a death can leave. They are compiled into the shipped module on purpose: what matters is the
// order of stores the release build emits (a debug build could order them differently), and an
// unarmed point costs one predictable branch.
enum CrashPoint {
    CRASH_NONE = 0,
    CRASH_PUT_AFTER_BYTES,       // message bytes in the ring, nothing committed
    CRASH_COMMIT_AFTER_JOURNAL,  // journal written, not yet marked valid
    CRASH_COMMIT_AFTER_VALID,    // journal valid, state not yet written
    CRASH_COMMIT_AFTER_STATE,    // state written, journal still valid
    CRASH_REPAIR_AFTER_STATE,    // a recoverer has copied the journal into the state
    CRASH_ACQUIRE_AFTER_OWNER,   // slot owned, free count not yet lowered
    CRASH_RELEASE_AFTER_MARKS,   // slots marked free, not yet pushed
    CRASH_RELEASE_AFTER_PUSH,    // the first slot pushed
    CRASH_RECLAIM_AFTER_PUSH,    // the first reclaimed slot pushed
    CRASH_NUM_POINTS
};
void crash_point_arm(int point);

// ---------------------------------------------------------------------------------------------
// Segment: a block of shared memory. It starts with a SegmentHeader saying what it holds; the
// object's own data starts SEGMENT_DATA_OFFSET bytes in. A handle carries the kind, the size and
// the random token, and attaching checks all three, so a stale handle (its fd number now reused
// for another object) is refused instead of mapped.
enum SegmentKind : uint32_t { KIND_BUFFER = 1, KIND_QUEUE = 2, KIND_SLOTS = 3 };
const uint64_t SEGMENT_MAGIC = 0x6f70706143504941ull;  // "AIPCappo"
const size_t SEGMENT_DATA_OFFSET = 64;

struct SegmentHeader {
    uint64_t magic;
    uint32_t kind;
    uint32_t reserved;
    uint64_t size;   // the whole segment, header included
    uint64_t token;  // random, drawn at creation
};

struct Segment {
    void* addr = nullptr;
    size_t size = 0;
    int fd = -1;
    pid_t owner_pid = 0;  // the process whose fd table holds the memfd others attach through
    void* data() const { return (char*)addr + SEGMENT_DATA_OFFSET; }
    const SegmentHeader* header() const { return (const SegmentHeader*)addr; }
};

// `data_size` bytes for the object, after the header.
int segment_create(Segment* seg, size_t data_size, uint32_t kind, const char* debug_name);
// OK; SYS_ERROR with errno set (ENOENT: the owner or its fd is gone; EACCES/EPERM: not allowed to
// open another process's fd); STALE if the segment is not the (kind, size, token) the handle names.
int segment_attach(Segment* seg, pid_t owner_pid, int owner_fd, uint32_t kind, size_t size, uint64_t token);
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
    uint32_t not_empty_seq;     // futex words, bumped (atomically) to wake sleepers
    uint32_t not_full_seq;
    uint32_t waiting_getters;   // sleepers, counted so that a put or get without any skips the
    uint32_t waiting_putters;   // wake-up syscall (one killed while asleep costs a syscall per call)
    uint64_t capacity;          // bytes of ring after the header
    uint64_t recoveries;        // how often a dead lock holder was cleaned up after
};

size_t queue_segment_size(size_t capacity);
int queue_init(void* addr, size_t capacity);
// Puts `num` messages, all or none; `sizes[i]` bytes each, concatenated in `data`.
// timeout < 0 waits forever; with block false it bounds only the wait for the lock.
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
//
// Generations make a late or repeated message harmless. A slot's generation goes up each time it
// is acquired, so a hand-off message names (slot, generation) and cannot take the slot's next
// life. A split's generation goes up each time its requests are sent, and an answer counts only
// for the generation it was asked in, so neither a duplicate nor a late answer from before a
// resend can complete a split (its counter never goes below 0).
const int32_t FREE = -1;  // owner of a slot on the free list
const int32_t IDLE = -1;  // split counter as split_pending reports it: the rollout worker holds the split

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
    // followed by: uint64 split_state[num_workers * num_splits] (generation << 32 | requests
    // waiting, or SPLIT_IDLE in the low half), int32 free_stack[num_slots], int32 owner[num_slots],
    // uint32 slot_generation[num_slots], uint32 wake_seq[num_workers], uint32 sleeping[num_workers]
};

size_t slots_segment_size(uint32_t num_slots, uint32_t num_workers, uint32_t num_splits);
int slots_init(void* addr, uint32_t num_slots, uint32_t num_workers, uint32_t num_splits);
// The lock-taking calls below return BUSY (TRY) or TIMEOUT (WAIT, past `timeout`) when another
// process holds the lock, and change nothing then.
int slots_acquire(SlotsHeader* s, int32_t owner, bool block, double timeout, LockMode mode,
                  int32_t* slot);
// FULL (and nothing released) if a slot is free already or listed twice.
int slots_release(SlotsHeader* s, const int32_t* slots, size_t num, double timeout, LockMode mode);
// Hands slot to `to` if `from` still holds it in the generation `generation`: OK, or STALE (the
// slot was freed since, or freed and taken again) and nothing changes.
int slots_transfer(SlotsHeader* s, int32_t slot, int32_t from, uint32_t generation, int32_t to,
                   double timeout, LockMode mode);
int32_t slots_owner(SlotsHeader* s, int32_t slot);
uint32_t slots_generation(SlotsHeader* s, int32_t slot);
uint32_t slots_free_count(SlotsHeader* s);
// Processes and threads asleep in acquire or wait_any (tests check that a waiter really blocked).
uint32_t slots_sleepers(SlotsHeader* s);
// Frees every slot `owner` holds; *num_reclaimed says how many.
int slots_reclaim(SlotsHeader* s, int32_t owner, double timeout, LockMode mode, size_t* num_reclaimed);
void slots_close(SlotsHeader* s);

// Rollout worker: num_requests requests of the split now wait; returns their generation.
uint32_t split_set_pending(SlotsHeader* s, uint32_t worker, uint32_t split, int32_t num_requests);
// Policy worker: num_done requests of generation `generation` answered. STALE (and nothing
// counted) if the split was asked again since, or has fewer requests waiting than that.
int split_complete(SlotsHeader* s, uint32_t worker, uint32_t split, uint32_t generation, int32_t num_done);
int32_t split_pending(SlotsHeader* s, uint32_t worker, uint32_t split);  // IDLE when held
uint32_t split_generation(SlotsHeader* s, uint32_t worker, uint32_t split);
// A restarted rollout worker's splits: IDLE in a new generation, so no answer meant for the dead
// process counts for the new one.
void split_reset_worker(SlotsHeader* s, uint32_t worker);
// Returns a split whose requests are all answered (and marks it IDLE), or -1 on timeout/close.
int32_t split_wait_any(SlotsHeader* s, uint32_t worker, double timeout);

}  // namespace ipc

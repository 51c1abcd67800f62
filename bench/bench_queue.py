"""Benchmark many-producers -> one-consumer message throughput of IPC queues.

What it measures
    Messages per second through one queue, for 1->1, 2->1, 4->1 and 8->1
    producer PROCESSES (multiprocessing "spawn" context) feeding ONE consumer
    (the main process).  Messages are small int tuples shaped like the
    trainer's (worker, split, slot, step), e.g. (p, i, i % 64, 7).

    Each producer sends its share of the messages with plain put(), one
    message per call, as the trainer does.  The consumer takes them in batches
    with get_many() (multiprocessing.Queue has none, so there it calls get()
    in a loop).  The clock starts when every producer is started and waiting
    on a start event (so process start-up is excluded) and stops when the
    consumer has received every message.  Every queue sends the same
    --messages per run, and the queues take turns run by run (ours, mp_queue,
    faster_fifo, ours, ...), so a change in the machine's load falls on all of
    them alike.  Each cell is the median of --runs runs, with the lowest and
    highest run beside it.  Other load on the machine skews the numbers; the
    header shows the load average.

Queues compared
    ours         appo_ipc.Queue
    mp_queue     multiprocessing.Queue (spawn context)
    faster_fifo  faster_fifo.Queue, when importable (else n/a / null)

How to run
    python bench/bench_queue.py                 # table, default sizes
    python bench/bench_queue.py --json          # one JSON object per case
    python bench/bench_queue.py --runs 5 --messages 500000
"""

import argparse
import json
import multiprocessing
import os
import queue
import statistics
import sys
import time

# Make the in-place built appo_ipc importable when run as bench/bench_queue.py.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

import appo_ipc  # noqa: E402

try:
    import faster_fifo
except ImportError:
    faster_fifo = None

PRODUCER_COUNTS = (1, 2, 4, 8)
QUEUE_NAMES = ("ours", "mp_queue", "faster_fifo")
QUEUE_BYTES = 1 << 20
GET_MANY_BATCH = 4096
# The whole run may not take longer than this; a stuck run raises instead of hanging.
RUN_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0

SPAWN = multiprocessing.get_context("spawn")


# ---------------------------------------------------------------- queues


def make_queue(name):
    """A fresh queue of the given kind, or None when it is not installed."""
    if name == "ours":
        return appo_ipc.Queue(max_size_bytes=QUEUE_BYTES)
    if name == "mp_queue":
        return SPAWN.Queue()
    if name == "faster_fifo":
        if faster_fifo is None:
            return None
        return faster_fifo.Queue(max_size_bytes=QUEUE_BYTES)
    raise ValueError(f"unknown queue {name!r}")


def receive_batch(name, q, timeout_s):
    """Blocks for at least one message and returns a list of those waiting."""
    if name == "ours":
        return q.get_many(max_messages=GET_MANY_BATCH, block=True, timeout=timeout_s)
    if name == "faster_fifo":
        return q.get_many(block=True, timeout=timeout_s, max_messages_to_get=GET_MANY_BATCH)
    return [q.get(block=True, timeout=timeout_s)]


def close_queue(name, q):
    if name == "ours":
        q.close()
    elif name == "mp_queue":
        q.close()
        q.join_thread()
    elif name == "faster_fifo":
        q.close()


# ---------------------------------------------------------------- producer


def produce(q, producer_id, message_count, ready, start):
    """Producer process body: signal ready, wait for start, put() each message."""
    ready.release()
    if not start.wait(START_TIMEOUT_S):
        return
    put = q.put
    for i in range(message_count):
        put((producer_id, i, i % 64, 7))
    if hasattr(q, "join_thread"):  # mp.Queue: flush its feeder thread before exit
        q.close()
        q.join_thread()


# ---------------------------------------------------------------- one run


def split_messages(total, producers):
    """Per-producer message counts that add up to total."""
    base, extra = divmod(total, producers)
    return [base + (1 if p < extra else 0) for p in range(producers)]


def make_producers(q, counts, ready, start):
    """One (not yet started) spawn process per per-producer message count."""
    return [
        SPAWN.Process(target=produce, args=(q, p, n, ready, start), daemon=True)
        for p, n in enumerate(counts)
    ]


def wait_until_ready(processes, ready):
    """Waits for one ready signal per process; fails fast if one dies first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    still_to_start = len(processes)
    while still_to_start:
        if ready.acquire(timeout=0.1):
            still_to_start -= 1
        elif any(p.exitcode is not None for p in processes):
            raise RuntimeError("a producer exited before it was ready")
        elif time.monotonic() > deadline:
            raise RuntimeError("a producer did not start in time")


def consume(name, q, total):
    """Receives total messages; raises if they do not all come within RUN_TIMEOUT_S."""
    received = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while received < total:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise RuntimeError(f"{name}: timed out after {received}/{total} messages")
        try:
            received += len(receive_batch(name, q, min(remaining_s, 5.0)))
        except queue.Empty:
            pass


def stop_processes(processes, join_timeout_s):
    """Joins every started process; terminates (then kills) any still running after that."""
    started = [p for p in processes if p.pid is not None]
    for process in started:
        process.join(timeout=join_timeout_s)
    for process in started:
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


def time_one_run(name, producers, total):
    """Messages per second for one run of `producers` processes -> main process."""
    q = make_queue(name)
    ready, start = SPAWN.Semaphore(0), SPAWN.Event()
    processes = make_producers(q, split_messages(total, producers), ready, start)
    finished = False
    try:
        for process in processes:
            process.start()
        wait_until_ready(processes, ready)
        began = time.perf_counter()
        start.set()
        consume(name, q, total)
        elapsed_s = time.perf_counter() - began
        finished = True
    finally:
        # After a failure, producers may be blocked on a full queue: do not wait long.
        stop_processes(processes, join_timeout_s=10 if finished else 0.5)
        close_queue(name, q)
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{name}: producer exit codes {failed}")
    return total / elapsed_s


def installed(name):
    return name != "faster_fifo" or faster_fifo is not None


def measure_case(producers, total, runs):
    """msgs/s of every installed queue for one producer count: the queues take turns run by run.
    A row: median per queue (None where not installed) and its runs under "<name>_runs"."""
    rates = {name: [] for name in QUEUE_NAMES if installed(name)}
    for _ in range(runs):
        for name in rates:
            rates[name].append(time_one_run(name, producers, total))
    row = {"case": f"{producers}->1"}
    for name in QUEUE_NAMES:
        row[name] = statistics.median(rates[name]) if name in rates else None
        row[f"{name}_runs"] = rates.get(name, [])
    return row


# ---------------------------------------------------------------- output


def format_rate(rate):
    if rate is None:
        return "n/a"
    if rate >= 1e6:
        return f"{rate / 1e6:.2f}M"
    return f"{rate / 1e3:.0f}k"


def format_ratio(numerator, denominator):
    if numerator is None or denominator is None:
        return "n/a"
    return f"{numerator / denominator:.2f}x"


TABLE_COLUMNS = ("case", "ours", "mp_queue", "faster_fifo", "ours/faster_fifo", "ours/mp_queue")


def format_spread(row, name):
    """The median, and the lowest and highest run: '1.12M (1.05M-1.20M)'."""
    runs = row[f"{name}_runs"]
    if not runs:
        return "n/a"
    return f"{format_rate(row[name])} ({format_rate(min(runs))}-{format_rate(max(runs))})"


def table_row(row):
    cells = (
        row["case"],
        format_spread(row, "ours"),
        format_spread(row, "mp_queue"),
        format_spread(row, "faster_fifo"),
        format_ratio(row["ours"], row["faster_fifo"]),
        format_ratio(row["ours"], row["mp_queue"]),
    )
    return format_cells(cells)


def format_cells(cells):
    # a queue's cell holds a median and its range: '1.02M (947k-1.10M)'
    return "  ".join(cell.rjust(max(len(column), 22 if column in QUEUE_NAMES else 8))
                     for cell, column in zip(cells, TABLE_COLUMNS))


def print_row(row, as_json):
    if as_json:
        print(json.dumps(row), flush=True)
    else:
        print(table_row(row), flush=True)


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=(
            "Messages/s of appo_ipc.Queue vs multiprocessing.Queue vs faster_fifo.Queue "
            "for 1, 2, 4 and 8 producer processes (spawn) putting small int tuples with "
            "put() into one consumer (the main process) that reads with get_many() "
            "(get() in a loop for multiprocessing.Queue). Start-up is excluded; the "
            "queues take turns run by run, and the median of --runs runs is reported "
            "with the lowest and highest."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--messages", type=int, default=500_000,
                        help="messages per run, the same for every queue, split evenly "
                             "over the producers (multiprocessing.Queue takes ~5-10 s for "
                             "the default)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per (queue, case); the median is reported")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object per case instead of a table, e.g. '
                             '{"case": "4->1", "ours": 1234567.0, "ours_runs": [...], "mp_queue": ..., '
                             '"faster_fifo": null, "faster_fifo_runs": []}; rates are messages per '
                             'second (medians, and every run), null where a queue is not installed')
    parser.add_argument("--out", default=None,
                        help="also write a result file (JSON): every row, the command, the commit, the machine")
    parser.add_argument("--report", default=None, help="run nothing: print the table of a result file from --out")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.runs < 1:
        parser.error("--messages and --runs must be at least 1")
    return args


def header(runs, messages, load):
    return (f"msgs/s, median (lowest-highest) of {runs} runs, queues taking turns run by run; "
            f"{messages:,} messages a run; {os.cpu_count()} CPUs, load average {load:.1f}")


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        print("\n".join(f"# {key}: {value}" for key, value in saved["provenance"].items()))
        print(header(saved["runs"], saved["messages"], saved["load_before"]))
        print(format_cells(TABLE_COLUMNS))
        for row in saved["rows"]:
            print_row(row, args.json)
        return
    load = os.getloadavg()[0]
    if not args.json:
        print(header(args.runs, args.messages, load))
        print(format_cells(TABLE_COLUMNS))
    rows = []
    for producers in PRODUCER_COUNTS:
        rows.append(measure_case(producers, args.messages, args.runs))
        print_row(rows[-1], args.json)
    if args.out:
        import bench_throughput  # for its provenance: command, commit, uncommitted files, machine
        with open(args.out, "w") as f:
            json.dump({"provenance": bench_throughput.provenance(args), "messages": args.messages, "runs": args.runs,
                       "load_before": load, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

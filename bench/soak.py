"""Soak test: one long training run, watched from outside for memory growth, FPS drift and leaks.

    python bench/soak.py --minutes 30 -- --env doom_basic --num_workers 2 --num_envs_per_worker 8

Everything after `--` goes to appo.py (the script adds --train_for_seconds, --train_dir and
--experiment). Every --sample_sec it records each process of the run (the runner, its children
and the env processes they start): resident memory (VmRSS) and private anonymous memory
(RssAnon, the part a leak grows). At the end it prints, per process, the memory one minute in and
at the end with the growth, the FPS over the first and last five minutes, and whether any process
or /dev/shm entry outlived the run.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tagged_processes(tag: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if tag.encode() in f.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def memory_kib(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None
    return {"name": fields["Name"].strip(), "rss": int(fields["VmRSS"].split()[0]),
            "anon": int(fields.get("RssAnon", "0 kB").split()[0]), "peak": int(fields["VmHWM"].split()[0])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the run")
    parser.add_argument("--sample_sec", type=float, default=15.0, help="seconds between memory samples")
    parser.add_argument("appo_flags", nargs=argparse.REMAINDER, help="flags for appo.py, after --")
    args = parser.parse_args(argv)
    flags = [flag for flag in args.appo_flags if flag != "--"]

    tag = uuid.uuid4().hex
    train_dir = tempfile.mkdtemp(prefix="appo_soak_")
    shm_before = set(os.listdir("/dev/shm"))
    command = [sys.executable, os.path.join(REPO, "appo.py"), *flags, "--train_for_seconds", str(args.minutes * 60),
               "--train_dir", train_dir, "--experiment", "soak"]
    print(" ".join(command), flush=True)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, APPO_SOAK_TAG=tag))
    fps_points: list[tuple[float, float]] = []  # (seconds into the run, FPS over 10 s)
    lines: list[str] = []

    def read_output():
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            match = re.search(r"\[\s*(\d+)s\] frames [\d,]+ \| FPS 10s/60s/300s ([\d,]+)", line)
            if match:
                fps_points.append((float(match.group(1)), float(match.group(2).replace(",", ""))))

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    first: dict[int, dict] = {}
    middle: dict[int, dict] = {}  # halfway: growth after it is what is left once allocators warmed up
    last: dict[int, dict] = {}
    start = time.monotonic()
    while process.poll() is None:
        elapsed = time.monotonic() - start
        for pid in tagged_processes(tag):
            sample = memory_kib(pid)
            if sample is None:
                continue
            if elapsed >= 60 and pid not in first:
                first[pid] = sample
            if elapsed >= args.minutes * 30 and pid not in middle:
                middle[pid] = sample
            last[pid] = sample
        time.sleep(args.sample_sec)
    reader.join(timeout=10)
    time.sleep(2.0)
    leftover_processes = tagged_processes(tag)
    leftover_shm = sorted(set(os.listdir("/dev/shm")) - shm_before)

    print(f"\nexit code {process.returncode}; last status line:\n{next((l for l in reversed(lines) if 'FPS' in l), '')}\n")
    print("| process | pid | RSS at 1 min (MiB) | at end | private anon at 1 min | halfway | at end "
          "| growth, 1 min to end | growth, second half | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pid in sorted(first, key=lambda p: (first[p]["name"], p)):
        a, b = first[pid], last[pid]
        m = middle.get(pid, a)
        print(f"| {a['name']} | {pid} | {a['rss'] / 1024:.0f} | {b['rss'] / 1024:.0f} | {a['anon'] / 1024:.1f} "
              f"| {m['anon'] / 1024:.1f} | {b['anon'] / 1024:.1f} | {(b['anon'] - a['anon']) / max(a['anon'], 1):+.1%} "
              f"| {(b['anon'] - m['anon']) / max(m['anon'], 1):+.1%} | {b['peak'] / 1024:.0f} |")
    early = [fps for t, fps in fps_points if 60 <= t < 360]
    late = [fps for t, fps in fps_points if t >= fps_points[-1][0] - 300] if fps_points else []
    if early and late:
        print(f"\nFPS (10 s windows), median: minutes 1-6 {statistics.median(early):,.0f}, "
              f"last 5 minutes {statistics.median(late):,.0f}")
    print(f"processes left: {len(leftover_processes)}; new /dev/shm entries: {leftover_shm or 'none'}")
    print(f"(run folder: {train_dir})")
    return 0 if process.returncode == 0 and not leftover_processes and not leftover_shm else 1


if __name__ == "__main__":
    sys.exit(main())

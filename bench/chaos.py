"""Chaos run: a real training while a killer SIGKILLs its processes, and a report of what the run
lost (it should be nothing).

    python bench/chaos.py                       # 10 minutes, a kill every ~5 s (the figures in docs/faults.md)
    python bench/chaos.py --minutes 1 --kill_every 2 --json chaos.json
    python bench/chaos.py --config synchronous  # atari_breakout, synchronous collection
    python bench/chaos.py --least_kills 6 --minutes 4 --kill_every 2  # until 6 kills, every kind among them

The run: 2 rollout workers x 2 splits, 2 policy workers, one learner (appo.train in this process;
the killer runs in its `watch` callback), on doom_basic collecting asynchronously (--config
asynchronous, the default) or on atari_breakout collecting synchronously, its family's default
(--config synchronous: splits park until the weights trained on their batch arrive, and the
policy lag must stay 0). The kills take these kinds in turn, in an order drawn once (so a short
run has every kind), at random instants and on random victims:
- a rollout worker, a policy worker or a VizDoom game process, at a random instant;
- a policy worker at an instant a rollout worker holds a split (it is stepping that split's envs):
  the requests it sends next go into the queues the runner drains, and are asked again, so the
  policy workers can answer a split twice (review row 1 of ../shared/notes/ipc-review.md);
- the rollout workers at an instant one of them has handed a finished slot to the learner that
  the learner has not taken yet (row 2): all of them, since the queue does not say whose it is.
  The learner takes a slot within milliseconds of its handoff, so the killer holds it (SIGSTOP, as
  a descheduled learner) until a slot waits in its queue, kills, and lets it go (SIGCONT) in the
  runner's next round, after the restarts have reclaimed the dead workers' slots: the learner then
  meets handoffs of slots that are no longer the senders'.
The policy worker's window is milliseconds wide: that kind polls for it for up to 2 s instead of
hoping to land in it. A game process killed while its VizDoom is still starting (its rollout worker
has not mapped the game's shared memory yet) takes its rollout worker with it: VizDoom 1.3's
`DoomController::init` reads the game state it has not opened yet when the game dies then, a
segfault (docs/faults.md). Such kills are counted apart, each allowed one restart.

It checks, and prints:
- every split of every rollout worker keeps stepping: its generation (raised by each request for
  actions) never stands still for --stall_s seconds beyond what the run's own restarts explain;
  a split that does is a stalled split. The time its rollout worker is dead or starting (from its
  death to the first step of its restarted process, measured in the run, so a loaded machine's
  slow start-ups do not count as stalls) and the time the killer holds the learner are not counted;
- the learner keeps training: its frames never stand still for --stall_s beyond the time some
  rollout worker is dead or starting, or the killer holds it;
- with --least_kills, the run recovered from its last kill: it ends only once the learner trained
  and every split stepped after it;
- no split counter below its idle value;
- no slot lost: at the end, once every process has stopped, the learner has released what it held
  and the dead rollout workers' slots are reclaimed, every slot is free;
- restarts: one per killed worker, none for any other reason (a torn message, an exception);
- synchronous collection: the policy lag the learner reports never rises above 0;
- a clean exit: exit code 0, no process of the run left, no new /dev/shm entry (another run's, held by its live processes, aside).
Exit status 0 when every check holds, 1 otherwise. The run's folder (a temporary directory: its
checkpoint, logs and TensorBoard files, about 34 MB) is deleted when every check holds and kept,
with its path printed, when one fails.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import appo  # noqa: E402
import appo_ipc  # noqa: E402
import env as envs  # noqa: E402

IDLE = -1  # SlotControl.pending of a split its rollout worker holds (it is stepping its envs)
KINDS = ("rollout worker", "policy worker", "game process", "policy worker while a split steps",
         "rollout worker with a slot in flight")
CONFIGS = {  # the env and its collection; ALE runs in the rollout worker, so Atari has no game process
    "asynchronous": ["--env", "doom_basic"],
    "synchronous": ["--env", "atari_breakout", "--rollout", "32", "--batch_size", "64"],  # 4 x 64 = 2 x 4 x 32
}


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def is_resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker: this process's helper, not the run's; it lives as long as we do."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # gone


def game_processes(rollout_worker_pid: int) -> list[int]:
    found = []
    for pid in children_of(rollout_worker_pid):
        try:
            if b"+viz_instance_id" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def game_is_starting(rollout_worker_pid: int, game_pid: int) -> bool:
    """VizDoom's init has not opened the game's shared memory yet (a death now segfaults the worker)."""
    segments = envs.shared_memory_of([game_pid])  # its ViZDoomSM<id> first
    try:
        return bool(segments) and os.path.basename(segments[0]) not in Path(
            f"/proc/{rollout_worker_pid}/maps").read_text()
    except OSError:
        return False  # the worker is gone


def send_signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def overlap(start: float, end: float, intervals: list[list]) -> float:
    """Seconds of [start, end] inside the union of `intervals` ([from, to], to None while open)."""
    clipped = sorted((max(a, start), min(end if b is None else b, end)) for a, b in intervals)
    covered, reached = 0.0, start
    for a, b in clipped:
        a = max(a, reached)
        if b > a:
            covered, reached = covered + b - a, b
    return covered


class Killer:
    """The `watch` callback of appo.train: kills, and keeps the books of what kept moving."""

    def __init__(self, args, cfg):
        self.args, self.cfg = args, cfg
        self.rng = random.Random(args.seed)
        self.kinds = [kind for kind in KINDS if kind != "game process" or cfg.env.startswith("doom")]
        self.rng.shuffle(self.kinds)
        self.attempts = 0
        self.kills: Counter = Counter()
        self.games_killed_starting = 0  # each may end its rollout worker (VizDoom's init segfaults)
        self.started = None
        self.last_round = 0.0
        self.next_kill = 0.0
        self.last_kill_at = 0.0
        self.split_moved: dict[tuple[int, int], tuple[int, float]] = {}  # (worker, split) -> (generation, when)
        self.split_silence: dict[tuple[int, int], float] = {}  # silent seconds no restart or hold explains
        self.longest_split_silence = 0.0  # as the clock reads, restarts included
        self.longest_unexplained_split_silence = 0.0
        self.stalled_splits: set[tuple[int, int]] = set()
        self.learner_moved: tuple[int, float] | None = None  # (frames trained, when they last rose)
        self.learner_silence = 0.0
        self.longest_learner_pause = 0.0  # as the clock reads
        self.longest_unexplained_learner_pause = 0.0
        self.lowest_counter = 0
        self.highest_lag = 0.0  # the learner's reported lag_max (stays 0 with synchronous collection)
        self.shared = self.workers = None
        self.worker_pids: dict[int, int] = {}  # rollout worker -> the pid last seen, to see restarts
        self.down: dict[int, list[list]] = {}  # rollout worker -> [[dead or starting from, to]]
        self.start_ups: list[float] = []  # seconds from a rollout worker's death to its successor's first step
        self.learner_held: list[list] = []  # [[SIGSTOP, SIGCONT]] of the in-flight kind
        self.held_pid: int | None = None
        self.release_timer: threading.Timer | None = None
        self.frames_at_last_kill = 0
        self.enough_kills_at: float | None = None

    def __call__(self, shared, workers, stats):
        now = time.monotonic()
        self.shared, self.workers = shared, workers
        self.release_learner(now)  # held during the last round: the dead workers were restarted since
        self.highest_lag = max(self.highest_lag, stats.learner[0].get("lag_max", 0.0))
        if self.started is None:
            self.started = self.last_round = now
            self.next_kill = now + self.args.warmup_s
            for worker in range(self.cfg.num_workers):  # starting, until its first step
                self.down[worker] = [[now, None]]
        self.keep_books(shared, workers, now)
        self.last_round = now
        if self.enough_kills():  # --least_kills: the run ends on what it did, not the clock
            if self.enough_kills_at is None and self.recovered():
                self.enough_kills_at = now
            if self.enough_kills_at is not None and now >= self.enough_kills_at + self.args.quiet_end_s:
                raise appo.StopRequested()
            return  # no more kills: on a loaded machine the learner may not train between kills 2 s apart
        if now >= self.next_kill and now < self.started + self.args.minutes * 60 - self.args.quiet_end_s:
            kind = self.kinds[self.attempts % len(self.kinds)]
            self.attempts += 1
            killed = self.kill(kind, shared, workers)
            self.kills[kind] += killed
            self.next_kill = time.monotonic() + self.rng.uniform(0.5, 1.5) * self.args.kill_every
            if killed:
                self.last_kill_at = time.monotonic()
                self.frames_at_last_kill = int(shared.run.learner_frames.min())

    def enough_kills(self) -> bool:
        return bool(self.args.least_kills and sum(self.kills.values()) >= self.args.least_kills
                    and all(self.kills[kind] for kind in self.kinds))

    def recovered(self) -> bool:
        """Since the last kill the learner trained, every rollout worker is up and every split stepped."""
        return (int(self.shared.run.learner_frames.min()) > self.frames_at_last_kill
                and not any(self.is_down(worker) for worker in self.down)
                and all(when > self.last_kill_at for _, when in self.split_moved.values()))

    def is_down(self, worker: int) -> bool:
        return bool(self.down[worker]) and self.down[worker][-1][1] is None

    def keep_books(self, shared, workers, now: float):
        """One round of the books: restarts seen, splits and the learner moved or silent since the last round."""
        for child in workers.children:
            if child.kind != "rollout worker":
                continue
            worker, pid = child.worker_id, child.process.pid
            if self.worker_pids.get(worker, pid) != pid:  # restarted (the supervisor also reset its splits)
                if not self.is_down(worker):  # died unkilled (a segfault) after the last round saw it
                    self.down[worker].append([self.last_round, None])
                for split in range(self.cfg.worker_num_splits):  # the reset's new generation is no step
                    _, when = self.split_moved[(worker, split)]
                    self.split_moved[(worker, split)] = (shared.slots.control.split_generation(worker, split), when)
            self.worker_pids[worker] = pid
        control = shared.slots.control
        window = (self.last_round, now)
        for worker in range(self.cfg.num_workers):
            for split in range(self.cfg.worker_num_splits):
                generation = control.split_generation(worker, split)
                self.lowest_counter = min(self.lowest_counter, control.pending(worker, split))
                last = self.split_moved.get((worker, split))
                if last is None or last[0] != generation:
                    self.split_moved[(worker, split)] = (generation, now)
                    self.split_silence[(worker, split)] = 0.0
                    if self.is_down(worker):  # its first step since it (re)started
                        self.down[worker][-1][1] = now
                        self.start_ups.append(now - self.down[worker][-1][0])
                    continue
                self.longest_split_silence = max(self.longest_split_silence, now - last[1])
                silence = self.split_silence[(worker, split)] + (now - self.last_round) - overlap(
                    *window, self.down[worker] + self.learner_held)
                self.split_silence[(worker, split)] = silence
                self.longest_unexplained_split_silence = max(self.longest_unexplained_split_silence, silence)
                if silence > self.args.stall_s:
                    self.stalled_splits.add((worker, split))
        frames = int(shared.run.learner_frames.min())
        if self.learner_moved is None or frames != self.learner_moved[0]:
            self.learner_moved, self.learner_silence = (frames, now), 0.0
        elif frames > 0:  # pauses count once it has started
            self.longest_learner_pause = max(self.longest_learner_pause, now - self.learner_moved[1])
            all_down = [interval for intervals in self.down.values() for interval in intervals]
            self.learner_silence += (now - self.last_round) - overlap(*window, all_down + self.learner_held)
            self.longest_unexplained_learner_pause = max(self.longest_unexplained_learner_pause, self.learner_silence)

    def kill(self, kind: str, shared, workers) -> int:
        """Kills one process of `kind` (all rollout workers for a slot in flight); how many it killed."""
        rollout = [c for c in workers.children if c.kind == "rollout worker" and c.process.is_alive()]
        policy = [c for c in workers.children if c.kind == "policy worker" and c.process.is_alive()]
        if kind == "policy worker while a split steps":
            if not self.wait_for(lambda: any(shared.slots.control.pending(w, s) == IDLE
                                             for w in range(self.cfg.num_workers)
                                             for s in range(self.cfg.worker_num_splits))):
                return False
            return self.sigkill(self.rng.choice(policy).process.pid) if policy else False
        if kind == "rollout worker with a slot in flight":
            # The queue does not say whose slot it carries, so every rollout worker goes: the sender
            # among them (each kill counts, and each restart is expected)
            learner = next(c for c in workers.children if c.kind == "learner")
            self.hold_learner(learner.process.pid)
            if not self.wait_for(lambda: shared.learner_queues[0].qsize() > 0, seconds=10.0):
                return 0  # no slot finished meanwhile (the learner may hold the queue's lock): next time
            return sum(self.sigkill(child.process.pid, child.worker_id) for child in rollout)
        if kind == "game process":
            games = [(child.process.pid, game) for child in rollout for game in game_processes(child.process.pid)]
            if not games:
                return False
            worker_pid, pid = self.rng.choice(games)
            starting = game_is_starting(worker_pid, pid)
            killed = self.sigkill(pid)
            self.games_killed_starting += killed and starting
            return killed
        candidates = rollout if kind == "rollout worker" else policy
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        return self.sigkill(victim.process.pid, victim.worker_id if kind == "rollout worker" else None)

    def hold_learner(self, pid: int):
        """SIGSTOPs the learner until the next round; a timer lets it go anyway, should no round come."""
        os.kill(pid, signal.SIGSTOP)
        self.held_pid = pid
        self.learner_held.append([time.monotonic(), None])
        self.release_timer = threading.Timer(5.0, send_signal, (pid, signal.SIGCONT))
        self.release_timer.start()

    def release_learner(self, now: float):
        if self.held_pid is not None:
            self.release_timer.cancel()
            send_signal(self.held_pid, signal.SIGCONT)
            self.held_pid, self.learner_held[-1][1] = None, now

    def wait_for(self, condition, seconds: float = 2.0) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.0005)  # a busy loop would take a core from the processes it waits on
        return False

    def sigkill(self, pid: int, rollout_worker: int | None = None) -> bool:
        if not send_signal(pid, signal.SIGKILL):
            return False
        if rollout_worker is not None and not self.is_down(rollout_worker):  # dead, then starting
            self.down[rollout_worker].append([time.monotonic(), None])
        return True


def slots_lost(cfg, shared) -> tuple[int, int]:
    """After the run: (slots neither free nor reclaimable, slots still with a learner)."""
    control = shared.slots.control
    with_learner = sum(control.owner(slot) >= cfg.num_workers for slot in range(control.num_slots))
    for worker in range(cfg.num_workers):  # every process has stopped: what they held is free again
        control.reclaim(worker)
    return control.num_slots - control.free_count, with_learner


CHECKS = {True: "hold", False: "FAILED", None: "in its log (files of 2717bfc)"}


def table_of(paths: list[str]) -> str:
    """One row per --json file: what docs/faults.md and docs/bench/chaos/ quote."""
    lines = ["| file | commit | env | min | kills | games killed starting | restarts (unexpected) | longest start-up s "
             "| longest split silence s (outside start-ups and holds) | longest learner pause s (outside) "
             "| learner held s | slots lost | recovered | exit | every check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        f = json.loads(Path(path).read_text())
        lines.append(f"| {Path(path).name} | {f['commit']}{'+' if f['uncommitted'] else ''} | {f['env']} | {f['minutes']} "
                     f"| {f['kills']} | {f['games_killed_starting']} | {f['restarts']} ({f['unexpected_restarts']}) "
                     f"| {f['longest_start_up_s']} | {f['longest_split_silence_s']} ({f['longest_unexplained_split_silence_s']}) "
                     f"| {f['longest_learner_pause_s']} ({f['longest_unexplained_learner_pause_s']}) | {f['learner_held_s']} "
                     f"| {f['slots_lost']} of {f['num_slots']} | {'yes' if f['ended_on_kills'] else 'no'} | {f['exit_code']} "
                     f"| {CHECKS.get(f.get('every_check_holds'))} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="length of the run (with --least_kills, the most it may last)")
    parser.add_argument("--least_kills", type=int, default=0,
                        help="stop killing after this many kills, every kind among them, and end the run "
                             "--quiet_end_s after the learner trained again (0: run --minutes); what a loaded "
                             "machine slows down then takes longer instead of being attacked less")
    parser.add_argument("--kill_every", type=float, default=5.0, help="mean seconds between kills")
    parser.add_argument("--stall_s", type=float, default=30.0,
                        help="a split or the learner standing still this long, outside the start-ups of "
                             "restarted rollout workers and the killer's holds of the learner, is a stall")
    parser.add_argument("--start_up_s", type=float, default=180.0,
                        help="the longest a rollout worker may take from its death to its successor's first "
                             "step (three times the supervisor's 60 s start-up allowance: a loaded machine, "
                             "and a restart whose starting game is killed again)")
    parser.add_argument("--warmup_s", type=float, default=15.0, help="no kill before this (processes start)")
    parser.add_argument("--quiet_end_s", type=float, default=20.0, help="no kill in the run's last seconds")
    parser.add_argument("--seed", type=int, default=0, help="the killer's random choices")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="asynchronous",
                        help="asynchronous: doom_basic; synchronous: atari_breakout, its family's synchronous default")
    parser.add_argument("--table", nargs="+", metavar="JSON", default=None,
                        help="print the Markdown table of these runs' --json files instead of running")
    args = parser.parse_args()
    if args.table:
        print(table_of(args.table))
        return 0

    train_dir = tempfile.mkdtemp(prefix="appo_chaos_")
    cfg = appo.parse_args([*CONFIGS[args.config], "--num_workers", "2", "--num_envs_per_worker", "4",
                           "--worker_num_splits", "2", "--policy_workers_per_policy", "2",
                           "--train_for_seconds", str(args.minutes * 60), "--max_restarts", "1000000",
                           "--report_every_sec", "30", "--train_dir", train_dir, "--experiment", "chaos"])
    errors = appo.flag_errors(cfg)
    if errors:
        appo.print_errors(errors)
        return 2
    shm_before = appo_ipc.shm_entries()
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # the code this run loads
    uncommitted = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "appo.py", "env.py", "csrc",
                                  "bench/chaos.py"], capture_output=True, text=True).stdout.split("\n")
    uncommitted = [line[3:] for line in uncommitted if line.strip()]  # files that differ from the commit
    killer = Killer(args, cfg)
    started = time.monotonic()
    exit_code = appo.train(cfg, watch=killer).exit_code
    minutes = (time.monotonic() - started) / 60
    lost, with_learner = slots_lost(cfg, killer.shared)
    time.sleep(2.0)  # exiting processes leave the process table
    left = [pid for pid in children_of(os.getpid()) if not is_resource_tracker(pid)]
    new_shm = appo_ipc.shm_left_since(shm_before, own_pids={os.getpid()})  # not another run's, held by it
    restarts = killer.workers.num_restarts
    worker_kills = sum(count for kind, count in killer.kills.items() if kind != "game process")
    expected_restarts = worker_kills + killer.games_killed_starting
    now = time.monotonic()
    start_ups = killer.start_ups + [now - intervals[-1][0] for intervals in killer.down.values()
                                    if intervals and intervals[-1][1] is None]  # still down at the end
    figures = {
        "commit": commit, "uncommitted": uncommitted, "config": args.config, "env": cfg.env, "async_rl": cfg.async_rl,
        "highest_policy_lag": killer.highest_lag,
        "minutes": round(minutes, 2), "kills": sum(killer.kills.values()), "kills_by_kind": dict(killer.kills),
        "games_killed_starting": killer.games_killed_starting,
        "restarts": restarts, "unexpected_restarts": max(0, restarts - expected_restarts),
        "stalled_splits": len(killer.stalled_splits), "longest_split_silence_s": round(killer.longest_split_silence, 1),
        "longest_unexplained_split_silence_s": round(killer.longest_unexplained_split_silence, 1),
        "start_ups": len(start_ups), "longest_start_up_s": round(max(start_ups, default=0.0), 1),
        "learner_frames": int(killer.shared.run.learner_frames.min()),
        "longest_learner_pause_s": round(killer.longest_learner_pause, 1),
        "longest_unexplained_learner_pause_s": round(killer.longest_unexplained_learner_pause, 1),
        "learner_held_s": round(sum(b - a for a, b in killer.learner_held if b is not None), 1),
        "lowest_split_counter": killer.lowest_counter, "slots_lost": lost, "slots_left_with_learner": with_learner,
        "num_slots": killer.shared.slots.control.num_slots, "exit_code": exit_code,
        "processes_left": len(left), "shm_entries_left": len(new_shm),
        "ended_on_kills": killer.enough_kills_at is not None,  # --least_kills reached before --minutes
    }
    ok = (figures["stalled_splits"] == 0 and figures["longest_unexplained_learner_pause_s"] <= args.stall_s
          and figures["longest_start_up_s"] <= args.start_up_s
          and (not args.least_kills or figures["ended_on_kills"])
          and figures["lowest_split_counter"] >= IDLE and lost == 0 and with_learner == 0
          and figures["unexpected_restarts"] == 0 and exit_code == 0 and not left and not new_shm
          and (cfg.async_rl or killer.highest_lag == 0))
    figures["every_check_holds"] = ok
    by_kind = ", ".join(f"{kind} {count}" for kind, count in killer.kills.items())
    collection = "asynchronous" if cfg.async_rl else "synchronous"
    print(f"\nchaos run: {cfg.env} ({collection}), 2 rollout workers x 2 splits, 2 policy workers, {minutes:.1f} min, "
          f"commit {figures['commit']}")
    print(f"  kills survived       {figures['kills']} ({by_kind})")
    print(f"  restarts             {restarts} (unexpected: {figures['unexpected_restarts']}; game processes killed "
          f"while starting, each allowed its worker's: {killer.games_killed_starting})")
    print(f"  start-ups            {figures['start_ups']} of rollout workers, longest {figures['longest_start_up_s']} s "
          f"from death to first step (at most {args.start_up_s:g} s)")
    print(f"  stalled splits       {figures['stalled_splits']} (longest silence of a split "
          f"{figures['longest_split_silence_s']} s, {figures['longest_unexplained_split_silence_s']} s of it "
          f"outside start-ups and holds; a stall is {args.stall_s:g} s of that)")
    print(f"  learner              {figures['learner_frames']:,} frames trained, longest pause "
          f"{figures['longest_learner_pause_s']} s ({figures['longest_unexplained_learner_pause_s']} s outside "
          f"start-ups and holds; held {figures['learner_held_s']} s in all)")
    if args.least_kills:
        print(f"  recovered            {'yes' if figures['ended_on_kills'] else 'NO'} (the learner trained and every "
              f"split stepped after the last kill, before --minutes)")
    print(f"  split counters       lowest {figures['lowest_split_counter']} (idle is -1)")
    print(f"  policy lag           highest {killer.highest_lag:g}" + ("" if cfg.async_rl else " (synchronous: must stay 0)"))
    print(f"  slots lost           {lost} of {figures['num_slots']} ({with_learner} left with the learner)")
    print(f"  exit                 code {exit_code}, processes left {len(left)}, /dev/shm entries left {len(new_shm)}")
    print("  result               " + ("every check holds" if ok else "FAILED"))
    if ok:
        shutil.rmtree(train_dir, ignore_errors=True)
    else:  # its engine logs say what each process saw before the check failed
        print(f"  run folder kept      {train_dir}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

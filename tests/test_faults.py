"""Fault injection on real training runs (real VizDoom, real processes, real signals): every fault
the trainer must survive, and what it must leave behind (nothing) when it stops.

The conftest fixture checks /dev/shm and our child processes after each test; these tests also
check that no process of the run (tagged through its environment) outlives it.
"""
import glob
import os
import queue
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import types
import uuid

import pytest
import torch

import appo
from conftest import fake_batch, processes_tagged

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
# Each test ends its run itself once the events it checks have happened (or the run ends on its own
# fault): the seconds below only bound a run, and a loaded machine needs many more of them. Two
# tests at a time beside a doom_basic training (2026-12-03, docs/bench/suite/) these runs had trained
# 0-1,024 frames after 34-62 s, and healthy workers went 4-5 s between heartbeats.
UNTIL_STOPPED_S = "600"
EVENT_TIMEOUT_S = 300.0  # how long a test waits for one event of its run: a hang guard, as RUN_TIMEOUT_S
SMALL_RUN = ["--num_workers", "2", "--num_envs_per_worker", "2", "--rollout", "16", "--batch_size", "64",
             "--hidden_size", "64", "--report_every_sec", "1", "--seed", "1", "--env_frameskip", "4"]


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class Run:
    """A training run in a subprocess whose output is read as it comes."""

    def __init__(self, tmp_path, flags, faults: str = "", env: str = "doom_basic", own_group: bool = False):
        self.tag = uuid.uuid4().hex
        self.tmp_path = tmp_path
        script = os.path.join(TESTS, "run_with_faults.py") if faults else os.path.join(REPO, "appo.py")
        command = [sys.executable, script, "--env", env, *SMALL_RUN, "--train_dir", str(tmp_path),
                   "--experiment", "faults", *flags]
        environment = dict(os.environ, APPO_TEST_TAG=self.tag, APPO_FAULTS=faults)
        # own_group: the run leads a process group of its own, as under timeout or a Slurm job step,
        # so that a test can signal the whole group
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=environment, cwd=tmp_path, process_group=0 if own_group else None)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def output(self) -> str:
        with self.changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = EVENT_TIMEOUT_S, after: int = 0) -> tuple[int, re.Match]:
        """The first output line from line `after` on that matches `pattern`: (its index, the match)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for index in range(after, len(self.lines)):
                    match = re.search(pattern, self.lines[index])
                    if match:
                        return index, match
                if self.process.poll() is not None and not self.reader.is_alive():
                    raise AssertionError(f"run ended before {pattern!r}:\n{self.output_tail()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no {pattern!r} within {timeout:.0f}s:\n{self.output_tail()}")
                self.changed.wait(timeout=1.0)

    def wait_for_training(self, after: int = 0, beyond: int = 0) -> int:
        """Waits for a status line that reports more than `beyond` trained frames; returns its index."""
        index = after
        while True:
            index, match = self.wait_for(r"trained ([\d,]+)", after=index)
            if int(match.group(1).replace(",", "")) > beyond:
                return index
            index += 1

    def output_tail(self) -> str:
        return "\n".join(self.lines[-40:])

    def children(self, role: str) -> list[int]:
        return [pid for pid in processes_tagged(self.tag) if process_name(pid) == f"appo-{role}"]

    def finish(self, timeout: float = EVENT_TIMEOUT_S) -> int:
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code

    def assert_nothing_left(self, timeout: float = 15.0):
        deadline = time.monotonic() + timeout
        while processes_tagged(self.tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_tagged(self.tag) == [], self.output_tail()

    def checkpoints(self) -> list[dict]:
        """Every checkpoint on disk, oldest first (a live run may delete one while we list them)."""
        loaded = []
        for path in sorted(glob.glob(str(self.tmp_path / "faults" / "checkpoint_p0" / "checkpoint_*.pth"))):
            try:
                loaded.append(torch.load(path, weights_only=True))
            except FileNotFoundError:
                pass
        return loaded

    def wait_for_checkpoint(self, timeout: float = EVENT_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while not self.checkpoints():
            assert time.monotonic() < deadline, f"no checkpoint within {timeout:.0f}s:\n{self.output_tail()}"
            time.sleep(0.2)


# Both ways of collecting: the default asynchronous one, and synchronous collection (the Atari and
# gym: families' default: splits park until the weights trained on their batch arrive)
COLLECTION = pytest.mark.parametrize("collection", [[], ["--no-async_rl"]], ids=["asynchronous", "synchronous"])


def trained_frames(line: str) -> int:
    return int(re.search(r"trained ([\d,]+)", line).group(1).replace(",", ""))


@pytest.mark.slow
@COLLECTION
def test_an_env_that_raises_or_whose_game_process_dies_is_recreated(tmp_path, collection):
    # envs 0 and 1 live in rollout worker 0, env 2 in rollout worker 1; env 1's reset at the start fails
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, *collection],
              faults="raise:0:20,crash:2:20,resetraise:1:1", env="doom_faulty")
    try:
        index, _ = run.wait_for(r"faults: env 3 ")  # all three faults
        before = trained_frames(run.lines[run.wait_for(r"trained", after=index)[0]])
        run.wait_for_training(after=index, beyond=before)  # and training goes on
        run.process.send_signal(signal.SIGTERM)
        assert run.finish() == 0, run.output_tail()
    finally:
        run.process.kill()
    output = run.output
    assert "env 0 failed (RuntimeError: injected env fault); recreating it" in output
    assert "rollout worker 0: env 1 failed (RuntimeError: injected reset fault); recreating it" in output
    assert re.search(r"rollout worker 1: env 0 failed \(\w+", output)  # the dead game, as VizDoom reports it
    assert "restarting" not in output  # no worker had to go
    run.assert_nothing_left()


def test_a_worker_still_starting_gets_the_start_up_allowance_and_then_the_env_step_timeout(capsys, processes):
    """A child is silent until its first heartbeat (building its model, making its envs): on a loaded machine
    that can outlast a short --env_step_timeout, so until then Supervisor.START_UP_S applies. A real
    process that never beats stands in for a starting worker, then one that beat once and hung."""
    cfg = appo.parse_args(["--env_step_timeout", "0.5"])
    run = appo.RunState(num_workers=1, num_policies=1, num_processes=1)
    child = appo.Child("rollout worker 0", "rollout worker", 0, time.sleep, (60,), worker_id=0)
    supervisor = appo.Supervisor(cfg, types.SimpleNamespace(run=run), [child], processes)
    restarted = []
    supervisor.restart = lambda stopped: restarted.append(stopped.name) or True
    try:
        supervisor.start_all()
        time.sleep(1.0)
        assert supervisor.check() is None and restarted == []  # silent for twice the timeout, but starting
        run.beat(0)  # its first heartbeat: from here on, the env step timeout
        time.sleep(1.0)
        assert supervisor.check() is None and restarted == ["rollout worker 0"]
        # "for 1 s", or more where the sleep overran on a loaded machine
        assert re.search(r"rollout worker 0 sent no heartbeat for \d+ s \(--env_step_timeout 0\.5\); restarting it",
                         capsys.readouterr().out)
    finally:
        child.process.kill()
        child.process.join()


@pytest.mark.slow
def test_a_hung_env_gets_its_worker_killed_and_restarted(tmp_path):
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, "--env_step_timeout", "10"], faults="hang:0:20",
              env="doom_faulty")
    try:
        index, _ = run.wait_for(r"rollout worker 0 sent no heartbeat for \d+ s .*restarting it")
        run.wait_for_training(after=index, beyond=trained_frames(run.lines[run.wait_for("trained", after=index)[0]]))
        run.process.send_signal(signal.SIGINT)  # Ctrl-C: the same clean stop as SIGTERM
        assert run.finish() == 0, run.output_tail()
    finally:
        run.process.kill()
    run.assert_nothing_left()


@pytest.mark.slow
@COLLECTION
def test_killed_workers_are_restarted_and_sigterm_then_stops_everything_cleanly(tmp_path, collection):
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, *collection])
    try:
        run.wait_for_training()
        os.kill(run.children("rollout")[0], signal.SIGKILL)
        os.kill(run.children("policy")[0], signal.SIGKILL)
        index, _ = run.wait_for(r"policy worker \d+ \(policy 0\) died \(exit code -9\); restarting it")
        rollout_index, _ = run.wait_for(r"rollout worker \d died \(exit code -9\); restarting it")
        index = max(index, rollout_index)
        resumed_at = trained_frames(run.lines[run.wait_for("trained", after=index)[0]])
        index = run.wait_for_training(after=index, beyond=resumed_at)
        stop_sent = time.monotonic()
        run.process.send_signal(signal.SIGTERM)
        assert run.finish(timeout=30) == 0, run.output_tail()
        # every child gone, the runner too: shutdown() gives the children 8 s and a learner 30 s to finish
        # the batch in hand, and this small model's batch takes well under a second: well under 30 s
        # even on a loaded machine (10.1 s once, two tests at a time), unless a learner was waited out
        assert time.monotonic() - stop_sent < 20
    finally:
        run.process.kill()
    assert "stop requested: saving and shutting down" in run.output
    assert run.checkpoints()[-1]["env_frames"] >= trained_frames(run.lines[index])  # the final one
    run.assert_nothing_left(timeout=1.0)


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_saves_a_final_checkpoint(tmp_path):
    """timeout, `kill -- -PGID` and Slurm signal every process of the group: the fork server and the
    learner with the runner. They leave the stop to the runner, and the learner saves; before, it died
    of the signal and the run ended with `checkpoint none`. No periodic checkpoint falls inside the
    run (--save_every_sec 600), so the one on disk is the final save."""
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, "--save_every_sec", "600"], own_group=True)
    try:
        index = run.wait_for_training()
        os.killpg(run.process.pid, signal.SIGTERM)
        assert run.finish(timeout=60) == 0, run.output_tail()
    finally:
        run.process.kill()
    assert "stop requested: saving and shutting down" in run.output
    checkpoints = run.checkpoints()
    assert checkpoints and checkpoints[-1]["env_frames"] >= trained_frames(run.lines[index])
    assert re.search(r"; checkpoint \S+checkpoint_p0/checkpoint_\d+_\d+\.pth$", run.output, re.M), run.output_tail()
    assert "warning" not in run.output and "checkpoint none" not in run.output
    run.assert_nothing_left()


@pytest.mark.slow
def test_a_run_under_timeout_s_term_ends_with_a_checkpoint(tmp_path):
    """The forker's case, as typed: `timeout -s TERM 25 python appo.py --env gym:CartPole-v1 ...`
    (timeout signals its whole process group) kept nothing before; it must end with a checkpoint."""
    tag = uuid.uuid4().hex
    command = ["timeout", "-s", "TERM", "25", sys.executable, os.path.join(REPO, "appo.py"), "--env", "gym:CartPole-v1",
               "--train_for_env_steps", "100000000", "--num_workers", "1", "--save_every_sec", "600",
               "--train_dir", str(tmp_path), "--experiment", "faults"]
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=EVENT_TIMEOUT_S, cwd=tmp_path,
                          env=dict(os.environ, APPO_TEST_TAG=tag))
    assert done.returncode == 124, done.stdout[-3000:] + done.stderr[-3000:]  # timeout's own: the time ran out
    assert "stop requested: saving and shutting down" in done.stdout
    saved = glob.glob(str(tmp_path / "faults" / "checkpoint_p0" / "checkpoint_*.pth"))
    assert saved and os.path.getmtime(max(saved)) > started + 5, done.stdout[-3000:]  # written at the stop
    assert "checkpoint none" not in done.stdout and "watch it play" in done.stdout
    deadline = time.monotonic() + 15
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_tagged(tag) == []


@pytest.mark.slow
def test_too_many_restarts_stop_the_run_with_a_message_and_a_checkpoint(tmp_path):
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, "--max_restarts", "0"])
    try:
        run.wait_for_training()
        os.kill(run.children("rollout")[0], signal.SIGKILL)
        assert run.finish(timeout=30) == 1, run.output_tail()
    finally:
        run.process.kill()
    assert re.search(r"error: rollout worker \d died \(exit code -9\): more than --max_restarts 0 restarts", run.output)
    assert run.checkpoints()  # the final one, written on the way out
    run.assert_nothing_left()


@pytest.mark.slow
def test_the_learner_dying_stops_the_run_with_its_checkpoint_intact(tmp_path):
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, "--save_every_sec", "1"])
    try:
        run.wait_for_training()
        run.wait_for_checkpoint()
        os.kill(run.children("learner")[0], signal.SIGKILL)
        assert run.finish(timeout=30) == 1, run.output_tail()
    finally:
        run.process.kill()
    assert re.search(r"error: learner 0 died \(exit code -9\); its last checkpoint is in .*; stopping", run.output)
    assert run.checkpoints()[-1]["policy_version"] > 0  # still loads
    run.assert_nothing_left()


LEARNER_SILENCE_PATCHED_S = 20.0  # run_with_faults' learnersilence:20 in the two tests below
WARNED = (r"warning: learner 0 \(pid \d+\) has sent no heartbeat for (\d+) s, inside one step; "
          r"the run stops if it stays silent for (\d+) s\.")
STOPPED = r"error: learner 0 sent no heartbeat for (\d+) s \(hung\)"
SILENT = r"\| silent learner 0 (\d+) s"


def learner_allowance(flags: list[str]) -> float:
    """A learner's allowance in these runs by docs/faults.md's rule: its silence allowance (here
    patched to 20 s) or --env_step_timeout if longer, which SMALL_RUN leaves at its default (60 s)."""
    cfg = appo.parse_args(["--env", "doom_basic", *SMALL_RUN, *flags])
    return max(cfg.env_step_timeout, LEARNER_SILENCE_PATCHED_S)


def assert_warned_at_half_and_stopped_at_the_allowance(lines: list[str], allowance: float, silences: int):
    """Timed by the run's own clock, as it logs the learner's silence at each event (no clock of the
    test's): every warning names the allowance and comes once the silence is at least half of it,
    one a silence; every 'silent' status part comes after a warning and is at least half; the stop
    comes after the last warning, once the silence is the whole allowance."""
    def found(pattern):
        return [(index, [int(group) for group in match.groups()])
                for index, line in enumerate(lines) if (match := re.search(pattern, line))]
    warnings, stops, silent = found(WARNED), found(STOPPED), found(SILENT)
    assert len(warnings) >= silences and len(stops) == 1, (warnings, stops)
    for _, (after_s, stops_at_s) in warnings:
        assert stops_at_s == allowance and after_s >= allowance / 2, (after_s, stops_at_s, allowance)
    assert silent and all(index > warnings[0][0] and seconds >= allowance / 2 for index, (seconds,) in silent), silent
    (stop_index, (stopped_after_s,)), (last_warning, (warned_after_s, _)) = stops[0], warnings[-1]
    assert last_warning < stop_index and stopped_after_s >= allowance and stopped_after_s >= warned_after_s


@pytest.mark.slow
def test_a_stopped_learner_is_reported_recovers_and_stops_the_run_when_it_stays_silent(tmp_path):
    """A learner that stops (SIGSTOP) is a warning and a 'silent' part on the status line at half its
    allowance (here 60 s: the silence allowance is patched to 20 s, in a run 300 s, but
    --env_step_timeout's default 60 is longer). It is not asked for its stack: a SIGUSR1 pending at SIGCONT
    ran faulthandler's all-threads dump as every thread resumed, and the learner once died of it
    (SIGSEGV). Continued, it trains again and the status line drops it; stopped again for the whole
    allowance, the run ends with a line that names it and its checkpoint, and leaves nothing behind."""
    flags = ["--train_for_seconds", UNTIL_STOPPED_S, "--save_every_sec", "1"]
    allowance = learner_allowance(flags)
    assert allowance == 60.0
    run = Run(tmp_path, flags, faults="learnersilence:20")
    try:
        run.wait_for_training()
        run.wait_for_checkpoint()
        learner = run.children("learner")[0]
        os.kill(learner, signal.SIGSTOP)
        warned, _ = run.wait_for(r"warning: learner 0 \(pid \d+\) has sent no heartbeat for \d+ s, inside one step")
        assert "Its Python stack: none: it is stopped (SIGSTOP or a debugger" in run.lines[warned]
        silent, _ = run.wait_for(r"\| silent learner 0 \d+ s", after=warned)
        os.kill(learner, signal.SIGCONT)
        trained_again = run.wait_for_training(after=silent + 1, beyond=trained_frames(run.lines[silent]))
        run.wait_for(r"^\[.*trained(?!.*silent)", after=trained_again)
        assert (tmp_path / "faults" / "stacks" / "process_0.txt").read_text() == ""  # never signalled
        os.kill(learner, signal.SIGSTOP)
        assert run.finish(timeout=EVENT_TIMEOUT_S) == 1, run.output_tail()
    finally:
        run.process.kill()
    assert re.search(r"error: learner 0 sent no heartbeat for \d+ s \(hung\); its last checkpoint is in .*; "
                     r"its Python stack: none: it is stopped", run.output)
    assert_warned_at_half_and_stopped_at_the_allowance(run.lines, allowance, silences=2)  # stopped twice
    assert run.checkpoints()[-1]["policy_version"] > 0
    run.assert_nothing_left()


@pytest.mark.slow
def test_a_learner_hung_in_python_is_reported_with_its_stack_and_stops_the_run(tmp_path):
    """A learner stuck in Python (a forker's loss in an endless loop: here after its 2nd checkpoint)
    gives its stack, every thread's, at the warning and at the end, where the function it hangs in
    shows; the file in the experiment's folder keeps both."""
    flags = ["--train_for_seconds", UNTIL_STOPPED_S, "--save_every_sec", "1"]
    run = Run(tmp_path, flags, faults="learnersilence:20,learnerhang:2")
    try:
        warned, _ = run.wait_for(r"warning: learner 0 \(pid \d+\) has sent no heartbeat for \d+ s, inside one step")
        assert "Its Python stack: (also in " in run.lines[warned]
        assert run.finish(timeout=EVENT_TIMEOUT_S) == 1, run.output_tail()
    finally:
        run.process.kill()
    warning, end = run.output.split("error: learner 0 sent no heartbeat")
    for part in (warning, end):
        assert "in hang_in_a_step" in part and "in batcher" in part, run.output_tail()  # every thread's
    stacks = (tmp_path / "faults" / "stacks" / "process_0.txt").read_text()
    assert stacks.count("in hang_in_a_step") >= 2
    assert_warned_at_half_and_stopped_at_the_allowance(run.lines, learner_allowance(flags), silences=1)
    assert len(run.checkpoints()) >= 1
    run.assert_nothing_left()


@pytest.mark.slow
def test_sigkill_of_the_runner_ends_every_child_and_the_next_run_resumes(tmp_path):
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, "--save_every_sec", "1"])
    try:
        run.wait_for_training()
        run.wait_for_checkpoint()
        run.process.kill()
        run.finish()
    finally:
        run.process.kill()
    run.assert_nothing_left()  # the rollout workers closed their games; the fixture checks /dev/shm
    saved_version = run.checkpoints()[-1]["policy_version"]

    second = Run(tmp_path, ["--train_for_seconds", "8"])
    assert second.finish() == 0, second.output_tail()
    assert f"resumed from policy version {saved_version}" in second.output
    second.assert_nothing_left()


@pytest.mark.slow
def test_nonfinite_losses_are_skipped_then_stop_the_run_with_a_reason(tmp_path):
    nan_everywhere = ",".join(f"nan:{env_index}:1" for env_index in range(4))
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S], faults=nan_everywhere, env="doom_faulty")
    try:
        assert run.finish() == 1, run.output_tail()
    finally:
        run.process.kill()
    output = run.output
    assert f"{appo.MAX_NONFINITE_STEPS} steps in a row had a non-finite loss" in output
    assert "NaN or Inf in the env's rewards" in output
    assert "learner 0 died (exit code 3)" in output, run.output_tail()
    run.assert_nothing_left()


def sleep_before_setting_up(seconds: float):
    time.sleep(seconds)  # a rollout worker that has not reached child_process_setup (no group of its own yet)


def test_stopping_a_rollout_worker_that_has_no_process_group_yet_still_ends_it(processes):
    """ipc-review row 15: killing the worker's group killed nothing before it had called setpgid,
    and its slots were then reclaimed while it lived."""
    child = appo.Child("rollout worker 0", "rollout worker", 0, sleep_before_setting_up, (60.0,), worker_id=0)
    child.process = processes.Process(target=child.target, args=child.args, daemon=True)
    child.process.start()
    assert os.getpgid(child.process.pid) == os.getpgid(0)  # in our group, not in one of its own
    started = time.monotonic()
    ended = appo.stop_child(child)
    assert not child.process.is_alive() and child.process.exitcode == -signal.SIGKILL
    assert ended and time.monotonic() - started < 5.0


def save_with_a_tiny_file_size_limit(train_dir: str, results):
    """In its own process: the kernel refuses writes past 64 KiB, as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
    cfg = appo.parse_args(["--train_dir", train_dir, "--experiment", "full"])
    try:
        appo.save_checkpoint(cfg, 0, {"policy_version": 2, "env_frames": 20, "model": {"w": torch.zeros(1 << 16)}})
        results.put("saved")
    except OSError as error:
        results.put(f"OSError {error.errno}")


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, processes):
    cfg = appo.parse_args(["--train_dir", str(tmp_path), "--experiment", "full"])
    first = appo.save_checkpoint(cfg, 0, {"policy_version": 1, "env_frames": 10, "model": {"w": torch.ones(4)}})
    results = processes.Queue()
    child = processes.Process(target=save_with_a_tiny_file_size_limit, args=(str(tmp_path), results))
    child.start()
    outcome = results.get(timeout=60)
    child.join()
    assert outcome.startswith("OSError"), outcome
    assert os.listdir(os.path.dirname(first)) == [os.path.basename(first)]  # no partial file left
    assert torch.equal(appo.load_latest_checkpoint(cfg, 0)["model"]["w"], torch.ones(4))


@pytest.mark.slow
def test_a_full_disk_during_training_is_reported_and_training_goes_on(tmp_path):
    """The fault table's row in a live run: after the first checkpoint the learner's disk is full."""
    run = Run(tmp_path, ["--train_for_seconds", UNTIL_STOPPED_S, "--save_every_sec", "2"], faults="diskfull:1",
              env="doom_faulty")
    try:
        index, _ = run.wait_for(r"error: could not save checkpoint of policy 0: .*(File too large|could not write)")
        full_at = trained_frames(run.lines[run.wait_for("trained", after=index)[0]])
        run.wait_for_training(after=index, beyond=full_at)  # training goes on
        run.wait_for(r"error: could not save checkpoint", after=index + 1)  # and every save fails alike
        run.process.send_signal(signal.SIGINT)
        assert run.finish(timeout=60) == 0, run.output_tail()
    finally:
        run.process.kill()
    folder = tmp_path / "faults" / "checkpoint_p0"
    assert [path.name for path in folder.iterdir() if not path.name.endswith(".pth")] == []  # no partial file
    saved = run.checkpoints()
    assert len(saved) == 1 and saved[0]["env_frames"] < full_at  # the one from before the disk filled, intact
    run.assert_nothing_left()


def test_unreadable_checkpoints_stop_the_run_before_it_starts(tmp_path, capsys):
    cfg = appo.parse_args(["--train_dir", str(tmp_path), "--experiment", "bad"])
    folder = appo.checkpoint_dir(cfg, 0)
    os.makedirs(folder)
    for name in ["checkpoint_000000001_10.pth", "checkpoint_000000002_20.pth"]:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"not a checkpoint")
    assert appo.main(["--train_dir", str(tmp_path), "--experiment", "bad", "--num_workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "none of the 2 checkpoints" in err and "--experiment" in err


def test_a_newest_truncated_checkpoint_falls_back_to_the_one_before(tmp_path, capsys):
    cfg = appo.parse_args(["--train_dir", str(tmp_path), "--experiment", "trunc"])
    appo.save_checkpoint(cfg, 0, {"policy_version": 1, "env_frames": 10, "model": {}})
    newest = appo.save_checkpoint(cfg, 0, {"policy_version": 2, "env_frames": 20, "model": {}})
    with open(newest, "r+b") as f:
        f.truncate(os.path.getsize(newest) // 2)
    assert appo.load_latest_checkpoint(cfg, 0)["policy_version"] == 1
    assert "skipping unreadable checkpoint" in capsys.readouterr().out


def test_a_checkpoint_of_another_model_is_refused_naming_the_keys(tmp_path, capsys):
    flags = ["--train_dir", str(tmp_path), "--experiment", "other", "--num_workers", "1", "--rnn_type", "gru"]
    cfg = appo.parse_args(flags)
    spaces_pair = appo.probe_env(cfg).spaces
    model = appo.ActorCritic(*spaces_pair, appo.parse_args(flags[:-1] + ["lstm"]))
    appo.save_checkpoint(cfg, 0, {"policy_version": 1, "env_frames": 10, "model": model.state_dict()})
    assert appo.main(flags) == 2
    err = capsys.readouterr().err
    assert "was made by a different model" in err and "core.weight_hh" in err


def test_resuming_with_flags_that_change_the_model_is_refused(tmp_path, capsys):
    flags = ["--train_dir", str(tmp_path), "--experiment", "resume", "--num_workers", "1"]
    appo.save_config(appo.parse_args(flags + ["--hidden_size", "64"]))
    assert appo.main(flags + ["--hidden_size", "128"]) == 2
    err = capsys.readouterr().err
    assert "--hidden_size 128 conflicts with 64 saved in" in err and "use another --experiment" in err


def learner_given_one_slow_batch(cfg, shared, spaces_pair, training):
    """A real Learner in its own loop (Learner.run: the stop flag, the batch in hand, the final
    checkpoint), whose batcher is replaced by one batch of seconds of SGD (many epochs); `training`
    is set when it starts on it."""
    appo.child_process_setup("learner", cfg.learner_threads)  # as learner_main
    learner = appo.Learner(0, cfg, shared, spaces_pair)
    batches = [fake_batch(*spaces_pair, cfg, cfg.rollout, appo.trajectories_per_batch(cfg))]

    def next_batch(timeout):
        if not batches:
            time.sleep(timeout)
            raise queue.Empty
        training.set()
        return batches.pop()

    learner.next_batch = next_batch
    learner.run(process_index=0)


def test_shutdown_waits_longer_for_a_learner_finishing_its_batch_than_for_other_children(tmp_path, processes):
    """A learner stops after the batch in hand, then writes the final checkpoint: killed at the
    other children's grace, a slow batch lost the weights trained since the last checkpoint. Here a
    real learner is stopped seconds into a batch (its version still 0 once the stop is set): it
    finishes the batch, saves it, and exits 0 while a hung child beside it is killed at its short
    grace."""
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--num_workers", "1", "--train_dir", str(tmp_path),
                           "--num_epochs", "40", "--save_every_sec", "100000"])  # a batch of 160 SGD steps
    probe = appo.probe_env(cfg)
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    training = processes.Event()
    learner = appo.Child("learner 0", "learner", 0, learner_given_one_slow_batch,
                         (cfg, shared, probe.spaces, training))
    worker = appo.Child("policy worker 0", "policy worker", 1, time.sleep, (60.0,))  # a child that hangs
    for child in (learner, worker):
        child.process = processes.Process(target=child.target, args=child.args, daemon=True)
        child.process.start()
    try:
        assert training.wait(timeout=120)
        time.sleep(0.2)  # into the batch
        assert glob.glob(os.path.join(appo.checkpoint_dir(cfg, 0), "*")) == []  # nothing saved yet
        shared.run.stop[0] = 1  # as shutdown does first
        assert shared.run.learner_version[0] == 0  # the batch was not done at the stop
        appo.shutdown(shared, [worker, learner], grace_s=0.3, learner_grace_s=30.0)
    finally:
        for child in (learner, worker):
            child.process.kill()
            child.process.join(timeout=10)
    assert learner.process.exitcode == 0  # it finished
    assert worker.process.exitcode == -signal.SIGKILL
    saved = glob.glob(os.path.join(appo.checkpoint_dir(cfg, 0), "*"))
    assert len(saved) == 1, saved  # the final checkpoint, written after the stop
    checkpoint = torch.load(saved[0], map_location="cpu", weights_only=False)
    assert checkpoint["policy_version"] == 1  # the batch in hand at the stop, trained and saved


def stale_request_setup(tmp_path):
    """A policy worker, and two actors of rollout worker 0 in slots of their own at step 3, whose
    actions read -7 (no valid action: shows whether anything was written)."""
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--num_workers", "1", "--num_envs_per_worker", "2",
                           "--train_dir", str(tmp_path), "--seed", "1"])
    probe = appo.probe_env(cfg)
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    worker = appo.PolicyWorker(0, cfg, shared, probe.spaces)
    actors = [appo.Actor(env_id, 0, 0) for env_id in range(2)]
    for actor in actors:
        actor.slot, actor.step = shared.slots.control.acquire(owner=0), 3
        shared.slots.tensors["actions"][actor.slot, actor.step] = -7
    return cfg, shared, worker, actors


def test_a_policy_worker_drops_requests_that_went_stale_and_writes_nothing_for_them(tmp_path):
    """Review row 16: an answer to a request asked again since (or whose worker died and whose
    slot was taken by another) used to overwrite the action and the RNN state that the split's
    new answer had written, and completed the split a second time."""
    cfg, shared, worker, (actor, other) = stale_request_setup(tmp_path)
    control, actions = shared.slots.control, shared.slots.tensors["actions"]
    lost = control.set_pending(0, 0, 1)
    asked_again = control.set_pending(0, 0, 1)  # the runner restarted a policy worker: resent
    worker.act_on([appo.action_request(0, 0, lost, [actor])])
    assert int(actions[actor.slot, 3]) == -7 and control.pending(0, 0) == 1
    worker.act_on([appo.action_request(0, 0, asked_again, [actor])])
    assert int(actions[actor.slot, 3]) in (0, 1) and control.pending(0, 0) == 0
    # One message, two actors, and one's slot is no longer its worker's (here handed to the
    # learner): the other is answered, and counted once.
    actions[actor.slot, 3] = -7
    both = control.set_pending(0, 1, 2)
    assert control.transfer(other.slot, 0, control.generation(other.slot), appo.learner_owner(cfg, 0))
    worker.act_on([appo.action_request(0, 1, both, [actor, other])])
    assert int(actions[actor.slot, 3]) in (0, 1) and int(actions[other.slot, 3]) == -7
    assert control.pending(0, 1) == 1
    # The slot's worker died and the runner reclaimed it: a request from before is dropped too.
    current = control.set_pending(0, 1, 1)
    control.reclaim(0)
    actions[actor.slot, 3] = -7
    worker.act_on([appo.action_request(0, 1, current, [actor])])
    assert int(actions[actor.slot, 3]) == -7 and control.pending(0, 1) == 1


def test_a_request_that_goes_stale_during_the_forward_pass_writes_nothing_and_the_others_their_own_rows(
        tmp_path, monkeypatch):
    """The check again just before writing: here the other actor's split is asked again while the
    batch is in the forward pass (a resend). The standing actor gets the outputs of its own row
    of the batch, not its neighbour's."""
    cfg, shared, worker, (actor, other) = stale_request_setup(tmp_path)
    control, tensors = shared.slots.control, shared.slots.tensors
    tensors["obs"][other.slot, 3] = torch.tensor([2.0, -1.0, 0.5, 3.0])  # different inputs, different values
    tensors["rnn_state"][other.slot, 3] = 1.0
    first, second = control.set_pending(0, 0, 1), control.set_pending(0, 1, 1)
    computed = []

    def act_while_the_split_is_asked_again(*args):
        computed.append(real_act(*args))
        control.set_pending(0, 0, 1)  # `other`'s split (split 0) asked again
        return computed[-1]

    real_act = appo.act
    monkeypatch.setattr(appo, "act", act_while_the_split_is_asked_again)
    worker.act_on([appo.action_request(0, 0, first, [other]), appo.action_request(0, 1, second, [actor])])
    outputs, next_state = computed[0]
    actions, log_probs, values = outputs["actions"], outputs["log_prob"], outputs["value"]
    assert int(tensors["actions"][other.slot, 3]) == -7 and control.pending(0, 0) == 1
    assert values[0] != values[1]
    assert float(tensors["value"][actor.slot, 3]) == float(values[1])
    assert float(tensors["log_prob"][actor.slot, 3]) == float(log_probs[1])
    assert int(tensors["actions"][actor.slot, 3]) == int(actions[1, 0])
    assert torch.equal(tensors["rnn_state"][actor.slot, 4], next_state[1])
    assert control.pending(0, 1) == 0


def test_cuda_ipc_files_are_found_by_the_pid_in_their_names():
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    pid = int(gone.stdout)  # a process that has exited
    names = [f"cuda.shm.0.{pid:x}.1", f"torch_{pid}_123_0", f"cuda.shm.0.{pid + 1:x}.1", f"torch_{pid}1_5_0"]
    for name in names:
        open(os.path.join("/dev/shm", name), "w").close()
    try:
        assert sorted(appo.cuda_ipc_files([pid])) == sorted(f"/dev/shm/{name}" for name in names[:2])
        assert appo.cuda_ipc_files([pid], reference_counters=False) == [f"/dev/shm/{names[0]}"]
    finally:
        appo.remove_files([os.path.join("/dev/shm", name) for name in names])


def leave_a_game_running(results):
    """A rollout worker's process whose env was never closed (a close that failed or never ran)."""
    appo.child_process_setup("rollout", owns_envs=True)
    env = appo.envs.create_env("doom_basic", appo.parse_args(["--env", "doom_basic"]))
    env.reset()
    games = appo.process_group_members(os.getpid())
    files = appo.envs.shared_memory_of(games)
    appo.leave_nothing_behind(os.getppid(), appo.RunState(1, 1, 1))  # what a rollout worker does last
    results.put({"games": [pid for pid in games if pid != os.getpid()], "files": files,
                 "alive_after": [pid for pid in appo.process_group_members(os.getpid()) if pid != os.getpid()],
                 "files_after": [path for path in files if os.path.exists(path)]})


def test_a_rollout_worker_ends_the_env_processes_its_envs_left_running(processes):
    """The GPU check's first run (16 cores) found VizDoom processes alive 30 s after a SIGKILLed
    runner, though every rollout worker had exited: whatever its envs' close missed, the worker
    now kills (its process group, sparing itself), and it removes their shared memory."""
    results = processes.Queue()
    child = processes.Process(target=leave_a_game_running, args=(results,))
    child.start()
    found = results.get(timeout=120)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert len(found["games"]) == 1 and len(found["files"]) == 3  # one VizDoom process, its 3 segments
    assert found["alive_after"] == [] and found["files_after"] == []

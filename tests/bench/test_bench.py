"""The benchmark scripts: bench_throughput.py (the log lines it reads, its legs on real VizDoom
processes), cpu_accounting.py and bench_policy_worker.py."""
import json
import os
import signal
import subprocess
import sys
import time
import types
import uuid

import numpy as np
import pytest

import appo
from conftest import RUN_TIMEOUT_S, process_running, processes_still_tagged, processes_tagged

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # two levels above tests/bench/
sys.path.insert(0, os.path.join(REPO, "bench"))
import bench_learner  # noqa: E402
import bench_policy_worker  # noqa: E402
import bench_throughput as bench  # noqa: E402
import cpu_accounting  # noqa: E402


def test_the_benchmark_reads_fps_busy_time_and_lag_from_our_status_line():
    cfg = appo.parse_args(["--env", "doom_basic", "--num_workers", "2"])
    stats = appo.Stats(num_policies=1)
    stats.frame_history.extend([(100.0, 10_000), (110.0, 33_000)])
    stats.learner[0] = {"lag_min": 1, "lag_avg": 2.5, "lag_max": 4}
    stats.last_report_time -= 10.0
    stats.busy_s.update({"env": 6.0, "inference": 4.0, "learner": 9.0})  # over 10 s, 2 workers
    shared = types.SimpleNamespace(run=types.SimpleNamespace(worker_frames=np.array([20_000, 13_000]),
                                                             learner_frames=np.array([30_000])), resumed_frames=0)
    line = appo.status_line(cfg, stats, shared, elapsed=42.0)
    assert bench.trained_frames_of_ours(line) == 30_000, line  # frames trained: what Sample Factory's FPS counts
    assert bench.OURS_BUSY.search(line).groups() == ("30", "40", "90"), line
    assert bench.OURS_LAG.search(line).group(1) == "2.5", line


def test_the_benchmark_reads_sample_factorys_fps_line():
    line = ("[2026-11-23 15:50:12,345][04321] Fps is (10 sec: 1433.6, 60 sec: 1501.2, 300 sec: 1501.2). "
            "Total num frames: 98304. Throughput: 0: 358.4. Samples: 24576. Policy #0 lag: (min: 0.0, avg: 1.2, max: 3.0)")
    assert bench.SF_FPS.search(line).group(1) == "1433.6" and bench.sf_reports_training(line)
    first = "[2026-11-23 15:49:52,001][04321] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0."
    assert bench.SF_FPS.search(first).group(1) == "nan" and not bench.sf_reports_training(first)


@pytest.mark.parametrize("env_name, minibatch, minibatches, epochs, asynchronous", [
    ("doom_basic", 512, 1, 1, "True"),  # the Doom family: one SGD step a batch, collecting while training
    # the Atari family: 4 epochs of 4 minibatches, synchronous (4 x 512 samples = 4 rollouts of 2 x 8 envs x 32 steps)
    ("atari_breakout", 512, 4, 4, "False"),
])
def test_sample_factory_is_given_the_sgd_work_our_learner_does_on_a_batch(env_name, minibatch, minibatches, epochs,
                                                                           asynchronous):
    args = types.SimpleNamespace(env=env_name, num_workers=2, worker_num_splits=2, batch_size=512, rollout=32,
                                 sf_python="sf-python", trainer_flags=[])
    command = bench.sample_factory_command(args, bench.trainer_config(args, 8), "/tmp/sf-train-dir")

    def last_value(flag):  # what Sample Factory's argparse keeps
        return command[len(command) - 1 - command[::-1].index(flag) + 1]

    assert last_value("--batch_size") == str(minibatch)  # one minibatch, on both sides
    assert last_value("--num_batches_per_epoch") == str(minibatches)
    assert last_value("--num_epochs") == str(epochs)
    assert last_value("--async_rl") == asynchronous and last_value("--rollout") == "32"


def bench_args(**overrides):
    args = dict(env="doom_basic", num_workers=2, worker_num_splits=2, batch_size=512, rollout=32,
                sf_python="sf-python", trainer_flags=[], policy_workers_per_policy=None, inference_batch=None)
    return types.SimpleNamespace(**{**args, **overrides})


def last_value(command, flag):  # what an argparse parser keeps of a repeated flag
    return command[len(command) - 1 - command[::-1].index(flag) + 1]


@pytest.mark.parametrize("trainer_flags, device", [([], "cpu"), (["--device", "cpu"], "cpu"),
                                                   (["--device", "cuda"], "gpu"), (["--device", "gpu"], "gpu")])
def test_sample_factory_runs_on_the_gpu_exactly_when_ours_does(trainer_flags, device):
    if not trainer_flags and appo.parse_args([]).device != "cpu":
        pytest.skip("appo.py's --device auto picks the GPU here")
    args = bench_args(trainer_flags=trainer_flags)
    command = bench.sample_factory_command(args, bench.trainer_config(args, 8), "/tmp/sf-train-dir")
    assert command.count("--device") == 1 and last_value(command, "--device") == device


@pytest.mark.parametrize("bench_flag, trainer_flags, workers", [(None, [], "1"), (2, [], "2"),
                                                                (None, ["--policy_workers_per_policy", "3"], "3")])
def test_both_trainers_get_the_same_number_of_policy_workers(bench_flag, trainer_flags, workers):
    args = bench_args(policy_workers_per_policy=bench_flag, trainer_flags=trainer_flags)
    flags = bench.trainer_config(args, 8)
    sf = bench.sample_factory_command(args, flags, "/tmp/sf-train-dir")
    assert last_value(sf, "--policy_workers_per_policy") == workers  # Sample Factory 2.1.1's flag of that name
    assert "--num_policy_workers" not in sf  # (Sample Factory 1's name, which 2.1.1 refuses)
    ours = bench.ours_command(args, flags, "/tmp/train-dir", 10.0)
    assert appo.parse_args(ours[2:]).policy_workers_per_policy == int(workers)  # what appo.py would run with


def test_the_pure_episodes_leg_cuts_every_episode_at_the_given_frames():
    assert bench.episode_steps(24, 4) == 6 and bench.episode_steps(2, 4) == 1 and bench.episode_steps(None, 4) is None

    class Env:  # ends an episode by itself every 10 steps
        action_space = types.SimpleNamespace(sample=lambda: 0)

        def __init__(self):
            self.steps, self.resets = 0, 0

        def step(self, action):
            self.steps += 1
            return None, 0.0, self.steps % 10 == 0, False, {}

        def reset(self):
            self.resets += 1

    env = Env()
    began = [bench.step_randomly(env, 1) for _ in range(10)]
    assert began == [False] * 9 + [True] and env.resets == 1  # uncut: the env's own end
    assert bench.step_randomly(env, 1, cut=True) and env.resets == 2  # cut: a new episode although not done


def test_the_legs_gpu_time_runs_after_ours_and_the_old_name_is_refused_as_a_bound(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench", "--legs", "ceiling,ours,pure"])
    args = bench.parse_args()
    assert args.legs == ["ours", "pure", "gpu_time"] and "now gpu_time" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["bench", "--legs", "pure_episodes"])
    with pytest.raises(SystemExit):  # the cut length must be given
        bench.parse_args()


def test_what_a_leg_leaves_in_dev_shm_is_recorded_against_that_leg(monkeypatch, capsys):
    """The GPU check of 2026-11-28 found a CUDA IPC file left after a bench with ours and Sample
    Factory legs, and could not say whose. A stand-in leg (the trainers cannot run in a unit test)
    that leaves a file and one that leaves none: the file is named in the first leg's run and in a
    warning naming that leg."""
    name = f"bench_test_{uuid.uuid4().hex}"

    def leaves_a_file(*args, **kwargs):
        open(os.path.join("/dev/shm", name), "w").close()
        return {"fps": 1.0}

    monkeypatch.setattr(bench, "measure_ours", leaves_a_file)
    monkeypatch.setattr(bench, "pure_sim_leg", lambda *args, **kwargs: {"fps": 1.0})
    monkeypatch.setattr(sys, "argv", ["bench", "--env", "gym:CartPole-v1", "--legs", "ours,pure", "--num_workers", "1"])
    try:
        result = bench.measure_configuration(bench.parse_args(), 1)
    finally:
        os.unlink(os.path.join("/dev/shm", name))
    assert result["runs"]["ours"][0]["shm_left"] == [name] and "shm_left" not in result["runs"]["pure"][0]
    assert f"warning: ours left in /dev/shm: ['{name}']" in capsys.readouterr().err


def test_a_configurations_figures_are_the_medians_of_its_repeats(monkeypatch):
    """With --repeats 3 each leg's figure is the median of its three runs: stand-in legs (the
    trainers cannot run in a unit test) whose runs read 1, 3, 8 (the median is neither the first,
    the last nor the mean) and 20, 10, 80 (nor the run in the middle)."""
    fps = {"ours": iter([1.0, 3.0, 8.0]), "pure": iter([20.0, 10.0, 80.0])}
    monkeypatch.setattr(bench, "measure_ours", lambda *args, **kwargs: {"fps": next(fps["ours"])})
    monkeypatch.setattr(bench, "pure_sim_leg", lambda *args, **kwargs: {"fps": next(fps["pure"])})
    monkeypatch.setattr(sys, "argv", ["bench", "--env", "gym:CartPole-v1", "--legs", "ours,pure", "--num_workers", "1",
                                      "--repeats", "3"])
    result = bench.measure_configuration(bench.parse_args(), 1)
    assert [run["fps"] for run in result["runs"]["ours"]] == [1.0, 3.0, 8.0]
    assert result["ours_fps"] == 3.0 and result["pure_sim_fps"] == 20.0
    assert result["ours_over_pure_sim"] == pytest.approx(3.0 / 20.0)


def test_gpu_time_times_the_batch_ours_formed_unless_one_is_given():
    ours_runs = [{"fps": 1.0, "inference_batch": 37}, {"fps": 1.0, "inference_batch": 41}, {"fps": 1.0}]
    assert bench.gpu_time_batch(bench_args(), ours_runs) == (39, "the ours leg's mean inference batch")
    assert bench.gpu_time_batch(bench_args(inference_batch=64), ours_runs) == (64, "--inference_batch")
    assert bench.gpu_time_batch(bench_args(), [{"fps": 1.0}]) == (None, "")
    line = "[     30s] frames 1,000 | busy env 50% inference 97% learner 70% | inference batch 38 wait 10% forward 60%"
    assert bench.OURS_BATCH.search(line).group(1) == "38"


def test_fps_is_the_rate_over_the_whole_span_not_a_median_of_batch_quantised_windows():
    # Sample Factory's totals on Atari at batch 1024: 4,096 frames a batch, three or two batches a window
    points = [(0.0, 0), (10.0, 12_288), (20.0, 24_576), (30.0, 32_768), (40.0, 45_056)]
    windows = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(points, points[1:])]
    assert bench.steady_windows(windows)["fps"] == pytest.approx(1_228.8)  # windows of 1,228.8 or 819.2
    result = bench.measured_fps(windows, points)
    assert result["fps"] == pytest.approx(45_056 / 40.0) and result["window_fps"] == windows
    assert bench.span_rate(points[:1]) is None and bench.measured_fps([], [])["fps"] is None


def test_steady_windows_report_the_median_and_the_worst_window():
    result = bench.steady_windows([100.0, 110.0, 90.0, 80.0])
    assert result["fps"] == 95.0 and result["windows"] == 4
    assert result["worst_deviation"] == pytest.approx(15 / 95)
    assert result["within_10_percent"] == 0.5 and result["window_fps"] == [100.0, 110.0, 90.0, 80.0]
    assert bench.steady_windows([])["fps"] is None


@pytest.mark.slow
def test_pure_sim_both_kinds_gpu_time_and_our_trainer_on_doom_basic(tmp_path):
    tag = uuid.uuid4().hex
    command = [sys.executable, os.path.join(REPO, "bench", "bench_throughput.py"), "--env", "doom_basic",
               "--num_workers", "1", "--num_envs_per_worker", "2", "--worker_num_splits", "1",
               "--batch_size", "128", "--rollout", "16", "--legs", "pure,pure_episodes,gpu_time,ours,ours_fp32",
               "--pure_episode_frames", "24", "--seconds", "4", "--warmup", "0", "--report_every", "2", "--json",
               "--out", str(tmp_path / "result.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path,
                            env={**os.environ, "BENCH_TEST_TAG": tag})
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["env"] == "doom_basic" and figures["num_envs"] == 2 and figures["sf_fps"] is None
    assert figures["pure_sim_fps"] > 0 and figures["pure_episodes_fps"] > 0 and figures["ours_fps"] > 0
    assert figures["ours_fp32_fps"] > 0 and figures["ours_fp32_over_sf"] is None  # no SF leg here
    # the table's figures are the runs' (one run each here: test_a_configurations_figures_are_the_medians_
    # of_its_repeats tells a median from a run). How the legs' rates compare is the bench's to measure,
    # not this test's: on a machine shared with another job they crossed.
    for leg, key in (("pure", "pure_sim_fps"), ("pure_episodes", "pure_episodes_fps"), ("ours", "ours_fps"),
                     ("ours_fp32", "ours_fp32_fps")):
        assert figures[key] == np.median([run["fps"] for run in figures["runs"][leg]])
    # the precision each trainer leg ran: the ours leg as appo.py resolves --encoder_dtype auto here
    ours_dtype = appo.parse_args(["--env", "doom_basic"]).encoder_dtype
    assert figures["precision"] == {"ours": f"{ours_dtype} encoder", "gpu_time": f"{ours_dtype} encoder",
                                    "ours_fp32": "float32 encoder", "ours_compile": f"{ours_dtype} encoder",
                                    "sf": "float32"}
    assert figures["ours_over_pure_sim"] == pytest.approx(figures["ours_fps"] / figures["pure_sim_fps"])
    assert figures["runs"]["pure_episodes"][0]["episode_frames"] == 24
    assert list(figures["runs"])[-1] == "gpu_time"  # run after ours, whose batch it times
    gpu_time = figures["runs"]["gpu_time"][0]
    assert gpu_time["fps"] is None  # the stages apart, never one bound
    assert gpu_time["inference_wall_ms_per_batch"] > 0 and gpu_time["learner_wall_ms_per_step"] > 0
    assert gpu_time["inference_event_ms_per_batch"] is None and gpu_time["learner_syncs_per_step"] is None  # CPU
    ours = figures["runs"]["ours"][0]
    assert set(ours["busy_percent"]) == {"env", "inference", "learner"}
    # each share read from the status lines (the learner's may be 0 over a 4 s window on a loaded machine:
    # it waited for its batch the whole time, as it did beside another training run)
    assert all(0 <= busy <= 100 for busy in ours["busy_percent"].values())
    assert "trained" in ours["status_line"] and " sgd " in ours["status_line"]  # the stage shares, kept
    assert 0 < ours["first_trained_s"] < 120  # the start-up, launch to the first frames trained
    assert processes_tagged(tag) == []  # and conftest checks /dev/shm
    saved = json.loads((tmp_path / "result.json").read_text())  # the result file: figures and where they came from
    assert saved["results"][0]["ours_fps"] == figures["ours_fps"]
    assert len(saved["provenance"]["commit"]) == 40 and "--legs" in saved["provenance"]["command"]
    assert saved["provenance"]["cpu_bfloat16"] == appo.native_bfloat16("cpu")  # what auto went by
    assert (ours_dtype == "bfloat16") == saved["provenance"]["cpu_bfloat16"]
    report = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_throughput.py"), "--report",
                             str(tmp_path / "result.json")], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "doom_basic" in report.stdout and "# commit:" in report.stdout, report.stderr
    assert "gpu_time on cpu: forward at batch" in report.stdout, report.stdout
    assert f"precision: ours {ours_dtype} encoder, gpu_time {ours_dtype} encoder, ours_fp32 float32 encoder" \
        in report.stdout, report.stdout


def test_random_steps_drive_a_multi_agent_env_to_its_next_match():
    import env as envs
    cfg = appo.parse_args(["--env", "doom_duel", "--doom_match_minutes", "0.02"])  # 42 tics: 21 steps
    duel = envs.create_env("doom_duel", cfg)
    try:
        duel.reset()
        resets, reset = [], duel.reset
        duel.reset = lambda **kwargs: resets.append(kwargs) or reset(**kwargs)
        for _ in range(25):  # past the end of the first match
            bench.step_randomly(duel, 2)
        assert len(resets) == 1
    finally:
        duel.close()


def test_cpu_accounting_divides_each_roles_cpu_over_the_span_by_its_frames():
    """Samples at status lines: (time, frames collected, pid -> (role, CPU s)). The span starts
    after the warm-up and ends at the last sample where every process of its start still ran (a
    trainer's final line comes after its children stopped)."""
    def sample(when, frames, learner_cpu, with_children=True):
        cpu = {1: ("runner", 0.1 * when)}
        if with_children:
            cpu.update({2: ("learner", learner_cpu), 3: ("rollout workers", 0.5 * when), 4: ("env", 0.25 * when)})
        return when, frames, cpu
    samples = [sample(0.0, 0, 0.0), sample(5.0, 1000, 2.0), sample(10.0, 3000, 6.0), sample(15.0, 5000, 10.0),
               sample(16.0, 5100, 0.0, with_children=False)]
    costs = cpu_accounting.span_costs(samples, warmup=0.0, seconds=10.0)
    assert costs["frames"] == 4000 and costs["seconds"] == 10.0 and costs["fps"] == 400
    per_role = costs["cpu_per_1000_frames"]
    assert per_role["learner"] == pytest.approx(1000 * 8.0 / 4000) and per_role["rollout workers"] == pytest.approx(1.25)
    assert per_role["env"] == pytest.approx(0.625) and per_role["runner"] == pytest.approx(0.25)
    assert costs["cores_busy"] == pytest.approx((8.0 + 5.0 + 2.5 + 1.0) / 10.0)
    assert "error" in cpu_accounting.span_costs(samples, warmup=0.0, seconds=60.0)  # no span that long


def test_the_projection_divides_the_cores_left_by_the_rollout_sides_cpu_per_frame():
    """Only the env and rollout-worker rows count (the learner and policy workers compute on the GPU);
    pure simulation gets every core, the trainers all but the GPU side's."""
    def leg(env, rollout, learner):
        return {"cpu_per_1000_frames": {"env": env, "rollout workers": rollout, "learner": learner}}
    result = {"env": "doom_basic", "pure": leg(0.1, 0.1, 0.0), "ours": leg(0.2, 0.05, 9.0), "sf": leg(0.3, 0.2, 0.1)}
    table = cpu_accounting.projection(result, machines=[16, 36], gpu_side_cores=2.0)
    assert "| 16 | 80,000 | 56,000 | 28,000 |" in table  # 16 / 0.2, 14 / 0.25, 14 / 0.5, per 1,000 frames
    assert "| 36 | 180,000 | 136,000 | 68,000 |" in table


def test_a_report_of_several_result_files_gives_each_its_row_with_flags_commit_and_runs(tmp_path):
    """--report A B: configurations side by side (the ResNet and pinning tables of the throughput
    page come from it), from --out files and from the figures-only files --json printed before."""
    result = {"env": "doom_basic", "runs": {"ours": [{"fps": 4000.0}, {"fps": 4200.0}, {"fps": 4100.0}]}}
    with_out = {"provenance": {"command": "python bench/bench_throughput.py --env doom_basic -- --encoder resnet",
                               "commit": "0123456789abcdef"}, "results": [result]}
    (tmp_path / "a.json").write_text(json.dumps(with_out))
    (tmp_path / "b.json").write_text(json.dumps({"env": "atari_breakout", "runs": {"ours": [{"fps": 2308.0}]}}))
    lines = bench.comparison_table([str(tmp_path / "a.json"), str(tmp_path / "b.json")]).splitlines()
    assert lines[0] == "| file | env | appo.py flags | commit | ours |"
    assert lines[2] == "| a.json | doom_basic | --encoder resnet | 0123456 | 4,100 (4,000, 4,200, 4,100) |"
    assert lines[3] == "| b.json | atari_breakout | (not recorded) | - | 2,308 (2,308) |"


def test_the_policy_worker_benchmark_splits_act_on_into_the_forward_and_the_rest():
    """bench/bench_policy_worker.py on this tree, one batch size, briefly: it answers every
    request (it stops with an error otherwise) and reports the forward inside act_on."""
    run = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_policy_worker.py"), "--json",
                          "--batches", "8", "--seconds", "0"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                         check=True)
    result = json.loads(run.stdout)
    assert result["appo"] == os.path.join(REPO, "appo.py") and len(result["results"]) == 1
    row = result["results"][0]
    assert row["batch"] == 8 and row["iterations"] >= 20
    assert 0 < row["forward_us"] < row["act_on_us"] and row["outside_us"] > 0
    assert result["clock"] == row["clock"] == "thread CPU time"  # on the CPU: what the path costs this thread
    assert bench_policy_worker.table({"here": [result]}).startswith("µs per sample by the thread CPU time")


def test_the_policy_worker_benchmark_times_a_gpu_by_the_wall_clock():
    """On a GPU a wait on a CUDA event spins the thread: its CPU time would count the GPU's time as work."""
    assert bench_policy_worker.clock_of("cuda") == (time.perf_counter, "wall clock")
    assert bench_policy_worker.clock_of("cuda:1") == (time.perf_counter, "wall clock")
    assert bench_policy_worker.clock_of("cpu") == (time.thread_time, "thread CPU time")


DIES_AT_STARTUP = "gym:dies_at_startup_env:DiesAtStartup-v0"


def test_a_pure_simulation_worker_killed_during_start_up_is_named_and_the_leg_runs_again(tmp_path, monkeypatch,
                                                                                          capsys):
    """Issue 51: a worker lost before it reported ready made the leg wait 300 s and fail with a bare
    queue.Empty. Now the leg names the worker and how it died, at once, and runs again once. "At
    once" is timed from the death itself (the env stamps its death file just before its SIGKILL), not
    from the leg's start: a start-up under load takes a minute (70 s beside a training), a death is
    seen within a second or two of the half-second poll, and the start-up timeout is 300 s."""
    monkeypatch.setenv("DIE_AT_STARTUP_DIR", str(tmp_path))
    monkeypatch.setenv("DIE_AT_STARTUP_TIMES", "1")  # the first env made, in whichever worker, kills it
    flags = bench.trainer_config(bench_args(env=DIES_AT_STARTUP, batch_size=64, rollout=16, worker_num_splits=1), 2)
    measure, lost_at = bench.measure_pure_sim, []

    def measure_and_note_a_loss(*args, **kwargs):
        try:
            return measure(*args, **kwargs)
        except bench.WorkerLost:
            lost_at.append(time.time())
            raise
    monkeypatch.setattr(bench, "measure_pure_sim", measure_and_note_a_loss)
    run = bench.pure_sim_leg(flags, num_workers=2, seconds=1.0, startup_timeout=300.0)
    died_at = os.stat(tmp_path / "death_0").st_mtime
    assert len(lost_at) == 1 and -1 < lost_at[0] - died_at < 30, (lost_at, died_at)  # named at once, not at 300 s
    assert run["fps"] > 0
    assert "during start-up, before it reported ready (killed by SIGKILL)" in run["retried"], run
    assert "running the leg again (once)" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["death_0"]


def test_a_pure_simulation_worker_lost_twice_ends_the_bench_with_both_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("DIE_AT_STARTUP_DIR", str(tmp_path))
    monkeypatch.setenv("DIE_AT_STARTUP_TIMES", "2")
    flags = bench.trainer_config(bench_args(env=DIES_AT_STARTUP, batch_size=64, rollout=16, worker_num_splits=1), 2)
    with pytest.raises(SystemExit) as stopped:
        bench.pure_sim_leg(flags, num_workers=1, seconds=1.0, startup_timeout=60.0)
    message = str(stopped.value)
    assert message.startswith("error: pure simulation lost a worker twice")
    assert message.count("worker 0 (pid") == 2 and message.count("killed by SIGKILL") == 2, message


def test_each_legs_figures_are_in_the_partial_file_as_the_leg_ends_and_stay_there_when_the_bench_is_stopped(
        tmp_path):
    """--partial: rewritten after every leg in --json's shape, so a caller that has to stop the bench
    (gpu_check at its deadline) keeps the legs that finished. Stopped here during the ours leg."""
    tag = uuid.uuid4().hex
    partial = tmp_path / "partial.json"
    command = [sys.executable, os.path.join(REPO, "bench", "bench_throughput.py"), "--env", "gym:CartPole-v1",
               "--num_workers", "1", "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--legs", "pure,ours",
               "--seconds", "1", "--warmup", "300", "--json", "--partial", str(partial), "--", "--device", "cpu"]
    bench_process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                     env={**os.environ, "BENCH_TEST_TAG": tag})
    try:
        deadline = time.monotonic() + 180
        while not partial.exists() and bench_process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert partial.exists(), bench_process.communicate(timeout=60)[1][-3000:]
        bench_process.send_signal(signal.SIGTERM)  # during the ours leg: its warm-up alone is 300 s
        _, stderr = bench_process.communicate(timeout=60)
    finally:
        bench_process.kill()
    assert bench_process.returncode != 0
    figures = json.loads(partial.read_text())
    assert figures["env"] == "gym:CartPole-v1" and figures["num_envs"] == 2, figures
    assert list(figures["runs"]) == ["pure"] and figures["pure_sim_fps"] > 0 and figures["ours_fps"] is None
    assert not list(tmp_path.glob("*.part"))
    assert processes_still_tagged(tag) == [], stderr[-3000:]


def test_a_sample_factory_that_never_trains_is_stopped_at_its_first_line_limit_with_its_group(tmp_path):
    """--sf_first_line_s: a Sample Factory that starts but never prints a training FPS line (only
    its nan one) is stopped that many seconds after launch, not 180 s plus the measurement later,
    and the leg says why; what it started in its process group goes with it."""
    never_trains = tmp_path / "sf_python"
    never_trains.write_text(
        "#!/bin/sh\n"
        "echo '[2026-11-23 15:49:52,001][04321] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0.'\n"
        "sleep 600 &\necho \"child $!\"\nwait\n")
    never_trains.chmod(0o755)
    args = bench_args(sf_python=str(never_trains), warmup=0.0, seconds=1.0, sf_first_line_s=2.0)
    started = time.monotonic()
    result = bench.measure_sample_factory(args, bench.trainer_config(args, 8))
    assert time.monotonic() - started < 20
    assert result["fps"] is None and result["error"] == "no training FPS line within 2 s of its launch: stopped"
    child = int(next(line for line in result["log_tail"] if line.startswith("child ")).split()[1])
    assert not process_running(child)


def test_the_learner_benchmarks_batch_ends_episodes_as_a_trained_doom_basic_agent_does():
    """Every --episode_steps (6) steps, each trajectory at its own phase: the learner's recurrent core
    (on a GPU, over the rollout cut at episode ends) is timed at the segments training gives it."""
    from gymnasium import spaces
    cfg = appo.parse_args(["--env", "doom_basic", "--rollout", "32", "--device", "cpu"])
    doom_basic = (spaces.Box(0, 255, (3, 72, 128), np.uint8), spaces.Discrete(4))
    slots = appo.RolloutSlots(appo.rollout_buffer_specs(*doom_basic, cfg), num_slots=16, rollout=32, num_workers=1,
                              num_splits=1)
    bench_learner.fill_randomly(slots, appo.ActorCritic(*doom_basic, cfg))
    done = slots.arrays["done"]  # [trajectory, T+1]
    ends = [np.flatnonzero(row) for row in done]
    assert all(row[0] < 6 and (np.diff(row) == 6).all() and len(row) >= 5 for row in ends), ends
    assert len({row[0] for row in ends}) > 1  # not every trajectory at the same phase
    plan = appo.rnn_segments(done[:, :-1].T)  # the T steps that train, [T, B]
    assert plan.max_len == 6 and plan.num_segments >= 16 * 32 // 6
    assert bench_learner.parse_args([]).episode_steps == bench_learner.EPISODE_STEPS == 6


def test_the_learner_benchmarks_profile_names_the_ops_that_took_the_step_and_their_shares():
    """--profile N: torch.profiler's ops by self CPU time over N steps, most first; the doom_basic
    model's convolutions and its linear layers' matrix products are among them, and each op's share
    and ms a step are its own time over all ops' and over the steps: one total (all ops' ms a step)
    stands behind every row."""
    import torch
    args = bench_learner.parse_args(["--device", "cpu", "--batch_size", "64", "--rollout", "8", "--seconds", "0",
                                     "--min_steps", "1", "--warmup_steps", "0", "--profile", "2"])
    result = bench_learner.measure(args)
    profile = result["profile"]
    shares = [row["share"] for row in profile]
    assert len(profile) == 12 and shares == sorted(shares, reverse=True), profile  # the 12 ops that took most
    ops = [row["op"] for row in profile]
    assert any("convolution" in op for op in ops) and any(op in ("aten::mm", "aten::addmm") for op in ops), ops
    totals = [row["ms_per_call"] / row["share"] for row in profile if row["share"] >= 0.01]
    assert len(totals) >= 3 and max(totals) < 1.1 * min(totals), profile  # ms and share of one whole, rounded
    assert result["threads"] == torch.get_num_threads()
    assert bench_learner.parse_args([]).profile == 0  # off unless asked


def test_the_learner_benchmarks_op_shares_are_each_ops_time_over_all_and_over_the_calls(monkeypatch):
    """op_shares against a profiler whose op times are set here: 600, 300 and 100 µs of self CPU
    time over 2 calls are shares 0.6, 0.3, 0.1 and 0.3, 0.15, 0.05 ms a call; `most` keeps the first."""
    import torch.profiler
    calls = []

    class SetProfile:
        def __init__(self, activities):
            assert activities == [torch.profiler.ProfilerActivity.CPU]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return [types.SimpleNamespace(key=key, self_cpu_time_total=us)
                    for key, us in (("aten::add", 100.0), ("aten::mm", 600.0), ("aten::convolution", 300.0))]

    monkeypatch.setattr(torch.profiler, "profile", SetProfile)
    rows = bench_learner.op_shares(lambda: calls.append(1), calls=2, most=2)
    assert len(calls) == 2
    assert rows == [{"op": "aten::mm", "share": 0.6, "ms_per_call": 0.3},
                    {"op": "aten::convolution", "share": 0.3, "ms_per_call": 0.15}]

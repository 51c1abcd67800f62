"""The benchmark scripts: bench_throughput.py (the log lines it reads, its legs on real VizDoom
processes), cpu_accounting.py and bench_policy_worker.py."""
import json
import os
import subprocess
import sys
import types
import uuid

import numpy as np
import pytest

import appo
from conftest import processes_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
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
                                                             learner_frames=np.array([30_000])))
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
def test_pure_sim_ceiling_and_our_trainer_on_doom_basic(tmp_path):
    tag = uuid.uuid4().hex
    command = [sys.executable, os.path.join(REPO, "scripts", "bench_throughput.py"), "--env", "doom_basic",
               "--num_workers", "1", "--num_envs_per_worker", "2", "--worker_num_splits", "1",
               "--batch_size", "128", "--rollout", "16", "--legs", "pure,ceiling,ours,ours_fp32",
               "--seconds", "4", "--warmup", "0", "--report_every", "2", "--json",
               "--out", str(tmp_path / "result.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, "BENCH_TEST_TAG": tag})
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["env"] == "doom_basic" and figures["num_envs"] == 2 and figures["sf_fps"] is None
    assert figures["pure_sim_fps"] > 0 and figures["ceiling_fps"] > 0 and figures["ours_fps"] > 0
    assert figures["ours_fp32_fps"] > 0 and figures["ours_fp32_over_sf"] is None  # no SF leg here
    assert figures["ours_over_pure_sim"] == pytest.approx(figures["ours_fps"] / figures["pure_sim_fps"])
    ceiling = figures["runs"]["ceiling"][0]
    assert ceiling["env_ms_per_step"] > 0 and ceiling["learner_ms_per_sample"] > 0
    ours = figures["runs"]["ours"][0]
    assert set(ours["busy_percent"]) == {"env", "inference", "learner"}
    assert processes_tagged(tag) == []  # and conftest checks /dev/shm
    saved = json.loads((tmp_path / "result.json").read_text())  # the result file: figures and where they came from
    assert saved["results"][0]["ours_fps"] == figures["ours_fps"]
    assert len(saved["provenance"]["commit"]) == 40 and "--legs" in saved["provenance"]["command"]
    report = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_throughput.py"), "--report",
                             str(tmp_path / "result.json")], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "doom_basic" in report.stdout and "# commit:" in report.stdout, report.stderr


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
    with_out = {"provenance": {"command": "python scripts/bench_throughput.py --env doom_basic -- --encoder resnet",
                               "commit": "0123456789abcdef"}, "results": [result]}
    (tmp_path / "a.json").write_text(json.dumps(with_out))
    (tmp_path / "b.json").write_text(json.dumps({"env": "atari_breakout", "runs": {"ours": [{"fps": 2308.0}]}}))
    lines = bench.comparison_table([str(tmp_path / "a.json"), str(tmp_path / "b.json")]).splitlines()
    assert lines[0] == "| file | env | appo.py flags | commit | ours |"
    assert lines[2] == "| a.json | doom_basic | --encoder resnet | 0123456 | 4,100 (4,000, 4,200, 4,100) |"
    assert lines[3] == "| b.json | atari_breakout | (not recorded) | - | 2,308 (2,308) |"


def test_the_policy_worker_benchmark_splits_act_on_into_the_forward_and_the_rest():
    """scripts/bench_policy_worker.py on this tree, one batch size, briefly: it answers every
    request (it stops with an error otherwise) and reports the forward inside act_on."""
    run = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_policy_worker.py"), "--json",
                          "--batches", "8", "--seconds", "0"], capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(run.stdout)
    assert result["appo"] == os.path.join(REPO, "appo.py") and len(result["results"]) == 1
    row = result["results"][0]
    assert row["batch"] == 8 and row["iterations"] >= 20
    assert 0 < row["forward_us"] < row["act_on_us"] and row["outside_us"] > 0

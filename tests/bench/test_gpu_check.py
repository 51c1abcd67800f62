"""bench/gpu_check.py: how it reads a training run, and what it does on a machine with no GPU.
(Its full dry run, `run --device cpu`, takes minutes: docs/gpu.md gives the command.)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
import zipfile

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # two levels above tests/bench/
sys.path.insert(0, os.path.join(REPO, "bench"))
import gpu_check  # noqa: E402
from conftest import process_running  # noqa: E402

OUTPUT = """training doom_basic on cuda with 16 processes in /tmp/x/trained; follow it with tensorboard
[      5s] frames 10,000 | FPS 10s/60s/300s 0/0/0 | samples/s 0
[     10s] frames 50,000 | FPS 10s/60s/300s 8,000/8,000/8,000 | samples/s 2,000 | lag 0/0.5/1 trained 40,960
[     30s] frames 250,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 204,800 | avg return -50.00 (20 ep)
[     40s] frames 350,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 307,200 | avg return 10.50 (100 ep)
[     50s] frames 450,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 409,600 | avg return 60.25 (100 ep)
[     52s] frames 460,000 | FPS 10s/60s/300s 9,000/9,000/9,000 | samples/s 2,250 | lag 0/0.5/1 trained 411,648 | avg return 61.00 (100 ep)
"""


def test_the_check_reads_trained_frames_and_score_from_appos_status_lines():
    lines = gpu_check.status_lines(OUTPUT)
    assert [line["seconds"] for line in lines] == [5, 10, 30, 40, 50, 52]
    assert lines[0]["trained"] == 0 and lines[1]["trained"] == 40_960 and lines[1]["return"] is None
    assert lines[-1]["return"] == 61.0 and lines[-1]["episodes"] == 100
    # from the first line 20 s after training began (30 s) to the last before the stop (50 s)
    assert gpu_check.training_rate(lines) == pytest.approx((409_600 - 204_800) / 20)


def test_without_a_gpu_a_cuda_check_fails_at_the_machine_step_says_why_and_skips_the_rest(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, os.path.join(REPO, "bench", "gpu_check.py"), "run", "--device", "cuda",
                             "--out", str(out), "--wheels", str(tmp_path / "no_wheels"),
                             "--pack", str(tmp_path / "no_pack.tar.xz"), "--sf_wheels", str(tmp_path / "no_sf_wheels")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    steps = {step["step"]: step for step in json.loads((out / "summary.json").read_text())["steps"]}
    assert list(steps) == [*gpu_check.ALWAYS, *gpu_check.STEPS]
    assert steps["packages"]["status"] == "skipped" and "no wheels" in steps["packages"]["reason"]
    assert steps["sample_factory"]["status"] == "skipped"
    assert "no Sample Factory wheels" in steps["sample_factory"]["reason"]
    assert steps["machine"]["status"] == "failed" and "torch sees no GPU" in steps["machine"]["reason"]
    for name in ["build", *gpu_check.STEPS]:
        assert steps[name]["status"] == "skipped" and "machine" in steps[name]["reason"], name
    assert "| machine | failed |" in (out / "summary.md").read_text()
    assert "torch sees no GPU" in (out / "steps.log").read_text()


def test_unknown_steps_are_refused_by_name():
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["run", "--out", "x", "--steps", "train,trian"])
    assert gpu_check.parse_args(["run", "--out", "x", "--steps", "eval"]).steps == ["eval"]


def test_the_sample_factory_wrapper_runs_this_python_with_only_its_packages_on_the_path(tmp_path):
    site = tmp_path / "sf site"  # a space: the path is quoted
    site.mkdir()
    (site / "only_in_sf_site.py").write_text("WHERE = 'sf site'\n")
    wrapper = gpu_check.write_sf_wrapper(str(tmp_path / "sf_python"), str(site), sys.executable)
    assert os.access(wrapper, os.X_OK)
    result = subprocess.run([wrapper, "-c", "import json, sys, only_in_sf_site; print(json.dumps(sys.path))"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "/elsewhere"}, timeout=60)
    assert result.returncode == 0, result.stderr
    path = json.loads(result.stdout)
    assert path[1] == str(site) and "/elsewhere" not in path  # first, and ours (numpy 2, gymnasium 1) not at all


def test_the_pack_carries_both_wheel_folders_with_their_wheels_uncompressed_inside(tmp_path):
    folders = {"whl": tmp_path / "whl", "whl-sf": tmp_path / "whl-sf"}
    for name, folder in folders.items():
        folder.mkdir()
        with zipfile.ZipFile(folder / f"{name}_pkg-1.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as wheel:
            wheel.writestr("pkg/__init__.py", "x = 1\n" * 1000)
            wheel.writestr("pkg-1.0.dist-info/RECORD", "")
    (folders["whl"] / "appo_ipc._native.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF module")
    pack = tmp_path / "pack" / "wheels.tar.xz"
    gpu_check.pack({name: str(folder) for name, folder in folders.items()}, str(pack))
    unpacked = gpu_check.unpack(str(pack), str(tmp_path / "unpacked"))
    assert set(unpacked) == {"whl", "whl-sf"}
    assert sorted(os.listdir(unpacked["whl"])) == ["appo_ipc._native.cpython-312-x86_64-linux-gnu.so",
                                                   "whl_pkg-1.0-py3-none-any.whl"]
    with zipfile.ZipFile(os.path.join(unpacked["whl-sf"], "whl-sf_pkg-1.0-py3-none-any.whl")) as wheel:
        assert wheel.read("pkg/__init__.py") == b"x = 1\n" * 1000
        assert {info.compress_type for info in wheel.infolist()} == {zipfile.ZIP_STORED}


def fake_check(tmp_path, episode_frames=None, sf_python=None, device="cuda", deadline_s=480.0):
    args = gpu_check.parse_args(["run", "--out", str(tmp_path / "out"), "--device", device,
                                 "--num_workers", "14", "--deadline_s", str(deadline_s)])
    return types.SimpleNamespace(args=args, episode_frames=episode_frames, sf_python=sf_python,
                                 sf_missing=None if sf_python else "no Sample Factory wheels in x and no --sf_python")


def test_the_bench_steps_legs_and_their_command_lines(tmp_path):
    check = fake_check(tmp_path, episode_frames=24, sf_python="/w/sf_python")
    assert gpu_check.bench_legs(check, "doom_1pw") == (["pure", "ours", "sf"], {})
    assert gpu_check.bench_legs(check, "doom_2pw") == (["ours", "sf"], {})  # pure simulation once
    assert gpu_check.bench_legs(check, "atari") == (["pure", "ours", "sf"], {})
    check.args.extra_legs = ["gpu_time", "pure_episodes"]  # doom_1pw's only, in the bench's order
    assert gpu_check.bench_legs(check, "doom_1pw") == (["pure", "pure_episodes", "ours", "sf", "gpu_time"], {})
    assert gpu_check.bench_legs(check, "doom_2pw") == (["ours", "sf"], {})
    check.args.extra_legs = ["ours_fp32"]  # like for like: with one policy worker and with two, not on atari
    assert gpu_check.bench_legs(check, "doom_1pw") == (["pure", "ours", "ours_fp32", "sf"], {})
    assert gpu_check.bench_legs(check, "doom_2pw") == (["ours", "ours_fp32", "sf"], {})
    assert gpu_check.bench_legs(check, "atari") == (["pure", "ours", "sf"], {})
    command = gpu_check.bench_command(check, "doom_basic", ["pure", "pure_episodes", "ours", "sf"], 2, "/w/p.json")
    flags = {flag: command[i + 1] for i, flag in enumerate(command[:-1]) if flag.startswith("--")}
    assert flags["--policy_workers_per_policy"] == "2" and flags["--pure_episode_frames"] == "24"
    assert flags["--sf_python"] == "/w/sf_python" and flags["--num_workers"] == "14"
    assert flags["--partial"] == "/w/p.json" and flags["--sf_first_line_s"] == "60"
    assert command[-3:] == ["--", "--device", "cuda"]
    bare = fake_check(tmp_path)
    bare.args.extra_legs = ["pure_episodes"]
    legs, left_out = gpu_check.bench_legs(bare, "doom_1pw")
    assert legs == ["pure", "ours"]
    assert "no episode length" in left_out["pure_episodes"] and "no Sample Factory wheels" in left_out["sf"]
    assert "--sf_python" not in gpu_check.bench_command(bare, "doom_basic", legs, 1, "/w/p.json")
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["plan", "--extra_legs", "ours_fp16"])
    check.args.extra_legs, check.args.skip_legs = ["ours_fp32"], ["pure"]  # a rerun with pure's figure already
    assert gpu_check.bench_legs(check, "doom_1pw") == (["ours", "ours_fp32", "sf"], {})
    assert gpu_check.bench_legs(check, "atari") == (["ours", "sf"], {})
    check.args.skip_legs = ["pure", "doom_1pw:sf"]  # one step's leg: the others keep theirs
    assert gpu_check.bench_legs(check, "doom_1pw") == (["ours", "ours_fp32"], {})
    assert gpu_check.bench_legs(check, "doom_2pw") == (["ours", "ours_fp32", "sf"], {})
    assert gpu_check.bench_legs(check, "atari") == (["ours", "sf"], {})


@pytest.mark.parametrize("skip_legs", ["sff", "doom_3pw:sf", "doom_1pw:", ":sf", "doom_1pw:sf:ours"])
def test_a_misspelt_leg_to_skip_is_refused_rather_than_skipping_nothing(skip_legs):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["plan", "--skip_legs", skip_legs])
    assert gpu_check.parse_args(["plan", "--skip_legs", "pure,doom_2pw:ours"]).skip_legs == ["pure", "doom_2pw:ours"]


def test_the_prepared_check_runs_what_has_not_passed_with_the_like_for_like_legs_and_fits_the_deadline():
    """PREPARED_FLAGS: the GPU path's steps, then both Doom steps with ours_fp32 beside ours (and
    Sample Factory beside both with two policy workers), each started in the plan and ending before 480 s."""
    args = gpu_check.parse_args(["plan", *gpu_check.PREPARED_FLAGS])
    assert args.deadline_s == 480
    rows = {line.split()[0]: line.split() for line in gpu_check.plan(args).splitlines()[1:]}
    started = [step for step in gpu_check.STEPS if rows[step][1] != "-"]
    assert started == ["cuda_tests", "train", "sigkill", "eval", "doom_1pw", "doom_2pw"] == args.steps
    assert rows["doom_1pw"][-1] == "ours,ours_fp32" and rows["doom_2pw"][-1] == "ours,ours_fp32,sf"
    assert all(float(rows[step][2]) < 480 for step in gpu_check.ALWAYS + started)
    assert float(rows["doom_2pw"][2]) == 462  # (docs/gpu.md prints this plan)
    with open(os.path.join(REPO, "docs", "gpu.md")) as f:
        doc = f.read()
    assert "python3 bench/gpu_check.py run --out OUT " + " ".join(gpu_check.PREPARED_FLAGS) in doc
    assert gpu_check.plan(args) in doc  # the plan the page prints is the script's


def test_a_bench_steps_details_carry_the_like_for_like_figures():
    figures = {"num_envs": 112, "ours_fp32_fps": 33_000.0, "sf_fps": 30_000.0, "ours_fp32_over_sf": 1.1,
               "precision": {"ours_fp32": "float32 encoder", "sf": "float32"},
               "runs": {"ours_fp32": [{"fps": 33_000.0, "window_fps": [32_900.0, 33_100.0],
                                       "busy_percent": {"env": 70.0, "inference": 80.0, "learner": 50.0}}],
                        "sf": [{"fps": 30_000.0, "window_fps": [30_000.0]}]}}
    details = gpu_check.bench_details(figures)
    assert details["ours_fp32_over_sf"] == 1.1 and details["ours_fp32_windows"] == [32_900.0, 33_100.0]
    assert details["ours_fp32_busy_percent"]["inference"] == 80.0 and details["precision"]["sf"] == "float32"


GPU_RUNS = os.path.join(REPO, "docs", "bench", "gpu_check")


def recorded_run(name: str) -> dict:
    with open(os.path.join(GPU_RUNS, f"{name}.json")) as f:
        return json.load(f)


def test_each_steps_expected_seconds_are_at_least_what_the_h200_recorded():
    """EXPECTED_S claims the H200's step times where a step ran there: each step the two runs of
    docs/gpu.md's Results (h200_4_d6fc914: cuda_tests 62.7 s, micro_policy 16.4 s, ...; h200_5_c7279a9)
    recorded, passed or failed, is planned to take at least as long as it took there; a skipped step
    recorded nothing."""
    recorded = {}
    for name in ("h200_4_d6fc914", "h200_5_c7279a9"):
        run = recorded_run(name)
        assert run["device"] == "cuda" and run["commit"].startswith("76273b4")  # the Results' two runs
        for step in run["steps"]:
            if step["status"] != "skipped" and step["step"] in gpu_check.EXPECTED_S:
                recorded[step["step"]] = max(recorded.get(step["step"], 0.0), step["seconds"])
    assert recorded["cuda_tests"] == 62.7 and recorded["micro_policy"] == 16.4 and recorded["build"] == 18.1
    assert set(recorded) == {"packages", "machine", "build", "sample_factory", "cuda_tests", "sigkill",
                             "micro_policy", "micro_learner"}  # eval was skipped in both (no checkpoint, not asked)
    for step, seconds in recorded.items():
        assert gpu_check.EXPECTED_S[step] >= seconds, (step, gpu_check.EXPECTED_S[step], seconds)


def test_a_recorded_doom_steps_ratio_is_ours_over_sample_factorys_span_rates_and_its_details_are_its_legs():
    """h200_5_c7279a9's doom_1pw step (docs/gpu.md, Results): the ratio recomputed here from its two
    figures, 38,187 over 30,452 frames/s, is the recorded 1.254 and the row's and page's 1.25; each
    figure, a span's rate, lies within its recorded 10-s windows (a span's rate is its windows' mean
    weighted by time); and the legs' runs those figures came from, fed through bench_details and
    gpu_row, give back the step's recorded details and the run's row."""
    run = recorded_run("h200_5_c7279a9")
    step = next(step for step in run["steps"] if step["step"] == "doom_1pw")
    assert step["status"] == "passed" and "--legs ours,sf" in step["command"]
    ratio = step["ours_fps"] / step["sf_fps"]
    assert round(step["ours_fps"]) == 38_187 and round(step["sf_fps"]) == 30_452
    assert round(ratio, 3) == 1.254 and ratio == pytest.approx(step["ours_over_sf"], rel=1e-12)
    for leg in ("ours", "sf"):
        windows = step[f"{leg}_windows"]
        assert len(windows) == 2 and min(windows) <= step[f"{leg}_fps"] <= max(windows), leg
    assert [round(w) for w in step["ours_windows"]] == [38_322, 38_050]
    assert [round(w) for w in step["sf_windows"]] == [8_602, 30_720]  # the first still warming up
    with open(os.path.join(REPO, "docs", "gpu.md")) as f:
        assert (f"| 1 policy worker | 38,187 (windows 38,322 and 38,050) | 30,452 (8,602 and 30,720) | "
                f"{ratio:.2f} |") in f.read()
    # the bench's figures for these legs, as bench_throughput gives them (a run per leg), through the check
    ours = {"fps": step["ours_fps"], "window_fps": step["ours_windows"], "busy_percent": step["ours_busy_percent"],
            "lag_avg": step["ours_policy_lag"], "inference_batch": step["ours_inference_batch"]}
    figures = {"num_envs": step["envs"], "policy_workers_per_policy": 1, "pure_sim_fps": None, "pure_episodes_fps": None,
               "ours_fps": step["ours_fps"], "sf_fps": step["sf_fps"], "ours_over_pure_sim": None,
               "ours_over_pure_episodes": None, "ours_over_sf": ratio,
               "runs": {"ours": [ours], "sf": [{"fps": step["sf_fps"], "window_fps": step["sf_windows"]}]}}
    details = gpu_check.bench_details(figures)
    assert {key: value for key, value in details.items() if key in step} == {
        key: value for key, value in step.items() if key in details}
    assert {key for key in step if key not in details} == {"step", "status", "seconds", "command", "left_out"}
    args = gpu_check.parse_args(["run", "--out", "x", "--num_workers", "14", "--num_envs_per_worker", "8",
                                 "--device", "cuda"])
    results = {result["step"]: result for result in run["steps"]}
    results["doom_1pw"] = {"status": "passed", **details}
    assert gpu_check.gpu_row(results, args) == run["row"]
    assert "| 38,187 | - | - | - | - | 30,452 | 1.25 |" in run["row"]


def test_a_step_that_would_end_past_the_deadline_does_not_start(tmp_path):
    args = gpu_check.parse_args(["run", "--out", str(tmp_path / "out"), "--device", "cpu", "--deadline_s", "100"])
    check = gpu_check.Check(args)
    try:
        ran = []
        check.step("atari", lambda: ran.append(1) or ("passed", {}), expected_s=110)
        check.step("doom_2pw", lambda: ran.append(2) or ("passed", {}), expected_s=90)
    finally:
        check.log.close()
        os.rmdir(check.work)
    assert ran == [2]  # 90 s ends before the deadline; 110 s would not
    assert check.results[0]["status"] == "skipped" and "expected to take about 110 s" in check.results[0]["reason"]


def test_the_default_plan_runs_the_steps_by_value_and_starts_none_that_would_end_past_the_deadline():
    args = gpu_check.parse_args(["plan"])
    assert (args.train_seconds, args.bench_warmup, args.bench_seconds, args.deadline_s) == (30, 8, 12, 480)
    rows = [line.split() for line in gpu_check.plan(args).splitlines()[1:]]
    assert [row[0] for row in rows] == ["packages", "machine", "build", "sample_factory", "cuda_tests", "train",
                                        "sigkill", "eval", "doom_1pw", "doom_2pw", "micro_policy", "micro_learner",
                                        "atari"]
    started = [(row[0], float(row[1]), float(row[2])) for row in rows if row[1] != "-"]
    assert started[0][1] == 0 and all(end < 480 for _, _, end in started)
    assert all(a[2] == b[1] for a, b in zip(started, started[1:]))  # one after the other
    assert dict((step, end - start) for step, start, end in started)["train"] == 30 + gpu_check.OURS_STOP_S
    assert [row for row in rows if row[0] == "doom_1pw"][0][-1] == "pure,ours,sf"
    skipped = [row for row in rows if row[1] == "-"]
    assert all(" ".join(row[3:]).startswith("would not start") for row in skipped)
    assert gpu_check.expected_seconds(args, "atari") == gpu_check.bench_seconds(args, ["pure", "ours", "sf"])


def test_the_check_reads_the_eval_length_and_the_scripts_json():
    line = "mean return 80.40 +- 6.31 over 5 games; mean length 1,024 env frames"
    assert gpu_check.EVAL_LENGTH.search(line).group(1) == "1,024" and gpu_check.EVAL_RETURN.search(line)
    output = 'loading...\n{\n "a": 1,\n "b": {"c": 2}\n}\nwarning: left running\n'
    assert gpu_check.json_in(output) == {"a": 1, "b": {"c": 2}} and gpu_check.json_in("no json") is None


def test_the_learner_micro_benchmark_times_doom_basics_batch_on_the_gpu_and_one_step_in_a_dry_run(tmp_path):
    on_gpu = gpu_check.learner_command(fake_check(tmp_path))
    flags = {flag: on_gpu[i + 1] for i, flag in enumerate(on_gpu[:-1]) if flag.startswith("--")}
    assert flags["--env"] == "doom_basic" and flags["--batch_size"] == "512" and flags["--rollout"] == "32"
    assert flags["--device"] == "cuda" and flags["--seconds"] == "5"
    dry = gpu_check.learner_command(fake_check(tmp_path, device="cpu"))
    assert dry[dry.index("--min_steps") + 1] == "1" and "--seconds" in dry


# prints its pid and that of a child in a session of its own (as bench_throughput starts a trainer),
# then waits; with an argument, it ignores SIGTERM
SESSIONS = """
import signal, subprocess, sys, time
if len(sys.argv) > 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                         stdout=subprocess.DEVNULL)
print("pids", child.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_command_past_its_time_is_stopped_with_every_process_it_started_in_any_session(tmp_path, monkeypatch,
                                                                                          ignores_sigterm):
    monkeypatch.setattr(gpu_check, "STOP_GRACE_S", 2.0)
    args = gpu_check.parse_args(["run", "--out", str(tmp_path / "out"), "--device", "cpu"])
    check = gpu_check.Check(args)
    try:
        started = time.monotonic()
        code, output = check.command([sys.executable, "-c", SESSIONS] + ["ignore"] * ignores_sigterm, timeout=3)
    finally:
        check.log.close()
        os.rmdir(check.work)
    assert time.monotonic() - started < 20
    assert code == (-signal.SIGKILL if ignores_sigterm else -signal.SIGTERM), output
    assert "(stopped: still running after 3 s)" in output
    child = int(next(line for line in output.splitlines() if line.startswith("pids ")).split()[1])
    assert not process_running(child)


def test_a_bench_that_fails_part_way_fails_its_step_with_the_figures_of_the_legs_that_finished(tmp_path,
                                                                                                 monkeypatch):
    """bench_throughput on CartPole with pure, ours and sf: Sample Factory has no launcher for a gym:
    env, so the bench ends with an error in its third leg, after the other two."""
    args = gpu_check.parse_args(["run", "--out", str(tmp_path / "out"), "--device", "cpu", "--num_workers", "1",
                                 "--num_envs_per_worker", "2", "--bench_seconds", "1", "--bench_warmup", "0",
                                 "--report_every", "1"])
    monkeypatch.setitem(gpu_check.BENCH_STEPS, "cartpole", ("gym:CartPole-v1", 1))
    check = gpu_check.Check(args)
    check.sf_python = sys.executable  # an executable, so the bench takes it and fails at the leg
    try:
        status, details = gpu_check.step_bench(check, "cartpole")
    finally:
        check.log.close()
        shutil.rmtree(check.work)
    assert status == "failed"
    assert details["reason"].startswith("bench_throughput exit code 1 (error: --sf_python: Sample Factory's "
                                        "launchers cover doom_* and atari_* only"), details["reason"]
    assert details["reason"].endswith("legs finished: pure, ours")
    assert details["pure_sim_fps"] > 0 and details["sf_fps"] is None and details["envs"] == 2


def test_the_summary_holds_every_finished_step_while_the_next_one_runs(tmp_path):
    """The GPU call's time limit may SIGKILL the check in any step: what finished is on disk by then."""
    args = gpu_check.parse_args(["run", "--out", str(tmp_path / "out"), "--device", "cpu"])
    check = gpu_check.Check(args)

    def read_summaries():
        steps = json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]
        return "passed", {"seen": [step["step"] for step in steps],
                          "md": "| machine | failed |" in (tmp_path / "out" / "summary.md").read_text()}

    try:
        check.step("machine", lambda: ("failed", {"reason": "no GPU"}))
        seen = check.step("train", read_summaries)
    finally:
        check.log.close()
        os.rmdir(check.work)
    assert seen["seen"] == ["machine"] and seen["md"]


@pytest.mark.parametrize("device, reason, status", [
    ("cpu", "torch's sync debug mode needs CUDA", "passed"),  # tests/test_cuda.py's own reason: expected in a dry run
    ("cpu", "CUDA events need a GPU", "passed"),  # its other one (since 455979d): every dry run failed on it
    ("cuda", "torch's sync debug mode needs CUDA", "failed"),  # on the GPU every test must run
    ("cpu", "not on this machine", "failed"),
])
def test_a_dry_run_expects_the_cuda_tests_that_need_a_real_gpu_to_be_skipped_and_no_others(tmp_path, device, reason,
                                                                                             status):
    tests = tmp_path / "test_some_cuda.py"
    tests.write_text("import pytest\n\ndef test_runs():\n    pass\n\n"
                     f"@pytest.mark.skip(reason={reason!r})\ndef test_skipped():\n    pass\n")
    args = gpu_check.parse_args(["run", "--out", str(tmp_path / "out"), "--device", device])
    check = gpu_check.Check(args)
    try:
        result = gpu_check.step_cuda_tests(check, str(tests))
    finally:
        check.log.close()
        os.rmdir(check.work)
    assert result[0] == status, result
    (skipped,) = result[1]["skipped"]
    assert skipped.endswith(f"{tests.name}:6: {reason}"), skipped  # where (pytest's line of the mark) and why


def test_the_train_step_counts_python_warnings_as_well_as_appos_and_torchs():
    output = ("training doom_basic on cuda\n"
              "warning: --batch_size is not a multiple of the rollout\n"
              "[W1126 17:03:03.571360441 CudaIPCTypes.cpp:16] Producer process has been terminated\n"
              "/x/torch/nn/modules/rnn.py:1123: UserWarning: RNN module weights are not part of single contiguous "
              "chunk of memory.\n"
              "  result = _VF.gru(input, hx)\n"
              "[     30s] frames 250,000 | no Warning here, and no warning either\n")
    assert gpu_check.warning_lines(output) == output.splitlines()[1:4]


def test_prepare_run_by_a_python_without_the_projects_packages_stops_first_and_names_the_fix(tmp_path):
    with pytest.raises(SystemExit) as stopped:
        gpu_check.project_versions(["gymnasium", "no-such-package-of-gpu-check"])
    assert str(stopped.value) == ("error: run prepare with the project's interpreter (the one `pip install -e "
                                  f".[doom,test]` installed into): {sys.executable} is missing "
                                  "no-such-package-of-gpu-check")
    assert gpu_check.project_versions(["gymnasium"])["gymnasium"]
    # this Python without its site-packages (-S): none of the project's packages, and nothing downloaded
    wheels = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-S", os.path.join(REPO, "bench", "gpu_check.py"), "prepare",
                             "--wheels", str(wheels), "--sf_wheels", str(tmp_path / "sf"),
                             "--pack", str(tmp_path / "pack.tar.xz")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "is missing vizdoom, gymnasium, ale-py" in result.stderr, result.stderr
    assert not wheels.exists()

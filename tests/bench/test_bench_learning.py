"""bench/bench_learning.py: its configuration keys, its reading of both trainers' summaries, the
table's figures from hand-made runs, the task probe on real VizDoom, and a real run's clean-up."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

from conftest import processes_tagged, shm_entries, shm_left_by_this_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # two levels above tests/bench/
sys.path.insert(0, os.path.join(REPO, "bench"))
import bench_learning as bench  # noqa: E402
import env  # noqa: E402


def run(trainer, seed, curve, wall_s, status="ok", share=0.0):
    return {"config": {"trainer": trainer, "seed": seed, "code": "c0de"}, "status": status, "curve": curve, "wall_s": wall_s,
            "commit": "abc", "other_cpu_share": share}


def test_scores_are_read_at_the_budget_and_times_at_the_first_crossing():
    curve = [[10.0, 100.0, -5.0], [20.0, 400.0, 3.0], [30.0, 900.0, 6.0], [40.0, 1100.0, 9.0]]
    assert bench.score_at(curve, 1000) == 6.0  # the last summary at or before the budget
    assert bench.score_at(curve, 50) is None
    assert bench.seconds_to_reach(curve, 3.0) == 20.0
    assert bench.seconds_to_reach(curve, 10.0) is None


def test_the_table_compares_medians_and_counts_a_seed_that_never_got_there_as_slowest():
    sf = [run("sf", 1, [[100.0, 1000.0, 10.0]], 100.0), run("sf", 2, [[120.0, 1000.0, 12.0]], 120.0)]
    appo = [run("appo", 1, [[20.0, 500.0, 11.5], [50.0, 1000.0, 13.0]], 50.0),
            run("appo", 2, [[30.0, 500.0, 10.5], [60.0, 1000.0, 12.0]], 60.0),
            run("appo", 3, [[60.0, 1000.0, 5.0]], 60.0),  # never reaches Sample Factory's 11
            run("appo", 4, [], 5.0, status="failed (exit code 1)")]
    row = bench.summarize_env("doom_x", 1000, {"appo": appo, "sf": sf}, "same")
    assert row["baseline_final_median"] == 11.0 and row["appo_median"] == 12.0
    assert row["appo_s_to_baseline_final"] == [20.0, 60.0, None]
    assert row["appo_s_to_baseline_final_median"] == 60.0  # median of 20, 60 and "never"
    assert row["time_ratio"] == pytest.approx(60.0 / 110.0)
    table = bench.format_table([row])
    assert "| doom_x | 0.001M | 12.00 [5.00, 13.00] (3) | 11.00 [10.00, 12.00] (2) |" in table
    assert "seed 4: failed (exit code 1)" in table

    appo[1]["curve"][0][2] = 5.0  # now two of three seeds never get there: no time, no ratio
    appo[1]["curve"][1][2] = 5.0
    row = bench.summarize_env("doom_x", 1000, {"appo": appo, "sf": sf}, "same")
    assert row["appo_s_to_baseline_final_median"] is None and row["time_ratio"] is None


def test_sample_factorys_score_is_the_whole_games_raw_score_on_atari_and_the_true_objective_on_doom(tmp_path):
    """On Atari Sample Factory's avg_true_objective sums the clipped rewards of one life; the raw
    score of a whole game is its RecordEpisodeStatistics_reward. doom_basic's is scaled by 0.01."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(os.path.join(tmp_path, "run", ".summary", "0")) as writer:
        for step, per_life, game in ((1000, 4.0, 30.0), (2000, 5.0, 42.0)):
            writer.add_scalar("policy_stats/avg_true_objective", per_life, step)
            writer.add_scalar("policy_stats/avg_RecordEpisodeStatistics_reward", game, step)
    assert [point[1:] for point in bench.sf_curve(str(tmp_path), 0.0, "atari_breakout")] == [[1000, 30.0], [2000, 42.0]]
    assert [point[1:] for point in bench.sf_curve(str(tmp_path), 0.0, "doom_basic")] == [[1000, 400.0], [2000, 500.0]]


def test_sb3s_score_is_read_as_appos_is_and_both_sit_in_one_row_at_equal_steps(tmp_path):
    """Stable-Baselines3 writes rollout/ep_rew_mean (its Monitor's returns, last 100 episodes) at
    env steps with torch's SummaryWriter, under tb/<env id>/PPO_1, as written here; appo.py its
    true_return at frames trained. Both curves are read at the budget the same way, and a gym: env's
    row and table put SB3 where a Doom env's put Sample Factory."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(os.path.join(tmp_path, "sb3", "run", "tb", "Hopper-v5", "PPO_1")) as writer:
        for step, score in ((512, 20.0), (1024, 35.0), (1536, 50.0)):
            writer.add_scalar("rollout/ep_rew_mean", score, step)
            writer.add_scalar("train/loss", -score, step)  # any other tag is not the score
    with SummaryWriter(os.path.join(tmp_path, "appo", "run", "tb")) as writer:
        for step, trained, score in ((600, 512, 21.0), (1100, 1024, 40.0), (1700, 1536, 45.0)):
            writer.add_scalar(bench.APPO_FRAMES_TAG, trained, step)  # the same write: collected at step
            writer.add_scalar(bench.APPO_SCORE_TAG, score, step)
    sb3_curve = bench.sb3_curve(str(tmp_path / "sb3"), 0.0)
    appo_curve = bench.appo_curve(str(tmp_path / "appo"), 0.0)
    assert [point[1:] for point in sb3_curve] == [[512, 20.0], [1024, 35.0], [1536, 50.0]]
    assert [point[1:] for point in appo_curve] == [[512, 21.0], [1024, 40.0], [1536, 45.0]]
    assert bench.score_at(sb3_curve, 1024) == 35.0 and bench.score_at(appo_curve, 1024) == 40.0
    assert bench.frame_axis_check("sb3", str(tmp_path / "sb3"), "gym:Hopper-v5") is None  # no frameskip

    def saved(trainer, seed, curve):
        return {**run(trainer, seed, curve, 60.0), "config": {"trainer": trainer, "seed": seed, "code": "c0de",
                                                               **({"zoo_entry": "Hopper-v4"} if trainer == "sb3" else {})}}
    row = bench.summarize_env("gym:Hopper-v5", 1024, {"appo": [saved("appo", 1, appo_curve)],
                                                      "sb3": [saved("sb3", 1, sb3_curve)]}, "appo.py alone")
    assert row["baseline"] == "sb3" and "sf" not in row
    assert row["appo_median"] == 40.0 and row["baseline_final_median"] == 35.0  # the baseline's median
    table = bench.format_table([row])
    assert "| gym:Hopper-v5 | 0.001024M | 40.00 (1) | 35.00 (1) | Hopper-v4 |" in table
    assert "Sample Factory" not in table


def test_sb3_takes_the_zoos_entry_for_the_env_or_its_newest_tuned_version(capsys):
    zoo = {"Hopper-v3": {}, "Hopper-v4": {}, "HalfCheetah-v4": {}, "LunarLander-v3": {}, "HopperHop-v9": {}}
    assert bench.zoo_entry_for(zoo, "LunarLander-v3") == "LunarLander-v3"
    assert bench.zoo_entry_for(zoo, "Hopper-v5") == "Hopper-v4"  # not HopperHop's
    assert bench.zoo_entry_for(zoo, "Walker2d-v5") is None
    with pytest.raises(SystemExit):  # sb3 is read beside gym: envs only
        bench.parse_args(["--envs", "doom_basic", "--trainers", "appo,sb3", "--report_only"])
    assert "doom_basic is read beside Sample Factory, not SB3: give --trainers appo,sf" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--envs", "gym:Hopper-v5", "--trainers", "appo,sb3"])
    assert "--sb3_python: give Stable-Baselines3's interpreter (bench/setup_sb3.sh makes one)" in capsys.readouterr().err


def test_the_rank_test_counts_the_splits_at_least_as_lopsided_as_the_real_one():
    # both SF seeds above all three appo seeds: only that one of the C(5, 2) = 10 splits is as lopsided
    assert bench.p_appo_below([1.0, 2.0, 3.0], [4.0, 5.0]) == pytest.approx(1 / 10)
    # appo 1 and 3 around SF's 2: SF beats one appo seed; the splits with SF = 2 or 3 beat at least one
    assert bench.p_appo_below([1.0, 3.0], [2.0]) == pytest.approx(2 / 3)
    # identical scores tie everywhere: nothing to see
    assert bench.p_appo_below([7.0, 7.0], [7.0, 7.0]) == 1.0
    assert bench.p_appo_below([], [1.0]) is None and bench.p_appo_below([1.0, None], []) is None
    sf = [run("sf", seed, [[100.0, 1000.0, score]], 100.0) for seed, score in ((1, 10.0), (2, 12.0))]
    appo = [run("appo", seed, [[50.0, 1000.0, score]], 50.0) for seed, score in ((1, 8.0), (2, 9.0), (3, 13.0))]
    row = bench.summarize_env("doom_x", 1000, {"appo": appo, "sf": sf}, "same")
    assert row["p_appo_below"] == pytest.approx(bench.p_appo_below([8.0, 9.0, 13.0], [10.0, 12.0]))
    assert f"| {row['p_appo_below']:.2f} |" in bench.format_table([row])


def test_on_the_wall_clock_axis_a_run_that_finished_early_keeps_its_final_score():
    fast = [[0.0, 0.0, 0.0], [10.0, 1000.0, 10.0]]  # (seconds, frames, score)
    slow = [[0.0, 0.0, 0.0], [20.0, 1000.0, 4.0]]
    grid = np.array([5.0, 15.0, 25.0])
    median, low, high = bench.band([fast, slow], 0, grid, hold_last=True)
    assert median[1] == pytest.approx((10.0 + 3.0) / 2) and low[1] == 3.0 and high[1] == 10.0
    assert median[2] == pytest.approx(7.0)  # both finished: the median of their final scores
    median, _, _ = bench.band([fast, slow], 0, grid)  # without: past its end a run drops out
    assert median[1] == pytest.approx(3.0) and np.isnan(median[2])


def test_a_run_that_shared_the_machine_is_marked():
    sf = [run("sf", 1, [[100.0, 1000.0, 10.0]], 100.0, share=0.3)]
    row = bench.summarize_env("doom_x", 1000, {"appo": [], "sf": sf}, "same")
    assert "30% of the CPU went elsewhere" in bench.format_table([row])


def test_an_ablations_table_names_the_flags_it_changed():
    appo = [run("appo", seed, [[60.0, 1000.0, 5.0]], 60.0) for seed in (1, 2)]
    for result in appo:
        result["config"]["extra_flags"] = ["--encoder_dtype", "float32"]
    row = bench.summarize_env("doom_x", 1000, {"appo": appo, "sf": []}, "same")
    assert "flags beyond its defaults: --encoder_dtype float32\n" in bench.format_table([row])
    plain = bench.summarize_env("doom_x", 1000, {"appo": [run("appo", 1, [[60.0, 1000.0, 5.0]], 60.0)], "sf": []}, "same")
    assert "beyond its defaults" not in bench.format_table([plain])


def test_round_twos_choice_follows_the_pre_registered_r1_prime(tmp_path):
    """R1' as learning.md words it: at least 8 of 10 HalfCheetah seeds at or above 3,000 and more
    than baseline's, a higher HalfCheetah median, and on Walker2d and Hopper neither all 3 seeds below
    all 3 of baseline's nor a median below baseline's by more than baseline's spread; among those,
    within 5% of the best median, the fewest changed flags. Only seeds 1-3 of Walker2d and Hopper count."""
    def save(arm, env_name, seed, score):
        path = tmp_path / arm / env_name / f"appo_seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run("appo", seed, [[60.0, 500_000.0, 0.0], [120.0, 1_000_448.0, score]], 120.0)))

    halfcheetah = {"baseline": [4000] * 5 + [1500] * 5,  # 5 of 10, median 2,750
                   "quiet": [4000] * 9 + [1500],  # 9 of 10, median 4,000: qualifies
                   "shuffle": [3900] * 8 + [1500] * 2,  # 8 of 10, median 3,900, within 5% of 4,000, one flag
                   "shuffle10": [5000] * 10,  # the best median, but Walker2d below
                   "scale": [4000] * 7 + [1500] * 3}  # 7 of 10
    others = {"baseline": [3000, 3200, 3400], "quiet": [3000, 3200, 3400], "shuffle": [2900, 3000, 3100],
              "shuffle10": [2000, 2100, 2200], "scale": [3000, 3200, 3400]}
    for arm, scores in halfcheetah.items():
        for seed, score in enumerate(scores, 1):
            save(arm, "gym:HalfCheetah-v5", seed, score)
        for env_name in ("gym:Walker2d-v5", "gym:Hopper-v5"):
            theirs = [2700, 3050, 2600] if (arm, env_name) == ("scale", "gym:Hopper-v5") else others[arm]
            for seed, score in enumerate(theirs, 1):
                save(arm, env_name, seed, score)
    save("baseline", "gym:Walker2d-v5", 4, 100)  # seed 4 is reported, not read: read, it would clear shuffle10

    reading, chosen = bench.round2_choice(str(tmp_path))
    lines = reading.splitlines()
    assert chosen == "shuffle"
    assert lines[0] == "- quiet: qualifies (HalfCheetah: 9 of 10 at or above 3,000, median 4,000)"
    assert lines[1] == "- shuffle: qualifies (HalfCheetah: 8 of 10 at or above 3,000, median 3,900)"
    assert lines[2] == ("- shuffle10: does not qualify: gym:Walker2d-v5: all 3 seeds below all 3 of baseline's; "
                        "gym:Walker2d-v5: median 2,100 below baseline's 3,200 by more than its spread; "
                        "gym:Hopper-v5: all 3 seeds below all 3 of baseline's; "
                        "gym:Hopper-v5: median 2,100 below baseline's 3,200 by more than its spread "
                        "(HalfCheetah: 10 of 10 at or above 3,000, median 5,000)")
    assert lines[3] == ("- scale: does not qualify: basin rate 7 of 10, below 8; "
                        "gym:Hopper-v5: median 2,700 below baseline's 3,200 by more than its spread "
                        "(HalfCheetah: 7 of 10 at or above 3,000, median 4,000)")
    assert lines[-1] == "R1' chooses shuffle (HalfCheetah median 3,900; the highest qualifying 4,000), for seeds 4-5 and R2."

    (tmp_path / "quiet" / "gym:Hopper-v5" / "appo_seed2.json").unlink()
    (tmp_path / "scale" / "gym:HalfCheetah-v5" / "appo_seed9.json").unlink()
    assert bench.round2_choice(str(tmp_path)) == ("R1' reads nothing yet: 2 of Stage 1's 80 runs are missing "
                                                  "(the first: gym:Hopper-v5 seed 2, quiet).", None)


def test_round_twos_held_out_rule_needs_no_env_all_below_and_a_mean_gain_of_at_least_zero(tmp_path):
    """R2 as learning.md words it for round two, on made-up runs: a Box-only arm is not compared on
    the discrete guards (they run it as baseline); the gain is the mean of (arm - baseline) /
    |baseline - random| over the envs compared, worked out here by hand."""
    def save(arm, env_name, seed, score, budget):
        path = tmp_path / "held_out" / arm / env_name / f"appo_seed{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run("appo", seed, [[60.0, budget, score]], 60.0)))

    box = ["gym:InvertedDoublePendulum-v5", "gym:Swimmer-v5", "gym:Reacher-v5", "gym:Ant-v5", "gym:LunarLanderContinuous-v3"]
    random_play = dict.fromkeys(box + ["gym:CartPole-v1", "gym:Acrobot-v1"], 0.0)
    for env_name in box:
        for seed in (1, 2, 3):
            save("baseline", env_name, seed, 100.0, 1_000_000)
            save("quiet", env_name, seed, 110.0 if env_name == "gym:Swimmer-v5" else 100.0, 1_000_000)
            save("shuffle", env_name, seed, 100.0, 1_000_000)
    for env_name in ("gym:CartPole-v1", "gym:Acrobot-v1"):
        for seed in (1, 2, 3):
            save("baseline", env_name, seed, 500.0, 500_000)
    # quiet: +10% on Swimmer alone, so the gain is 0.1 / 5 = +0.020 over the five Box envs
    assert bench.round2_held_out("quiet", str(tmp_path), random_play) == (
        "R2 holds for quiet on 5 envs: mean (arm - baseline) / |baseline - random| +0.020; every seed below "
        "baseline's on no env: quiet becomes the gym default for Box actions.")
    assert bench.round2_held_out("shuffle", str(tmp_path), random_play) == "R2 reads nothing yet: 6 of its 42 runs are missing."
    for seed, score in zip((1, 2, 3), (490.0, 495.0, 499.0)):  # CartPole: every seed below baseline's
        save("shuffle", "gym:CartPole-v1", seed, score, 500_000)
        save("shuffle", "gym:Acrobot-v1", seed, 500.0 + 35.0 * seed, 500_000)  # median 570: +0.14, the gain above 0
    assert bench.round2_held_out("shuffle", str(tmp_path), random_play) == (
        "R2 fails for shuffle on 7 envs: mean (arm - baseline) / |baseline - random| +0.019; every seed below "
        "baseline's on gym:CartPole-v1: no gym default changes.")


def test_any_change_to_the_trainer_or_the_flags_changes_the_saved_configurations_key(monkeypatch):
    args = bench.parse_args(["--envs", "doom_basic", "--trainers", "appo"])
    key = bench.config_key(bench.run_config(args, "appo", "doom_basic", 1))
    assert key == bench.config_key(bench.run_config(args, "appo", "doom_basic", 1))
    assert key != bench.config_key(bench.run_config(args, "appo", "doom_basic", 2))
    args.appo_flags = "--batch_size 512"
    assert key != bench.config_key(bench.run_config(args, "appo", "doom_basic", 1))
    args.appo_flags = ""
    monkeypatch.setattr(bench, "appo_code_hash", lambda: "edited")
    assert key != bench.config_key(bench.run_config(args, "appo", "doom_basic", 1))


def test_the_saved_sb3_and_sample_factory_runs_keep_the_setup_hash_the_bench_gives_now():
    """An SB3 or Sample Factory run's key holds its setup script's hash ("setup"), which covers the
    script's path with its bytes. The scripts moved from scripts/ to bench/ and are hashed under their
    old names: the saved runs are still ones the bench would make, found rather than run again."""
    setups = {}
    for path in glob.glob(os.path.join(REPO, "docs", "bench", "**", "*.json"), recursive=True):
        run = bench.load_result(path)
        if isinstance(run, dict) and isinstance(run.get("config"), dict) and "setup" in run["config"]:
            setups.setdefault(run["config"]["trainer"], set()).add(run["config"]["setup"])
    given = os.path.join(REPO, "docs", "bench", "gym_crossover", "sb3_at_appo_defaults.json")  # (no zoo to ask)
    sb3 = bench.run_config(bench.parse_args(["--envs", "gym:Hopper-v5", "--trainers", "sb3", "--report_only",
                                             "--sb3_hyperparams", given]), "sb3", "gym:Hopper-v5", 1)
    sf = bench.run_config(bench.parse_args(["--envs", "doom_basic", "--trainers", "sf", "--report_only"]), "sf",
                          "doom_basic", 1)
    assert sb3["setup"] == bench.setup_hash("setup_sb3.sh") and sb3["setup"] in setups["sb3"]
    assert sf["setup"] == bench.setup_hash("setup_sample_factory.sh") and sf["setup"] in setups["sf"]


def test_the_report_shows_runs_of_earlier_code_and_says_so(monkeypatch, tmp_path, capsys):
    """A suite takes longer than the code stays still: --report_only keeps reporting runs made at
    another version of appo.py, and names that version; a run with other flags is never reported."""
    monkeypatch.setattr(bench, "appo_code_hash", lambda: "earlier")
    args = bench.parse_args(["--envs", "doom_basic", "--trainers", "appo", "--results_dir", str(tmp_path)])
    saved = {"key": bench.config_key(bench.run_config(args, "appo", "doom_basic", 1)), "status": "ok",
             "config": bench.run_config(args, "appo", "doom_basic", 1), "commit": "abc1234", "wall_s": 60.0,
             "curve": [[60.0, 500_000.0, 70.0]], "other_cpu_share": 0.0}
    bench.save_json(bench.result_path(args, "appo", "doom_basic", 1), saved)
    monkeypatch.setattr(bench, "appo_code_hash", lambda: "now")
    assert not bench.same_but_code({**saved, "config": {**saved["config"], "extra_flags": ["--rollout=16"]}},
                                   bench.run_config(args, "appo", "doom_basic", 1))
    bench.main(["--envs", "doom_basic", "--results_dir", str(tmp_path), "--report_only"])
    table = capsys.readouterr().out
    assert "| doom_basic | 0.5M | 70.00 (1) |" in table
    assert "earlier (this checkout's code is now: the runs are of an earlier version)" in table


def test_sb3s_runs_can_live_apart_from_appo_pys(monkeypatch, tmp_path, capsys):
    """--sb3_results_dir: the gym: table's appo.py runs are also the SB3 table's appo.py side, so SB3's
    runs are saved and read in a folder of their own, and the report puts both in one row."""
    appo_dir, sb3_dir = tmp_path / "gym", tmp_path / "gym_sb3"
    argv = ["--envs", "gym:Hopper-v5", "--trainers", "appo,sb3", "--results_dir", str(appo_dir),
            "--sb3_results_dir", str(sb3_dir), "--report_only"]
    args = bench.parse_args(argv)
    for trainer, score in (("appo", 1500.0), ("sb3", 1000.0)):
        config = bench.run_config(args, trainer, "gym:Hopper-v5", 1)
        path = bench.result_path(args, trainer, "gym:Hopper-v5", 1)
        assert path.startswith(str(appo_dir if trainer == "appo" else sb3_dir) + os.sep), path
        bench.save_json(path, {"key": bench.config_key(config), "status": "ok", "config": config, "commit": "abc1234",
                               "wall_s": 60.0, "curve": [[60.0, 1_000_000.0, score]], "other_cpu_share": 0.0})
    assert bench.parse_args(argv[:6] + ["--report_only"]).sb3_results_dir == str(appo_dir)  # one folder by default
    bench.main(argv)
    assert "| gym:Hopper-v5 | 1M | 1500.00 (1) | 1000.00 (1) |" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--envs", "dmlab_30", "--trainers", "appo"])
    assert "dmlab_30 is not a doom_*, atari_*, gym: or pz: env" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--envs", "doom_basic"])  # Sample Factory's runs need its interpreter
    assert "--sf_python" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # appo.py plays this one on Sample Factory's map, found through it
        bench.parse_args(["--envs", "doom_health_gathering_supreme", "--trainers", "appo"])
    assert "load Sample Factory's scenario files" in capsys.readouterr().err


def test_the_task_probe_plays_doom_basic_the_same_way_twice(tmp_path):
    """The probe replays a fixed action sequence from a seed: two probes of the same trainer agree
    exactly (what check_task compares across trainers)."""
    first = bench.probe(sys.executable, "appo", "doom_basic", str(tmp_path / "a.npz"))
    second = bench.probe(sys.executable, "appo", "doom_basic", str(tmp_path / "b.npz"))
    assert first["action_sizes"].tolist() == [4]
    assert len(first["rewards"]) == 200 and first["dones"].any()  # episodes end and restart within 200 steps
    assert np.array_equal(first["screens"], second["screens"]) and np.array_equal(first["rewards"], second["rewards"])


def test_a_patched_sample_factory_configuration_sets_what_it_has_no_flag_for(tmp_path):
    """doom_batch_512_area_resize: the batch as a flag, the area resize by a sitecustomize module on
    the run's PYTHONPATH. Sample Factory is not installed here, so the patch runs against a stand-in
    sample_factory.envs.env_wrappers whose ResizeWrapper has Sample Factory 2.1.1's signature."""
    args = bench.parse_args(["--envs", "doom_defend_the_center", "--trainers", "appo",
                             "--sf_config", "doom_batch_512_area_resize"])
    config = bench.run_config(args, "sf", "doom_defend_the_center", 1)
    assert config["extra_flags"] == ["--batch_size", "512"] and config["patch"] == "area_resize"
    stand_in = tmp_path / "stand_in" / "sample_factory" / "envs"
    stand_in.mkdir(parents=True)
    for package in (stand_in.parent, stand_in):
        (package / "__init__.py").write_text("")
    (stand_in / "env_wrappers.py").write_text(
        "class ResizeWrapper:\n"
        "    def __init__(self, env, w, h, grayscale=True, add_channel_dim=False, area_interpolation=False):\n"
        "        self.area_interpolation = area_interpolation\n")
    made_as_doom_utils_makes_it = ("from sample_factory.envs.env_wrappers import ResizeWrapper; "
                                   "print(ResizeWrapper(None, 128, 72, grayscale=False).area_interpolation)")
    for environment, expected in ((bench.patched_environment(config, str(tmp_path)), "True"),
                                  (dict(os.environ), "False")):
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [environment.get("PYTHONPATH"), str(tmp_path / "stand_in")]))
        printed = subprocess.run([sys.executable, "-c", made_as_doom_utils_makes_it], env=environment,
                                 capture_output=True, text=True, cwd=tmp_path / "stand_in")
        assert printed.stdout.strip() == expected, printed.stderr
    assert bench.patched_environment(bench.run_config(args, "appo", "doom_defend_the_center", 1), str(tmp_path)) is None


def test_the_task_check_tells_the_same_task_from_one_with_another_reward(tmp_path, monkeypatch):
    """check_task compares the two trainers' probes. Sample Factory's interpreter is not here, so
    both sides are appo.py's env, loaded from copies of doom_basic's scenario files: the same copy
    on both sides, then one whose living reward was changed."""
    import vizdoom

    for name, living_reward in (("same", "-1"), ("changed", "-2")):
        (tmp_path / name).mkdir()
        shutil.copy(os.path.join(vizdoom.scenarios_path, "basic.wad"), tmp_path / name)
        with open(os.path.join(vizdoom.scenarios_path, "basic.cfg")) as f:
            text = f.read().replace("living_reward = -1", f"living_reward = {living_reward}")
        (tmp_path / name / "basic.cfg").write_text(text)
    real_probe = bench.probe
    theirs = {"folder": str(tmp_path / "same")}
    monkeypatch.setattr(bench, "probe", lambda python, trainer, env_name, out, flags=(): real_probe(
        sys.executable, "appo", env_name, out,
        ("--doom_scenarios_dir", theirs["folder"] if trainer == "sf" else str(tmp_path / "same"))))
    args = argparse.Namespace(sf_python=sys.executable)
    assert bench.check_task(args, "doom_basic").startswith("same rewards over 200 steps, identical screens")
    theirs["folder"] = str(tmp_path / "changed")
    assert bench.check_task(args, "doom_basic").startswith("DIFFERENT rewards")


@pytest.mark.slow
def test_a_short_appo_run_gives_a_curve_on_frames_trained_and_leaves_nothing(tmp_path, monkeypatch):
    tag = uuid.uuid4().hex
    monkeypatch.setenv("APPO_TEST_TAG", tag)
    args = bench.parse_args(["--envs", "doom_basic", "--trainers", "appo", "--frames", "20000",
                             "--results_dir", str(tmp_path), "--appo_flags=--num_envs_per_worker=4", "--keep_checkpoints"])
    shm_before = shm_entries()
    result = bench.run_one(args, bench.run_config(args, "appo", "doom_basic", 1))
    assert result["status"] == "ok", result["log_tail"]
    assert result["machine"]["cores"] == os.cpu_count() and isinstance(result["machine"]["bfloat16"], bool)
    import torch
    import vizdoom  # the versions of what decided the run, as installed here

    def release(version: str) -> str:  # a local suffix aside: PyPI's CUDA wheel records 2.14.1, reports 2.14.1+cu130
        return str(version).split("+", 1)[0]
    assert release(result["versions"]["torch"]) == release(torch.__version__), (result["versions"], torch.__version__)
    assert release(result["versions"]["vizdoom"]) == release(vizdoom.__version__), result["versions"]
    # the precision it trained in, read from its saved configuration: auto resolves by the CPU
    assert result["precision"] == ("bfloat16 encoder" if result["machine"]["bfloat16"] else "float32 encoder")
    frames = [point[1] for point in result["curve"]]
    assert frames and frames == sorted(frames) and frames[-1] >= 20000 * 0.75
    batch_size = env.env_defaults("doom_basic")["batch_size"]
    assert all(frame % (batch_size * 4) == 0 for frame in frames)  # whole batches of steps x frameskip 4: trained, not collected
    assert processes_tagged(tag) == [] and shm_left_by_this_run(shm_before) == []
    assert not os.path.exists(os.path.join(tmp_path, "doom_basic", "appo_seed1.log"))
    with open(os.path.join(tmp_path, bench.STARTED_LOG)) as f:  # the run's start, noted before it ran
        [started] = [json.loads(line) for line in f]
    assert (started["trainer"], started["env"], started["seed"], started["key"]) == ("appo", "doom_basic", 1, result["key"])
    # what a diagnosis needs, at the summaries' frames trained: every learner figure, the last one kept
    diagnostics = result["diagnostics"]
    assert sorted(diagnostics) == sorted(bench.APPO_DIAGNOSTIC_TAGS)
    for name, points in diagnostics.items():
        assert points and all(point[0] in frames for point in points), name
        assert points[-1][0] == frames[-1] and 0 < len(points) <= bench.DIAGNOSTIC_POINTS
    assert all(0 <= value <= 1 for _, value in diagnostics["clip_fraction"])
    # the final checkpoint, kept beside the result file: the one that trained the last summary's frames
    kept = torch.load(os.path.join(tmp_path, "doom_basic", result["checkpoint"]), weights_only=True)
    assert result["checkpoint"] == "appo_seed1.pth" and kept["cfg"]["env"] == "doom_basic"
    assert kept["env_frames"] >= frames[-1]


def test_a_run_that_fails_to_start_is_saved_with_its_exit_code_and_its_error(tmp_path):
    """It was saved as a frame axis problem (no config.json to read), which hid its error: MuJoCo not
    installed, 2026-12-03."""
    (tmp_path / "basic.cfg").write_text("doom_scenario_path = no_such.wad\n")  # the flags are right, the env is not
    args = bench.parse_args(["--envs", "doom_basic", "--trainers", "appo", "--frames", "40000",
                             "--results_dir", str(tmp_path / "results"),
                             f"--appo_flags=--doom_scenarios_dir={tmp_path}"])
    result = bench.run_one(args, bench.run_config(args, "appo", "doom_basic", 1))
    assert result["status"] == "failed (exit code 1)" and result["curve"] == []
    assert any("doom_basic failed to start" in line and "no_such.wad" in line for line in result["log_tail"])


def test_a_named_sample_factory_configuration_is_part_of_the_saved_configuration():
    """--sf_config doom_batch_512 gives Sample Factory the batch the Doom family took from appo.py's
    own measurement; the published configuration keeps the key of the results saved before."""
    flags = ["--envs", "doom_defend_the_center", "--trainers", "sf", "--sf_python", sys.executable]
    published = bench.run_config(bench.parse_args(flags), "sf", "doom_defend_the_center", 1)
    tuned = bench.run_config(bench.parse_args(flags + ["--sf_config", "doom_batch_512"]), "sf",
                             "doom_defend_the_center", 1)
    assert "sf_config" not in published and published["extra_flags"] == []
    assert tuned["sf_config"] == "doom_batch_512" and tuned["extra_flags"] == ["--batch_size", "512"]
    assert bench.config_key(published) != bench.config_key(tuned)
    saved = json.loads(open(os.path.join(bench.REPO, "docs", "bench", "learning", "doom_defend_the_center",
                                         "sf_seed1.json")).read())
    assert saved["key"] == bench.config_key(published)  # still the run the bench would make: reused, not re-run


@pytest.mark.parametrize("trainer, saved, wrong", [
    ("appo", {"env_frameskip": 4}, None),
    ("appo", {"env_frameskip": 1}, "appo.py's env_frameskip 1, expected 4"),
    ("sf", {"env_frameskip": 4, "summaries_use_frameskip": True}, None),
    ("sf", {"env_frameskip": 4, "summaries_use_frameskip": False}, "summaries_use_frameskip False"),
    ("sf", {}, "Sample Factory's env_frameskip None"),
])
def test_the_frame_axis_check_reads_each_trainers_saved_configuration(tmp_path, trainer, saved, wrong):
    """Both trainers' curves must count env frames with the frameskip (doom_basic's is 4): a run
    whose saved configuration says otherwise is named, not plotted on the wrong axis."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    found = bench.frame_axis_check(trainer, str(tmp_path), "doom_basic")
    assert found is None if wrong is None else wrong in found


def test_headline_cells_count_only_finished_runs_and_name_a_single_seed(tmp_path):
    curve = [[60.0, 1000.0, 20.0]]
    for seed, score in ((1, 20.0), (2, 22.0)):
        bench.save_json(str(tmp_path / "doom_x" / f"sf_doom_batch_512_seed{seed}.json"),
                        {**run("sf", seed, [[60.0, 1000.0, score]], 60.0), "status": "ok"})
    bench.save_json(str(tmp_path / "doom_x" / "sf_doom_batch_512_seed3.json"), run("sf", 3, curve, 60.0, status="stalled"))
    runs = bench.saved_runs(str(tmp_path), "doom_x", "sf_doom_batch_512")
    assert [r["config"]["seed"] for r in runs] == [1, 2]  # the failed run is not a score
    assert bench.headline_cell(runs, 1000) == "21.00 [20.00, 22.00]"
    assert bench.headline_cell(runs[:1], 1000) == "20.00 (1 seed)"
    assert bench.saved_runs(str(tmp_path), "doom_y", "sf_doom_batch_512") == []


@pytest.mark.parametrize("trainer, saved, expected", [
    ("appo", {"encoder_dtype": "bfloat16"}, "bfloat16 encoder"),
    ("appo", {"encoder_dtype": "float32"}, "float32 encoder"),
    ("appo", {}, "not recorded"),  # no saved configuration: said, not guessed
    ("sf", {}, "float32"),
])
def test_each_run_records_the_precision_its_trainer_ran_and_the_table_says_it(tmp_path, trainer, saved, expected):
    """Issue 51: appo.py's encoder runs in bfloat16 where the CPU computes it, Sample Factory in
    float32, so the wall-clock columns compare different precisions: every run says which."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
    assert bench.trainer_precision(trainer, str(tmp_path)) == expected
    runs = [{**run(trainer, 1, [[60.0, 1000.0, 20.0]], 60.0), "precision": expected},
            {**run(trainer, 2, [[60.0, 1000.0, 21.0]], 60.0), "precision": expected}]
    row = bench.summarize_env("doom_x", 1000, {trainer: runs}, "same")
    name = "appo.py" if trainer == "appo" else "Sample Factory"
    assert f"Precision: {name} {expected} (2 runs)." in bench.format_table([row])


def test_every_saved_learning_run_says_its_precision():
    """The result files under docs/bench record the precision each run trained in, or say that it
    was not recorded; Sample Factory's and Stable-Baselines3's runs are float32. Where a run's own
    flags name its precision (`--encoder_dtype`, in its configuration), the record is that one; where
    it ran at `auto` on a recorded machine, the record follows the machine's bfloat16 (the two come
    from different places: appo.py's resolved configuration, and the bench's probe of the CPU)."""
    runs = [bench.load_result(path) for path in glob.glob(os.path.join(REPO, "docs", "bench", "**", "*.json"),
                                                          recursive=True)]
    runs = [r for r in runs if isinstance(r, dict) and "curve" in r and "config" in r]
    assert len(runs) > 200
    flagged = 0
    for r in runs:
        allowed = ({"float32"} if r["config"]["trainer"] in ("sf", "sb3")
                   else {"bfloat16 encoder", "float32 encoder", "not recorded"})
        assert r.get("precision") in allowed, r["config"]
        if r["config"]["trainer"] != "appo":
            continue
        flags = r["config"].get("extra_flags", [])
        if "--encoder_dtype" in flags:
            flagged += 1
            assert r["precision"] == f"{flags[flags.index('--encoder_dtype') + 1]} encoder", r["config"]
        elif r.get("machine"):
            assert r["precision"] == ("bfloat16 encoder" if r["machine"]["bfloat16"] else "float32 encoder")
    assert flagged >= 5  # the float32 ablation's runs


def test_the_tables_count_the_first_run_of_each_seed_and_a_rerun_stays_aside():
    """docs/results/learning.md's rule: no run is replaced for contention or its score; a rerun
    kept in a replaced/ folder is of the same configuration and seed as the counted run, and
    started after it."""
    import glob
    reruns = glob.glob(os.path.join(REPO, "docs", "bench", "**", "replaced", "*.json"), recursive=True)
    assert reruns
    for path in reruns:
        rerun = bench.load_result(path)
        env_name, trainer, seed = rerun["config"]["env"], rerun["config"]["trainer"], rerun["config"]["seed"]
        counted = bench.load_result(os.path.join(os.path.dirname(os.path.dirname(path)), env_name,
                                                 f"{trainer}_seed{seed}.json"))
        assert counted["key"] == rerun["key"], path
        assert counted["started_at"] < rerun["started_at"], f"{path}: the table counts the later run"


def test_the_contention_table_lists_each_shared_run_where_it_is_kept_and_the_highest_share_of_the_rest(tmp_path):
    def save(path, trainer, env_name, seed, share, **config):
        result = run(trainer, seed, [[60.0, 1000.0, 1.0]], 60.0, share=share)
        result["config"].update(env=env_name, extra_flags=[], **config)
        bench.save_json(str(tmp_path / path), result)

    save("learning/doom_x/appo_seed1.json", "appo", "doom_x", 1, 0.051)
    save("learning/doom_x/appo_seed2.json", "appo", "doom_x", 2, 0.05)  # 5% is not over 5%
    save("learning/doom_x/appo_seed3.json", "appo", "doom_x", 3, 0.30)
    save("learning/doom_x/sf_seed1.json", "sf", "doom_x", 1, 0.01)
    save("gym/superseded_1/gym:Y-v0/appo_seed1.json", "appo", "gym:Y-v0", 1, 0.2)
    save("heldout/replaced/doom_z_appo_seed1_rerun.json", "appo", "doom_z", 1, 0.07)  # kept flat, no env folder
    save("ablations/mine/doom_x/sf_doom_batch_512_seed2.json", "sf", "doom_x", 2, 0.09, sf_config="doom_batch_512")
    (tmp_path / "learning" / "doom_x" / "task_match.json").write_text(json.dumps({"task": "same"}))  # no run
    lines = bench.contention_table(str(tmp_path)).splitlines()
    assert lines[:2] == bench.CONTENTION_HEADER
    assert lines[2:6] == [  # the folders that make a table first, then the others by path
        "| doom_x | appo.py | defaults, code c0de | 1, 3 | 5.1%, 30.0% | `learning/`: the Doom suite and Atari "
        "tables, the README |",
        "| doom_x | Sample Factory | doom_batch_512 | 2 | 9.0% | `ablations/mine/` |",
        "| gym:Y-v0 | appo.py | defaults, code c0de | 1 | 20.0% | `gym/superseded_1/`: set aside, counted in no table |",
        "| doom_z | appo.py | defaults, code c0de | 1 | 7.0% | `heldout/replaced/`: set aside, counted in no table |"]
    assert lines[6:] == ["", "5 of the 7 saved runs under docs/bench/ shared the machine; every other run had at "
                             "most 5.0% of the CPU elsewhere."]


def test_the_sb3_table_read_at_equal_seconds_takes_each_side_at_the_others_minutes(tmp_path):
    """`--equal_seconds`: SB3's curves are read at appo.py's median minutes to its budget, and appo.py's
    at SB3's from its longer runs when a folder of them exists (else from the table's own runs, read at
    their end); the steps where each side was read are printed beside its scores. appo.py's runs are
    the gym: table's, in a folder apart from SB3's."""
    def save(root, trainer, seed, wall_s, frames, points):
        folder = root / "gym:Hopper-v5"
        folder.mkdir(parents=True, exist_ok=True)
        run = {"status": "ok", "wall_s": wall_s, "config": {"seed": seed, "frames": frames, "trainer": trainer},
               "curve": points}
        (folder / f"{trainer}_seed{seed}.json").write_text(json.dumps(run))
    table, sb3_table, long_table = tmp_path / "gym", tmp_path / "gym_sb3", tmp_path / "gym_sb3_4m"
    for seed in (1, 2, 3):
        # SB3: 30 minutes to 1M, 100 + seed at 300 s (appo.py's median), 500 + seed at the budget
        save(sb3_table, "sb3", seed, 1800.0, 1_000_000, [[300.0, 200_000, 100 + seed], [301.0, 210_000, -1],
                                                     [1800.0, 1_000_000, 500 + seed]])
        # appo.py: 1M in 300 s (seed 2), 400 + seed there
        save(table, "appo", seed, 298.0 + seed, 1_000_000, [[100.0, 300_000, 50], [298.0 + seed, 1_000_000, 400 + seed]])
    cells = bench.equal_seconds_table(str(table), str(sb3_table), str(long_table)).splitlines()[2].split(" | ")
    # no longer runs: appo.py read at its end, 1M, before SB3's 30 minutes
    assert cells[1:] == ["30.0", "502.00 [501.00, 503.00]", "402.00 [401.00, 403.00]", "1.00M", "5.0",
                         "402.00 [401.00, 403.00]", "102.00 [101.00, 103.00]", "0.20M |"]
    for seed in (1, 2, 3):
        save(long_table, "appo", seed, 1200.0 + seed, 4_000_000,
             [[300.0, 1_000_000, 400], [1799.0, 3_000_000, 700 + seed], [1801.0, 3_010_000, -1]])
    cells = bench.equal_seconds_table(str(table), str(sb3_table), str(long_table)).splitlines()[2].split(" | ")
    assert cells[3:5] == ["702.00 [701.00, 703.00]", "3.00M"]


def test_sb3_can_run_at_given_hyperparameters_which_enter_its_saved_configuration():
    """The crossover (issue 95): SB3 at appo.py's gym defaults, from a JSON file that replaces the zoo's
    entry whole; the file's settings are the configuration, so its runs never pass for the zoo's."""
    path = os.path.join(REPO, "docs", "bench", "gym_crossover", "sb3_at_appo_defaults.json")
    args = bench.parse_args(["--envs", "gym:HalfCheetah-v5", "--trainers", "sb3", "--report_only",
                             "--sb3_hyperparams", path])
    config = bench.run_config(args, "sb3", "gym:HalfCheetah-v5", 1)
    with open(path) as f:
        given = json.load(f)
    assert config["hyperparams"] == given and config["zoo_entry"] == "given: sb3_at_appo_defaults.json"
    assert (given["n_envs"], given["n_steps"], given["batch_size"], given["n_epochs"]) == (4, 256, 256, 2)  # appo.py's 1,024
    assert bench.run_configuration({"config": config}) == "hyperparameters sb3_at_appo_defaults.json"
    zoo_args = bench.parse_args(["--envs", "gym:HalfCheetah-v5", "--trainers", "sb3", "--report_only"])
    assert bench.config_key(bench.run_config(zoo_args, "sb3", "gym:HalfCheetah-v5", 1)) != bench.config_key(config)

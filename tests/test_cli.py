"""First contact: what a user sees on the command line. Bad flags end in a short error that names
the flag, before anything starts; a run's terminal shows the trainer's own lines only."""
import glob
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import types
import uuid

import numpy as np
import pytest

import appo
from conftest import RUN_TIMEOUT_S, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (flags, what the error must contain: the flag's name, and where it helps, the value or the rule)
BAD_INVOCATIONS = [
    (["--device", "tpu"], "--device"),
    (["--rnn_type", "transformer"], "--rnn_type"),
    (["--exploration_loss", "kl"], "--exploration_loss"),
    (["--mode", "play"], "--mode"),
    (["--learning_rate", "abc"], "--learning_rate"),
    (["--num_workers", "2.5"], "--num_workers"),
    (["--train_for_env_steps", "1.5"], "--train_for_env_steps"),
    (["--no_such_flag", "1"], "--no_such_flag"),
    (["--encoder_d", "float32"], "--encoder_d"),  # a prefix of --encoder_dtype: not accepted
    (["--learning_rate"], "--learning_rate"),
    (["--learning_rate", "-1e-4"], "--learning_rate must be positive"),  # a value, not a flag
    (["--gamma", "1.5"], "--gamma must be in (0, 1]"),
    (["--gae_lambda", "-0.5"], "--gae_lambda must be in [0, 1]"),
    (["--adam_beta2", "1"], "--adam_beta2 must be in [0, 1)"),
    (["--num_workers", "0"], "--num_workers must be positive"),
    (["--hidden_size", "-8"], "--hidden_size must be positive"),
    (["--max_grad_norm", "0"], "--max_grad_norm must be positive"),
    (["--ppo_clip_value", "-1"], "--ppo_clip_value must be positive"),
    (["--exploration_loss_coeff", "-0.01"], "--exploration_loss_coeff must be 0 or more"),
    (["--seed", "-3"], "--seed must be 0 or more"),
    (["--batch_size", "100", "--rollout", "32"], "--batch_size 100 is not a multiple of --rollout 32"),
    (["--rollout", "64", "--batch_size", "32"], "--rollout 64 is larger than --batch_size 32"),
    (["--num_envs_per_worker", "3", "--worker_num_splits", "2"], "--num_envs_per_worker 3 is not divisible"),
    (["--num_envs_per_worker", "2", "--worker_num_splits", "4"], "--worker_num_splits 4 is larger"),
    (["--lr_decay_frames", "0"], "--lr_decay_frames must be positive"),
    (["--no-async_rl", "--num_workers", "2", "--num_envs_per_worker", "2", "--rollout", "32", "--batch_size", "192"],
     "--no-async_rl needs an iteration"),
    (["--no-async_rl", "--num_policies", "2"], "--no-async_rl is for one policy"),
    (["--num_batches_per_epoch", "0"], "--num_batches_per_epoch must be positive"),
    (["--with_pbt"], "--with_pbt needs a population"),
    (["--env", "doom_nope"], "unknown env 'doom_nope' (--env)"),
    (["--env", "atari_nope"], "--env atari_nope"),
    (["--doom_scenarios_dir", "/no/such/folder"], "--doom_scenarios_dir"),
    (["--env", "gym:CartPol-v1"], "--env gym:CartPol-v1"),
    (["--env", "gym:CartPole-v1", "--env_frameskip", "4"], "--env_frameskip 4"),
    (["--env_kwargs", "continuous=true"], "--env_kwargs"),
    (["--encoder_mlp_layers", "64", "0"], "--encoder_mlp_layers"),
    (["--experiment", "../elsewhere"], "--experiment"),
    (["--experiment", "a/b"], "--experiment"),
    (["--train_dir", "/proc/appo_runs"], "--train_dir"),
    (["--train_dir", "/sys/appo_runs"], "--train_dir"),  # a read-only mount
    (["--train_dir", "{a_file}/runs"], "--train_dir"),    # a path through a regular file
    (["--train_dir", "{a_file}"], "--train_dir"),         # a regular file
    (["--past_opponents_fraction", "0.5"], "--past_opponents_fraction needs a multi-agent env"),
    (["--checkpoint", "x.pth"], "--checkpoint is for --mode eval"),
    (["--save_video"], "--save_video is for --mode eval"),
    (["--mode", "eval"], "--checkpoint"),                 # nothing trained yet
    (["--mode", "eval", "--checkpoint", "/no/such.pth"], "--checkpoint"),
]


def run_appo_cli(flags: list[str], cwd, tag: str) -> subprocess.CompletedProcess:
    # RUN_TIMEOUT_S, not 120 s: two tests at a time beside a training (2026-12-03) the duel run, then
    # given 25 s, took 34 s to start its two games and was not done at 120 s
    return subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), *flags], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=cwd, env=dict(os.environ, APPO_TEST_TAG=tag))


def check_bad_invocation(flags: list[str], expected: str, returncode: int, output: str):
    assert returncode == 2, (flags, output)
    assert "Traceback" not in output, (flags, output)
    assert len(output.strip().splitlines()) <= 5, (flags, output)
    assert expected in output, (flags, output)
    assert "--help" in output, (flags, output)  # and where to read the rest


def bad_invocations(tmp_path) -> list[list[str]]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    invocations = [[flag.format(a_file=a_file) for flag in flags] for flags, _ in BAD_INVOCATIONS]
    return [flags if "--train_dir" in flags else flags + ["--train_dir", str(tmp_path / "runs")]
            for flags in invocations]


def test_every_bad_invocation_is_a_short_error_naming_the_flag_and_starts_nothing(tmp_path, monkeypatch, capsys):
    """In this process, through appo.main, as `python appo.py` calls it (the command itself, for a
    few of them, is the test below): a fresh interpreter for each would cost a torch import each."""
    monkeypatch.chdir(tmp_path)
    for flags, (_, expected) in zip(bad_invocations(tmp_path), BAD_INVOCATIONS):
        try:
            returncode = appo.main(flags)
        except SystemExit as stop:  # argparse's own errors
            returncode = stop.code
        captured = capsys.readouterr()
        check_bad_invocation(flags, expected, returncode, captured.out + captured.err)
        assert multiprocessing.active_children() == [], flags  # nothing spawned
    assert sorted(os.listdir(tmp_path)) == ["a_file"]  # nothing written: no runs folder, nothing in the working folder


@pytest.mark.parametrize("index", [
    BAD_INVOCATIONS.index((["--no_such_flag", "1"], "--no_such_flag")),  # argparse's error
    BAD_INVOCATIONS.index((["--gamma", "1.5"], "--gamma must be in (0, 1]")),  # a check of the parsed flags
    BAD_INVOCATIONS.index((["--env", "gym:CartPol-v1"], "--env gym:CartPol-v1")),  # the env family's check
])
def test_a_bad_command_line_exits_2_with_its_short_error_and_leaves_no_process(tmp_path, index):
    flags = bad_invocations(tmp_path)[index]
    tag = uuid.uuid4().hex
    result = run_appo_cli(flags, tmp_path, tag)
    check_bad_invocation(flags, BAD_INVOCATIONS[index][1], result.returncode, result.stdout + result.stderr)
    assert sorted(os.listdir(tmp_path)) == ["a_file"]
    assert processes_still_tagged(tag) == []  # nothing spawned, or nothing left


def test_frame_counts_take_scientific_notation_and_negative_numbers_are_values():
    cfg = appo.parse_args(["--train_for_env_steps", "2.5e6", "--gamma", "9.9e-1", "--adam_beta1", "-0.5"])
    assert cfg.train_for_env_steps == 2_500_000 and cfg.gamma == 0.99 and cfg.adam_beta1 == -0.5
    assert "--adam_beta1 must be in [0, 1)" in " ".join(appo.config_errors(cfg))


def test_device_auto_is_the_gpu_when_torch_sees_one(monkeypatch):
    assert appo.build_parser().get_default("device") == "auto"
    monkeypatch.setattr(appo.torch.cuda, "is_available", lambda: False)
    assert appo.parse_args([]).device == "cpu"
    monkeypatch.setattr(appo.torch.cuda, "is_available", lambda: True)
    assert appo.parse_args(["--encoder_dtype", "float32"]).device == "cuda"  # (bf16 support would ask CUDA)
    assert appo.parse_args(["--device", "cpu"]).device == "cpu"  # an explicit choice stands


# The lines a training run prints itself: its first line, status lines, and its warnings and errors.
TRAINER_LINE = re.compile(r"^(training \S+ on \S+ with \d+ processes in .*; follow it with tensorboard --logdir .*"
                          r"|defaults of the .*: --.*|the learner's recurrent core: .*|\[ *\d+s\] frames .*"
                          r"|(warning|error): .*|stop requested: .*"
                          r"|done: [\d,]+ frames trained in .*|watch it play: python appo.py --mode eval .*)$")


@pytest.mark.slow
def test_a_doom_duel_run_shows_only_the_trainers_lines_and_logs_the_engines(tmp_path):
    tag = uuid.uuid4().hex
    result = run_appo_cli(["--env", "doom_duel", "--num_workers", "1", "--num_envs_per_worker", "2",
                           "--rollout", "16", "--batch_size", "128", "--hidden_size", "64",
                           "--doom_match_minutes", "0.1", "--train_for_env_steps", "8192", "--report_every_sec", "5",
                           "--train_dir", str(tmp_path), "--experiment", "duel"], tmp_path, tag)
    lines = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 0, "\n".join(lines[-20:])
    assert re.match(rf"training doom_duel on cpu with \d+ processes in {tmp_path / 'duel'}; follow it with", lines[0])
    seed = int(re.search(r"; seed (\d+) \(drawn: --seed \1 repeats it\);", lines[0]).group(1))  # no --seed given
    assert json.loads((tmp_path / "duel" / "config.json").read_text())["seed"] == seed
    assert lines[1] == "defaults of the Doom matches: --env_frameskip 2, --gamma 0.995"
    assert [line for line in lines if not TRAINER_LINE.match(line)] == []
    assert sum(line.startswith("[") for line in lines) >= 2
    # the engines' chatter went to the experiment's logs instead (ViZDoom's multiplayer handshake)
    engine_output = "".join(open(path).read() for path in glob.glob(str(tmp_path / "duel" / "engine_logs" / "*.log")))
    assert "player" in engine_output.lower(), engine_output[:500]
    assert processes_still_tagged(tag) == []


@pytest.mark.parametrize("env_name, learning_rate", [("atari_breakout", "0.00025"), ("doom_basic", "0.0001")])
def test_help_with_an_env_shows_its_familys_defaults(env_name, learning_rate, capsys):
    with pytest.raises(SystemExit) as exit_info:
        appo.parse_args(["--env", env_name, "--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert re.search(rf"--learning_rate LEARNING_RATE .*?\(default: {learning_rate}\)", help_text)


def test_an_env_that_fails_to_start_names_its_engine_log(tmp_path, capsys):
    (tmp_path / "basic.cfg").write_text("doom_scenario_path = no_such.wad\n")  # the flags are right, the env is not
    flags = ["--env", "doom_basic", "--doom_scenarios_dir", str(tmp_path), "--train_dir", str(tmp_path / "runs")]
    assert appo.main(flags) == 1
    err = capsys.readouterr().err
    assert "doom_basic failed to start" in err and "no_such.wad" in err
    assert appo.engine_log_path(appo.parse_args(flags), "probe") in err


def test_the_default_experiment_of_a_gym_id_is_one_plain_folder():
    assert appo.parse_args(["--env", "gym:MyFork/Reach-v0"]).experiment == "gym_MyFork_Reach-v0"
    assert appo.parse_args(["--env", "doom_basic"]).experiment == "doom_basic"


def small_serial_run(train_dir, *flags) -> list[str]:
    return ["--serial_mode", "--env", "doom_basic", "--num_workers", "1", "--num_envs_per_worker", "2",
            "--rollout", "16", "--batch_size", "64", "--hidden_size", "32", "--train_for_env_steps", "1000",
            "--train_dir", str(train_dir), "--experiment", "e", *flags]


def test_restart_behavior_resumes_by_default_restart_moves_the_old_folder_aside_and_overwrite_deletes_it(
        tmp_path, capsys):
    assert appo.main(small_serial_run(tmp_path)) == 0
    assert "resuming" not in capsys.readouterr().out
    assert appo.main(small_serial_run(tmp_path)) == 0  # the default resumes
    out = capsys.readouterr().out
    assert f"resuming the experiment in {tmp_path / 'e'}; its flags are the saved ones" in out  # a drawn seed is new
    assert re.search(r"resumed from policy version \d+, [\d,]+ env frames \(.*checkpoint_p0/checkpoint_[\d_]+\.pth\)", out)
    assert appo.main(small_serial_run(tmp_path, "--learning_rate", "0.0003", "--seed", "5")) == 0
    out = capsys.readouterr().out
    assert "flags that differ from its saved config.json: --learning_rate 0.0003 (saved: 0.0001), --seed 5 (saved: " in out
    first = sorted(os.listdir(tmp_path / "e" / "checkpoint_p0"))
    first_config = (tmp_path / "e" / "config.json").read_text()

    assert appo.main(small_serial_run(tmp_path, "--restart_behavior", "restart")) == 0
    out = capsys.readouterr().out
    assert f"moved {tmp_path / 'e'} to {tmp_path / 'e_old0001'}" in out and "resumed" not in out
    old = tmp_path / "e_old0001"
    assert set(first) <= set(os.listdir(old / "checkpoint_p0"))  # the old run whole, under another name
    assert (old / "config.json").read_text() == first_config
    assert (tmp_path / "e" / "config.json").exists()  # and a new one in the experiment's name

    # a restart or an overwrite keeps nothing, so flags that a resume would refuse are fine
    conflicting = small_serial_run(tmp_path, "--hidden_size", "16", "--restart_behavior", "restart")
    assert "conflicts with" in " ".join(appo.flag_errors(appo.parse_args(conflicting[:-2])))
    assert appo.main(conflicting) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "e_old0001", "e_old0002"]

    assert appo.main(small_serial_run(tmp_path, "--restart_behavior", "overwrite")) == 0
    assert f"deleted {tmp_path / 'e'}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "e_old0001", "e_old0002"]
    assert json.loads((tmp_path / "e" / "config.json").read_text())["hidden_size"] == 32  # not the 16 run's


def test_a_resumed_run_counts_its_frames_from_the_checkpoint_as_it_counts_those_trained(tmp_path, capsys):
    """A forker's resumed run showed frames from 0 beside a trained count from the checkpoint: both
    count since the experiment began now, so frames collected are never fewer than those trained,
    and TensorBoard's step (the same frames) goes on where the first run's stopped."""
    first = appo.train(appo.parse_args(small_serial_run(tmp_path, "--train_for_env_steps", "2000")))
    resumed = appo.train(appo.parse_args(small_serial_run(tmp_path, "--train_for_env_steps", "2500")))
    status = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    frames = int(re.search(r"frames ([\d,]+)", status[-1]).group(1).replace(",", ""))
    assert first.frames_trained[0] >= 2000 and resumed.frames_trained[0] > first.frames_trained[0]
    assert frames == first.frames_trained[0] + resumed.frames_collected, status[-1]  # the checkpoint's, and this run's
    assert frames >= resumed.frames_trained[0], status[-1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "e" / "tb"), purge_orphaned_data=False).Reload()
    steps = [event.step for event in sorted(events.Scalars("p0/frames_trained"), key=lambda event: event.wall_time)]
    assert steps == sorted(steps) and steps[-1] == frames, steps  # TensorBoard's step: the same frames, going on


@pytest.mark.parametrize("flags, expected", [([], True), (["--async_rl"], True), (["--no-async_rl"], False),
                                             (["--async_rl=False"], False), (["--async_rl=True"], True),
                                             (["--async_rl", "false"], False)])
def test_a_switch_takes_sample_factorys_true_false_spelling_too(flags, expected):
    assert appo.parse_args(["--env", "doom_basic", *flags]).async_rl is expected


@pytest.mark.parametrize("flag, message", [("--async_rl=maybe", "--async_rl=maybe: a switch takes True or False"),
                                           ("--no-async_rl=True", "--no-async_rl takes no value")])
def test_a_switch_given_a_word_it_does_not_know_is_a_short_error(flag, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        appo.parse_args(["--env", "doom_basic", flag])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_second_line_of_a_run_names_its_familys_defaults_and_where_the_run_differs():
    cfg = appo.parse_args(["--env", "atari_breakout", "--rollout", "64", "--learning_rate=3e-4"])
    line = appo.family_line(cfg)
    assert line.startswith("defaults of the Atari family: --env_frameskip 4, --gamma 0.99, ")
    assert "--rollout 128 (yours: 64)" in line and "--learning_rate 0.00025 (yours: 0.0003)" in line
    assert "--batch_size 256," in line and "--batch_size 256 (" not in line
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--num_workers", "3"])  # 3 x 2 x 64 = 384 samples a round
    line = appo.family_line(cfg)
    assert "--num_batches_per_epoch 4 (now 6)" in line and "--async_rl False," in line  # still synchronous
    assert cfg.flags_given == ["env", "num_workers"]


CORRIDOR_MODULE = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor of 5 cells."""
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.cell = max(0, self.cell + (1 if action == 1 else -1))
        done = self.cell == 4
        return np.full(1, self.cell / 4, np.float32), float(done), done, False, {}


gym.register("Corridor-v0", entry_point=Corridor)
'''


def test_a_gym_env_of_a_module_of_yours_trains_as_gym_module_id(tmp_path, monkeypatch, capsys):
    """Gymnasium's own way to name an env of a module that registers it (gymnasium.make imports the
    module): no launcher script needed."""
    (tmp_path / "my_corridor.py").write_text(CORRIDOR_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    flags = ["--serial_mode", "--num_workers", "1", "--num_envs_per_worker", "2", "--train_for_env_steps", "2048",
             "--train_dir", str(tmp_path / "runs")]
    assert appo.main(["--env", "gym:my_corridor:Corridor-v0", *flags]) == 0, capsys.readouterr().err
    assert os.listdir(tmp_path / "runs" / "gym_my_corridor_Corridor-v0" / "checkpoint_p0")
    assert appo.main(["--env", "gym:no_such_module:Corridor-v0", *flags]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err


@pytest.mark.parametrize("env_id, learns", [("gym:MountainCar-v0", False), ("gym:CartPole-v1", True)])
def test_a_run_whose_score_never_rose_above_its_first_100_games_ends_naming_flags_to_try(tmp_path, capsys, env_id,
                                                                                          learns):
    """MountainCar's reward is sparse: at its defaults and 25,000 steps the agent does what random play
    does; CartPole's score rises from its first games on. Seeded serial runs in float32: the same every
    time (at --encoder_dtype auto a CPU with bfloat16 trains another run, whose MountainCar seed 1 had a
    few lucky games by 25,000 steps: -198.13, enough for the hint's two standard errors)."""
    flags = ["--env", env_id, "--serial_mode", "--seed", "1", "--train_for_env_steps", "25000",
             "--encoder_dtype", "float32", "--report_every_sec", "0.2", "--train_dir", str(tmp_path)]
    assert appo.main(flags) == 0
    out = capsys.readouterr().out
    hint = [line for line in out.splitlines() if "never rose above its first" in line]
    assert bool(hint) != learns, out[-2000:]
    if hint:
        assert "--exploration_loss_coeff" in hint[0] and "When a run does not learn" in hint[0]
    assert appo.did_not_learn((-200.0, 0.0), (-200.0, 0.0)) and not appo.did_not_learn((-200.0, 1.0), (-197.0, 1.0))
    # every first game alike (no error of its own), then one lucky game of 100: the best window's error counts
    lucky = [-200.0] * 99 + [-158.0]
    assert appo.did_not_learn((-200.0, 0.0), (np.mean(lucky), np.std(lucky) / 10))
    assert not appo.did_not_learn(None, (10.0, 1.0))  # never 100 games at a status line: nothing to say


def test_with_learning_rivals_a_flat_return_points_to_eval_not_to_flags(tmp_path):
    """simple_adversary's good agents end every seed below their first 100 games' average while
    beating random opponents (learning.md): their rival learned too. There the hint names eval
    against random play, and not flags that would not help."""
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--num_policies", "2", "--train_dir", str(tmp_path)])
    result = appo.TrainResult(0, 60.0, 2000, [1000, 1000], [-20.0, 5.0], [100, 100], [-19.0, 9.0], [None, None])
    flat_then_rising = [(-19.0, 0.5), (5.0, 0.5)]
    for rivals_learn in (False, True):
        lines = appo.end_of_run_lines(cfg, result, flat_then_rising, rivals_learn, [(-19.0, 0.5), (9.0, 0.5)])
        hints = [line for line in lines if "never rose above its first" in line]
        assert len(hints) == 1 and hints[0].startswith("policy 0: ")
        assert ("--exploration_loss_coeff" in hints[0]) != rivals_learn
        assert ("=random" in hints[0]) == rivals_learn


def test_a_learner_gone_before_its_final_save_is_the_last_line_and_no_eval_is_offered_without_a_checkpoint(tmp_path):
    """The run's end reads the checkpoints on disk: where the learner trained past the newest one (it
    was killed before its final save), the last line says how much was lost and names that checkpoint;
    where there is none, no command to watch a policy that was never saved."""
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--train_dir", str(tmp_path)])
    saved = str(tmp_path / "checkpoint_000000004_4096.pth")
    for checkpoint, unsaved in ((saved, 0), (saved, 3), (None, 7)):
        result = appo.TrainResult(0, 60.0, 7168, [7168], [20.0], [100], [20.0], [checkpoint], [unsaved])
        lines = appo.end_of_run_lines(cfg, result)
        assert lines[0].endswith(f"checkpoint {checkpoint or 'none'}")
        assert any(line.startswith("watch it play") for line in lines) == (checkpoint is not None)
        assert lines[-1].startswith("warning: ") == bool(unsaved)
        if unsaved:
            assert f"the last {unsaved} policy versions it trained are lost" in lines[-1]
            assert (checkpoint or "it saved no checkpoint") in lines[-1]


def test_the_best_100_game_average_counts_the_last_status_line(tmp_path, capsys):
    """A forker's run ended "average return 68.09 ... best 64.59": the runner prints its last status
    line as it stops, after the last report, and that line's average was left out of the best."""
    cfg = appo.parse_args(["--env", "gym:CartPole-v1", "--train_dir", str(tmp_path)])
    frames = types.SimpleNamespace(worker_frames=np.array([2000]), learner_frames=np.array([2000]),
                                   learner_version=np.array([0]))
    shared = types.SimpleNamespace(run=frames, resumed_frames=0)
    run = appo.Run(cfg, False, shared, model=None, stats=appo.Stats(1), workers=None)
    reporting = appo.Reporting(run)
    run.stats.episode_returns[0].extend([10.0] * 100)
    reporting.report(run)  # a status line's report
    run.stats.episode_returns[0].extend([20.0] * 100)  # games that ended after it
    reporting.stop(run)
    assert run.result.best_average_returns == [20.0]
    assert ("average return 20.00 over the last 100 games (best 100-game average at a status line 20.00)"
            in capsys.readouterr().out)


def test_a_run_shows_its_progress_against_the_budget_ends_with_a_summary_and_returns_its_figures(tmp_path, capsys):
    # train() in this process, as a hyperparameter search would call it (main() returns its exit code)
    result = appo.train(appo.parse_args(small_serial_run(tmp_path, "--report_every_sec", "0.5", "--seed", "1")))
    assert isinstance(result, appo.TrainResult) and result.exit_code == 0
    out = capsys.readouterr().out
    status = [line for line in out.splitlines() if line.startswith("[")]
    assert status and all(re.search(r"\| \d+% of 1,000(, \w+ left)?$", line) for line in status), status
    assert status[-1].endswith("100% of 1,000, 0s left")
    assert re.search(r"^done: [\d,]+ frames trained in \d+s; (average return -?[\d.]+ over the last \d+ games|no game "
                     r"finished).*; checkpoint .*checkpoint_p0/checkpoint_[\d_]+\.pth$", out, re.MULTILINE), out
    assert f"watch it play: python appo.py --mode eval --env doom_basic --train_dir {tmp_path} --experiment e " \
           "--save_video" in out
    log = (tmp_path / "e" / "train.log").read_text()  # the runner's lines, kept with the experiment
    assert out.splitlines()[0] in log and status[-1] in log and "watch it play:" in log
    # the figures returned are the summary's
    assert result.frames_trained[0] >= 1000 and result.frames_collected >= result.frames_trained[0]
    assert math.isfinite(result.average_returns[0]) and result.games_averaged[0] > 0
    assert (f"done: {result.frames_trained[0]:,} frames trained in {appo.duration(result.seconds)}; average return "
            f"{result.average_returns[0]:.2f} over the last {result.games_averaged[0]} games") in out
    assert result.checkpoints[0] and out.rstrip().splitlines()[-2].endswith(f"checkpoint {result.checkpoints[0]}")


def test_a_fork_running_another_checkouts_compiled_module_is_refused_with_the_build_command(tmp_path):
    """A fork (appo.py, env.py, csrc/ and its appo_ipc link, its module not built yet) beside an
    editable install of this checkout: its appo_ipc would take this checkout's compiled module. One
    line names both folders and the in-place build, before anything starts; one checkout's face and
    module pass, through the appo_ipc -> csrc link too (a copy of appo.py alone elsewhere, as
    tests/test_extras.py makes, runs the installed appo_ipc, face and module alike)."""
    fork = tmp_path / "fork"
    (fork / "csrc").mkdir(parents=True)
    for name in ("appo.py", "env.py"):
        (fork / name).write_text(open(os.path.join(REPO, name)).read())
    (fork / "csrc" / "__init__.py").write_text(open(os.path.join(REPO, "csrc", "__init__.py")).read())
    os.symlink("csrc", fork / "appo_ipc")
    mixed = appo.checkout_errors(str(fork / "appo_ipc" / "__init__.py"), os.path.join(REPO, "csrc", "_native.so"))
    assert len(mixed) == 1 and "pip install pybind11 && python setup.py build_ext --inplace" in mixed[0]
    assert str(fork / "csrc") in mixed[0] and os.path.join(REPO, "csrc") in mixed[0]
    assert appo.checkout_errors(str(fork / "appo_ipc" / "__init__.py"), str(fork / "csrc" / "_native.so")) == []
    run = subprocess.run([sys.executable, "appo.py", "--env", "doom_basic", "--train_dir", str(tmp_path / "runs")],
                         cwd=fork, capture_output=True, text=True, timeout=120)
    if "No module named 'appo_ipc._native'" in run.stderr:
        pytest.skip("no editable install of another checkout here to lend the fork its module")
    assert run.returncode == 2 and "build_ext --inplace" in run.stderr, run.stdout + run.stderr
    assert not os.path.exists(tmp_path / "runs")

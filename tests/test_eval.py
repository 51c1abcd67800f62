"""appo.py --mode eval: plays a saved policy on real VizDoom and Atari, prints the scores, and
writes an H.264 MP4 that is decoded back here."""
import os
import re
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

import appo
from conftest import RUN_TIMEOUT_S, outside_a_run, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def save_untrained_policy(train_dir, env_name: str, *flags: str) -> str:
    """A checkpoint written by the learner's own code, as a training run would leave it."""
    cfg = appo.parse_args(["--env", env_name, "--train_dir", str(train_dir), "--experiment", "played", *flags])
    spaces_pair = appo.probe_env(cfg).spaces
    learner = appo.Learner(0, cfg, outside_a_run(cfg, spaces_pair), spaces_pair)
    learner.policy_version, learner.env_frames = 7, 1234
    return appo.save_checkpoint(cfg, 0, learner.checkpoint_state())


def run_eval(train_dir, *flags: str) -> subprocess.CompletedProcess:
    """appo.py --mode eval, checked to have left none of its processes (the game's, for VizDoom)."""
    tag = uuid.uuid4().hex
    result = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), "--mode", "eval", "--train_dir",
                             str(train_dir), "--experiment", "played", *flags],
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                            env=dict(os.environ, APPO_TEST_TAG=tag))
    assert processes_still_tagged(tag) == []
    return result


def decoded_video(path: str) -> tuple[str, str, int, set[tuple[int, int]]]:
    """An MP4 decoded by imageio's ffmpeg: its codec, pixel format, frame count and frame sizes."""
    import imageio
    with imageio.get_reader(path, format="FFMPEG") as reader:
        meta = reader.get_meta_data()
        sizes = [(frame.shape[1], frame.shape[0]) for frame in reader]
    return meta["codec"], meta["pix_fmt"].split("(")[0], len(sizes), set(sizes)


def steps_played(output: str, frameskip: int) -> int:
    games = re.findall(r"game \d+: .*, ([\d,]+) env frames", output)
    return sum(int(frames.replace(",", "")) for frames in games) // frameskip


@pytest.mark.parametrize("env_name, native_size", [("doom_basic", (160, 120)), ("atari_breakout", (160, 210))])
def test_eval_plays_games_prints_scores_and_records_a_video(tmp_path, env_name, native_size):
    # a model unlike the defaults: eval must take its shape from the checkpoint, not from flags
    save_untrained_policy(tmp_path, env_name, "--hidden_size", "64", "--rnn_type", "lstm")
    video_path = tmp_path / "agent.mp4"
    result = run_eval(tmp_path, "--env", env_name, "--max_num_episodes", "2", "--save_video",
                      "--video_frames", "25", "--video_path", str(video_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "policy version 7 (1,234 env frames of training)" in result.stdout
    games = re.findall(r"game (\d): return (-?[\d.]+), ([\d,]+) env frames", result.stdout)
    assert [number for number, _, _ in games] == ["1", "2"], result.stdout
    returns = [float(value) for _, value, _ in games]
    mean = re.search(r"mean return (-?[\d.]+) \+- [\d.]+ over 2 games", result.stdout)
    assert mean and float(mean.group(1)) == pytest.approx(sum(returns) / 2, abs=0.01)
    frameskip = appo.parse_args(["--env", env_name]).env_frameskip
    expected_frames = min(25, steps_played(result.stdout, frameskip))
    assert f"video: {expected_frames} frames of {native_size[0]}x{native_size[1]}" in result.stdout
    # H.264 in yuv420p: what browsers, GitHub and W&B play
    assert decoded_video(str(video_path)) == ("h264", "yuv420p", expected_frames, {native_size})


def test_a_video_of_odd_sized_frames_is_h264_one_pixel_larger_where_odd(tmp_path):
    path = str(tmp_path / "odd.mp4")
    video = appo.VideoWriter(path, fps=35 / 4, max_frames=5)
    for step in range(7):  # two beyond --video_frames
        video.add(np.full((21, 33, 3), 30 * step, np.uint8), f"score {step}")
    video.close()
    assert video.num_frames == 5 and video.size == (34, 22)
    assert decoded_video(path) == ("h264", "yuv420p", 5, {(34, 22)})


def test_save_video_without_imageio_is_a_flag_error(monkeypatch):
    real_find_spec = appo.importlib.util.find_spec
    monkeypatch.setattr(appo.importlib.util, "find_spec",
                        lambda name, *args: None if name == "imageio_ffmpeg" else real_find_spec(name, *args))
    errors = appo.config_errors(appo.parse_args(["--env", "doom_basic", "--mode", "eval", "--save_video"]))
    assert errors == ["--save_video needs the imageio and imageio-ffmpeg packages (they write H.264): "
                      "pip install imageio imageio-ffmpeg"]


def test_eval_deterministic_with_a_seed_plays_the_same_game_twice(tmp_path):
    save_untrained_policy(tmp_path, "atari_breakout")
    outputs = [run_eval(tmp_path, "--env", "atari_breakout", "--max_num_episodes", "1", "--eval_deterministic",
                        "--seed", "3") for _ in range(2)]
    assert all(output.returncode == 0 for output in outputs), outputs[0].stderr[-3000:]
    games = [re.search(r"game 1: .*", output.stdout).group(0) for output in outputs]
    assert games[0] == games[1]


@pytest.mark.parametrize("env_name, trained_with, played_with", [
    ("doom_basic", ["--doom_resize", "nearest"], {"doom_resize": "nearest"}),
    ("gym:CartPole-v1", ["--env_kwargs", '{"sutton_barto_reward": true}'], {"env_kwargs": '{"sutton_barto_reward": true}'}),
    ("gym:small_image_env:SmallView-v0", ["--obs_keys", "image"], {"obs_keys": ["image"]}),  # a list: MiniGrid's
    ("gym:CartPole-v1", ["--encoder_mlp_layers", "32"], {"encoder_mlp_layers": [32]}),  # a model flag's list
])
def test_eval_plays_with_the_env_flags_the_checkpoint_was_trained_with(tmp_path, env_name, trained_with, played_with):
    """A policy trained on nearest-pixel screens (or other env kwargs, the Dict keys it saw, the
    widths of its MLP) is played on them, whatever the eval command line says: its family's
    trained_flags and the model's flags come from the checkpoint, lists included."""
    save_untrained_policy(tmp_path, env_name, *trained_with)
    cfg = appo.parse_args(["--mode", "eval", "--env", env_name, "--train_dir", str(tmp_path), "--experiment", "played"])
    assert {flag: getattr(cfg, flag) for flag in played_with} != played_with  # the command line's defaults
    appo.load_policy_for_eval(cfg)
    assert {flag: getattr(cfg, flag) for flag in played_with} == played_with
    if "env_kwargs" in played_with:  # and the games played are the trained env's: Sutton and Barto's reward
        # is 0 a step and -1 when the pole falls, where the default pays 1 a step (an untrained game lasts 8+)
        played = run_eval(tmp_path, "--env", env_name, "--max_num_episodes", "2")
        assert played.returncode == 0, played.stderr[-2000:]
        assert re.findall(r"^game \d: return (\S+),", played.stdout, re.MULTILINE) == ["-1.00", "-1.00"], played.stdout


def test_eval_names_each_flag_of_its_command_line_that_the_checkpoint_replaces(tmp_path, capsys):
    """Eval plays with the checkpoint's model and env flags: one given otherwise on the command line
    is replaced, with a line saying so; one given as trained, or not given, needs no line."""
    save_untrained_policy(tmp_path, "doom_basic", "--hidden_size", "64", "--doom_resize", "nearest")
    cfg = appo.parse_args(["--mode", "eval", "--env", "doom_basic", "--train_dir", str(tmp_path),
                           "--experiment", "played", "--hidden_size", "128", "--doom_resize", "nearest"])
    appo.load_policy_for_eval(cfg)
    assert cfg.hidden_size == 64 and cfg.doom_resize == "nearest"
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ["note: --hidden_size 128 from the command line replaced by the checkpoint's 64"]


def test_eval_plays_on_the_policy_workers_torch_threads(tmp_path, monkeypatch):
    """Eval's batch is one game's agents, small as a policy worker's, so it computes on
    --policy_worker_threads (1 unless given) rather than torch's thread a core."""
    save_untrained_policy(tmp_path, "gym:CartPole-v1")
    threads_while_playing = []
    play_games = appo.play_games

    def counting_play_games(*args):
        threads_while_playing.append(torch.get_num_threads())
        return play_games(*args)

    monkeypatch.setattr(appo, "play_games", counting_play_games)
    try:
        assert appo.main(["--mode", "eval", "--env", "gym:CartPole-v1", "--train_dir", str(tmp_path),
                          "--experiment", "played", "--max_num_episodes", "1", "--policy_worker_threads", "2"]) == 0
    finally:
        torch.set_num_threads(1)  # this process's, as tests/conftest.py set it
    assert threads_while_playing == [2]


def test_eval_errors_name_the_fix(tmp_path, capsys):
    """Through appo.main in this process, as `python appo.py --mode eval` calls it (the command
    itself is run by the tests above): each error is found before a game starts."""
    def eval_error(*flags: str) -> str:
        assert appo.main(["--mode", "eval", "--train_dir", str(tmp_path), "--experiment", "played", *flags]) == 2
        return capsys.readouterr().err

    missing = eval_error("--env", "doom_basic")
    assert "no checkpoint in" in missing and "--checkpoint" in missing
    assert "cannot be read" in eval_error("--env", "doom_basic", "--checkpoint", str(tmp_path / "nothing.pth"))
    other_env = eval_error("--env", "atari_breakout", "--checkpoint", save_untrained_policy(tmp_path, "doom_basic"))
    assert "trained on doom_basic" in other_env and "use --env doom_basic" in other_env


@pytest.mark.slow
def test_an_encoder_registered_in_a_launcher_trains_and_that_launcher_is_the_eval_command(tmp_path):
    """appo.register_encoder from a forker's launcher (tests/encoder_launcher.py): its spawned
    workers register it too, the run's last line gives that launcher's eval command, the command
    plays, and appo.py itself, which lacks the encoder, says so in one line instead of a KeyError."""
    launcher = os.path.join(REPO, "tests", "encoder_launcher.py")
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    tag = uuid.uuid4().hex
    train = subprocess.run([sys.executable, launcher, "--env", "doom_basic", "--encoder", "one_layer",
                            "--num_workers", "1", "--num_envs_per_worker", "2", "--rollout", "16", "--batch_size", "64",
                            "--hidden_size", "32", "--train_for_env_steps", "1000", "--train_dir", str(tmp_path),
                            "--experiment", "mine", "--seed", "1"],
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path,
                           env=dict(environment, APPO_TEST_TAG=tag))
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert processes_still_tagged(tag) == []
    (command,) = re.findall(r"^watch it play: python (.*)$", train.stdout, re.MULTILINE)
    assert command.startswith(f"{launcher} --mode eval --env doom_basic ")
    play = subprocess.run([sys.executable, *command.replace(" --save_video", "").split(), "--max_num_episodes", "1"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=environment)
    assert play.returncode == 0 and "over 1 games" in play.stdout, play.stdout[-3000:] + play.stderr[-3000:]
    lacking = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), *command.split()[1:],
                              "--max_num_episodes", "1"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                             cwd=tmp_path, env=environment)
    assert lacking.returncode == 2 and "Traceback" not in lacking.stderr
    assert "the checkpoint's encoder one_layer is not registered in this process" in lacking.stderr.splitlines()[0]

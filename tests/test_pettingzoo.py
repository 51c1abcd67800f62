"""pz:<module>:<factory>: PettingZoo parallel envs, each agent one of appo.py's agents. A real
PettingZoo env (rock-paper-scissors) trains with one and with two policies; tests/pz_envs.py's
env has action masks and an agent that leaves early, and raises on what it must never be given."""
import os
import re
import subprocess
import sys
import uuid

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="pip install -e .[pettingzoo]")

import appo  # noqa: E402
import env as envs  # noqa: E402
import pz_envs  # noqa: E402
from conftest import RUN_TIMEOUT_S, processes_still_tagged  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
RPS = "pz:pettingzoo.classic.rps_v2:parallel_env"
MASKED_AND_LEAVING = "pz:pz_envs:masked_and_leaving"


def test_an_agent_that_left_is_padded_marked_and_given_no_action_and_every_agent_is_scored_at_the_end():
    game = envs.create_env(MASKED_AND_LEAVING)
    obs, _ = game.reset(seed=3)
    assert game.num_agents == 3 and game.observation_space["action_mask"].shape == (5,)
    for step in range(12):
        # the lowest allowed action for everyone, the agent that left too: the env raises if it gets one
        obs, rewards, dones, _, infos = game.step([int(np.flatnonzero(o["action_mask"])[0]) for o in obs])
        if step >= 4:
            assert infos[2].get("agent_left") and dones[2] and rewards[2] == 0.0
        assert not infos[0].get("agent_left")
    assert all(dones) and [info["true_return"] for info in infos] == [12.0, 12.0, 4.0]
    assert {info["true_length"] for info in infos} == {12}
    game.close()


def test_envs_that_cannot_run_here_are_one_line_naming_the_fix(tmp_path, capsys):
    for name, kwargs, expected in [
            ("pz:pettingzoo.classic.tictactoe_v3:env", "{}", "makes an AEC env (agents act in turn)"),
            ("pz:pz_envs:no_such_factory", "{}", "cannot find the factory"),
            (MASKED_AND_LEAVING, '{"bogus": 1}', "the factory failed (TypeError")]:
        assert appo.main(["--env", name, "--train_dir", str(tmp_path), "--env_kwargs", kwargs]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and expected in errors[0], errors


def run_appo(tmp_path, env: str, *flags: str) -> subprocess.CompletedProcess:
    tag = uuid.uuid4().hex
    result = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), "--env", env, "--train_dir", str(tmp_path),
                             *flags], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path,
                            env=dict(os.environ, APPO_TEST_TAG=tag,
                                     PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])))
    assert processes_still_tagged(tag) == []
    return result


SHORT_RUN = ["--num_workers", "1", "--num_envs_per_worker", "2", "--train_for_env_steps", "3000",
             "--report_every_sec", "2"]


@pytest.mark.slow
def test_a_pettingzoo_env_trains_from_the_command_line_with_one_policy_and_with_two(tmp_path):
    one = run_appo(tmp_path, RPS, "--experiment", "one", *SHORT_RUN)
    assert one.returncode == 0 and re.search(r"^done: [\d,]+ frames trained", one.stdout, re.MULTILINE), \
        (one.stdout + one.stderr)[-3000:]
    two = run_appo(tmp_path, RPS, "--experiment", "two", "--num_policies", "2", "--async_rl", *SHORT_RUN)
    assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
    assert re.search(r"^done: policy 0: ", two.stdout, re.MULTILINE) and \
        re.search(r"^done: policy 1: ", two.stdout, re.MULTILINE), two.stdout[-3000:]


@pytest.mark.slow
def test_the_synchronous_default_batch_fits_agents_known_only_once_an_env_is_made(tmp_path):
    # three agents an env, known only after the runner made one: 1 worker x 2 envs x 3 agents x 64
    # steps = 384 samples a rollout of every env; the family's iteration (256 x 4) becomes 6 minibatches
    result = run_appo(tmp_path, MASKED_AND_LEAVING, "--experiment", "e", *SHORT_RUN)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "--num_batches_per_epoch 4 (now 6)" in result.stdout, result.stdout[-3000:]


@pytest.mark.slow
def test_masked_actions_and_an_agent_that_left_never_reach_the_env_in_training_or_evaluation(tmp_path):
    # three agents a env: an iteration of 384 samples, 3 minibatches of 128
    result = run_appo(tmp_path, MASKED_AND_LEAVING, "--experiment", "e", "--batch_size", "128",
                      "--num_batches_per_epoch", "3", *SHORT_RUN)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "failed (" not in output, output[-3000:]
    played = run_appo(tmp_path, MASKED_AND_LEAVING, "--experiment", "e", "--mode", "eval", "--max_num_episodes", "3",
                      "--save_video")
    assert played.returncode == 0, (played.stdout + played.stderr)[-3000:]
    assert re.search(r"agent 2 mean return [\d.]+ \+- [\d.]+ over 3 games", played.stdout), played.stdout
    # the video, as for any env: one picture a step, at the env's own render_fps
    video = re.search(r"video: (\d+) frames of 64x48 at 10 fps in (\S+)", played.stdout)
    assert video and int(video.group(1)) == 3 * pz_envs.GAME_STEPS, played.stdout
    import imageio
    with imageio.get_reader(video.group(2), format="FFMPEG") as reader:
        assert sum(1 for _ in reader) == 3 * pz_envs.GAME_STEPS


def test_the_rollout_worker_keeps_the_steps_of_an_agent_that_left_out_of_the_loss():
    import queue
    import types

    arrays = {"reward": np.zeros((1, 3), np.float32), "done": np.zeros((1, 3), np.float32),
              "truncated": np.zeros((1, 3), np.float32),
              "valid": np.ones((1, 3), np.float32), "rnn_state": np.ones((1, 3, 1), np.float32),
              "obs": np.zeros((1, 3, 2), np.float32)}
    worker = types.SimpleNamespace(past_policy=None, env_field_names=[], shared=types.SimpleNamespace(stats_queue=queue.Queue()))
    worker.write_obs = lambda actor, obs: appo.RolloutWorker.write_obs(worker, actor, obs)
    actor = types.SimpleNamespace(slot=0, step=0, policy_id=0, fields=appo.GroupFields(arrays, ["obs"], None))
    appo.RolloutWorker.record_step(worker, actor, np.ones(2), 0.0, True, False, {"agent_left": True})
    appo.RolloutWorker.record_step(worker, actor, np.ones(2), 1.0, False, False, {})
    assert arrays["valid"][0].tolist() == [0.0, 1.0, 1.0]

"""Self-play end to end: two policies on doom_duel (two VizDoom games joined over UDP), agents
remapped between matches, a share of them playing frozen past versions of the population."""
import glob
import os
import subprocess
import sys
import uuid

import pytest
import torch

from conftest import RUN_TIMEOUT_S, processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_duel(tmp_path, tag, *flags):
    command = [sys.executable, os.path.join(REPO, "appo.py"), "--env", "doom_duel", "--num_policies", "2",
               "--doom_match_minutes", "0.1", "--remap_policies_every", "1", "--num_workers", "1",
               "--num_envs_per_worker", "2", "--rollout", "16", "--batch_size", "64", "--hidden_size", "64",
               "--learner_threads", "1", "--report_every_sec", "3", "--save_every_sec", "5",
               "--train_dir", str(tmp_path), "--experiment", "duel", "--seed", "5", *flags]
    environment = dict(os.environ, APPO_TEST_TAG=tag)
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=environment, cwd=tmp_path)


def trained_versions(tmp_path, policy_id):
    paths = glob.glob(str(tmp_path / "duel" / f"checkpoint_p{policy_id}" / "checkpoint_*.pth"))
    return [torch.load(path, weights_only=True)["policy_version"] for path in paths]


@pytest.mark.slow
def test_two_policies_learn_from_duels_against_each_other_and_past_versions(tmp_path):
    tag = uuid.uuid4().hex
    # frames, not seconds (about 40 s alone): on a loaded machine a run of fixed seconds ended before a match did
    result = run_duel(tmp_path, tag, "--past_opponents_fraction", "0.5", "--past_opponent_refresh_sec", "5",
                      "--train_for_env_steps", "3000")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for policy_id in range(2):  # both learners trained on duel experience
        assert max(trained_versions(tmp_path, policy_id), default=0) > 0, output[-4000:]
        assert f"p{policy_id} objective" in result.stdout  # matches ended, with a win (1) or not (0)
    assert "past-version opponents now play" in result.stdout
    assert processes_still_tagged(tag) == []


def test_past_opponents_need_a_multi_agent_env(tmp_path):
    command = [sys.executable, os.path.join(REPO, "appo.py"), "--env", "doom_basic",
               "--past_opponents_fraction", "0.5", "--train_dir", str(tmp_path)]
    tag = uuid.uuid4().hex
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env=dict(os.environ, APPO_TEST_TAG=tag))
    assert result.returncode == 2
    assert processes_still_tagged(tag) == []  # refused before anything was spawned
    assert "--past_opponents_fraction needs a multi-agent env" in result.stderr

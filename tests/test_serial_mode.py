"""--serial_mode: the whole run in the calling process, for a debugger; with --seed, repeatable."""
import glob
import multiprocessing
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

import appo
from conftest import processes_still_tagged

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serial_flags(train_dir, experiment: str, frames: int) -> list[str]:
    return ["--serial_mode", "--env", "doom_basic", "--num_workers", "2", "--num_envs_per_worker", "2",
            "--rollout", "16", "--batch_size", "128", "--hidden_size", "64", "--seed", "1",
            "--train_for_env_steps", str(frames), "--train_dir", str(train_dir), "--experiment", experiment]


def final_weights(train_dir, experiment: str) -> dict:
    path = sorted(glob.glob(str(train_dir / experiment / "checkpoint_p0" / "checkpoint_*.pth")))[-1]
    return torch.load(path, weights_only=True)["model"]


@pytest.mark.slow
def test_two_serial_runs_with_a_seed_train_alike_in_this_process(tmp_path, monkeypatch):
    losses: list[float] = []
    compute_loss = appo.appo_loss

    def recorded_loss(*args, **kwargs):
        assert multiprocessing.active_children() == []  # the learner runs here, and no worker apart
        loss, stats = compute_loss(*args, **kwargs)
        losses.append(loss.item())
        return loss, stats

    monkeypatch.setattr(appo, "appo_loss", recorded_loss)  # the learner's call resolves the name at run time
    runs = {}
    for experiment in ("first", "second"):
        losses.clear()
        assert appo.main(serial_flags(tmp_path, experiment, frames=6_000)) == 0
        runs[experiment] = list(losses)
    assert len(runs["first"]) >= 10  # 6,000 frames / (128 samples x frameskip 4) SGD steps
    assert runs["first"] == runs["second"]
    first, second = final_weights(tmp_path, "first"), final_weights(tmp_path, "second")
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.slow
def test_a_breakpoint_in_the_loss_stops_under_pdb(tmp_path):
    """What --serial_mode is for: python -m pdb appo.py --serial_mode ... stops in appo_loss."""
    with open(os.path.join(REPO, "appo.py")) as f:
        lines = f.read().splitlines()
    in_loss = lines.index(next(text for text in lines if text.startswith("def appo_loss(")))
    line = 1 + next(number for number in range(in_loss, len(lines)) if lines[number].strip() == "action_dist = model.action_dist")
    commands = f"break {os.path.join(REPO, 'appo.py')}:{line}\ncontinue\np policy_version >= 0\nquit\n"
    tag = uuid.uuid4().hex
    result = subprocess.run([sys.executable, "-m", "pdb", os.path.join(REPO, "appo.py"),
                             *serial_flags(tmp_path, "pdb", frames=100_000)],
                            input=commands, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                            env=dict(os.environ, APPO_TEST_TAG=tag))
    assert "appo_loss()" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert "(Pdb) True" in result.stdout  # it evaluated an argument of the loss, in the loss's frame
    assert processes_still_tagged(tag) == []  # quitting the debugger ends the run's env processes too


@pytest.mark.slow
def test_one_more_per_step_quantity_reaches_the_loss_through_act_and_acting_fields(tmp_path, monkeypatch):
    """docs/fork.md's seam for a forker's per-step quantity: the behaviour logits (for an exact KL)
    added to acting_fields and to act()'s dict are written by the policy worker into a slot field
    of their own and reach the loss as batch["logits"]. Where the learner trains with the weights
    that acted (lag 0, the first SGD step of a batch, no input statistics to update), the logits it
    computes are the ones that acted."""
    real_fields, real_loss = appo.acting_fields, appo.appo_loss

    def fields_with_logits(action_dist):
        return {**real_fields(action_dist), "logits": ((action_dist.num_outputs,), np.dtype(np.float32))}

    def act_with_logits(model, obs, rnn_state):
        with torch.inference_mode():
            logits, values, next_state = model(obs, rnn_state)
            actions = model.action_dist.sample(logits)
            return {"actions": actions, "log_prob": model.action_dist.log_prob(logits, actions), "value": values,
                    "logits": logits}, next_state

    compared = []

    def loss_reading_the_logits(model, batch, policy_version, cfg, update_statistics=False):
        with torch.no_grad():
            logits, _ = model.forward_rollout({key: batch[key] for key in model.encoders}, batch["rnn_state"][0],
                                              batch["done"])
        # version 0 is the runner's first draw, which the learner's own does not equal: from version 1 on,
        # the weights that acted a step are the learner's of that version
        acted_by_these = ((batch["valid"][:-1] > 0) & (batch["policy_version"][:-1] == policy_version)
                          & (policy_version > 0))
        if update_statistics and acted_by_these.any():  # the batch's first step: no weights have moved yet
            torch.testing.assert_close(batch["logits"][:-1][acted_by_these], logits[:-1][acted_by_these],
                                       rtol=1e-4, atol=1e-4)
            compared.append(int(acted_by_these.sum()))
        return real_loss(model, batch, policy_version, cfg, update_statistics)

    monkeypatch.setattr(appo, "acting_fields", fields_with_logits)
    monkeypatch.setattr(appo, "act", act_with_logits)
    monkeypatch.setattr(appo, "appo_loss", loss_reading_the_logits)
    # without input normalisation: the learner would update its statistics before the loss
    assert appo.main(serial_flags(tmp_path, "logits", frames=3_000) + ["--no-async_rl", "--no-normalize_input"]) == 0
    assert len(compared) >= 3 and sum(compared) > 100, compared

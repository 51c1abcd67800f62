"""Every image size: images too small for the default encoder get one that fits (the gym: family's
small-image default), a size no encoder of the run fits is refused before anything starts, in one
line naming --encoder, and an observation the model cannot encode names the flag that leaves it out.
The env is our own MiniGrid-like one (tests/small_image_env.py: a 7x7 view and a text mission)."""
import os
import re
import subprocess
import sys
import uuid

import numpy as np
import pytest
from gymnasium import spaces

import appo
import env as envs
from conftest import RUN_TIMEOUT_S, processes_still_tagged

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
SMALL_VIEW = "gym:small_image_env:SmallView-v0"


def image_space(side: int) -> spaces.Dict:
    return spaces.Dict({"image": spaces.Box(0, 255, (3, side, side), np.uint8)})


def test_the_default_encoder_is_refused_below_its_size_and_the_small_one_fits_minigrids_views():
    cfg = appo.parse_args(["--env", "doom_basic"])
    assert cfg.encoder == "convnet_simple"
    smallest = min(side for side in range(1, 100) if not appo.encoder_errors(image_space(side), cfg))
    assert smallest == envs.SMALL_IMAGE_SIDE == 36  # (36 - 8) / 4 + 1 = 8; (8 - 4) / 2 + 1 = 3; (3 - 3) / 2 + 1 = 1
    [error] = appo.encoder_errors(image_space(7), cfg)
    assert "--encoder convnet_simple does not fit observation 'image', images of 7x7" in error
    assert "at least 36x36" in error and "--encoder convnet_small" in error
    small = appo.parse_args(["--env", "doom_basic", "--encoder", "convnet_small"])
    assert appo.encoder_errors(image_space(4), small) == appo.encoder_errors(image_space(7), small) == []
    assert appo.encoder_errors(image_space(3), small)


def run(tmp_path, *flags, frames: int = 4096) -> subprocess.CompletedProcess:
    tag = uuid.uuid4().hex
    environment = dict(os.environ, APPO_TEST_TAG=tag, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, os.path.join(REPO, "appo.py"), "--env", SMALL_VIEW, *flags,
                             "--train_for_env_steps", str(frames), "--train_dir", str(tmp_path), "--report_every_sec", "2"],
                            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=environment)
    assert processes_still_tagged(tag) == []
    return result


@pytest.mark.slow
def test_a_small_image_env_is_refused_in_one_line_until_told_which_keys_and_which_encoder(tmp_path):
    text_key = run(tmp_path)
    assert text_key.returncode != 0
    error = [line for line in text_key.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "'mission' is a Text" in error[0] and "--obs_keys image" in error[0], text_key.stderr
    too_big = run(tmp_path, "--obs_keys", "image", "--encoder", "convnet_simple", "--restart_behavior", "overwrite")
    assert too_big.returncode == 2 and "Traceback" not in too_big.stderr, too_big.stderr[-2000:]
    assert [line for line in too_big.stderr.splitlines() if line.startswith("error:")] == [
        "error: --encoder convnet_simple does not fit observation 'image', images of 7x7 (it needs at least 36x36): "
        "use --encoder convnet_small, made for small images"]


@pytest.mark.slow
def test_a_small_image_env_trains_with_the_familys_small_image_encoder(tmp_path):
    """The family's default for a 7x7 view is convnet_small, and it learns to read the picture: random
    play scores about 6.7 of 20."""
    result = run(tmp_path, "--obs_keys", "image", frames=60_000)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "--encoder convnet_small" in result.stdout.splitlines()[1]  # the family's defaults line
    returns = [float(value) for value in re.findall(r"avg return (-?[\d.]+) \(100 ep\)", result.stdout)]
    assert returns and max(returns) > 12, result.stdout[-3000:]

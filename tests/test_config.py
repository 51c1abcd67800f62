"""appo.py's PLUMBING: config: the flags' defaults and derived sizes, the hardware probes, the
checks before anything starts, and the flags' help and docs/flags.md."""
import os
import re
import sys

import pytest
import torch

import appo
from conftest import IMAGE_AND_VECTOR, TWO_HEADS, small_cfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Defaults and derived sizes

def test_env_defaults_apply_unless_a_flag_is_given():
    assert appo.parse_args(["--env", "doom_basic"]).env_frameskip == 4
    assert appo.parse_args(["--env", "doom_basic", "--env_frameskip", "2"]).env_frameskip == 2


def test_dmlab_takes_the_resnet_encoder_by_default():
    import env as envs
    assert envs.env_defaults("dmlab_30")["encoder"] == "resnet"
    assert envs.env_defaults("doom_basic").get("encoder", "convnet_simple") == "convnet_simple"


def test_batch_size_and_num_batches_per_epoch_mean_what_they_mean_in_sample_factory():
    """A Sample Factory Atari command line: minibatches of 256, 4 of them an iteration (1024 samples),
    synchronous. Before, --batch_size was the iteration and this trained minibatches of 64."""
    cfg = appo.parse_args(["--env", "atari_breakout", "--num_workers", "2", "--num_envs_per_worker", "4",
                           "--batch_size", "256", "--num_batches_per_epoch", "4", "--async_rl=False"])
    assert appo.samples_per_iteration(cfg) == 1024 and appo.trajectories_per_batch(cfg) == 8
    assert cfg.async_rl is False and appo.config_errors(cfg) == []
    three = small_cfg(num_batches_per_epoch=3)  # any count: each minibatch is 24 / 6 = 4 whole trajectories
    assert appo.config_errors(three) == [] and appo.trajectories_per_batch(three) == 12


@pytest.mark.parametrize("env, minibatch, epochs", [("atari_breakout", 256, 4), ("gym:Hopper-v5", 256, 2)])
@pytest.mark.parametrize("workers", [1, 2, 8, 36])
def test_a_synchronous_family_stays_synchronous_with_the_same_sgd_work_per_sample_on_any_machine(
        env, minibatch, epochs, workers, capsys):
    """Before, the Atari and gym: families' synchronous default went asynchronous wherever their
    batch was not whole rollouts of every env: on most machines past 4 (Atari) or 8 (gym:) cores.
    Now the batch is the fewest rollouts of every env that hold the family's, in minibatches of
    the family's size: the same SGD steps per sample, a different number of samples per update."""
    cfg = appo.parse_args(["--env", env, "--num_workers", str(workers)])  # 2 envs per worker by default
    one_rollout_of_every_env, iteration = workers * 2 * cfg.rollout, appo.samples_per_iteration(cfg)
    assert cfg.async_rl is False and appo.config_errors(cfg) == []
    assert iteration % one_rollout_of_every_env == 0 and iteration >= 1024
    assert cfg.batch_size == minibatch and cfg.num_epochs == epochs
    assert iteration - one_rollout_of_every_env < 1024  # no more rollouts than it takes
    assert capsys.readouterr().out == ""  # nothing to note: the algorithm did not change


def test_a_batch_of_your_own_is_kept_and_a_misfit_is_an_error_not_a_switch():
    given = appo.parse_args(["--env", "atari_breakout", "--num_workers", "3", "--num_batches_per_epoch", "4"])
    assert given.async_rl is False and appo.samples_per_iteration(given) == 1024  # 3 x 2 x 128 = 768 a round
    assert "--no-async_rl needs an iteration" in " ".join(appo.config_errors(given))
    assert "--num_batches_per_epoch 3" in " ".join(appo.config_errors(given))  # the nearest that fits
    asynchronous = appo.parse_args(["--env", "atari_breakout", "--num_workers", "3", "--async_rl"])
    assert appo.samples_per_iteration(asynchronous) == 1024
    assert appo.parse_args(["--env", "doom_basic"]).async_rl  # Sample Factory's Doom default: asynchronous


def test_a_run_without_a_budget_decays_its_rate_over_the_familys_published_one():
    atari = appo.parse_args(["--env", "atari_breakout"])  # CleanRL's and Sample Factory's 10M steps
    assert atari.train_for_env_steps == 40_000_000
    assert appo.scheduled_learning_rate(atari, 20_000_000) == pytest.approx(2.5e-4 / 2)
    assert appo.parse_args(["--env", "gym:Hopper-v5"]).train_for_env_steps == 10_000_000
    own = appo.parse_args(["--env", "atari_breakout", "--train_for_env_steps", "2000000"])
    assert appo.scheduled_learning_rate(own, 1_000_000) == pytest.approx(2.5e-4 / 2)


# ---------------------------------------------------------------------------------------------
# Hardware probes and checks before anything starts

def test_encoder_dtype_auto_picks_bfloat16_only_where_the_hardware_computes_it_natively(monkeypatch):
    def auto_on(device="cpu"):
        return appo.parse_args(["--env", "doom_basic", "--device", device]).encoder_dtype

    monkeypatch.setattr(appo, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_vnni"})  # AVX-512, bf16 emulated
    assert auto_on() == "float32"
    monkeypatch.setattr(appo, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert auto_on() == "bfloat16"
    monkeypatch.setattr(appo, "cpu_flags", lambda: {"amx_bf16", "amx_tile"})
    assert auto_on() == "bfloat16"
    monkeypatch.setattr(appo, "cpu_flags", set)  # not Linux, or an old CPU
    assert auto_on() == "float32"
    assert appo.parse_args(["--env", "doom_basic", "--encoder_dtype", "float32"]).encoder_dtype == "float32"
    # GPUs: only where bf16 is native (Ampere and later), not where torch would emulate it
    monkeypatch.setattr(appo.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(appo.torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert auto_on("cuda") == "float32"
    monkeypatch.setattr(appo.torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert auto_on("cuda") == "bfloat16"


def test_this_machines_cpu_flags_are_read():
    assert "fpu" in appo.cpu_flags() or not os.path.exists("/proc/cpuinfo")


def test_an_optimizer_is_checked_before_the_run_kept_across_a_resume_and_pbt_leaves_adams_betas_to_adam(
        tmp_path, monkeypatch):
    """make_optimizer is a forker's edit: one whose step needs a closure (LBFGS) is one line before
    anything starts; a resume with another --optimizer is one line (its state would not load), while a
    config.json from before the flag resumes as Adam's; PBT's rows carry Adam's beta1 only for Adam."""
    cfg = small_cfg(train_dir=str(tmp_path))
    model = appo.ActorCritic(IMAGE_AND_VECTOR, TWO_HEADS, cfg)
    assert appo.optimizer_errors(model, cfg) == []
    monkeypatch.setattr(appo, "make_optimizer", lambda model, cfg: torch.optim.LBFGS(model.parameters()))
    assert "LBFGS.step needs a closure" in appo.optimizer_errors(model, cfg)[0]
    monkeypatch.undo()
    folder = tmp_path / cfg.experiment
    folder.mkdir()
    (folder / "config.json").write_text('{"env": "%s", "num_policies": 1}' % cfg.env)  # before --optimizer
    assert appo.saved_config_errors(cfg) == []
    sgd = small_cfg(train_dir=str(tmp_path), optimizer="sgd")
    assert "--optimizer sgd conflicts with adam saved in" in appo.saved_config_errors(sgd)[0]
    assert "adam_beta1" in appo.PolicyHyperparams(cfg, None).names
    assert appo.PolicyHyperparams(sgd, None).names == ["learning_rate", "exploration_loss_coeff"]


# ---------------------------------------------------------------------------------------------
# The flags' help and docs/flags.md

def test_every_flag_has_help():
    for action in appo.build_parser()._actions:
        assert action.help, action.dest


def test_the_flag_tables_of_the_docs_are_the_parsers_names_defaults_and_help():
    """docs/flags.md's tables are what scripts/update_flag_docs.py makes from the parser now: a
    changed default or help text without a docs update fails here."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import update_flag_docs

    with open(os.path.join(REPO, "docs", "flags.md")) as f:
        page = f.read()
    assert update_flag_docs.flag_tables() in page, "run python scripts/update_flag_docs.py"


def test_a_help_text_with_a_pipe_stays_one_row_of_the_flag_tables(monkeypatch):
    """A forker's help "a || b" split its row of docs/flags.md into more cells than the header's."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import update_flag_docs

    build_parser = appo.build_parser

    def with_a_piped_help():
        parser = build_parser()
        parser.add_argument("--piped", default="x|y", help="train || evaluate")
        return parser

    monkeypatch.setattr(appo, "build_parser", with_a_piped_help)
    (row,) = [line for line in update_flag_docs.flag_tables().splitlines() if "--piped" in line]
    cells = re.split(r"(?<!\\)\|", row)[1:-1]  # split at the unescaped pipes, as GitHub does
    assert [cell.strip() for cell in cells] == ["`--piped`", "x\\|y", "train \\|\\| evaluate"], row


def test_the_docs_document_every_flag():
    with open(os.path.join(REPO, "docs", "flags.md")) as f:
        page = f.read()
    for action in appo.build_parser()._actions:
        if action.option_strings and action.dest != "help":
            assert f"`{action.option_strings[0]}" in page, action.option_strings[0]

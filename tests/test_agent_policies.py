"""--agent_policies: agents pinned to policies by name (PettingZoo) or index (Doom players), checked
against the env's agents before anything starts."""
import types

import pytest
import torch

import appo
import env as envs
from conftest import free_handed_slots


def pinned(mapping: str, names: list[str], num_policies: int = 2, mode: str = "train"):
    cfg = types.SimpleNamespace(agent_policies=mapping, num_policies=num_policies, env="test_env", mode=mode)
    return appo.pinned_policies(cfg, names)


def test_rules_pin_agents_by_name_glob_or_index():
    assert pinned("adversary_*=0,agent_*=1", ["adversary_0", "adversary_1", "agent_0"]) == ([0, 0, 1], [])
    assert pinned("1=0, 0=1", ["0", "1"]) == ([1, 0], [])  # a Doom duel's two players, swapped
    assert pinned("*=1", ["a", "b"]) == ([1, 1], [])
    assert pinned("a=random,b=1", ["a", "b"], mode="eval") == ([appo.RANDOM_PLAY, 1], [])  # eval only


@pytest.mark.parametrize("mapping, names, line", [
    ("a=0", ["a", "b"], "gives no policy to agent(s) b of test_env"),
    ("a=0,b=1,c=1", ["a", "b"], '"c" names no agent of test_env, whose agents are a, b'),
    ("a=0,b=2", ["a", "b"], '"b=2" is not AGENT=POLICY with POLICY one of 0 to 1 (--num_policies 2)'),
    ("a=0,b", ["a", "b"], '"b" is not AGENT=POLICY'),
    ("*=0,b=1", ["a", "b"], "agent b is given policies 0 and 1"),
    ("a=random,b=1", ["a", "b"], '"a=random" is not AGENT=POLICY with POLICY one of 0 to 1 (--num_policies 2)'),
    ("a=-1,b=1", ["a", "b"], '"a=-1" is not AGENT=POLICY'),  # random play's id is no policy of a run
])
def test_a_mapping_that_leaves_out_or_invents_an_agent_is_refused(mapping, names, line):
    assert any(line in error for error in pinned(mapping, names)[1])


def test_a_run_with_a_wrong_mapping_stops_before_it_starts(tmp_path, capsys):
    code = appo.main(["--env", "pz:pz_envs:masked_and_leaving", "--num_policies", "2", "--async_rl",
                      "--agent_policies", "a=0,b=1,x=1", "--train_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and '"x" names no agent of pz:pz_envs:masked_and_leaving, whose agents are a, b, c' in err
    assert "gives no policy to agent(s) c" not in err  # one mistake at a time: the unknown name first


def test_pinned_agents_keep_their_policies_across_episodes(tmp_path):
    cfg = appo.parse_args(["--env", "pz:pz_envs:time_limited", "--num_policies", "2", "--agent_policies",
                           "cut=1,ends=0,stays=1", "--remap_policies_every", "1", "--async_rl", "--num_workers", "1",
                           "--num_envs_per_worker", "2", "--worker_num_splits", "1", "--rollout", "8",
                           "--train_dir", str(tmp_path)])
    probe = appo.probe_env(cfg)
    assert probe.agent_names == ["cut", "ends", "stays"]
    shared = appo.create_shared(cfg, appo.ActorCritic(*probe.spaces, cfg), probe)
    worker = appo.RolloutWorker(0, 0, cfg, shared)
    try:
        assert worker.reset_all()
        for _ in range(40):  # games of 12 steps: a remap after each, were the agents not pinned
            assert worker.step_split(0)
            free_handed_slots(cfg, shared)
        assert worker.episodes_per_env == [3, 3]
        assert [actor.policy_id for actor in worker.actors] == [1, 0, 1] * 2
    finally:
        worker.close()


def test_agent_names_are_a_pettingzoo_envs_own_or_the_players_indices():
    assert envs.get_agent_names(types.SimpleNamespace(num_agents=2, unwrapped=None)) == ["0", "1"]


def test_eval_plays_each_pinned_agent_with_its_policys_checkpoint(tmp_path, capsys):
    common = ["--env", "pz:pz_envs:time_limited", "--num_policies", "2", "--agent_policies", "cut=1,ends=0,stays=1",
              "--train_dir", str(tmp_path), "--experiment", "pinned", "--seed", "1", "--async_rl"]
    assert appo.main([*common, "--serial_mode", "--num_workers", "1", "--num_envs_per_worker", "2",
                      "--rollout", "8", "--batch_size", "16", "--train_for_env_steps", "600"]) == 0
    capsys.readouterr()
    assert appo.main([*common, "--mode", "eval", "--max_num_episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "with policy 0's version" in out and "with policy 1's version" in out
    assert all(f"agent {agent} (policy {policy}) mean return" in out for agent, policy in enumerate([1, 0, 1]))
    assert appo.main([*common[:5], "x=0", *common[6:], "--mode", "eval"]) == 2  # a wrong rule stops it too


def test_a_policy_started_from_a_checkpoint_and_frozen_plays_those_weights_while_the_other_learns(tmp_path, capsys):
    common = ["--env", "pz:pz_envs:time_limited", "--num_policies", "2", "--agent_policies", "cut=1,ends=0,stays=1",
              "--train_dir", str(tmp_path), "--seed", "1", "--async_rl", "--serial_mode", "--num_workers", "1",
              "--num_envs_per_worker", "2", "--rollout", "8", "--batch_size", "16", "--train_for_env_steps", "600"]
    assert appo.main([*common[:-1], "300", "--experiment", "trained"]) == 0  # half the budget held has
    trained = appo.load_latest_checkpoint(appo.parse_args([*common, "--experiment", "trained"]), 0)
    assert appo.main([*common, "--experiment", "held", "--init_policies", f"1={trained['path']}",
                      "--frozen_policies", "1"]) == 0
    assert "policy 1 is frozen: it acts with the weights of " + trained["path"] in capsys.readouterr().out
    held = appo.parse_args([*common, "--experiment", "held"])
    frozen, learning = appo.load_latest_checkpoint(held, 1), appo.load_latest_checkpoint(held, 0)
    assert frozen["env_frames"] >= 600 and frozen["policy_version"] > 0  # it played and counted its batches
    assert all(torch.equal(tensor, trained["model"][key]) for key, tensor in frozen["model"].items())
    # its learning opponent trains on past the 300 frames of the weights it holds
    assert learning["policy_version"] > trained["policy_version"]
    assert not all(torch.equal(tensor, trained["model"][key]) for key, tensor in learning["model"].items())


@pytest.mark.parametrize("flags, line", [
    (["--init_policies", "2=x.pth"], '--init_policies: "2=x.pth" is not POLICY=CHECKPOINT with POLICY one of 0 to 1'),
    (["--init_policies", "1=missing.pth"], "--init_policies: no file missing.pth for policy 1"),
    (["--frozen_policies", "0;1"], '--frozen_policies: "0;1" is not a policy index'),
    (["--frozen_policies", "1", "--with_pbt"], "--frozen_policies with --with_pbt"),
])
def test_wrong_init_or_frozen_policies_are_refused_before_anything_starts(tmp_path, capsys, flags, line):
    assert appo.main(["--env", "pz:pz_envs:time_limited", "--num_policies", "2", "--async_rl",
                      "--train_dir", str(tmp_path), *flags]) == 2
    assert line in capsys.readouterr().err

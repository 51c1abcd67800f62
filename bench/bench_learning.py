#!/usr/bin/env python
"""Learning at equal frames: appo.py against Sample Factory 2.1.1 on the benchmark suite, and
against Stable-Baselines3's PPO with rl-zoo3's tuned hyperparameters on gym: envs.

    python bench/bench_learning.py --sf_python .venv-sf/bin/python
    python bench/bench_learning.py --envs gym:LunarLander-v3 --trainers appo,sb3 --sb3_python .venv-sb3/bin/python \
        --results_dir docs/bench/gym --sb3_results_dir docs/bench/gym_sb3
    python bench/bench_learning.py --envs doom_basic,doom_my_way_home --trainers appo --json
    python bench/bench_learning.py --report_only          # the table and plots from saved results
    python bench/bench_learning.py --headline             # the README's table, from four folders of runs
    python bench/bench_learning.py --contention           # every saved run that shared the machine
    python bench/bench_learning.py --equal_seconds        # the SB3 table, each side read at the other's minutes

For every env it trains both trainers, one run at a time, with the same system configuration
(SYSTEM: workers, envs per worker, splits, rollout; each env's own frameskip) and each trainer
otherwise on its own defaults for that env, for the env's frame budget (SUITE) and several seeds.
Every finished run is saved at once under --results_dir (one JSON file per trainer, env and seed:
its command, configuration, curve, wall-clock and exit status) and committed with the repo; a run
whose saved configuration is the one the bench would use now is not run again, so an interrupted
suite resumes where it stopped and, while appo.py's defaults change, Sample Factory's results are
reused. appo.py's configuration includes a hash of its code (appo.py, env.py, csrc/), so any
change to the trainer re-runs it.

The frame axis of every table and plot is env frames the learner has trained on, frameskip
included: what Sample Factory's summaries count (its `env_steps`, with summaries_use_frameskip),
and appo.py's `frames_trained` summary. The bench checks both trainers' saved configurations for
it. Scores are each trainer's average over its last 100 finished games of the game's own score
(appo.py: true_return; Sample Factory: avg_true_objective on Doom, RecordEpisodeStatistics_reward on
Atari, where its episodes are lives and its rewards clipped), on tasks the bench checks are the
same (see TASK MATCHING below and `task` in the table).

The table gives per env: the budget, how the tasks were matched, appo.py's median score at the
budget (min-max over seeds), Sample Factory's, each one's median wall-clock to the budget,
appo.py's median wall-clock to reach Sample Factory's final median score, that time as a
fraction of Sample Factory's, and p, the exact rank-sum p-value of appo.py's final scores being
below Sample Factory's (is a gap more than the seeds' spread?). Runs that crash or hang (no
output for --stall_seconds) count as failures, are reported, and leave no process and no
/dev/shm entry behind.
"""
import argparse
import functools
import glob
import hashlib
import itertools
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# The suite and its frame budgets (the learning-suite issue); seeds per family: (appo.py, Sample Factory).
SUITE = {
    "doom_basic": 500_000,
    "doom_defend_the_center": 1_000_000,
    "doom_defend_the_line": 1_000_000,
    "doom_health_gathering": 1_000_000,
    "doom_my_way_home": 1_000_000,
    "doom_take_cover": 1_000_000,
    "atari_breakout": 3_000_000,
    "atari_space_invaders": 3_000_000,
}
# Held out: envs of the same families that no default was chosen on (a family default moves only on
# the suite; these say whether it carries over). Results go to their own --results_dir,
# docs/bench/heldout, and are reported beside the suite, never used to choose.
HELD_OUT = {
    "doom_deadly_corridor": 1_000_000,
    "doom_health_gathering_supreme": 1_000_000,
    "atari_pong": 3_000_000,
}
# Envs whose map the vizdoom package ships otherwise than Sample Factory does: appo.py's runs and
# probe load Sample Factory's own scenario files (--doom_scenarios_dir, found through --sf_python),
# so that both trainers play one map.
SF_SCENARIO_FILES = {"doom_health_gathering_supreme"}
# gym: envs, appo.py alone (Sample Factory is not set up for them here), each with its family's
# defaults; results in their own --results_dir, docs/bench/gym. Frames are env steps (frameskip 1).
# Budgets are those of the published PPO figures they are read beside (docs/results/learning.md):
# CleanRL's ppo.py (classic control, 500k steps) and ppo_continuous_action.py (MuJoCo, 1M steps).
GYM = {
    "gym:CartPole-v1": 500_000,
    "gym:Acrobot-v1": 500_000,
    "gym:HalfCheetah-v5": 1_000_000,  # pip install -e .[mujoco]
    "gym:Hopper-v5": 1_000_000,
    "gym:Walker2d-v5": 1_000_000,
    "gym:InvertedPendulum-v5": 1_000_000,
    "gym:LunarLander-v3": 1_000_000,  # pip install -e .[box2d]; rl-zoo3's budget (none from CleanRL)
}
# pz: envs, appo.py alone, at the pz: family's defaults (results in docs/bench/pettingzoo): a frame
# is one agent's step, so mpe2's simple_spread (3 agents, 25-step games) plays 1M / 75 games a seed.
PZ = {
    "pz:mpe2.simple_spread_v3:parallel_env": 1_000_000,  # pip install mpe2
}
AGAINST_SF = {**SUITE, **HELD_OUT}  # the envs both trainers run: the README's table
BUDGETS = {**AGAINST_SF, **GYM, **PZ}
# (appo.py, Sample Factory) seeds per env. Atari's were (2, 1), the minimum, until a third
# appo.py seed moved both games' medians by more than the gap being measured; then (3, 2), (5, 2)
# since seeds 4 and 5 moved breakout's median again, and (5, 3) since a third Sample Factory seed
# on space_invaders scored below three of appo.py's five (docs/results/learning.md, the Atari table).
SEEDS = {"doom": (3, 2), "atari": (5, 3), "gym": (3, 0), "pz": (3, 0)}
SB3_SEEDS = 3  # Stable-Baselines3's seeds per gym: env, as many as appo.py's
# The system configuration both trainers share. The rollout is each family's in Sample Factory's
# published configuration (its cfg.py default 32; atari_params.py 128). Atari runs 8 envs, as
# atari_params.py does (8 workers x 1 env): its defaults train synchronously (async_rl False), which
# needs the envs' rollouts (envs x 128) to divide the samples of one training iteration (4 x 256);
# with 16 envs Sample Factory refuses to start.
SYSTEM = {
    "doom": {"num_workers": 2, "num_envs_per_worker": 8, "worker_num_splits": 2, "rollout": 32},
    "atari": {"num_workers": 2, "num_envs_per_worker": 4, "worker_num_splits": 2, "rollout": 128},
    "gym": {},  # appo.py alone: the gym: family's own defaults
    "pz": {},  # appo.py alone: the pz: family's own defaults
}
# Sample Factory's launchers (bench/setup_sample_factory.sh installs the two sf_train_* modules).
SF_MODULES = {"doom": "sf_train_vizdoom_extra", "atari": "sf_train_atari_ale"}
# Sample Factory's configurations the bench knows by name (--sf_config): its own published one for
# each family, and its published one with each setting that appo.py's family defaults took from
# appo.py's own measurement rather than from Sample Factory's configuration, so that a comparison
# can give Sample Factory what appo.py was given.
SF_CONFIGS = {
    "published": [],  # cfg.py with doom_params.py or atari_params.py
    "doom_batch_512": ["--batch_size", "512"],  # the Doom family's batch (Sample Factory's is 1024)
    # ... and appo.py's resize of Doom screens, the average (SF_PATCHES): appo.py's Doom defaults in full
    "doom_batch_512_area_resize": ["--batch_size", "512"],
}
# Settings Sample Factory has no flag for, made by a sitecustomize module put on its PYTHONPATH (so in
# every process a run starts). area_resize: its doom_utils.py makes ResizeWrapper without
# area_interpolation, so Doom screens shrink to the nearest pixel; appo.py averages (INTER_AREA).
SF_PATCHES = {
    "area_resize": """
try:
    import sample_factory.envs.env_wrappers as wrappers
except ImportError:  # an interpreter without Sample Factory
    wrappers = None
if wrappers is not None:
    _resize_init = wrappers.ResizeWrapper.__init__

    def _area_resize_init(self, *args, **kwargs):
        kwargs["area_interpolation"] = True
        _resize_init(self, *args, **kwargs)

    wrappers.ResizeWrapper.__init__ = _area_resize_init
""",
}
SF_CONFIG_PATCHES = {"doom_batch_512_area_resize": "area_resize"}
# Where Sample Factory spells a game otherwise (its sf_examples/atari/atari_utils.py ATARI_ENVS).
SF_ENV_NAMES = {"atari_space_invaders": "atari_spaceinvaders"}
# Where a Sample Factory Doom env sets no true objective, its avg_true_objective is the sum of the
# training rewards, which its doom_utils.py scales by DoomSpec.reward_scaling: undone here.
SF_SCORE_SCALE = {"doom_basic": 100.0, "doom_deadly_corridor": 100.0}
APPO_SCORE_TAG, APPO_FRAMES_TAG = "p0/true_return", "p0/frames_trained"
# Stable-Baselines3 (--trainers sb3, gym: envs): rl-zoo3's train script with the zoo's PPO
# hyperparameters for the env id, or, where the zoo has none for this version (it tunes v4 MuJoCo
# envs; we run v5), for the newest version it has, which the result file names (zoo_entry). Its
# score is rollout/ep_rew_mean: the mean over the last 100 finished episodes of the return that its
# Monitor wrapper records below VecNormalize, i.e. the env's own reward, against env steps: the
# same metric and axis as appo.py's true_return against frames trained (frameskip 1).
SB3_SCORE_TAG = "rollout/ep_rew_mean"
BASELINE_NAMES = {"sf": "Sample Factory", "sb3": "SB3 + rl-zoo3"}
# Sample Factory's score of a finished game, by family. Its avg_true_objective is the sum of the
# rewards of an *episode*; on Atari, EpisodicLifeEnv ends an episode at every lost life and
# ClipRewardEnv clips its rewards, so that is a per-life, clipped sum. The whole game's raw score
# is what gym's RecordEpisodeStatistics (the innermost wrapper in its atari_utils.py) puts in
# info["episode"], which Sample Factory averages as RecordEpisodeStatistics_reward.
SF_SCORE_TAGS = {"doom": "policy_stats/avg_true_objective", "atari": "policy_stats/avg_RecordEpisodeStatistics_reward"}
# A run during which more than this share of the machine's CPU went to other jobs is marked.
CONTENDED_SHARE = 0.05
# Entries in /dev/shm that a killed trainer can leave: VizDoom's segments, multiprocessing's
# semaphores, torch's shared tensors (Sample Factory's).
SHM_PREFIXES = ("ViZDoom", "sem.mp-", "torch_")


def family(env_name: str) -> str:
    if env_name.startswith(("gym:", "pz:")):
        return env_name.split(":")[0]
    return env_name.split("_")[0]


# ---------------------------------------------------------------------------------------------
# Configurations and their keys
# ---------------------------------------------------------------------------------------------

def code_hash(paths: list[str], names: list[str] | None = None) -> str:
    """The files' bytes, each under its name: its path in the repository, unless `names` gives it."""
    digest = hashlib.sha256()
    for path, name in zip(paths, names or [os.path.relpath(path, REPO) for path in paths]):
        with open(path, "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def setup_hash(script: str) -> str:
    """A setup script's hash, the "setup" of each SB3 or Sample Factory run's key. Hashed under the
    name it had when the saved runs were made (scripts/, before bench/), so that they keep their keys."""
    return code_hash([os.path.join(REPO, "bench", script)], names=[f"scripts/{script}"])


def appo_code_hash() -> str:
    return code_hash([os.path.join(REPO, "appo.py"), os.path.join(REPO, "env.py"),
                      *sorted(glob.glob(os.path.join(REPO, "csrc", "*")))])


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        # the trainer and the benches themselves: a result made by an uncommitted bench says so
        dirty = subprocess.run(["git", "status", "--porcelain", "appo.py", "env.py", "csrc", "bench", "scripts",
                                "setup.py"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return commit + ("+uncommitted" if dirty else "")
    except OSError:
        return "unknown"


def system_flags(env_name: str) -> list[str]:
    return [f"--{name}={value}" for name, value in SYSTEM[family(env_name)].items()]


def run_config(args, trainer: str, env_name: str, seed: int) -> dict:
    """Everything that decides a run's result; its hash names the saved result."""
    config = {"trainer": trainer, "env": env_name, "frames": args.frames or BUDGETS[env_name], "seed": seed,
              "system": system_flags(env_name)}
    if trainer == "appo":
        config.update(extra_flags=args.appo_flags.split(), code=appo_code_hash())
        if env_name in SF_SCENARIO_FILES:  # the folder is this machine's; the key names whose files
            config["scenario_files"] = "sample_factory"
    elif trainer == "sb3":
        entry, hyperparams = (given_hyperparams(args.sb3_hyperparams) if args.sb3_hyperparams
                              else zoo_hyperparams(args.sb3_python, gym_id(env_name)))
        config.update(zoo_entry=entry, hyperparams=hyperparams, threads=os.cpu_count(),
                      setup=setup_hash("setup_sb3.sh"))
    else:
        config.update(extra_flags=SF_CONFIGS[args.sf_config] + args.sf_flags.split(),
                      launcher=SF_MODULES[family(env_name)],
                      setup=setup_hash("setup_sample_factory.sh"))
        if args.sf_config != "published":  # saved results of the published one keep their key
            config["sf_config"] = args.sf_config
        if args.sf_config in SF_CONFIG_PATCHES:
            config["patch"] = SF_CONFIG_PATCHES[args.sf_config]
    return config


def gym_id(env_name: str) -> str:
    return env_name.removeprefix("gym:")


@functools.lru_cache(maxsize=None)
def zoo_hyperparams(sb3_python: str | None, env_id: str) -> tuple[str, dict]:
    """rl-zoo3's PPO entry for `env_id` (its hyperparams/ppo.yml, as installed for `sb3_python`):
    the env's own, else that of the newest version of the same env it tunes; (entry, settings)."""
    if not sb3_python:
        return "not read (no --sb3_python)", {}
    code = ("import json, os, rl_zoo3, yaml\n"
            "with open(os.path.join(os.path.dirname(rl_zoo3.__file__), 'hyperparams', 'ppo.yml')) as f:\n"
            "    print(json.dumps(yaml.safe_load(f)))")
    zoo = json.loads(subprocess.run([sb3_python, "-c", code], capture_output=True, text=True, check=True).stdout)
    entry = zoo_entry_for(zoo, env_id)
    if entry is None:
        raise SystemExit(f"error: rl-zoo3 has no PPO hyperparameters for {env_id} or another version of it")
    return entry, zoo[entry]


def given_hyperparams(path: str) -> tuple[str, dict]:
    """--sb3_hyperparams: a JSON file of rl-zoo3 hyperparameters that replaces the zoo's entry whole
    (a crossover: SB3 at another trainer's settings); (its name, as the entry, and the settings)."""
    with open(path) as f:
        return f"given: {os.path.basename(path)}", json.load(f)


def zoo_entry_for(zoo: dict, env_id: str) -> str | None:
    """`env_id` if the zoo tunes it, else the newest version of the same env that it tunes."""
    if env_id in zoo:
        return env_id
    name = env_id.rsplit("-v", 1)[0]
    versions = sorted((int(key.rsplit("-v", 1)[1]), key) for key in zoo
                      if key.rsplit("-v", 1)[0] == name and key.rsplit("-v", 1)[1].isdigit())
    return versions[-1][1] if versions else None


def config_key(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


# What --report_only cannot know without the trainers' interpreters or the machine that ran them:
# SB3's zoo entry and settings (read through --sb3_python) and its threads (the machine's cores).
NOT_KNOWN_WHEN_REPORTING = ("zoo_entry", "hyperparams", "threads")


def same_but_code(saved: dict, config: dict, also: tuple = ()) -> bool:
    """Was `saved` run with `config`, except perhaps at another version of appo.py's code (and
    other values of the fields in `also`)?"""
    ignored = dict.fromkeys(("code", *also))
    return {**saved["config"], **ignored} == {**config, **ignored}


def result_path(args, trainer: str, env_name: str, seed: int) -> str:
    # Sample Factory's named configurations other than its published one get files of their own, so
    # that both can live in one folder (a held-out env's, say)
    label = trainer if trainer in ("appo", "sb3") or args.sf_config == "published" else f"sf_{args.sf_config}"
    folder = args.sb3_results_dir if trainer == "sb3" else args.results_dir
    return os.path.join(folder, env_name, f"{label}_seed{seed}.json")


def load_result(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def save_json(path: str, data: dict):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(temporary, path)


# ---------------------------------------------------------------------------------------------
# Running one trainer
# ---------------------------------------------------------------------------------------------

def trainer_command(args, config: dict, train_dir: str) -> list[str]:
    if config["trainer"] == "sb3":
        # rl-zoo3 reads the hyperparameters by env id: the entry chosen goes in a file under this id
        # (JSON is YAML, and rl-zoo3 takes a .yml)
        conf_file = os.path.join(train_dir, "zoo_ppo.yml")
        with open(conf_file, "w") as f:
            json.dump({gym_id(config["env"]): config["hyperparams"]}, f)
        return [args.sb3_python, "-m", "rl_zoo3.train", "--algo", "ppo", "--env", gym_id(config["env"]),
                "--conf-file", conf_file, "-n", str(config["frames"]), "--seed", str(config["seed"]),
                "--num-threads", str(config["threads"]), "--eval-freq", "-1", "--log-folder",
                os.path.join(train_dir, "run"), "--tensorboard-log", os.path.join(train_dir, "run", "tb")]
    appo = config["trainer"] == "appo"
    env_name = config["env"] if appo else SF_ENV_NAMES.get(config["env"], config["env"])
    common = ["--env", env_name, *config["system"], "--seed", str(config["seed"]), "--train_dir", train_dir,
              "--experiment", "run", "--train_for_env_steps", str(config["frames"]), *config["extra_flags"]]
    if appo:
        scenarios = ["--doom_scenarios_dir", args.sf_scenarios_dir] if "scenario_files" in config else []
        return [sys.executable, os.path.join(REPO, "appo.py"), *common, *scenarios, "--report_every_sec", "5"]
    return [args.sf_python, "-m", config["launcher"], *common, "--device", "cpu"]


def patched_environment(config: dict, folder: str) -> dict | None:
    """The environment of a run whose configuration names a patch (SF_PATCHES): its sitecustomize
    module in `folder`, first on PYTHONPATH; None (this process's environment) for the others."""
    if "patch" not in config:
        return None
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write(SF_PATCHES[config["patch"]])
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")])))


def sf_scenarios_dir(sf_python: str) -> str:
    """The folder of Sample Factory's own Doom scenario files, in its interpreter's site-packages."""
    code = "import os, sf_examples.vizdoom.doom as d; print(os.path.join(os.path.dirname(d.__file__), 'scenarios'))"
    return subprocess.run([sf_python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def kill_group(pid: int):
    import appo

    appo.kill_process_group(pid)


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [float(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_trainer(command: list[str], cwd: str, log_path: str, stall_seconds: float, max_seconds: float,
                environment: dict | None = None) -> dict:
    """Runs one training in its own process group, its output to log_path. A run that prints
    nothing for stall_seconds, or runs past max_seconds, is killed as hung. Whatever it leaves
    (processes, /dev/shm entries) is removed and reported. `other_cpu_share` is the share of the
    machine's CPU time that went to anything but this run (another job would slow it down: its
    wall-clock is then not comparable)."""
    import appo_ipc  # torch, which the report alone does not need

    shm_before = appo_ipc.shm_entries()
    busy_before, own_before = busy_cpu_seconds(), children_cpu_seconds()
    started_at = time.time()
    last_output = [time.monotonic()]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env=environment)

        def copy_output():
            for line in process.stdout:
                log.write(line)
                last_output[0] = time.monotonic()

        reader = threading.Thread(target=copy_output, daemon=True)
        reader.start()
        status = None
        try:
            while process.poll() is None:
                time.sleep(1.0)
                if time.monotonic() - last_output[0] > stall_seconds:
                    status = f"hung (no output for {stall_seconds:.0f} s)"
                elif time.time() - started_at > max_seconds:
                    status = f"hung (still running after {max_seconds:.0f} s)"
                if status:
                    process.terminate()
                    try:
                        process.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        pass
                    break
        finally:  # also on Ctrl-C or SIGTERM of the bench: nothing of the run survives it
            kill_group(process.pid)
            process.wait()
            reader.join(timeout=10)
            # what the run left, held by no process now that its group is gone: another run's
            # live segments on the same machine stay
            leftovers = [name for name in appo_ipc.shm_left_since(shm_before) if name.startswith(SHM_PREFIXES)]
            for name in leftovers:
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass
    wall_s = time.time() - started_at
    other_cpu_s = (busy_cpu_seconds() - busy_before) - (children_cpu_seconds() - own_before)
    other_cpu_share = max(0.0, other_cpu_s) / (wall_s * (os.cpu_count() or 1))
    if status is None:
        status = "ok" if process.returncode == 0 else f"failed (exit code {process.returncode})"
    return {"status": status, "returncode": process.returncode, "started_at": started_at, "wall_s": wall_s,
            "other_cpu_share": round(other_cpu_share, 3), "shm_leftovers_removed": leftovers}


# ---------------------------------------------------------------------------------------------
# Reading results: curves of (wall seconds since launch, frames trained, score)
# ---------------------------------------------------------------------------------------------

def scalar_events(events_dir: str) -> dict[str, list]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}


def appo_lag(train_dir: str) -> float | None:
    """Median over the run of appo.py's average policy lag (versions between acting and training)."""
    events = scalar_events(os.path.join(train_dir, "run", "tb")).get("p0/lag_avg", [])
    return statistics.median(event.value for event in events) if events else None


# What a diagnosis of a run needs beside its score (docs/monitoring.md defines each): how wide the
# policy's action distribution is, how well the critic fits, how far each update moved the policy.
APPO_DIAGNOSTIC_TAGS = ("entropy", "value_loss", "explained_variance", "approx_kl", "clip_fraction", "learning_rate")
DIAGNOSTIC_POINTS = 100  # per tag and run, evenly spread over its summaries: a few KB a file


def appo_diagnostics(train_dir: str) -> dict[str, list[list[float]]]:
    """Policy 0's learner figures along the run, each point [frames trained, value] at one summary,
    thinned to DIAGNOSTIC_POINTS (the last one always kept)."""
    events = scalar_events(os.path.join(train_dir, "run", "tb"))
    trained_at = {event.step: event.value for event in events.get(APPO_FRAMES_TAG, [])}
    kept = {}
    for name in APPO_DIAGNOSTIC_TAGS:
        points = [[trained_at[event.step], event.value] for event in events.get(f"p0/{name}", [])
                  if event.step in trained_at]
        every = max(1, math.ceil(len(points) / DIAGNOSTIC_POINTS))
        kept[name] = points[::-1][::every][::-1]
    return kept


def keep_final_checkpoint(train_dir: str, result_file: str) -> str | None:
    """Copies the run's newest checkpoint beside its result file (same name, .pth); its file name."""
    found = sorted(glob.glob(os.path.join(train_dir, "run", "checkpoint_p0", "checkpoint_*.pth")))
    if not found:
        return None
    kept = result_file.removesuffix(".json") + ".pth"
    shutil.copyfile(found[-1], kept)
    return os.path.basename(kept)


def appo_curve(train_dir: str, started_at: float) -> list[list[float]]:
    """appo.py writes its summaries at frames collected, with frames trained as a scalar of the
    same write: each score is placed at the frames trained when it was written."""
    events = scalar_events(os.path.join(train_dir, "run", "tb"))
    trained_at = {event.step: event.value for event in events.get(APPO_FRAMES_TAG, [])}  # the write's step
    curve = []
    for event in events.get(APPO_SCORE_TAG, []):
        frames = trained_at.get(event.step)
        if frames is not None:
            curve.append([event.wall_time - started_at, frames, event.value])
    return sorted(curve, key=lambda point: point[1])


def sf_curve(train_dir: str, started_at: float, env_name: str) -> list[list[float]]:
    scale = SF_SCORE_SCALE.get(env_name, 1.0)
    events = scalar_events(os.path.join(train_dir, "run", ".summary", "0"))
    return sorted(([event.wall_time - started_at, event.step, event.value * scale]
                   for event in events.get(SF_SCORE_TAGS[family(env_name)], [])), key=lambda point: point[1])


def sb3_curve(train_dir: str, started_at: float) -> list[list[float]]:
    """Stable-Baselines3 writes its summaries at env steps (num_timesteps) under a folder per run
    (tb/<env id>/PPO_1)."""
    folders = glob.glob(os.path.join(train_dir, "run", "tb", "*", "PPO_*"))
    if len(folders) != 1:
        raise RuntimeError(f"expected one run of summaries in {train_dir}/run/tb, found {len(folders)}")
    events = scalar_events(folders[0])
    return sorted(([event.wall_time - started_at, event.step, event.value] for event in events.get(SB3_SCORE_TAG, [])),
                  key=lambda point: point[1])


def frame_axis_check(trainer: str, train_dir: str, env_name: str) -> str | None:
    """None if the trainer's saved configuration counts frames as env frames with frameskip;
    otherwise what is wrong."""
    import env as envs

    expected = envs.env_defaults(env_name).get("env_frameskip", 1)
    if trainer == "sb3":  # it counts env steps: frames only where the env skips none
        return None if expected == 1 else f"Stable-Baselines3 counts env steps, and {env_name} skips {expected} frames"
    saved = load_result(os.path.join(train_dir, "run", "config.json")) or {}  # both trainers save one there
    skip = saved.get("env_frameskip")
    if trainer == "appo":
        return None if skip == expected else f"appo.py's env_frameskip {skip}, expected {expected}"
    with_skip = saved.get("summaries_use_frameskip")
    if skip != expected or with_skip is not True:
        return f"Sample Factory's env_frameskip {skip}, summaries_use_frameskip {with_skip}: expected {expected}, True"
    return None


def machine() -> dict:
    """The CPU a run had. appo.py's encoder runs in bfloat16 by default where the CPU multiplies it
    natively, so runs from sessions on CPUs with and without it differ in precision."""
    import appo

    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return {"cpu": model, "cores": os.cpu_count(), "bfloat16": appo.native_bfloat16("cpu")}


# The packages whose versions decide what a run computes: torch, and each env family's engine.
VERSIONED_PACKAGES = ("torch", "numpy", "gymnasium", "vizdoom", "ale-py", "mujoco", "box2d", "pettingzoo",
                      "sample-factory", "stable-baselines3", "rl_zoo3")


def package_versions(python: str) -> dict:
    """The versions of VERSIONED_PACKAGES installed for `python`, the interpreter that ran the
    trainer (Sample Factory's venv has versions of its own); those not installed are left out."""
    code = ("import importlib.metadata as m, json\nfound = {}\nfor name in %r:\n    try:\n"
            "        found[name] = m.version(name)\n    except m.PackageNotFoundError:\n        pass\n"
            "print(json.dumps(found))" % (VERSIONED_PACKAGES,))
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def trainer_precision(trainer: str, train_dir: str) -> str:
    """The precision a run trained in, as the trainer saved it: appo.py's resolved --encoder_dtype
    (`auto` becomes bfloat16 where the CPU computes it, so the same command differs by machine);
    Sample Factory 2.1.1 and Stable-Baselines3 train in float32 (neither has a reduced-precision setting)."""
    if trainer != "appo":
        return "float32"
    saved = load_result(os.path.join(train_dir, "run", "config.json")) or {}
    dtype = saved.get("encoder_dtype")
    return f"{dtype} encoder" if dtype in ("bfloat16", "float32") else "not recorded"


STARTED_LOG = "started.jsonl"


def note_start(folder: str, config: dict):
    """A line for every run the bench starts, in its results folder (STARTED_LOG): a run started
    again (a crash, a lost file) shows there, and which finished run came first can be read."""
    line = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "trainer": config["trainer"], "env": config["env"],
            "seed": config["seed"], "key": config_key(config), "commit": git_commit()}
    with open(os.path.join(folder, STARTED_LOG), "a") as f:
        f.write(json.dumps(line) + "\n")


def run_one(args, config: dict) -> dict:
    trainer, env_name, seed = config["trainer"], config["env"], config["seed"]
    print(f"{time.strftime('%H:%M:%S')} {trainer} {env_name} seed {seed}: training {config['frames']:,} frames",
          flush=True)
    load_before = os.getloadavg()[0]
    train_dir = tempfile.mkdtemp(prefix=f"bench_learning_{trainer}_")
    log_path = result_path(args, trainer, env_name, seed).removesuffix(".json") + ".log"
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    note_start(os.path.dirname(os.path.dirname(log_path)), config)
    try:
        command = trainer_command(args, config, train_dir)
        outcome = run_trainer(command, cwd=train_dir, log_path=log_path, stall_seconds=args.stall_seconds,
                              max_seconds=args.max_hours * 3600, environment=patched_environment(config, train_dir))
        curve = []
        try:
            curve = (appo_curve(train_dir, outcome["started_at"]) if trainer == "appo"
                     else sb3_curve(train_dir, outcome["started_at"]) if trainer == "sb3"
                     else sf_curve(train_dir, outcome["started_at"], env_name))
            if trainer == "appo":
                outcome["lag_avg_median"] = appo_lag(train_dir)
                outcome["diagnostics"] = appo_diagnostics(train_dir)
        except Exception as error:  # a run that died before its first summary has none
            outcome["curve_error"] = f"{type(error).__name__}: {error}"
        if trainer == "appo" and args.keep_checkpoints and outcome["status"] == "ok":
            outcome["checkpoint"] = keep_final_checkpoint(train_dir, result_path(args, trainer, env_name, seed))
        axis_problem = frame_axis_check(trainer, train_dir, env_name)
        precision = trainer_precision(trainer, train_dir)
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)
    if outcome["status"] == "ok" and not curve:
        outcome["status"] = "failed (no score was reported)"
    if axis_problem and outcome["status"] == "ok":  # a run that failed saved no config to check
        outcome["status"] = f"failed (frame axis: {axis_problem})"
    with open(log_path) as f:
        log_tail = f.read().splitlines()[-20:]
    if outcome["status"] != "ok" and log_tail:
        print(f"{trainer} {env_name} seed {seed}, the last line of its output: {log_tail[-1]}", flush=True)
    result = {"key": config_key(config), "config": config, "command": " ".join(command), "commit": git_commit(),
              **outcome, "load_before": load_before, "machine": machine(), "precision": precision,
              "versions": package_versions({"appo": sys.executable, "sf": args.sf_python, "sb3": args.sb3_python}[trainer]),
              "curve": curve,
              "log_tail": log_tail if outcome["status"] != "ok" else []}
    os.remove(log_path)  # the curve and the tail are kept; whole logs would bloat the repo
    print(f"{time.strftime('%H:%M:%S')} {trainer} {env_name} seed {seed}: {outcome['status']} in "
          f"{outcome['wall_s'] / 60:.1f} min, final score {curve[-1][2] if curve else 'none'}", flush=True)
    return result


# ---------------------------------------------------------------------------------------------
# Task matching: do both trainers play the same game?
# ---------------------------------------------------------------------------------------------

def probe(python: str, trainer: str, env_name: str, out: str, flags: tuple = ()) -> dict | None:
    command = [python, os.path.join(REPO, "bench", "task_probe.py"), "--trainer", trainer, "--env", env_name,
               "--out", out, *flags]
    completed = subprocess.run(command, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=600)
    if completed.returncode != 0:
        print(f"warning: task probe of {trainer} on {env_name} failed: {completed.stderr.strip()[-500:]}", flush=True)
        return None
    with np.load(out) as data:
        return {key: data[key] for key in data.files}


def check_task(args, env_name: str) -> str:
    """One line: how the two trainers' tasks were matched, and what the probe found."""
    with tempfile.TemporaryDirectory() as folder:
        scenarios = ("--doom_scenarios_dir", args.sf_scenarios_dir) if env_name in SF_SCENARIO_FILES else ()
        ours = probe(sys.executable, "appo", env_name, os.path.join(folder, "appo.npz"), scenarios)
        theirs = probe(args.sf_python, "sf", SF_ENV_NAMES.get(env_name, env_name), os.path.join(folder, "sf.npz"))
    if ours is None or theirs is None:
        return "probe failed"
    if not np.array_equal(ours["action_sizes"], theirs["action_sizes"]):
        return f"DIFFERENT action spaces {ours['action_sizes'].tolist()} / {theirs['action_sizes'].tolist()}"
    if "ale" in ours:  # rewards are not compared: the no-op starts draw differently across ale-py versions
        same = np.array_equal(ours["ale"], theirs["ale"])
        sticky, ale_frameskip, _, rom = ours["ale"].tolist()  # task_probe.py's order; _ = the action meanings
        return (f"{'same' if same else 'DIFFERENT'} ALE setup ({rom}, sticky-action probability "
                f"{sticky}, ALE frameskip {ale_frameskip}: the wrappers' max-and-skip makes it 4); "
                f"ale-py {ours['ale_version']} / {theirs['ale_version']}; score of whole games")
    steps = min(len(ours["rewards"]), len(theirs["rewards"]))
    same_rewards = np.allclose(ours["rewards"][:steps], theirs["rewards"][:steps], atol=1e-6)
    frames = min(len(ours["screens"]), len(theirs["screens"]))
    differing = (ours["screens"][:frames] != theirs["screens"][:frames]).any(-1).reshape(frames, -1).sum(1)
    pixels = ours["screens"][0].shape[0] * ours["screens"][0].shape[1]
    screens = ("identical screens" if differing.max() == 0 else
               f"screens differ in at most {differing.max()} of {pixels} pixels")
    return (f"{'same' if same_rewards else 'DIFFERENT'} rewards over {steps} steps, {screens} (same actions, seed)")


# ---------------------------------------------------------------------------------------------
# The table and the plots
# ---------------------------------------------------------------------------------------------

def score_at(curve: list, frames: float) -> float | None:
    """The trainer's average score at the last summary at or before `frames` trained."""
    before = [point for point in curve if point[1] <= frames * 1.001]
    return before[-1][2] if before else None


def seconds_to_reach(curve: list, score: float) -> float | None:
    reached = [point[0] for point in curve if point[2] >= score]
    return reached[0] if reached else None


def p_appo_below(appo_scores: list, baseline_scores: list) -> float | None:
    """Exact one-sided rank-sum (Mann-Whitney) p-value of "appo.py scores lower than the baseline"
    (Sample Factory or SB3).

    The share of all ways of splitting the pooled final scores into groups of these sizes in which
    the baseline's group beats appo.py's in at least as many (appo, baseline) pairs as it really
    does (ties count a half). A small p says the gap is more than seed-to-seed spread; with 2
    baseline seeds the smallest possible p is 1 / C(n + 2, 2), so a few seeds can only ever say
    "not shown".
    """
    appo_scores = [s for s in appo_scores if s is not None]
    baseline_scores = [s for s in baseline_scores if s is not None]
    if not appo_scores or not baseline_scores:
        return None
    pooled = appo_scores + baseline_scores

    def baseline_wins(baseline_group: tuple) -> float:
        appo_group = [pooled[i] for i in range(len(pooled)) if i not in baseline_group]
        return sum((a < pooled[j]) + 0.5 * (a == pooled[j]) for a in appo_group for j in baseline_group)

    observed = baseline_wins(tuple(range(len(appo_scores), len(pooled))))
    splits = list(itertools.combinations(range(len(pooled)), len(baseline_scores)))
    return sum(baseline_wins(split) >= observed for split in splits) / len(splits)


def spread(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def baseline_of(env_name: str) -> str:
    """The trainer appo.py is read beside: Stable-Baselines3 on gym: envs, else Sample Factory."""
    return "sb3" if family(env_name) == "gym" else "sf"


def summarize_env(env_name: str, frames: int, results: dict[str, list[dict]], task: str) -> dict:
    """The row of one env: appo.py's figures under "appo", its baseline's under "sf" or "sb3"
    ("baseline" says which), and the figures comparing the two."""
    baseline = baseline_of(env_name)
    row = {"env": env_name, "frames": frames, "task": task, "baseline": baseline}
    for trainer in ("appo", baseline):
        runs = results.get(trainer, [])
        ok = [r for r in runs if r["status"] == "ok"]
        row[trainer] = {
            "seeds": len(runs), "failures": [f"seed {r['config']['seed']}: {r['status']}" for r in runs if r not in ok],
            "scores": [score_at(r["curve"], frames) for r in ok],
            "wall_s": [r["wall_s"] for r in ok],
            "commit": sorted({r["commit"] for r in ok}),
            "code": sorted({r["config"].get("code", "-") for r in ok}),
            "extra_flags": extra_flags_of(ok),
            "zoo_entry": sorted({r["config"]["zoo_entry"] for r in ok if "zoo_entry" in r["config"]}),
            "precision": [r.get("precision", "not recorded") for r in ok],
            "shared_machine": [f"seed {r['config']['seed']}: {r['other_cpu_share']:.0%} of the CPU went elsewhere"
                               for r in ok if r.get("other_cpu_share", 0.0) > CONTENDED_SHARE],
        }
    baseline_scores = [s for s in row[baseline]["scores"] if s is not None]
    appo_scores = [s for s in row["appo"]["scores"] if s is not None]
    row["baseline_final_median"] = statistics.median(baseline_scores) if baseline_scores else None
    row["appo_median"] = statistics.median(appo_scores) if appo_scores else None
    row["p_appo_below"] = p_appo_below(appo_scores, baseline_scores)
    if row["baseline_final_median"] is not None:
        times = [seconds_to_reach(r["curve"], row["baseline_final_median"]) for r in results.get("appo", [])
                 if r["status"] == "ok"]
        row["appo_s_to_baseline_final"] = times
        # a seed that never got there counts as infinitely slow: the median exists if most got there
        median = statistics.median([math.inf if t is None else t for t in times]) if times else math.inf
        row["appo_s_to_baseline_final_median"] = None if math.isinf(median) else median
        baseline_wall = statistics.median(row[baseline]["wall_s"]) if row[baseline]["wall_s"] else None
        row["time_ratio"] = (row["appo_s_to_baseline_final_median"] / baseline_wall
                             if baseline_wall and row["appo_s_to_baseline_final_median"] is not None else None)
    return row


def extra_flags_of(runs: list[dict]) -> str:
    """The --appo_flags/--sf_flags the runs were given, each distinct set once ("" for none)."""
    given = dict.fromkeys(" ".join(r["config"].get("extra_flags", [])) for r in runs)
    return " / ".join(flags for flags in given if flags)


def minutes(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values) / 60:.1f}" if values else "-"


def format_table(rows: list[dict]) -> str:
    """One table for the rows read beside Sample Factory, one for those read beside SB3."""
    tables = []
    for baseline in BASELINE_NAMES:
        chosen = [row for row in rows if row.get("baseline", "sf") == baseline]
        if chosen or (baseline == "sf" and not rows):
            tables.append(format_baseline_table(chosen) if baseline == "sf" else format_sb3_table(chosen))
    return "\n\n".join(tables)


def p_cell(row: dict) -> str:
    return "-" if row.get("p_appo_below") is None else f"{row['p_appo_below']:.2f}"


def format_sb3_table(rows: list[dict]) -> str:
    lines = [
        "Scores at equal steps: each trainer's mean true return over its last 100 training episodes at the step",
        "budget, median [min, max] over seeds (n = seeds). Stable-Baselines3's PPO runs with rl-zoo3's tuned",
        "hyperparameters for the entry named (the zoo tunes v4 MuJoCo envs; these are v5), float32, on",
        "--num-threads as many threads as the machine has cores; appo.py at its gym: family defaults. Wall-clock:",
        "median minutes from launch to the budget. p = exact one-sided rank-sum p-value that appo.py's scores",
        "are lower than SB3's.",
        "",
        "| env | steps | appo.py (n) | SB3 + rl-zoo3 (n) | zoo entry | p | appo min | SB3 min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        appo, sb3 = row["appo"], row["sb3"]
        lines.append(f"| {row['env']} | {row['frames'] / 1e6:g}M | {spread(appo['scores'])} ({len(appo['scores'])}) | "
                     f"{spread(sb3['scores'])} ({len(sb3['scores'])}) | {', '.join(sb3['zoo_entry']) or '-'} | "
                     f"{p_cell(row)} | {minutes(appo['wall_s'])} | {minutes(sb3['wall_s'])} |")
    notes = [f"{row['env']} {trainer}: {note}" for row in rows for trainer in ("appo", "sb3")
             for note in row[trainer]["failures"] + row[trainer]["shared_machine"]]
    if notes:
        lines += ["", "Failed runs, and runs that shared the machine with another job:", *[f"- {n}" for n in notes]]
    codes = sorted({c for row in rows for c in row["appo"]["code"]})
    lines += ["", f"appo.py code (hash of appo.py, env.py, csrc/): {', '.join(codes) or '-'}"]
    return "\n".join(lines)


def format_baseline_table(rows: list[dict]) -> str:
    lines = [
        "Scores at equal frames: each trainer's average game score over its last 100 games at the frame budget,",
        "frames = env frames (frameskip included) the learner has trained on, for both trainers; median [min, max]",
        "over seeds (n = seeds). Wall-clock: median minutes from launch to the budget. 'appo to SF' = appo.py's",
        "median minutes to first reach Sample Factory's final median score; ratio = that / SF's wall-clock.",
        "p = exact one-sided rank-sum p-value that appo.py's scores at the budget are lower than SF's (small:",
        "a gap beyond seed-to-seed spread; large: the seeds interleave).",
        "",
        "| env | frames | appo.py (n) | Sample Factory (n) | p | appo min | SF min | appo to SF | ratio | task match |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        appo, sf = row["appo"], row["sf"]
        ratio, to_final = row.get("time_ratio"), row.get("appo_s_to_baseline_final_median")
        lines.append(
            f"| {row['env']} | {row['frames'] / 1e6:g}M | {spread(appo['scores'])} ({len(appo['scores'])}) | "
            f"{spread(sf['scores'])} ({len(sf['scores'])}) | {p_cell(row)} | {minutes(appo['wall_s'])} | "
            f"{minutes(sf['wall_s'])} | "
            f"{minutes([to_final]) if to_final else '-'} | "
            f"{f'{ratio:.2f}' if ratio is not None else '-'} | {row['task']} |")
    failures = [f"{row['env']} {trainer}: {failure}" for row in rows for trainer in ("appo", "sf")
                for failure in row[trainer]["failures"]]
    if failures:
        lines += ["", "Failed runs (counted as failures, not in the scores):", *[f"- {f}" for f in failures]]
    shared = [f"{row['env']} {trainer}: {note}" for row in rows for trainer in ("appo", "sf")
              for note in row[trainer]["shared_machine"]]
    if shared:
        lines += ["", "Runs that shared the machine with another job (their wall-clock reads slow):",
                  *[f"- {s}" for s in shared]]
    precision = []
    for trainer, name in (("appo", "appo.py"), ("sf", "Sample Factory")):
        found = [p for row in rows for p in row[trainer]["precision"]]
        if found:
            precision.append(f"{name} " + ", ".join(f"{p} ({found.count(p)} runs)" for p in dict.fromkeys(found)))
    if precision:
        lines += ["", f"Precision: {'; '.join(precision)}. The wall-clock columns are at these precisions."]
    flags = " / ".join(dict.fromkeys(row["appo"]["extra_flags"] for row in rows if row["appo"]["extra_flags"]))
    if flags:
        lines += ["", f"appo.py ran with these flags beyond its defaults: {flags}"]
    codes = sorted({c for row in rows for c in row["appo"]["code"]})
    commits = sorted({c[:7] for row in rows for c in row["appo"]["commit"]})
    current = appo_code_hash()
    stale = f" (this checkout's code is {current}: the runs are of an earlier version)" if set(codes) - {current} else ""
    lines += ["", f"appo.py code (hash of appo.py, env.py, csrc/): {', '.join(codes) or '-'}{stale}; "
                  f"HEAD during its runs: {', '.join(commits) or '-'}"]
    return "\n".join(lines)


# The README's headline table ("How it compares"), from the runs saved in four folders: the suite
# at each trainer's published configuration, the held-out envs (all configurations), and Sample
# Factory given the Doom family's settings of our own measurement on the suite: its batch of 512,
# then that batch and appo.py's average resize (appo.py's Doom defaults in full).
HEADLINE_FOLDERS = {"suite": os.path.join(REPO, "docs", "bench", "learning"),
                    "held out": os.path.join(REPO, "docs", "bench", "heldout"),
                    "doom_batch_512": os.path.join(REPO, "docs", "bench", "ablations", "sf_doom_batch_512"),
                    "doom_batch_512_area_resize": os.path.join(REPO, "docs", "bench", "ablations",
                                                               "sf_doom_batch_512_area_resize")}
HEADLINE_SF_CONFIGS = ("doom_batch_512", "doom_batch_512_area_resize")  # the columns after the published one
HEADLINE_HEADER = ["| env | frames | appo.py | Sample Factory | Sample Factory at our batch of 512 "
                   "| Sample Factory at our batch and resize | appo.py min | SF min |",
                   "|---|---|---|---|---|---|---|---|"]


def saved_runs(folder: str, env_name: str, label: str) -> list[dict]:
    """Every finished run saved as `label`_seed<N>.json for the env in `folder`, by seed."""
    paths = sorted(glob.glob(os.path.join(folder, env_name, f"{label}_seed*.json")),
                   key=lambda path: int(path.rsplit("_seed", 1)[1][:-len(".json")]))
    return [run for run in map(load_result, paths) if run is not None and run["status"] == "ok"]


def headline_cell(runs: list[dict], frames: int) -> str:
    scores = [score_at(run["curve"], frames) for run in runs]
    return f"{spread(scores)} (1 seed)" if len(scores) == 1 else spread(scores)


def headline_table() -> str:
    """The README's table, every env of the suite and the held-out ones, each cell from saved runs."""
    lines = list(HEADLINE_HEADER)
    for env_name, frames in AGAINST_SF.items():
        held_out = env_name in HELD_OUT
        folder = HEADLINE_FOLDERS["held out" if held_out else "suite"]
        appo, sf = saved_runs(folder, env_name, "appo"), saved_runs(folder, env_name, "sf")
        if family(env_name) == "atari":  # the Atari family's settings are Sample Factory's published ones
            ours = ["same configuration"] * len(HEADLINE_SF_CONFIGS)
        else:
            ours = [headline_cell(runs, frames) if runs else "not run"
                    for runs in (saved_runs(folder if held_out else HEADLINE_FOLDERS[sf_config], env_name,
                                            f"sf_{sf_config}") for sf_config in HEADLINE_SF_CONFIGS)]
        name = f"{env_name}, held out" if held_out else env_name
        lines.append(f"| {name} | {frames / 1e6:g}M | {headline_cell(appo, frames)} | {headline_cell(sf, frames)} | "
                     f"{' | '.join(ours)} | {minutes([run['wall_s'] for run in appo])} | "
                     f"{minutes([run['wall_s'] for run in sf])} |")
    return "\n".join(lines)


# The rule's table in docs/results/learning.md ("Reruns and contention: one rule"): every saved run
# during which more than CONTENDED_SHARE of the machine's CPU went elsewhere, from the files. The
# folders whose runs make a table of the README or learning.md, named as the docs name them, in
# learning.md's order; a folder of runs set aside (superseded_*, replaced) is counted in no table;
# any other folder is named by its path (its table, if any, is in ablations.md).
BENCH_DIR = os.path.join(REPO, "docs", "bench")
# The gym vector defaults' ablation (issue 80; the rules in docs/results/learning.md): its arms in
# the pre-registered order, each a folder of ABLATION_DIR with one folder per env.
ABLATION_DIR = os.path.join(BENCH_DIR, "gym_ablation")
ABLATION_ARMS = ("defaults", "bootstrap", "init", "sgd", "separate", "bundle")
# Continuous control, round two (issue 95; its rules in learning.md): Stage 1's arms, each a folder of ROUND2_DIR.
ROUND2_DIR = os.path.join(BENCH_DIR, "gym_round2")
# Each arm's --appo_flags beside --encoder_dtype float32, as the rules give them (R1' prefers fewer).
ROUND2_FLAGS = {"baseline": "", "quiet": "--policy_head_gain 0.01 --initial_stddev 0.6",
                "shuffle": "--shuffle_minibatches",
                "shuffle10": "--shuffle_minibatches --num_epochs 10 --learning_rate 0.0006",
                "scale": "--scale_rewards --no-normalize_returns"}
ROUND2_ARMS = tuple(ROUND2_FLAGS)
ROUND2_SEEDS = {"gym:HalfCheetah-v5": 10, "gym:Walker2d-v5": 3, "gym:Hopper-v5": 3}  # Stage 1: seeds 1..N per env
# R2's held-out envs for round two and their budgets (runs in ROUND2_DIR/held_out/ARM/ENV); the last
# two are the discrete guards, on which a Box-only arm runs as baseline and so is not compared.
ROUND2_HELD_OUT = {"gym:InvertedDoublePendulum-v5": 1_000_000, "gym:Swimmer-v5": 1_000_000, "gym:Reacher-v5": 1_000_000,
                   "gym:Ant-v5": 1_000_000, "gym:LunarLanderContinuous-v3": 1_000_000,
                   "gym:CartPole-v1": 500_000, "gym:Acrobot-v1": 500_000}
BOX_ONLY_ARMS = ("quiet",)
BASIN_BAR = 3000  # a HalfCheetah seed at or above it at 1M left the low basin (the rules' basin rate)
TABLE_FOLDERS = {"learning": "the Doom suite and Atari tables, the README",
                 "ablations/sf_doom_batch_512": "the batch-512 table, the README",
                 "ablations/sf_doom_batch_512_area_resize": "the README",
                 "heldout": "the held-out tables, the README",
                 "gym": "the gym: table, the SB3 table's appo.py side",
                 "gym_sb3": "the SB3 table's SB3 side",
                 "gym_sb3_4m": "the SB3 table read at equal seconds",
                 "pettingzoo": "the pz: table",
                 "repin_2026-11-28/after_70ed530": "the re-pin table",
                 "repin_2026-11-28/before_e4fc108": "the re-pin table",
                 "repin_2026-12-05/after_894d4bf": "the re-pin table of 2026-12-05",
                 "repin_2026-12-05/before_a033fe0": "the re-pin table of 2026-12-05",
                 "repin_2026-12-05/after_e4725c7": "the re-pin table of 2026-12-05",
                 **{f"gym_ablation/{arm}": "the gym defaults' ablation table" for arm in ABLATION_ARMS},
                 "gym_basin/defaults": "the HalfCheetah basin table",
                 **{f"gym_round2/{arm}": "the round-two table" for arm in ROUND2_ARMS}}
CONTENTION_HEADER = ["| env | trainer | configuration | seeds | CPU elsewhere | kept in |",
                     "|---|---|---|---|---|---|"]


def saved_learning_runs(root: str = BENCH_DIR) -> list[tuple[str, dict]]:
    """Every saved learning run under `root`, (folder it is kept in, relative to root; the run):
    each result file that records `other_cpu_share`, in any folder, set-aside ones included."""
    runs = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.json"), recursive=True)):
        run = load_result(path)
        if not (isinstance(run, dict) and "other_cpu_share" in run and "config" in run):
            continue
        folder = os.path.dirname(path)
        if os.path.basename(folder) == run["config"]["env"]:  # FOLDER/ENV/trainer_seedN.json
            folder = os.path.dirname(folder)
        runs.append((os.path.relpath(folder, root), run))
    return runs


def kept_in(folder: str) -> str:
    if folder in TABLE_FOLDERS:
        return f"`{folder}/`: {TABLE_FOLDERS[folder]}"
    if os.path.basename(folder).startswith(("superseded_", "replaced")):
        return f"`{folder}/`: set aside, counted in no table"
    return f"`{folder}/`"


def run_configuration(run: dict) -> str:
    """What a run was, beyond env, trainer and seed: appo.py's flags beyond its family's defaults
    and its code; Sample Factory's named configuration (its published one by default); SB3's zoo entry."""
    config = run["config"]
    if config["trainer"] == "appo":
        return f"{' '.join(config.get('extra_flags', [])) or 'defaults'}, code {config.get('code', '-')[:8]}"
    if config["trainer"] == "sb3":
        entry = config["zoo_entry"]
        return f"hyperparameters {entry.removeprefix('given: ')}" if entry.startswith("given: ") else f"rl-zoo3's {entry} entry"
    return config.get("sf_config", "published")


def contention_table(root: str = BENCH_DIR) -> str:
    """learning.md's table of the runs that shared the machine (over CONTENDED_SHARE of the CPU
    elsewhere), one row per folder, env, trainer and configuration, then the highest share among
    all the other saved runs."""
    runs = saved_learning_runs(root)
    order = list(TABLE_FOLDERS)
    rows = {}
    for folder, run in runs:
        if run["other_cpu_share"] > CONTENDED_SHARE:
            config = run["config"]
            key = (order.index(folder) if folder in order else len(order), folder, config["env"],
                   config["trainer"], run_configuration(run))
            rows.setdefault(key, []).append((config["seed"], run["other_cpu_share"]))
    lines = list(CONTENTION_HEADER)
    for (_, folder, env_name, trainer, configuration), seeds in sorted(rows.items()):
        seeds.sort()
        lines.append(f"| {env_name} | {'appo.py' if trainer == 'appo' else BASELINE_NAMES[trainer]} | {configuration} | "
                     f"{', '.join(str(seed) for seed, _ in seeds)} | "
                     f"{', '.join(f'{share:.1%}' for _, share in seeds)} | {kept_in(folder)} |")
    others = [run["other_cpu_share"] for _, run in runs if run["other_cpu_share"] <= CONTENDED_SHARE]
    shared = len(runs) - len(others)
    lines += ["", f"{shared} of the {len(runs)} saved runs under docs/bench/ shared the machine; every other run "
                  f"had at most {max(others, default=0.0):.1%} of the CPU elsewhere."]
    return "\n".join(lines)


def band(curves: list[list], axis: int, grid: np.ndarray, hold_last: bool = False
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median, min and max over runs of the score interpolated on `grid` (nan outside each run).

    hold_last: a run keeps its final score after its last point. On the wall-clock axis a run that
    finished early has reached its budget, not vanished; without this the median past the fastest
    seed's end is over the slower seeds only, and drops or jumps where they differ.
    """
    values = np.array([np.interp(grid, np.array(curve)[:, axis], np.array(curve)[:, 2], left=np.nan,
                                 right=curve[-1][2] if hold_last else np.nan) for curve in curves])
    with warnings.catch_warnings():  # grid points that no run covers are all-nan: nan is the answer there
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values, 0), np.nanmin(values, 0), np.nanmax(values, 0)


def plot_env(env_name: str, results: dict[str, list[dict]], path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_frames, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    baseline = baseline_of(env_name)
    baseline_label = {"sf": "Sample Factory 2.1.1", "sb3": "Stable-Baselines3 PPO, rl-zoo3's settings"}[baseline]
    for trainer, label, color in (("appo", "appo.py", "tab:blue"), (baseline, baseline_label, "tab:orange")):
        runs = [r for r in results.get(trainer, []) if r["status"] == "ok" and len(r["curve"]) > 1]
        curves = [r["curve"] for r in runs]
        if not curves:
            continue
        label = f"{label} {extra_flags_of(runs)}".strip()  # an ablation's curve names what it changed
        for axis, panel, scale in ((1, by_frames, 1e6), (0, by_time, 60.0)):
            grid = np.linspace(0, max(max(p[axis] for p in c) for c in curves), 200)
            median, low, high = band(curves, axis, grid, hold_last=axis == 0)
            panel.plot(grid / scale, median, color=color, label=f"{label} (median of {len(curves)})")
            panel.fill_between(grid / scale, low, high, color=color, alpha=0.2)
    by_frames.set_xlabel("env frames trained (millions, frameskip included)" if baseline == "sf" else "env steps (millions)")
    by_time.set_xlabel("wall-clock minutes from launch")
    for panel in (by_frames, by_time):
        panel.set_ylabel("average game score (last 100 games)")
        panel.grid(alpha=0.3)
    if by_frames.get_legend_handles_labels()[0]:  # an env with no finished run yet draws empty panels
        by_frames.legend(loc="lower right")
    figure.suptitle(f"{env_name}: appo.py vs {BASELINE_NAMES[baseline]}, min-max band over seeds")
    figure.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default=",".join(SUITE),
                        help="comma-separated envs (default: the suite; HELD_OUT has envs no default was chosen on)")
    parser.add_argument("--trainers", default="appo,sf",
                        help="appo with sf (Doom, Atari) or sb3 (gym: envs), or one of them")
    parser.add_argument("--sb3_python", default=None,
                        help="Stable-Baselines3's interpreter (bench/setup_sb3.sh makes it); needed for its runs")
    parser.add_argument("--sb3_seeds", type=int, default=None, help="seeds of SB3 per gym: env (default: SB3_SEEDS)")
    parser.add_argument("--sb3_hyperparams", default=None,
                        help="a JSON file of rl-zoo3 hyperparameters to run SB3 with instead of the zoo's entry for the "
                             "env (part of the saved configuration), e.g. docs/bench/gym_crossover/sb3_at_appo_defaults.json")
    parser.add_argument("--sf_python", default=None,
                        help="Sample Factory's interpreter (bench/setup_sample_factory.sh makes it); needed for "
                             "its runs and the task check")
    parser.add_argument("--appo_seeds", type=int, default=None, help="seeds of appo.py per env (default: SEEDS)")
    parser.add_argument("--sf_seeds", type=int, default=None, help="seeds of Sample Factory per env (default: SEEDS)")
    parser.add_argument("--frames", type=int, default=None, help="frame budget for every env (default: SUITE's or HELD_OUT's)")
    parser.add_argument("--appo_flags", default="",
                        help="extra appo.py flags, part of the saved configuration: --appo_flags=\"--batch_size 512\"")
    parser.add_argument("--sf_config", choices=sorted(SF_CONFIGS), default="published",
                        help="which of Sample Factory's configurations: its published one, or with one of "
                             "the settings appo.py's defaults took from appo.py's own measurement (SF_CONFIGS)")
    parser.add_argument("--sf_flags", default="",
                        help="extra Sample Factory flags, part of the saved configuration: --sf_flags=\"--batch_size 512\"")
    parser.add_argument("--results_dir", default=os.path.join(REPO, "docs", "bench", "learning"),
                        help="one JSON per finished run; commit it (the bench resumes from it)")
    parser.add_argument("--sb3_results_dir", default=None,
                        help="SB3's runs, when appo.py's are kept elsewhere (the gym: table's runs are the SB3 "
                             "table's appo.py side; default: --results_dir)")
    parser.add_argument("--keep_checkpoints", action="store_true",
                        help="keep each appo.py run's final checkpoint beside its result file (same name, .pth; "
                             "gym: runs' are 40-600 KB), for bench/probe_policy.py and --mode eval --checkpoint")
    parser.add_argument("--plot_dir", default=None, help="one PNG per env (default: --results_dir)")
    parser.add_argument("--stall_seconds", type=float, default=300.0,
                        help="a run that prints nothing for this long is hung: killed, counted as a failure")
    parser.add_argument("--max_hours", type=float, default=4.0, help="a run still going after this long is hung")
    parser.add_argument("--report_only", action="store_true",
                        help="run nothing: the table and plots from saved results, including appo.py runs of "
                             "another version of its code (the table's last line names the versions)")
    parser.add_argument("--json", action="store_true", help="print the table's figures as JSON")
    parser.add_argument("--headline", action="store_true",
                        help="run nothing: print the README's table of every env from the saved runs")
    parser.add_argument("--ablation", action="store_true",
                        help="run nothing: print docs/results/learning.md's table of the gym defaults' ablation "
                             "(docs/bench/gym_ablation/)")
    parser.add_argument("--round2", action="store_true",
                        help="run nothing: print learning.md's table of continuous control's round two "
                             "(docs/bench/gym_round2/) and each arm's HalfCheetah basin rate so far")
    parser.add_argument("--basin", action="store_true",
                        help="run nothing: print learning.md's table of HalfCheetah's two basins "
                             "(docs/bench/gym_basin/defaults/, with the probe's readings in its probe.json)")
    parser.add_argument("--contention", action="store_true",
                        help="run nothing: print docs/results/learning.md's table of every saved run under "
                             "docs/bench/ that shared the machine (over 5%% of the CPU elsewhere)")
    args = parser.parse_args(argv)
    args.envs = [name for name in args.envs.split(",") if name]
    args.trainers = [name for name in args.trainers.split(",") if name]
    problems = [f"--envs: {name} is not a doom_*, atari_*, gym: or pz: env" for name in args.envs
                if family(name) not in SYSTEM]
    problems += [f"--envs: {name} is not run by Sample Factory here: give --trainers appo (or appo,sb3 for gym: envs)"
                 for name in args.envs if family(name) in ("gym", "pz") and "sf" in args.trainers]
    problems += [f"--envs: {name} has no frame budget in SUITE, HELD_OUT, GYM or PZ: give --frames" for name in args.envs
                 if name not in BUDGETS and args.frames is None]
    problems += [f"--envs: {name} is read beside Sample Factory, not SB3: give --trainers appo,sf" for name in args.envs
                 if family(name) != "gym" and "sb3" in args.trainers]
    problems += [f"--trainers: {name} is not appo, sf or sb3" for name in args.trainers if name not in ("appo", "sf", "sb3")]
    if "sb3" in args.trainers and not args.report_only and not (args.sb3_python and os.path.isfile(args.sb3_python)):
        problems.append("--sb3_python: give Stable-Baselines3's interpreter (bench/setup_sb3.sh makes one), "
                        "or leave sb3 out of --trainers")
    if "sf" in args.trainers and not args.report_only and not (args.sf_python and os.path.isfile(args.sf_python)):
        problems.append("--sf_python: give Sample Factory's interpreter (bench/setup_sample_factory.sh makes one), "
                        "or --trainers appo")
    elif not args.report_only and not (args.sf_python and os.path.isfile(args.sf_python)):
        problems += [f"--sf_python: appo.py's runs on {name} load Sample Factory's scenario files: give its interpreter "
                     "(bench/setup_sample_factory.sh makes one)" for name in args.envs if name in SF_SCENARIO_FILES]
    if problems:
        parser.error("; ".join(problems))
    args.plot_dir = args.plot_dir or args.results_dir
    args.sb3_results_dir = args.sb3_results_dir or args.results_dir
    if args.sf_python:  # its runs and the task probe start in other folders
        args.sf_python = os.path.abspath(args.sf_python)
    if args.sb3_python:
        args.sb3_python = os.path.abspath(args.sb3_python)
    # asked of Sample Factory's interpreter once, for every run and probe that needs its map
    needed = args.sf_python and not args.report_only and any(name in SF_SCENARIO_FILES for name in args.envs)
    args.sf_scenarios_dir = sf_scenarios_dir(args.sf_python) if needed else None
    return args


def seeds_for(args, trainer: str, env_name: str) -> list[int]:
    appo_seeds, sf_seeds = SEEDS[family(env_name)]
    count = {"appo": args.appo_seeds or appo_seeds, "sf": args.sf_seeds or sf_seeds,
             "sb3": args.sb3_seeds or SB3_SEEDS}[trainer]
    return list(range(1, count + 1))


STAGE_1 = ("gym:HalfCheetah-v5", "gym:Walker2d-v5")
STAGE_2 = ("gym:Hopper-v5", "gym:LunarLander-v3")
# R2's held-out envs and budgets (learning.md): runs in ABLATION_DIR/held_out/ARM/ENV
HELD_OUT_GYM = {"gym:InvertedDoublePendulum-v5": 1_000_000, "gym:Swimmer-v5": 1_000_000, "gym:Reacher-v5": 1_000_000,
                "gym:Ant-v5": 1_000_000, "gym:LunarLanderContinuous-v3": 1_000_000,
                "gym:CartPole-v1": 500_000, "gym:Acrobot-v1": 500_000, "gym:InvertedPendulum-v5": 1_000_000}
ABLATION_HEADER = ["| env | arm | seeds | at 200k steps | at 1M steps | minutes |", "|---|---|---|---|---|---|"]


def ablation_table(root: str = ABLATION_DIR, arms: tuple = ABLATION_ARMS) -> str:
    """learning.md's table of an ablation's arms (the gym defaults' by default; round two's with
    ROUND2_DIR and ROUND2_ARMS): each env and arm's saved runs, median [min, max] of the score at
    200k and at 1M steps (the bench's score_at), and the median minutes to 1M."""
    lines = list(ABLATION_HEADER)
    envs = sorted({os.path.basename(path) for arm in arms for path in glob.glob(os.path.join(root, arm, "*"))
                   if os.path.isdir(path)}, key=lambda name: ((STAGE_1 + STAGE_2).index(name) if name in STAGE_1 + STAGE_2 else 9, name))
    for env_name in envs:
        for arm in arms:
            runs = saved_runs(os.path.join(root, arm), env_name, "appo")
            if runs:
                lines.append(f"| {env_name} | {arm} | {', '.join(str(run['config']['seed']) for run in runs)} | "
                             f"{spread([score_at(run['curve'], 200_000) for run in runs])} | "
                             f"{spread([score_at(run['curve'], 1_000_000) for run in runs])} | "
                             f"{minutes([run['wall_s'] for run in runs])} |")
    return "\n".join(lines)


def basin_rates(root: str = ROUND2_DIR, arms: tuple = ROUND2_ARMS, env_name: str = "gym:HalfCheetah-v5") -> str:
    """Round two's basin rate, arm by arm: how many of the seeds saved so far score at least
    BASIN_BAR at 1M on HalfCheetah (a reading, not the rules' verdict: that needs seeds 1-10)."""
    lines = []
    for arm in arms:
        scores = [score_at(run["curve"], 1_000_000) for run in saved_runs(os.path.join(root, arm), env_name, "appo")]
        if scores:
            lines.append(f"- {arm}: {sum(score >= BASIN_BAR for score in scores)} of {len(scores)} seeds at or above "
                         f"{BASIN_BAR:,} at 1M")
    return "\n".join(lines)


def seed_scores(folder: str, env_name: str, budget: int, seeds: int) -> list:
    """appo.py's score at the budget for seeds 1..seeds, None where no finished run is saved."""
    by_seed = {run["config"]["seed"]: score_at(run["curve"], budget) for run in saved_runs(folder, env_name, "appo")}
    return [by_seed.get(seed) for seed in range(1, seeds + 1)]


def round2_choice(root: str = ROUND2_DIR) -> tuple[str, str | None]:
    """R1' of round two's rules (learning.md, "Rules for a gym default"), applied to Stage 1's saved
    runs, seeds 1..N of ROUND2_SEEDS only (later seeds are reported, not read). Written before
    Stage 1 finished, so the rule is read from its text and not from the scores; until every run is
    saved it says how many are missing and reads nothing. Returns the reading and the chosen arm."""
    halfcheetah, others = "gym:HalfCheetah-v5", ("gym:Walker2d-v5", "gym:Hopper-v5")
    scores, missing = {}, []
    for arm in ROUND2_ARMS:
        for env_name, count in ROUND2_SEEDS.items():
            scores[arm, env_name] = seed_scores(os.path.join(root, arm), env_name, 1_000_000, count)
            missing += [(arm, env_name, seed) for seed, score in enumerate(scores[arm, env_name], 1) if score is None]
    if missing:  # the first in the loop's order: seed by seed, then env, then arm
        arm, env_name, seed = min(missing, key=lambda m: (m[2], list(ROUND2_SEEDS).index(m[1]), ROUND2_ARMS.index(m[0])))
        return (f"R1' reads nothing yet: {len(missing)} of Stage 1's {len(ROUND2_ARMS) * sum(ROUND2_SEEDS.values())} "
                f"runs are missing (the first: {env_name} seed {seed}, {arm}).", None)
    base = scores["baseline", halfcheetah]
    base_rate, base_median = sum(x >= BASIN_BAR for x in base), statistics.median(base)
    lines, qualified = [], {}
    for arm in ROUND2_ARMS[1:]:
        mine = scores[arm, halfcheetah]
        rate, median = sum(x >= BASIN_BAR for x in mine), statistics.median(mine)
        failed = [f"basin rate {rate} of 10, below 8"] * (rate < 8)
        failed += [f"basin rate {rate}, not above baseline's {base_rate}"] * (rate <= base_rate)
        failed += [f"HalfCheetah median {median:,.0f}, not above baseline's {base_median:,.0f}"] * (median <= base_median)
        for env_name in others:
            theirs, ours = scores["baseline", env_name], scores[arm, env_name]
            if max(ours) < min(theirs):
                failed.append(f"{env_name}: all 3 seeds below all 3 of baseline's")
            if statistics.median(theirs) - statistics.median(ours) > max(theirs) - min(theirs):
                failed.append(f"{env_name}: median {statistics.median(ours):,.0f} below baseline's "
                              f"{statistics.median(theirs):,.0f} by more than its spread")
        if not failed:
            qualified[arm] = median
        lines.append(f"- {arm}: " + ("qualifies" if not failed else "does not qualify: " + "; ".join(failed)) +
                     f" (HalfCheetah: {rate} of 10 at or above {BASIN_BAR:,}, median {median:,.0f})")
    if not qualified:
        return "\n".join(lines + ["", "R1': no arm qualifies, so no default changes."]), None
    best = max(qualified.values())
    near = [arm for arm in qualified if qualified[arm] >= 0.95 * best]  # within 5%: fewer changed flags wins
    chosen = min(near, key=lambda arm: (ROUND2_FLAGS[arm].count("--"), -qualified[arm]))
    return "\n".join(lines + ["", f"R1' chooses {chosen} (HalfCheetah median {qualified[chosen]:,.0f}; the highest "
                                   f"qualifying {best:,.0f}), for seeds 4-5 and R2."]), chosen


def round2_held_out(chosen: str, root: str = ROUND2_DIR, random_play: dict | None = None, seeds: int = 3) -> str:
    """R2 of round two's rules for the arm R1' chose, against baseline, seeds 1..3 at each env's
    budget: the default changes only if on no env all of the arm's seeds end below all of
    baseline's, and the mean over the envs of (arm - baseline) / |baseline - random play| (medians)
    is at least 0. Written before any held-out run; reads nothing until every run is saved."""
    envs = [name for name in ROUND2_HELD_OUT if not (chosen in BOX_ONLY_ARMS and name in ("gym:CartPole-v1", "gym:Acrobot-v1"))]
    scores = {}
    for arm in ("baseline", chosen):
        for env_name in envs:
            scores[arm, env_name] = seed_scores(os.path.join(root, "held_out", arm), env_name,
                                                ROUND2_HELD_OUT[env_name], seeds)
    missing = sum(score is None for arm_scores in scores.values() for score in arm_scores)
    if missing:
        return f"R2 reads nothing yet: {missing} of its {len(scores) * seeds} runs are missing."
    random_play = random_play or {name: load_result(os.path.join(BENCH_DIR, "gym", "random", f"{name}.json"))["mean_return"]
                                  for name in envs}
    below = [name for name in envs if max(scores[chosen, name]) < min(scores["baseline", name])]
    gain = statistics.mean((statistics.median(scores[chosen, name]) - statistics.median(scores["baseline", name]))
                           / abs(statistics.median(scores["baseline", name]) - random_play[name]) for name in envs)
    holds = not below and gain >= 0
    return (f"R2 {'holds' if holds else 'fails'} for {chosen} on {len(envs)} envs: mean (arm - baseline) / "
            f"|baseline - random| {gain:+.3f}; every seed below baseline's on {', '.join(below) or 'no env'}"
            + (f": {chosen} becomes the gym default{' for Box actions' if chosen in BOX_ONLY_ARMS else ''}." if holds
               else ": no gym default changes."))


def round2_report() -> str:
    """What --round2 prints: the table, the basin rates, R1', and R2 once R1' has chosen an arm."""
    choice, chosen = round2_choice()
    parts = [ablation_table(ROUND2_DIR, ROUND2_ARMS), basin_rates(), choice]
    return "\n\n".join(parts + [round2_held_out(chosen)] if chosen else parts)


def held_out_table(root: str = ABLATION_DIR) -> str:
    """R2's table: each held-out env and arm's saved runs, median [min, max] at the env's budget,
    beside random play, and the median minutes; empty until a held-out run is saved."""
    lines = ["| env | steps | random play | arm | seeds | score | minutes |", "|---|---|---|---|---|---|---|"]
    for env_name, budget in HELD_OUT_GYM.items():
        random_play = load_result(os.path.join(BENCH_DIR, "gym", "random", f"{env_name}.json"))["mean_return"]
        for arm in ABLATION_ARMS:
            runs = saved_runs(os.path.join(root, "held_out", arm), env_name, "appo")
            if runs:
                lines.append(f"| {env_name} | {budget // 1000}k | {random_play:.2f} | {arm} | "
                             f"{', '.join(str(run['config']['seed']) for run in runs)} | "
                             f"{spread([score_at(run['curve'], budget) for run in runs])} | "
                             f"{minutes([run['wall_s'] for run in runs])} |")
    return "\n".join(lines) if len(lines) > 2 else ""


BASIN_DIR = os.path.join(BENCH_DIR, "gym_basin", "defaults")
HIGH_BASIN = 3000.0  # HalfCheetah's runs end above 3,000 or below about 2,000 at 1M (learning.md, round two)
BASIN_HEADER = ["| seed | at 200k | at 1M | basin | upside down | cos pitch | speed m/s | actions clipped | "
                "clip fraction to 300k | approx KL to 300k |", "|---|---|---|---|---|---|---|---|---|---|"]


def early_median(points: list, frames: float = 300_000) -> float:
    """The median of a diagnostic's summaries up to `frames` trained (one minibatch's figure each)."""
    return statistics.median(value for at, value in points if at <= frames * 1.001)


def basin_table(root: str = BASIN_DIR, env_name: str = "gym:HalfCheetah-v5") -> str:
    """learning.md's table of what each HalfCheetah run at the defaults ends as: its scores, the
    probe's reading of its final checkpoint (probe.json beside the runs) and its early update sizes."""
    with open(os.path.join(root, "probe.json")) as f:
        probes = {os.path.basename(report["checkpoint"]): report for report in json.load(f)["reports"]}
    lines = list(BASIN_HEADER)
    for seed in sorted(int(path.rsplit("seed", 1)[1][:-5]) for path in glob.glob(os.path.join(root, env_name, "appo_seed*.json"))):
        run = load_result(os.path.join(root, env_name, f"appo_seed{seed}.json"))
        final, probe_report = score_at(run["curve"], 1_000_000), probes[run["checkpoint"]]
        lines.append(f"| {seed} | {score_at(run['curve'], 200_000):.0f} | {final:.0f} | "
                     f"{'high' if final >= HIGH_BASIN else 'low'} | {probe_report['upside_down']:.0%} | "
                     f"{probe_report['mean_cos_pitch']:.2f} | {probe_report['forward_speed']:.2f} | "
                     f"{probe_report['clipped_share']:.0%} | {early_median(run['diagnostics']['clip_fraction']):.2f} | "
                     f"{early_median(run['diagnostics']['approx_kl']):.3f} |")
    return "\n".join(lines)


def score_at_seconds(curve: list, seconds: float) -> tuple[float, float] | None:
    """(score, steps) at the last summary at or before `seconds` from launch; a run that ended
    sooner is read at its last summary."""
    before = [point for point in curve if point[0] <= seconds]
    return (before[-1][2], before[-1][1]) if before else None


# The SB3 table's two sides (appo.py's are the gym: table's runs), and appo.py's runs beyond 1M steps
# (`--frames 4000000`) that read it at equal seconds; the table's own appo.py runs where there are none
GYM_DIR, SB3_DIR, SB3_LONG_DIR = (os.path.join(BENCH_DIR, name) for name in ("gym", "gym_sb3", "gym_sb3_4m"))


def equal_seconds_table(appo_root: str = GYM_DIR, sb3_root: str = SB3_DIR, long_root: str = SB3_LONG_DIR) -> str:
    """Each side of the SB3 table read at the other's median minutes to its budget: SB3's curves at
    appo.py's minutes, and appo.py's at SB3's, from its longer runs where saved (a run that ended
    sooner is read at its end, and the steps column says where each side was read)."""
    lines = ["| env | SB3 min | SB3 at its budget | appo.py at SB3's min | at steps | appo.py min | "
             "appo.py at its budget | SB3 at appo.py's min | at steps |", "|---|---|---|---|---|---|---|---|---|"]
    for env_name in sorted(os.listdir(sb3_root)):
        sb3, appo = saved_runs(sb3_root, env_name, "sb3"), saved_runs(appo_root, env_name, "appo")
        if not sb3 or not appo:
            continue
        long = saved_runs(long_root, env_name, "appo") or appo
        sb3_s, appo_s = (statistics.median(run["wall_s"] for run in runs) for runs in (sb3, appo))
        appo_then = [score_at_seconds(run["curve"], sb3_s) for run in long]
        sb3_then = [score_at_seconds(run["curve"], appo_s) for run in sb3]

        def steps(read: list) -> str:
            return f"{statistics.median(point[1] for point in read) / 1e6:.2f}M"

        lines.append(f"| {env_name} | {sb3_s / 60:.1f} | {spread([score_at(r['curve'], r['config']['frames']) for r in sb3])} | "
                     f"{spread([point[0] for point in appo_then])} | {steps(appo_then)} | {appo_s / 60:.1f} | "
                     f"{spread([score_at(r['curve'], r['config']['frames']) for r in appo])} | "
                     f"{spread([point[0] for point in sb3_then])} | {steps(sb3_then)} |")
    return "\n".join(lines)


# The flags that run nothing and print one of the docs' tables from the saved runs.
REPORTS = {
    "--ablation": lambda: "\n\n".join(filter(None, [ablation_table(), held_out_table()])),
    "--round2": round2_report,
    "--basin": basin_table,
    "--equal_seconds": equal_seconds_table,
    "--headline": headline_table,
    "--contention": contention_table,
}


def main(argv=None):
    given = sys.argv[1:] if argv is None else argv
    for flag, table in REPORTS.items():
        if flag in given:
            print(table())
            return
    args = parse_args(argv)
    # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so the running trainer is stopped and cleaned up
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"bench_learning: stopped by signal {signum}"))
    rows = []
    for env_name in args.envs:
        task_path = os.path.join(args.results_dir, env_name, "task_match.json")
        if args.sf_python and not args.report_only and env_name in AGAINST_SF:  # gym: envs: appo.py alone
            save_json(task_path, {"task": check_task(args, env_name), "commit": git_commit()})
        task = (load_result(task_path) or {}).get("task", "not checked (no --sf_python)" if env_name in AGAINST_SF
                                                  else "appo.py alone")
        trainers = ("appo", baseline_of(env_name))
        results = {trainer: [] for trainer in trainers}
        # seed by seed, the trainers in turn: a slow drift of the machine falls on both alike
        turns = sorted((seed, trainers.index(trainer)) for trainer in trainers for seed in seeds_for(args, trainer, env_name))
        for seed, trainer in ((seed, trainers[index]) for seed, index in turns):
            config = run_config(args, trainer, env_name, seed)
            path = result_path(args, trainer, env_name, seed)
            saved = load_result(path)
            if saved is not None and saved["status"] == "ok" and (
                    saved.get("key") == config_key(config)
                    or args.report_only and same_but_code(saved, config, also=NOT_KNOWN_WHEN_REPORTING)):
                results[trainer].append(saved)
                continue
            if args.report_only or trainer not in args.trainers:
                continue  # nothing saved for this configuration, and not asked to run it
            if saved is not None and not same_but_code(saved, config):  # a run at other code is re-run
                raise SystemExit(f"error: {path} holds a run of another configuration (flags or Sample Factory "
                                 "configuration): give this one a --results_dir of its own")
            result = run_one(args, config)
            save_json(path, result)
            results[trainer].append(result)
        rows.append(summarize_env(env_name, args.frames or BUDGETS[env_name], results, task))
        if any(results.values()):
            plot_env(env_name, results, os.path.join(args.plot_dir, f"{env_name}.png"))
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))


if __name__ == "__main__":
    main()

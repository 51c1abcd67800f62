"""appo.py with one extra env, `doom_faulty`: the real doom_basic, with a fault injected on request.

    APPO_FAULTS="raise:0:30,crash:1:30" python tests/run_with_faults.py --env doom_faulty ...

Each fault is kind:env_index:step, and fires once, in the first instance of that env (the
instance the trainer makes to replace it behaves). Kinds:
  raise  env.step raises RuntimeError
  resetraise  env.reset raises RuntimeError (step: its Nth reset; 1 is the one at the worker's start)
  crash  the env's VizDoom game process is SIGKILLed, so the next step fails inside VizDoom
  hang   env.step never returns
  nan    every reward from then on is NaN
and two faults of the learner: diskfull:N, after its Nth checkpoint the learner's process may
write no file larger than 64 KiB (RLIMIT_FSIZE), as on a full disk, so every later save fails;
learnerhang:N, after its Nth checkpoint the learner sleeps forever in Python (`hang_in_a_step`), as a
forker's loss stuck in a loop.
`learnersilence:S` is no fault but a shorter allowance: the runner takes a learner silent for S
seconds as hung (Supervisor.LEARNER_SILENCE_S, 300 s in a run), so that a test can stop one.
The env is registered and the learner's save patched at import time, so the spawned processes
have them too.
"""
import os
import resource
import signal
import sys
import time

import gymnasium as gym

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import appo  # noqa: E402
import env as envs  # noqa: E402

FIRED: set[tuple[str, int]] = set()  # per process: faults already injected


def parse_faults(spec: str) -> list[tuple[str, int, int]]:
    """The env faults, kind:env_index:step each."""
    faults = []
    for item in filter(None, spec.split(",")):
        if not item.startswith(("diskfull:", "learnerhang:", "learnersilence:")):
            kind, env_index, step = item.split(":")
            faults.append((kind, int(env_index), int(step)))
    return faults


def after_saves(saves: int, fault):
    """The learner's save_checkpoint, calling `fault` right after the `saves`th save."""
    save, done = appo.save_checkpoint, [0]

    def save_then_fault(cfg, policy_id, state):
        path = save(cfg, policy_id, state)
        done[0] += 1
        if done[0] == saves:
            fault()
        return path

    appo.save_checkpoint = save_then_fault


def fill_the_disk():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def hang_in_a_step():
    while True:
        time.sleep(1.0)


def vizdoom_children() -> list[int]:
    """VizDoom game processes started by this process."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                is_vizdoom = b"+viz_instance_id" in f.read()
        except OSError:
            continue
        if parent == os.getpid() and is_vizdoom:
            pids.append(int(entry))
    return pids


class FaultyEnv(gym.Wrapper):
    def __init__(self, env, env_index: int, faults, game_pids: set[int]):
        super().__init__(env)
        self.game_pids = game_pids
        self.env_index, self.steps, self.resets = env_index, 0, 0
        self.faults = [(kind, step) for kind, index, step in faults
                       if index == env_index and (kind, env_index) not in FIRED]
        self.nan_rewards = False

    def reset(self, **kwargs):
        self.resets += 1
        for kind, step in self.faults:
            if kind == "resetraise" and self.resets == step and (kind, self.env_index) not in FIRED:
                FIRED.add((kind, self.env_index))
                raise RuntimeError("injected reset fault")
        return self.env.reset(**kwargs)

    def step(self, action):
        self.steps += 1
        for kind, step in self.faults:
            if kind != "resetraise" and self.steps == step and (kind, self.env_index) not in FIRED:
                FIRED.add((kind, self.env_index))
                self.inject(kind)
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float("nan") if self.nan_rewards else reward, terminated, truncated, info

    def inject(self, kind: str):
        if kind == "raise":
            raise RuntimeError("injected env fault")
        if kind == "crash":
            for pid in self.game_pids:
                os.kill(pid, signal.SIGKILL)
        elif kind == "hang":
            while True:
                time.sleep(1.0)
        elif kind == "nan":
            self.nan_rewards = True


def make_faulty_env(cfg, env_index, render_mode):
    before = set(vizdoom_children())
    env = envs.create_env("doom_basic", cfg, env_index=env_index, render_mode=render_mode)
    game_pids = set(vizdoom_children()) - before  # the game process this env started
    return FaultyEnv(env, env_index, parse_faults(os.environ.get("APPO_FAULTS", "")), game_pids)


envs.register_env("doom_faulty", make_faulty_env)
for fault in os.environ.get("APPO_FAULTS", "").split(","):
    if fault.startswith("diskfull:"):
        after_saves(int(fault.split(":")[1]), fill_the_disk)
    elif fault.startswith("learnerhang:"):
        after_saves(int(fault.split(":")[1]), hang_in_a_step)
    elif fault.startswith("learnersilence:"):
        appo.Supervisor.LEARNER_SILENCE_S = float(fault.split(":")[1])

if __name__ == "__main__":
    sys.exit(appo.main())

#!/usr/bin/env python
"""The whole GPU check in one command: does appo.py's --device cuda path work on this machine, how
fast does it train, and what does a crash leave behind.

    python scripts/gpu_check.py prepare              # here: wheels for the GPU machine into .whl/
    python3 scripts/gpu_check.py run --out OUT       # there: the check, results in OUT/
    python scripts/gpu_check.py run --device cpu --out /tmp/gpu_check   # a dry run with no GPU

`run` does these steps in order, each timed, each recorded as passed, failed or skipped (with the
reason) in OUT/summary.md and OUT/summary.json, every command's output in OUT/steps.log:

  packages     installs the wheels of --wheels (if that folder exists) into a folder of its own and
               puts it on PYTHONPATH: the GPU machine has torch but no VizDoom and reaches no index
  machine      torch, CUDA, the GPU, its native bfloat16, the cores
  build        builds the C++ module (csrc/) in place; without a compiler, takes the prebuilt one
               from --wheels
  cuda_tests   tests/test_cuda.py: CUDA IPC weights, pinned batches, bf16 autocast, checkpoints
               across devices (a dry run runs them with the CPU in the GPU's place)
  train        doom_basic for --train_seconds with the family's defaults, every core: frames
               trained per second, the score reached; a clean stop must leave no process and
               nothing in /dev/shm
  throughput   scripts/bench_throughput.py's pure simulation, ceiling and ours legs, same config
  sigkill      SIGKILLs a training run's runner: which processes outlive it by 30 s, and what it
               leaves in /dev/shm (both removed afterwards)
  eval         plays the train step's checkpoint with --mode eval on --device

The exit code is 0 when no step failed. The defaults should take about 6 minutes on 16 cores
(the dry run on 2 cores: under 3); a call on the GPU machine is limited to 10, so `run` starts no
step past --deadline_s, and --steps reruns only some.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import uuid
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the GPU machine lacks: the env engines and gymnasium (its image has torch, numpy, OpenCV,
# TensorBoard, cloudpickle and pytest); versions are this machine's, the ones the tests ran with
CARRIED_PACKAGES = ["vizdoom", "gymnasium", "ale-py", "farama-notifications"]
STATUS = re.compile(r"^\[ *(\d+)s\] frames ")
TRAINED = re.compile(r"trained ([\d,]+)")
RETURN = re.compile(r"avg return (-?[\d.]+) \((\d+) ep\)")
STEPS = ["cuda_tests", "train", "throughput", "sigkill", "eval"]
PYTEST_SUMMARY = re.compile(r"\d+ (passed|failed|error)")
EVAL_RETURN = re.compile(r"mean return (-?[\d.]+) \+- ([\d.]+) over (\d+) games")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="download and build what the GPU machine needs, into --wheels")
    prepare.add_argument("--wheels", default=os.path.join(REPO, ".whl"), help="folder for the wheels")
    prepare.add_argument("--python", default=None,
                         help="a Python of the GPU machine's version (3.12) to build the C++ module with; "
                              "default: python3.12 on PATH or under pyenv")
    run = commands.add_parser("run", help="run the check")
    run.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                     help="cpu: a dry run, the CUDA-only parts skipped with the reason")
    run.add_argument("--out", required=True, help="folder for summary.md, summary.json and steps.log")
    run.add_argument("--wheels", default=os.path.join(REPO, ".whl"),
                     help="wheels from `prepare`; installed only if the folder exists")
    run.add_argument("--num_workers", type=int, default=max(1, len(os.sched_getaffinity(0)) - 2),
                     help="rollout workers (default: the cores less two, for the learner and the policy worker)")
    run.add_argument("--num_envs_per_worker", type=int, default=8, help="envs per rollout worker")
    run.add_argument("--train_seconds", type=float, default=90, help="length of the training run")
    run.add_argument("--bench_seconds", type=float, default=20, help="measured seconds of each throughput leg")
    run.add_argument("--bench_warmup", type=float, default=10, help="training seconds before the ours leg counts")
    run.add_argument("--steps", default=",".join(STEPS),
                     help=f"comma-separated steps to run, from {','.join(STEPS)} (a rerun after a fix can "
                          "name only what failed); packages, machine and build always run")
    run.add_argument("--deadline_s", type=float, default=500, help="start no step after this many seconds")
    args = parser.parse_args(argv)
    if args.command == "run":
        args.steps = args.steps.split(",")
        unknown = [step for step in args.steps if step not in STEPS]
        if unknown:
            parser.error(f"--steps: unknown step(s) {unknown}; choose from {','.join(STEPS)}")
    return args


# ---------------------------------------------------------------------------------------------
# prepare: runs on a machine that reaches the package index
# ---------------------------------------------------------------------------------------------

def find_python312(given: str | None) -> str:
    candidates = [given] if given else [shutil.which("python3.12"),
                                        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")))]
    for candidate in filter(None, candidates):  # (a pyenv shim is on PATH but may run no 3.12)
        check = [candidate, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"]
        if os.access(candidate, os.X_OK) and subprocess.run(check, capture_output=True).returncode == 0:
            return candidate
    raise SystemExit("error: no Python 3.12 found (the GPU machine's version): name one with --python")


def installed_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


def prepare(args):
    """Wheels of the GPU machine's platform (CPython 3.12, manylinux x86-64) for the packages it
    lacks, and the C++ module built with a Python 3.12 as a fallback for a machine with no compiler."""
    os.makedirs(args.wheels, exist_ok=True)
    pins = [f"{name}=={installed_version(name)}" for name in CARRIED_PACKAGES]
    platforms = [arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                 "manylinux2014_x86_64") for arg in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *platforms, "-d", args.wheels, *pins], check=True)
    python = find_python312(args.python)
    with tempfile.TemporaryDirectory() as build_dir:  # pip builds it in isolation, fetching pybind11
        subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "-w", build_dir, REPO], check=True)
        (wheel,) = glob.glob(os.path.join(build_dir, "appo-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            (module,) = [name for name in archive.namelist() if name.startswith("appo_ipc")]
            with open(os.path.join(args.wheels, module), "wb") as f:
                f.write(archive.read(module))
    files = sorted(os.listdir(args.wheels))
    size = sum(os.path.getsize(os.path.join(args.wheels, name)) for name in files)
    print(f"{len(files)} files, {size / 2**20:.1f} MiB in {args.wheels}:\n  " + "\n  ".join(files))
    print("on the GPU machine, from the repository root: python3 scripts/gpu_check.py run --out OUT")


# ---------------------------------------------------------------------------------------------
# run: every step records its result; a failed step does not stop the ones after it
# ---------------------------------------------------------------------------------------------

class Check:
    def __init__(self, args):
        self.args, self.start = args, time.monotonic()
        os.makedirs(args.out, exist_ok=True)
        self.log = open(os.path.join(args.out, "steps.log"), "w")
        self.results: list[dict] = []
        self.work = tempfile.mkdtemp(prefix="gpu_check_")  # train dirs, outside OUT: only summaries come back
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")

    def remaining(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.start)

    def step(self, name: str, function, needs: tuple[str, ...] = ()):
        """Runs function() -> (status, details); an exception fails the step."""
        failed_needs = [result["step"] for result in self.results if result["step"] in needs
                        and result["status"] != "passed"]
        started = time.monotonic()
        if name in STEPS and name not in self.args.steps:
            status, details = "skipped", {"reason": "not in --steps"}
        elif failed_needs:
            status, details = "skipped", {"reason": f"needs {', '.join(failed_needs)}, which did not pass"}
        elif self.remaining() <= 0:
            status, details = "skipped", {"reason": f"past --deadline_s {self.args.deadline_s:g}"}
        else:
            self.say(f"== {name}")
            try:
                status, details = function()
            except Exception as error:
                self.say(traceback.format_exc())
                status, details = "failed", {"reason": f"{type(error).__name__}: {error}"}
        result = {"step": name, "status": status, "seconds": round(time.monotonic() - started, 1), **details}
        self.results.append(result)
        self.say(f"== {name}: {status} in {result['seconds']:.0f} s " + json.dumps(details, default=str)[:1500])
        return result

    def say(self, text: str):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def command(self, argv: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
        """Runs argv to completion (or until timeout, then its group is killed); its output goes to
        steps.log and comes back."""
        self.say("$ " + " ".join(arg if len(arg) < 200 else "'" + arg.strip()[:60] + " ...'" for arg in argv))
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=env or self.env, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=max(1.0, min(timeout, self.remaining() + 60)))
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            output, _ = process.communicate()
            output += f"\n(killed: still running after {timeout:.0f} s)"
        self.log.write(output)
        self.log.flush()
        return process.returncode, output


def kill_group(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def processes_tagged(tag: str) -> dict[int, str]:
    """pid -> command line of every process whose environment holds `tag` (a run and its children)."""
    found = {}
    for environ in glob.glob("/proc/[0-9]*/environ"):
        pid = int(environ.split("/")[2])
        try:
            with open(environ, "rb") as f:
                if tag.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                state, ppid, pgid = f.read().rsplit(")", 1)[1].split()[:3]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
            found[pid] = f"[{state} ppid {ppid} pgid {pgid}] {command}"
        except OSError:
            pass  # exited meanwhile
    found.pop(os.getpid(), None)
    return found


def wait_until_gone(tag: str, seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_tagged(tag)


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def status_lines(output: str) -> list[dict]:
    """appo.py's status lines as {seconds, trained, return, episodes}."""
    lines = []
    for line in output.splitlines():
        match = STATUS.match(line)
        if not match:
            continue
        trained, score = TRAINED.search(line), RETURN.search(line)
        lines.append({"seconds": int(match.group(1)),
                      "trained": int(trained.group(1).replace(",", "")) if trained else 0,
                      "return": float(score.group(1)) if score else None,
                      "episodes": int(score.group(2)) if score else 0})
    return lines


def training_rate(lines: list[dict], skip_s: float = 20.0) -> float | None:
    """Frames trained per second between the first status line `skip_s` after training began and
    the last one before the stop (the final line comes at shutdown, over a part-window)."""
    trained = [line for line in lines if line["trained"] > 0]
    if len(trained) < 3:
        return None
    steady = [line for line in trained[:-1] if line["seconds"] >= trained[0]["seconds"] + skip_s] or trained[:-1]
    first, last = steady[0], trained[-2]
    if last["seconds"] <= first["seconds"]:
        return None
    return (last["trained"] - first["trained"]) / (last["seconds"] - first["seconds"])


# ---------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------

def step_packages(check: Check):
    wheels = sorted(glob.glob(os.path.join(check.args.wheels, "*.whl")))
    if not wheels:
        return "skipped", {"reason": f"no wheels in {check.args.wheels}: using the packages installed here"}
    target = os.path.join(check.work, "site")
    code, output = check.command([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                  "--no-compile", "--no-cache-dir", "--target", target, *wheels], timeout=300)
    if code != 0:
        return "failed", {"reason": "pip install failed: " + output.strip().splitlines()[-1]}
    check.env["PYTHONPATH"] = os.pathsep.join(filter(None, [target, check.env.get("PYTHONPATH")]))
    return "passed", {"installed": [os.path.basename(wheel) for wheel in wheels], "into": target}


PROBE = """
import json, os, sys, importlib.metadata as m
import torch
info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
        "cores": len(os.sched_getaffinity(0))}
for name in ("numpy", "gymnasium", "vizdoom", "ale-py", "opencv-python-headless", "tensorboard"):
    try:
        info[name] = m.version(name)
    except m.PackageNotFoundError:
        info[name] = None
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                capability=".".join(map(str, torch.cuda.get_device_capability(0))), cuda=torch.version.cuda,
                bf16_native=torch.cuda.is_bf16_supported(including_emulation=False))
print(json.dumps(info))
"""


def step_machine(check: Check):
    code, output = check.command([sys.executable, "-c", PROBE], timeout=120)
    if code != 0:
        return "failed", {"reason": "torch does not import: " + output.strip().splitlines()[-1]}
    info = json.loads(output.strip().splitlines()[-1])
    missing = [name for name in ("gymnasium", "vizdoom") if info.get(name) is None]
    if missing:
        return "failed", {"reason": f"missing packages {missing}: run `prepare` where pip works and carry "
                                    f"{check.args.wheels}", **info}
    if check.args.device == "cuda" and not info["cuda_available"]:
        return "failed", {"reason": "--device cuda but torch sees no GPU (use --device cpu for a dry run)", **info}
    return "passed", info


def step_build(check: Check):
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    code, output = check.command([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], timeout=300)
    how = "built here"
    if code != 0:
        prebuilt = os.path.join(check.args.wheels, "appo_ipc" + suffix)
        if not os.path.exists(prebuilt):
            return "failed", {"reason": f"the build failed and {prebuilt} is missing: " +
                                        output.strip().splitlines()[-1]}
        shutil.copy(prebuilt, os.path.join(REPO, "appo_ipc" + suffix))
        how = f"the build failed ({output.strip().splitlines()[-1][:200]}); took {prebuilt}"
    code, output = check.command([sys.executable, "-c", "import appo_ipc; print(appo_ipc.__file__)"], timeout=60)
    if code != 0:
        return "failed", {"reason": "appo_ipc does not import: " + output.strip().splitlines()[-1], "module": how}
    return "passed", {"module": how}


def step_cuda_tests(check: Check):
    env = dict(check.env)
    if check.args.device == "cpu":
        env["APPO_CUDA_TESTS_ON_CPU"] = "1"  # the tests' own logic, with the CPU in the GPU's place
    code, output = check.command([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                  "tests/test_cuda.py"], timeout=400, env=env)
    # pytest's last line of its own: the lines after it are what processes print as they exit
    summary = next((line for line in reversed(output.splitlines()) if PYTEST_SUMMARY.search(line)), "")
    details = {"pytest": summary, "on": "the CPU standing in for the GPU" if check.args.device == "cpu" else "the GPU"}
    if code != 0 or "passed" not in summary or "skipped" in summary:
        return "failed", {"reason": f"pytest exit code {code}", **details}
    return "passed", details


def train_command(check: Check, experiment: str, seconds: float) -> list[str]:
    return [sys.executable, "appo.py", "--env", "doom_basic", "--device", check.args.device,
            "--num_workers", str(check.args.num_workers), "--num_envs_per_worker", str(check.args.num_envs_per_worker),
            "--train_for_seconds", str(seconds), "--report_every_sec", "5", "--seed", "1",
            "--train_dir", os.path.join(check.work, "train"), "--experiment", experiment]


def step_train(check: Check):
    tag = uuid.uuid4().hex
    env = dict(check.env, GPU_CHECK_TAG=tag)
    shm_before = shm_entries()
    code, output = check.command(train_command(check, "trained", check.args.train_seconds),
                                 timeout=check.args.train_seconds + 180, env=env)
    survivors = wait_until_gone(tag, 15)
    shm_left = sorted(shm_entries() - shm_before)
    lines = status_lines(output)
    scored = [line for line in lines if line["return"] is not None]
    checkpoints = glob.glob(os.path.join(check.work, "train", "trained", "checkpoint_p0", "checkpoint_*.pth"))
    start = next((line for line in output.splitlines() if line.startswith("training ")), "")
    details = {"command": " ".join(train_command(check, "trained", check.args.train_seconds)[1:]),
               "started": start[:200], "exit_code": code,
               "frames_trained": lines[-1]["trained"] if lines else 0,
               "frames_trained_per_s": training_rate(lines),
               "score": scored[-1]["return"] if scored else None,
               "episodes_in_score": scored[-1]["episodes"] if scored else 0,
               "checkpoints": len(checkpoints), "processes_left": survivors, "shm_left": shm_left,
               "status_line": next((l for l in reversed(output.splitlines()) if STATUS.match(l)), "")[:400]}
    for pid in survivors:
        kill_group(pid)
    warnings = [line for line in output.splitlines() if line.startswith(("warning", "[W"))]
    if warnings:
        details["warnings"] = warnings[:5]
    problems = [text for bad, text in [
        (code != 0, f"exit code {code}"), (not lines or not lines[-1]["trained"], "nothing trained"),
        (bool(warnings), f"{len(warnings)} warnings (a clean run prints none)"),
        (not checkpoints, "no checkpoint"), (bool(survivors), f"{len(survivors)} processes outlived it"),
        (bool(shm_left), f"left in /dev/shm: {shm_left}"),
        (f" on {check.args.device} " not in start, f"did not train on {check.args.device}")] if bad]
    if problems:
        return "failed", {"reason": "; ".join(problems), **details}
    return "passed", details


def step_throughput(check: Check):
    legs = "pure,ceiling,ours"
    command = [sys.executable, "scripts/bench_throughput.py", "--env", "doom_basic",
               "--num_workers", str(check.args.num_workers), "--num_envs_per_worker", str(check.args.num_envs_per_worker),
               "--legs", legs, "--seconds", str(check.args.bench_seconds), "--warmup", str(check.args.bench_warmup),
               "--json", "--", "--device", check.args.device]
    code, output = check.command(command, timeout=3 * check.args.bench_seconds + check.args.bench_warmup + 300)
    start = output.find("{\n")
    if code != 0 or start < 0:
        return "failed", {"reason": f"bench_throughput exit code {code}", "command": " ".join(command[1:])}
    figures = json.loads(output[start:output.rindex("}") + 1])
    ceiling = figures["runs"]["ceiling"][0] if figures["runs"].get("ceiling") else {}
    ours = figures["runs"]["ours"][0] if figures["runs"].get("ours") else {}
    details = {"command": " ".join(command[1:]), "envs": figures["num_envs"],
               "pure_sim_fps": figures["pure_sim_fps"], "ceiling_fps": figures["ceiling_fps"],
               "ceiling_cpu_bound_fps": ceiling.get("cpu_bound_fps"), "ceiling_gpu_bound_fps": ceiling.get("gpu_bound_fps"),
               "ours_fps": figures["ours_fps"], "ours_over_pure_sim": figures["ours_over_pure_sim"],
               "ours_over_ceiling": figures["ours_over_ceiling"], "busy_percent": ours.get("busy_percent"),
               "policy_lag": ours.get("lag_avg"), "ms": {key: ceiling.get(key) for key in (
                   "env_ms_per_step", "inference_ms_per_sample", "learner_ms_per_sample")}}
    if not all(figures[key] for key in ("pure_sim_fps", "ceiling_fps", "ours_fps")):
        return "failed", {"reason": "a leg gave no figure", **details}
    return "passed", details


def step_sigkill(check: Check):
    """SIGKILLs the runner once its learner has trained: the children notice their parent is gone."""
    tag = uuid.uuid4().hex
    shm_before = shm_entries()
    command = train_command(check, "killed", 600)
    check.say("$ " + " ".join(command))
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(check.env, GPU_CHECK_TAG=tag), start_new_session=True)
    output, trained_at = [], None
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + min(180.0, max(30.0, check.remaining()))
        while process.poll() is None and time.monotonic() < deadline:
            if trained_at is None and any(STATUS.match(line) and TRAINED.search(line) for line in output):
                trained_at = time.monotonic()  # the learner trained: the GPU path is all in use
            if trained_at is not None and time.monotonic() > trained_at + 10:
                break
            time.sleep(0.2)
        children = {pid: cmd for pid, cmd in processes_tagged(tag).items() if pid != process.pid}
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        killed = time.monotonic()
        survivors = wait_until_gone(tag, 30)
        gone_after = round(time.monotonic() - killed, 1)
        shm_left = sorted(shm_entries() - shm_before)
    finally:
        for pid in processes_tagged(tag):  # what outlived it, and its group
            try:
                kill_group(os.getpgid(pid))
            except ProcessLookupError:
                pass  # gone meanwhile
        kill_group(process.pid)
        reader.join(timeout=10)
    check.log.write("".join(output))
    for name in shm_left:  # removed after being recorded: the next step starts clean
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass
    details = {"trained_before_kill": trained_at is not None, "children_at_kill": len(children),
               "processes_left_after_30s": survivors, "all_gone_after_s": None if survivors else gone_after,
               "shm_left": shm_left}
    problems = [text for bad, text in [
        (trained_at is None, "it never trained"), (bool(survivors), f"{len(survivors)} processes outlived it by 30 s"),
        (bool(shm_left), f"left in /dev/shm: {shm_left}")] if bad]
    if problems:
        return "failed", {"reason": "; ".join(problems), **details}
    return "passed", details


def step_eval(check: Check):
    if not glob.glob(os.path.join(check.work, "train", "trained", "checkpoint_p0", "checkpoint_*.pth")):
        return "skipped", {"reason": "the train step left no checkpoint to play"}
    command = [sys.executable, "appo.py", "--mode", "eval", "--env", "doom_basic", "--device", check.args.device,
               "--train_dir", os.path.join(check.work, "train"), "--experiment", "trained", "--max_num_episodes", "5"]
    code, output = check.command(command, timeout=300)
    score = EVAL_RETURN.search(output)
    playing = next((line for line in output.splitlines() if line.startswith("playing ")), "")
    details = {"command": " ".join(command[1:]), "exit_code": code, "playing": playing,
               "mean_return": float(score.group(1)) if score else None,
               "games": int(score.group(3)) if score else 0}
    if code != 0 or not score or f" on {check.args.device} " not in playing:
        return "failed", {"reason": f"exit code {code}; " + (output.strip().splitlines() or [""])[-1][:300], **details}
    return "passed", details


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------

def gpu_row(results: dict[str, dict], args) -> str | None:
    """The GPU throughput row (README and docs/scaling.md): card, cores, configuration, FPS, pure simulation, share, score."""
    machine, train, bench = results.get("machine", {}), results.get("train", {}), results.get("throughput", {})
    if bench.get("status") != "passed":
        return None
    card = machine.get("gpu") or "no GPU (dry run)"
    cores, workers, envs = machine.get("cores"), args.num_workers, args.num_envs_per_worker
    score = train.get("score")
    return (f"| doom_basic | {card} | {cores} | {workers}x{envs} envs, batch 512, --device {args.device} | "
            f"{bench['ours_fps']:,.0f} | {bench['pure_sim_fps']:,.0f} | {bench['ours_over_pure_sim']:.2f} | "
            f"{bench['ceiling_fps']:,.0f} | "
            f"{'-' if score is None else f'{score:.1f}'} after {train.get('frames_trained', 0):,} frames |")


def rounded(value):
    """Figures to a readable precision for the summary table (summary.json keeps them whole)."""
    if isinstance(value, float):
        return round(value) if abs(value) >= 100 else round(value, 3)
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    return value


def write_summary(check: Check) -> str:
    args, results = check.args, {result["step"]: result for result in check.results}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "appo.py", "env.py", "csrc", "scripts", "tests"],
                           cwd=REPO, capture_output=True, text=True).stdout.strip()
    summary = {"device": args.device, "commit": commit or None, "uncommitted_changes": bool(dirty),
               "total_seconds": round(time.monotonic() - check.start, 1), "steps": check.results,
               "row": gpu_row(results, args)}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    lines = [f"# GPU check, --device {args.device}, commit {commit[:12] or '?'}"
             f"{' (with uncommitted changes)' if dirty else ''}, {summary['total_seconds']:.0f} s", "",
             "| step | status | seconds | what it found |", "|---|---|---|---|"]
    for result in check.results:
        found = {key: rounded(value) for key, value in result.items()
                 if key not in ("step", "status", "seconds", "command")}
        lines.append(f"| {result['step']} | {result['status']} | {result['seconds']:.0f} | "
                     f"{json.dumps(found, default=str)[:600].replace('|', '/')} |")
    if summary["row"]:
        lines += ["", "| env | GPU | cores | configuration | frames trained/s | pure simulation | share | ceiling "
                      "| score |", "|---|---|---|---|---|---|---|---|---|", summary["row"]]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    return text


def run(args) -> int:
    check = Check(args)
    if args.device == "cpu":
        check.say("dry run (--device cpu): every step runs on the CPU; the CUDA tests run with the CPU in the "
                  "GPU's place, which checks their logic, not CUDA")
    try:
        check.step("packages", lambda: step_packages(check))
        check.step("machine", lambda: step_machine(check))
        check.step("build", lambda: step_build(check), needs=("machine",))
        ready = ("machine", "build")
        check.step("cuda_tests", lambda: step_cuda_tests(check), needs=ready)
        check.step("train", lambda: step_train(check), needs=ready)
        check.step("throughput", lambda: step_throughput(check), needs=ready)
        check.step("sigkill", lambda: step_sigkill(check), needs=ready)
        check.step("eval", lambda: step_eval(check), needs=ready)  # plays the train step's checkpoint
    finally:
        text = write_summary(check)
        check.log.close()
        shutil.rmtree(check.work, ignore_errors=True)
    print("\n" + text)
    return 0 if all(result["status"] != "failed" for result in check.results) else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command == "prepare":
        prepare(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The whole GPU check in one command: does appo.py's --device cuda path work on this machine, how
fast does it train next to pure simulation and Sample Factory, and where does a step's time go.

    python bench/gpu_check.py prepare              # here: wheels for the GPU machine, packed into .whl-pack/
    python bench/gpu_check.py plan                 # here: when each step would start and end (runs nothing)
    python3 bench/gpu_check.py run --out OUT       # there: the check, results in OUT/
    python bench/gpu_check.py run --device cpu --out /tmp/gpu_check   # a dry run with no GPU
    python3 bench/gpu_check.py run --out OUT --steps cuda_tests,train,sigkill,eval,doom_1pw,doom_2pw \
        --extra_legs ours_fp32 --skip_legs pure,doom_1pw:sf     # what has not passed on a GPU (PREPARED_FLAGS)

`run` does these steps in this order (by value: a check stopped at its deadline has done the most
useful ones), each timed, each recorded as passed, failed or skipped (with the reason) in
OUT/summary.md and OUT/summary.json, rewritten after every step, every command's output in
OUT/steps.log:

  packages       unpacks --pack (if it exists) and installs its wheels (or those of --wheels) into a
                 folder of its own on PYTHONPATH: the GPU machine has torch but no VizDoom and reaches
                 no index; Sample Factory's wheels (--sf_wheels) go into another folder, run through a
                 wrapper that puts only that folder on PYTHONPATH (numpy 1.26, gymnasium 0.29)
  machine        torch, CUDA, the GPU, its native bfloat16, the cores
  build          builds the C++ module (csrc/) in place; without a compiler, takes the prebuilt one
  sample_factory whether Sample Factory's interpreter imports its Doom launcher (else the sf legs
                 are left out, with the reason)
  cuda_tests     tests/test_cuda.py: CUDA IPC weights, pinned batches, bf16 autocast, checkpoints
                 across devices (a dry run runs them with the CPU in the GPU's place)
  train          doom_basic for --train_seconds with the family's defaults: frames trained per
                 second, the score reached; a clean stop must leave no process and nothing in /dev/shm
  sigkill        SIGKILLs a training run's runner 5 s after it first trained: which processes
                 outlive it by 30 s, and what it leaves in /dev/shm (both removed afterwards)
  eval           plays the train step's checkpoint with --mode eval on --device; its mean episode
                 length is where the pure_episodes leg cuts episodes (unless --pure_episode_frames)
  doom_1pw       bench/bench_throughput.py on doom_basic at every core with one policy worker per
                 policy: pure simulation (random actions), ours, Sample Factory (same flags, SGD work,
                 policy workers, on the GPU); --extra_legs adds ours_fp32 (ours at Sample Factory's
                 float32: like for like), pure_episodes (episodes cut at the eval's length) and
                 gpu_time (the forward pass at ours' mean batch and the learner's step, timed apart)
  doom_2pw       ours and Sample Factory with two policy workers per policy; --extra_legs adds
                 ours_fp32 here too
  micro_policy   bench/bench_policy_worker.py --device, where this tree has it
  micro_learner  bench/bench_learner.py: ms per learner train_step, wall clock and GPU, and host
                 syncs per step, on doom_basic's model at batch 512
  atari          atari_breakout at its synchronous defaults: pure simulation, ours, Sample Factory

The exit code is 0 when no step failed. A step starts only if it is expected to end before
--deadline_s (EXPECTED_S: the H200's step times, and estimates where a step has not run there;
`plan` prints them under the flags given); a command still running a minute past it gets SIGTERM,
then SIGKILL with every process it started. The default, 480 s, brings the summary back from a
machine that stops a command after 10 minutes; with no such limit, a larger one runs every step. A
bench step stopped part-way keeps the figures of the legs that finished. --steps reruns only some
steps.
"""
import argparse
import glob
import json
import os
import re
import shutil
import shlex
import signal
import subprocess
import sys
import sysconfig
import tarfile
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
# Sample Factory 2.1.1 and the numpy<2 / gymnasium<1.0 stack it was released with, installed apart
# from ours (its own folder first on its PYTHONPATH) and run by the GPU machine's python and torch.
# Not carried: torch and OpenCV (the machine's own: its opencv-python-headless imports under numpy 1.26;
# wheels of 4.12, 4.13 and 5.0 were checked so), wandb, huggingface-hub, pyglet (never imported when
# training); VizDoom is ours (its wheel runs under numpy 1.26 and gymnasium 0.29) and goes into both.
SF_PACKAGES = ["sample-factory==2.1.1", "signal-slot-mp==1.0.5", "numpy==1.26.4", "gymnasium==0.29.1",
               "farama-notifications==0.0.6", "tensorboardX==2.6.5", "protobuf==7.36.2", "psutil==7.2.2",
               "threadpoolctl==3.8.0", "colorlog==6.12.0", "filelock==4.3.1", "ale-py==0.9.1"]
SF_COMPILED = "faster-fifo==1.5.2"  # a Cython extension: built with prepare's Python 3.12 if PyPI has no wheel
SF_IMPORTS = ["torch", "numpy", "cv2", "vizdoom", "gymnasium", "faster_fifo", "signal_slot", "tensorboardX",
              "sample_factory", "sf_examples.vizdoom.train_vizdoom"]
DEFAULT_PACK = os.path.join(REPO, ".whl-pack", "gpu_wheels.tar.xz")
STATUS = re.compile(r"^\[ *(\d+)s\] frames ")
TRAINED = re.compile(r"trained ([\d,]+)")
RETURN = re.compile(r"avg return (-?[\d.]+) \((\d+) ep\)")
ALWAYS = ["packages", "machine", "build", "sample_factory"]
# by value: does the GPU path work, then throughput (the 1 against 2 policy workers question), then
# where a step's time goes, and atari last
STEPS = ["cuda_tests", "train", "sigkill", "eval", "doom_1pw", "doom_2pw", "micro_policy", "micro_learner", "atari"]
BENCH_STEPS = {"doom_1pw": ("doom_basic", 1), "doom_2pw": ("doom_basic", 2), "atari": ("atari_breakout", 1)}
# --extra_legs: leg -> the bench steps it joins. ours_fp32 (appo.py at Sample Factory's float32: like
# for like) joins both Doom steps, as the throughput targets are judged with one and two policy workers;
# pure_episodes and gpu_time do not depend on the policy workers' count, so they are measured once
EXTRA_LEGS = {"pure_episodes": ("doom_1pw",), "ours_fp32": ("doom_1pw", "doom_2pw"), "gpu_time": ("doom_1pw",)}
LEG_ORDER = ["pure", "pure_episodes", "ours", "ours_fp32", "sf", "gpu_time"]  # bench_throughput's (gpu_time times ours' batch)
# Seconds a step takes on the H200 of docs/gpu.md (16 cores): its runs' step times (docs/bench/gpu_check/h200_*)
# where it ran, else estimates. A step starts only if it is expected to end before --deadline_s.
EXPECTED_S = {
    "packages": 12,  # 1-2 s for our wheels; Sample Factory's are about as many again, and the pack is unpacked
    "machine": 8, "build": 19,  # 7.6 s and 18.1 s there (h200_5)
    "sample_factory": 10,  # importing Sample Factory's stack and torch through its wrapper
    "cuda_tests": 65,  # 44 s for 10 tests there; 14 now
    "sigkill": 35,  # 37 s there, killed 10 s after it first trained; 5 s now
    "eval": 8,  # 5-6 s there
    "micro_policy": 20, "micro_learner": 30,  # never ran there: three batch sizes; a 5-s timing, then the profiler
}
OURS_FIRST_TRAINED_S = 15  # appo.py there: launch to its first status line with frames trained (16 s)
OURS_STOP_S = 7  # there --train_for_seconds 30 took 37 s: its clock starts at launch, then the stop
SF_FIRST_FPS_S = 35  # Sample Factory (never run there): about 25 s to start, 10 more to its first FPS line
SF_STOP_S = 5  # its runner dies on SIGTERM, then its group is killed
PURE_START_S = 12  # making and resetting every env in its process
BENCH_START_S = 5  # bench_throughput importing torch, appo and the env
SIGKILL_AFTER_TRAINED_S = 5  # the sigkill step kills the runner this long after its learner first trained
# What has not passed on a GPU at the current code, with the legs the throughput targets need (ours_fp32
# beside ours, with one policy worker and with two): docs/gpu.md's "The GPU check" runs it, and `plan`
# with these flags has it end before the default --deadline_s. Not all of it fits in 480 s at the
# H200's times and the flags that gave Sample Factory a figure there (--bench_warmup 8, --bench_seconds
# 12): cuda_tests, train, sigkill and eval end at 194 s, each Doom step with ours, ours_fp32 and sf 169 s,
# atari with ours and sf 122 s. So atari is left for a check of its own (--steps atari), and doom_1pw
# runs without sf: Sample Factory's code does not change with ours, and its one-worker figure there is
# known twice (30,721 and 30,452 frames/s), its two-worker figure once. Pure simulation does not
# depend on appo.py either (129,240 frames/s there).
PREPARED_FLAGS = ["--steps", "cuda_tests,train,sigkill,eval,doom_1pw,doom_2pw", "--extra_legs", "ours_fp32",
                  "--skip_legs", "pure,doom_1pw:sf"]
PYTEST_SUMMARY = re.compile(r"\d+ (passed|failed|error)")
PYTEST_SKIPPED = re.compile(r"^SKIPPED \[\d+\] (\S+): (.*)$", re.MULTILINE)  # -rs's lines: where, reason
# tests/test_cuda.py's reasons for a test no CPU can stand in for ("... needs CUDA", "CUDA events need a GPU")
NEEDS_A_GPU = re.compile(r"\bneeds? (a )?(CUDA|GPU)\b")
EVAL_RETURN = re.compile(r"mean return (-?[\d.]+) \+- ([\d.]+) over (\d+) games")
EVAL_LENGTH = re.compile(r"mean length ([\d,]+) env frames")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="download and build what the GPU machine needs, into --wheels")
    prepare.add_argument("--wheels", default=os.path.join(REPO, ".whl"), help="folder for the wheels")
    prepare.add_argument("--sf_wheels", default=os.path.join(REPO, ".whl-sf"),
                         help="folder for Sample Factory's wheels")
    prepare.add_argument("--pack", default=DEFAULT_PACK, help="the one file of both folders that travels")
    prepare.add_argument("--python", default=None,
                         help="a Python of the GPU machine's version (3.12) to build the C++ module with; "
                              "default: python3.12 on PATH or under pyenv")
    options = argparse.ArgumentParser(add_help=False)  # run's, and plan's, which shows what they make fit
    options.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                         help="cpu: a dry run, the CUDA-only parts skipped with the reason")
    options.add_argument("--pack", default=DEFAULT_PACK,
                         help="the file `prepare` packs both wheel folders into; where it exists, its folders "
                              "replace --wheels and --sf_wheels")
    options.add_argument("--wheels", default=os.path.join(REPO, ".whl"),
                         help="wheels from `prepare`; installed only if the folder exists")
    options.add_argument("--sf_wheels", default=os.path.join(REPO, ".whl-sf"),
                         help="Sample Factory's wheels from `prepare`, installed into a folder of their own for the "
                              "sf legs (the VizDoom and ale wheels of --wheels too)")
    options.add_argument("--sf_python", default=None,
                         help="a Sample Factory 2.1.1 interpreter to use instead of --sf_wheels (.venv-sf/bin/python)")
    options.add_argument("--num_workers", type=int, default=max(1, len(os.sched_getaffinity(0)) - 2),
                         help="rollout workers (default: the cores less two, for the learner and the policy worker)")
    options.add_argument("--num_envs_per_worker", type=int, default=8, help="envs per rollout worker")
    options.add_argument("--train_seconds", type=float, default=30, help="length of the training run")
    options.add_argument("--bench_seconds", type=float, default=12, help="measured seconds of each throughput leg")
    options.add_argument("--bench_warmup", type=float, default=8,
                         help="training seconds before the trainers' legs count")
    options.add_argument("--report_every", type=float, default=5,
                         help="appo.py's status interval in the trainers' legs")
    options.add_argument("--sf_first_line_s", type=float, default=60,
                         help="a Sample Factory leg that has printed no training FPS line this many seconds after "
                              "its launch is stopped and recorded as failed")
    options.add_argument("--extra_legs", default="",
                         help="comma-separated legs the bench steps add to pure, ours and sf: " +
                              "; ".join(f"{leg} to {' and '.join(steps)}" for leg, steps in EXTRA_LEGS.items()))
    options.add_argument("--skip_legs", default="",
                         help="comma-separated legs no bench step runs, or STEP:LEG for one step's only (doom_1pw:sf): "
                              "a rerun that has their figures already")
    options.add_argument("--pure_episode_frames", type=int, default=None,
                         help="episode length of the pure_episodes leg, in env frames; default: the eval step's "
                              "mean length (the leg is left out when neither gives one)")
    options.add_argument("--steps", default=",".join(STEPS),
                         help=f"comma-separated steps to run, from {','.join(STEPS)} (a rerun after a fix can "
                              f"name only what failed); {', '.join(ALWAYS)} always run")
    options.add_argument("--deadline_s", type=float, default=480,
                         help="start no step expected to end after this many seconds (EXPECTED_S); a command "
                              "still running a minute past it is stopped")
    run = commands.add_parser("run", parents=[options], help="run the check",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run.add_argument("--out", required=True, help="folder for summary.md, summary.json and steps.log")
    commands.add_parser("plan", parents=[options], formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                        help="run nothing: print when each step would start and end under these flags")
    args = parser.parse_args(argv)
    if args.command != "prepare":
        args.steps = args.steps.split(",")
        unknown = [step for step in args.steps if step not in STEPS]
        if unknown:
            parser.error(f"--steps: unknown step(s) {unknown}; choose from {','.join(STEPS)}")
        args.extra_legs = [leg for leg in args.extra_legs.split(",") if leg]
        args.skip_legs = [leg for leg in args.skip_legs.split(",") if leg]
        unknown = [leg for leg in args.extra_legs if leg not in EXTRA_LEGS]
        if unknown:
            parser.error(f"--extra_legs: unknown leg(s) {unknown}; choose from {','.join(EXTRA_LEGS)}")
        # a misspelt leg would skip nothing, and the call would spend its time on the leg meant to go
        unknown = [name for name in args.skip_legs if not known_leg_to_skip(name)]
        if unknown:
            parser.error(f"--skip_legs: unknown leg(s) {unknown}; choose from {','.join(LEG_ORDER)}, each alone or "
                         f"after one of {','.join(BENCH_STEPS)} and a colon")
    return args


def known_leg_to_skip(name: str) -> bool:
    """LEG, or STEP:LEG for a bench step's own."""
    *step, leg = name.split(":")
    return leg in LEG_ORDER and (step == [] or (len(step) == 1 and step[0] in BENCH_STEPS))


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


def project_versions(names: list[str]) -> dict[str, str]:
    """The version of each package in this interpreter (the wheels to fetch are of these versions);
    SystemExit, with the fix, where one is missing: prepare was run by another Python."""
    from importlib.metadata import PackageNotFoundError, version
    versions, missing = {}, []
    for name in names:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            missing.append(name)
    if missing:
        raise SystemExit("error: run prepare with the project's interpreter (the one `pip install -e .[doom,test]` "
                         f"installed into): {sys.executable} is missing {', '.join(missing)}")
    return versions


PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def download_wheels(requirements: list[str], folder: str, python_version: str = "3.12"):
    """pip download of binary wheels for CPython `python_version` on manylinux x86-64, without
    dependencies (each package is named): the GPU machine's platform, whatever this one's is."""
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    python_version, "--implementation", "cp", *platforms, "-d", folder, *requirements], check=True)


def download_sample_factory_wheels(folder: str, python: str | None, python_version: str = "3.12"):
    """SF_PACKAGES into `folder`; faster-fifo, a C extension, built with `python` (of
    `python_version`) where PyPI has no wheel for that Python."""
    os.makedirs(folder, exist_ok=True)
    download_wheels(SF_PACKAGES, folder, python_version)
    try:
        download_wheels([SF_COMPILED], folder, python_version)
    except subprocess.CalledProcessError:
        print(f"no {SF_COMPILED} wheel for Python {python_version} on PyPI: building it with {python}", flush=True)
        subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-binary", SF_COMPILED.split("==")[0],
                        "-w", folder, SF_COMPILED], check=True)


def stored_copy(wheel: str, folder: str) -> str:
    """The wheel re-written uncompressed, so that one solid xz stream compresses across files (the
    VizDoom wheel's two IWADs are mostly alike)."""
    path = os.path.join(folder, os.path.basename(wheel))
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_STORED  # (file modes kept)
            target.writestr(copy, source.read(info))
    return path


def pack(folders: dict[str, str], path: str):
    """One .tar.xz of the folders' files under their names (`whl/...`, `whl-sf/...`), wheels
    uncompressed inside: what travels to the GPU machine, whose working tree is size-limited."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with tempfile.TemporaryDirectory() as stored, tarfile.open(path + ".part", "w:xz", preset=9) as archive:
        for name, folder in folders.items():
            for file in sorted(os.listdir(folder)):
                source = os.path.join(folder, file)
                copy = stored_copy(source, stored) if file.endswith(".whl") else source
                archive.add(copy, arcname=f"{name}/{file}")
                if copy != source:
                    os.unlink(copy)
    os.replace(path + ".part", path)


def unpack(path: str, folder: str) -> dict[str, str]:
    """The pack's folders, extracted under `folder`: name -> path."""
    with tarfile.open(path, "r:xz") as archive:
        archive.extractall(folder, filter="data")
    return {name: os.path.join(folder, name) for name in sorted(os.listdir(folder))}


def folder_listing(folder: str) -> str:
    files = sorted(os.listdir(folder))
    size = sum(os.path.getsize(os.path.join(folder, name)) for name in files)
    return f"{len(files)} files, {size / 2**20:.1f} MiB in {folder}:\n  " + "\n  ".join(files)


def prepare(args):
    """Wheels of the GPU machine's platform (CPython 3.12, manylinux x86-64) for the packages it
    lacks, the C++ module built with a Python 3.12 as a fallback for a machine with no compiler,
    Sample Factory's wheels, and the pack of both that travels."""
    versions = project_versions(CARRIED_PACKAGES)  # before anything is downloaded
    os.makedirs(args.wheels, exist_ok=True)
    download_wheels([f"{name}=={version}" for name, version in versions.items()], args.wheels)
    python = find_python312(args.python)
    with tempfile.TemporaryDirectory() as build_dir:  # pip builds it in isolation, fetching pybind11
        subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "-w", build_dir, REPO], check=True)
        (wheel,) = glob.glob(os.path.join(build_dir, "appo-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            (module,) = [name for name in archive.namelist() if name.startswith("appo_ipc/_native")]
            # stored flat, by its module's dotted name: appo_ipc._native.cpython-312-x86_64-linux-gnu.so
            with open(os.path.join(args.wheels, module.replace("/", ".")), "wb") as f:
                f.write(archive.read(module))
    print(folder_listing(args.wheels))
    download_sample_factory_wheels(args.sf_wheels, python)
    print(folder_listing(args.sf_wheels))
    print(f"packing both into {args.pack} (xz, minutes) ...", flush=True)
    pack({"whl": args.wheels, "whl-sf": args.sf_wheels}, args.pack)
    print(f"{os.path.getsize(args.pack) / 2**20:.1f} MiB in {args.pack}")
    print("on the GPU machine, from the repository root, with .whl-pack carried: "
          "python3 bench/gpu_check.py run --out OUT")


# ---------------------------------------------------------------------------------------------
# run: every step records its result; a failed step does not stop the ones after it
# ---------------------------------------------------------------------------------------------

def ends_in_time(args, elapsed: float, expected_s: float) -> bool:
    """Whether a step started `elapsed` s into the check is expected to end before --deadline_s."""
    return elapsed + expected_s < args.deadline_s


class Check:
    def __init__(self, args):
        self.args, self.start = args, time.monotonic()
        os.makedirs(args.out, exist_ok=True)
        self.log = open(os.path.join(args.out, "steps.log"), "w")
        self.results: list[dict] = []
        self.work = tempfile.mkdtemp(prefix="gpu_check_")  # train dirs, outside OUT: only summaries come back
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.wheels, self.sf_wheels = args.wheels, args.sf_wheels  # or the pack's folders (step_packages)
        self.sf_python = args.sf_python  # or the wrapper step_packages writes
        self.sf_missing = None if args.sf_python else f"no Sample Factory wheels in {args.sf_wheels} and no --sf_python"
        self.episode_frames = args.pure_episode_frames  # or the eval step's mean length

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return self.args.deadline_s - self.elapsed()

    def step(self, name: str, function, needs: tuple[str, ...] = (), expected_s: float = 0.0):
        """Runs function() -> (status, details); an exception fails the step. A step expected to take
        `expected_s` starts only if it would end before --deadline_s."""
        failed_needs = [result["step"] for result in self.results if result["step"] in needs
                        and result["status"] != "passed"]
        started = time.monotonic()
        if name in STEPS and name not in self.args.steps:
            status, details = "skipped", {"reason": "not in --steps"}
        elif failed_needs:
            status, details = "skipped", {"reason": f"needs {', '.join(failed_needs)}, which did not pass"}
        elif not ends_in_time(self.args, self.elapsed(), expected_s):
            status, details = "skipped", {"reason": f"expected to take about {expected_s:.0f} s, {self.remaining():.0f} s "
                                                    f"left before --deadline_s {self.args.deadline_s:g}"}
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
        write_summary(self)  # now, not only at the end: a call killed at its time limit keeps every step done
        return result

    def say(self, text: str):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def command(self, argv: list[str], timeout: float, env: dict | None = None,
                tag: str | None = None) -> tuple[int, str]:
        """Runs argv to completion, its output to steps.log and back. Every process it starts carries
        GPU_CHECK_TAG=`tag` (a new one unless given) in its environment: past `timeout` (or a minute
        past --deadline_s) its group gets SIGTERM, so that a script's own cleanup runs, then
        STOP_GRACE_S later SIGKILL, with every tagged process, those in sessions of their own too
        (bench_throughput starts each trainer in one)."""
        self.say("$ " + " ".join(arg if len(arg) < 200 else "'" + arg.strip()[:60] + " ...'" for arg in argv))
        tag = tag or uuid.uuid4().hex
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=dict(env or self.env, GPU_CHECK_TAG=tag), start_new_session=True)
        limit = max(1.0, min(timeout, self.remaining() + 60))
        try:
            output, _ = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            output = stop(process, tag) + f"\n(stopped: still running after {limit:.0f} s)"
        self.log.write(output)
        self.log.flush()
        return process.returncode, output


STOP_GRACE_S = 20.0  # from SIGTERM to SIGKILL: bench_throughput stops its trainer leg (appo.py takes ~10 s)


def stop(process: subprocess.Popen, tag: str) -> str:
    """SIGTERM to the process's group, then, once it and every process carrying `tag` have ended or
    STOP_GRACE_S has passed, SIGKILL to the group and to every process still tagged; what it printed."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        output, _ = process.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        output = None
    wait_until_gone(tag, deadline - time.monotonic())  # its children's own cleanup (appo.py's /dev/shm)
    kill_group(process.pid)
    kill_tagged(tag)  # before reading on: one in a session of its own may hold the output pipe open
    return output if output is not None else process.communicate()[0]


def kill_group(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_tagged(tag: str, seconds: float = 10.0) -> dict[int, str]:
    """SIGKILLs every process carrying `tag`, and its group, until none is left (one may start
    another meanwhile) or `seconds` pass; what is left."""
    deadline = time.monotonic() + seconds
    while (tagged := processes_tagged(tag)) and time.monotonic() < deadline:
        for pid in tagged:
            try:
                if os.getpgid(pid) != os.getpgrp():  # (never this script's own group)
                    kill_group(os.getpgid(pid))
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone meanwhile
        time.sleep(0.1)
    return processes_tagged(tag)


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

def pip_install(check: Check, wheels: list[str], target: str) -> str | None:
    """Installs the wheels into `target` as the GPU machine must (no index, no dependencies); None
    or what went wrong."""
    code, output = check.command([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                  "--no-compile", "--no-cache-dir", "--target", target, *wheels], timeout=300)
    return None if code == 0 else "pip install failed: " + (output.strip().splitlines() or [""])[-1]


def sf_wrapper_text(site: str, python: str) -> str:
    """An executable that runs `python` with the Sample Factory packages alone on PYTHONPATH (ours,
    which need numpy 2 and gymnasium 1, stay out): what bench_throughput.py takes as --sf_python."""
    return ("#!/bin/sh\n# Sample Factory 2.1.1: this machine's Python and torch, its own packages first\n"
            f"PYTHONPATH={shlex.quote(site)} exec {shlex.quote(python)} \"$@\"\n")


def write_sf_wrapper(path: str, site: str, python: str) -> str:
    with open(path, "w") as f:
        f.write(sf_wrapper_text(site, python))
    os.chmod(path, 0o755)
    return path


def step_packages(check: Check):
    details = {}
    if os.path.exists(check.args.pack):
        folders = unpack(check.args.pack, os.path.join(check.work, "unpacked"))
        check.wheels, check.sf_wheels = folders.get("whl", check.wheels), folders.get("whl-sf", check.sf_wheels)
        details["pack"] = check.args.pack
    wheels = sorted(glob.glob(os.path.join(check.wheels, "*.whl")))
    if wheels:
        target = os.path.join(check.work, "site")
        problem = pip_install(check, wheels, target)
        if problem:
            return "failed", {"reason": problem, **details}
        check.env["PYTHONPATH"] = os.pathsep.join(filter(None, [target, check.env.get("PYTHONPATH")]))
        details.update(installed=[os.path.basename(wheel) for wheel in wheels], into=target)
    else:
        details["ours"] = f"no wheels in {check.wheels}: using the packages installed here"
    sf_wheels = sorted(glob.glob(os.path.join(check.sf_wheels, "*.whl")))
    if sf_wheels and not check.args.sf_python:
        # VizDoom (and nothing else) of ours goes in too: Sample Factory's set has none of its own
        shared = [wheel for wheel in wheels if os.path.basename(wheel).startswith("vizdoom-")]
        site = os.path.join(check.work, "sf_site")
        problem = pip_install(check, sf_wheels + shared, site)
        if problem:
            check.sf_missing = f"Sample Factory's wheels: {problem}"
        else:
            shutil.copy(os.path.join(REPO, "bench", "sf_train_atari_ale.py"), site)
            check.sf_python = write_sf_wrapper(os.path.join(check.work, "sf_python"), site, sys.executable)
            check.sf_missing = None
            details.update(sf_installed=[os.path.basename(wheel) for wheel in sf_wheels + shared], sf_into=site)
    if not wheels and not check.sf_python:
        return "skipped", {"reason": f"no wheels in {check.wheels} or {check.sf_wheels}: using the packages "
                                     "installed here", **details}
    return "passed", details


SF_PROBE = """
import importlib, json, sys
info = {"python": sys.version.split()[0]}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    info[name] = getattr(module, "__version__", None) or "imported"
import torch
info["cuda_available"] = torch.cuda.is_available()
print(json.dumps(info))
"""


def step_sample_factory(check: Check):
    """Whether Sample Factory's interpreter imports what its Doom launcher needs: the sf legs run
    only where it does."""
    if check.sf_python is None:
        return "skipped", {"reason": f"{check.sf_missing}: the sf legs are left out"}
    code, output = check.command([check.sf_python, "-c", SF_PROBE, *SF_IMPORTS], timeout=120)
    if code != 0:
        reason = "Sample Factory's packages do not import: " + (output.strip().splitlines() or [""])[-1][:300]
        check.sf_python, check.sf_missing = None, reason
        return "failed", {"reason": reason + "; the sf legs are left out"}
    info = json.loads(output.strip().splitlines()[-1])
    if check.args.device == "cuda" and not info["cuda_available"]:
        check.sf_python, check.sf_missing = None, "Sample Factory's torch sees no GPU"
        return "failed", {"reason": check.sf_missing, **info}
    return "passed", {"sf_python": check.sf_python, **info}


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
        prebuilt = os.path.join(check.wheels, "appo_ipc._native" + suffix)
        if not os.path.exists(prebuilt):
            return "failed", {"reason": f"the build failed and {prebuilt} is missing: " +
                                        output.strip().splitlines()[-1]}
        shutil.copy(prebuilt, os.path.join(REPO, "csrc", "_native" + suffix))  # where the in-place build puts it
        how = f"the build failed ({output.strip().splitlines()[-1][:200]}); took {prebuilt}"
    code, output = check.command([sys.executable, "-c", "import appo_ipc; print(appo_ipc.__file__)"], timeout=60)
    if code != 0:
        return "failed", {"reason": "appo_ipc does not import: " + output.strip().splitlines()[-1], "module": how}
    return "passed", {"module": how}


def step_cuda_tests(check: Check, tests: str = "tests/test_cuda.py"):
    """The CUDA tests; none may be skipped on the GPU. In a dry run a test that needs a real GPU
    (tests/test_cuda.py says so in its skip reason: the sync debug mode, CUDA events) is skipped, as expected."""
    env = dict(check.env)
    if check.args.device == "cpu":
        env["APPO_CUDA_TESTS_ON_CPU"] = "1"  # the tests' own logic, with the CPU in the GPU's place
    code, output = check.command([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", tests],
                                 timeout=400, env=env)
    # pytest's last line of its own: the lines after it are what processes print as they exit
    summary = next((line for line in reversed(output.splitlines()) if PYTEST_SUMMARY.search(line)), "")
    skipped = [f"{where}: {reason}" for where, reason in PYTEST_SKIPPED.findall(output)]
    unexpected = [skip for skip in skipped if check.args.device == "cuda" or not NEEDS_A_GPU.search(skip)]
    details = {"pytest": summary, "on": "the CPU standing in for the GPU" if check.args.device == "cpu" else "the GPU",
               "skipped": skipped}
    if code != 0 or "passed" not in summary or unexpected:
        return "failed", {"reason": f"pytest exit code {code}" + (f"; skipped: {unexpected}" if unexpected else ""),
                          **details}
    return "passed", details


def train_command(check: Check, experiment: str, seconds: float) -> list[str]:
    return [sys.executable, "appo.py", "--env", "doom_basic", "--device", check.args.device,
            "--num_workers", str(check.args.num_workers), "--num_envs_per_worker", str(check.args.num_envs_per_worker),
            "--train_for_seconds", str(seconds), "--report_every_sec", "5", "--seed", "1",
            "--train_dir", os.path.join(check.work, "train"), "--experiment", experiment]


def warning_lines(output: str) -> list[str]:
    """appo.py's own warnings ("warning: ..."), torch's C++ ones ("[W..."), and Python's, which
    come anywhere in a line ("...: UserWarning: RNN module weights are not part of ...")."""
    return [line for line in output.splitlines() if line.startswith(("warning", "[W")) or "Warning:" in line]


def step_train(check: Check):
    tag = uuid.uuid4().hex
    shm_before = shm_entries()
    code, output = check.command(train_command(check, "trained", check.args.train_seconds),
                                 timeout=check.args.train_seconds + 180, tag=tag)
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
    kill_tagged(tag)
    warnings = warning_lines(output)
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
            if trained_at is not None and time.monotonic() > trained_at + SIGKILL_AFTER_TRAINED_S:
                break
            time.sleep(0.2)
        children = {pid: cmd for pid, cmd in processes_tagged(tag).items() if pid != process.pid}
        if process.poll() is not None:  # it ended by itself (a crash): nothing to kill
            raise RuntimeError(f"the run exited by itself with code {process.returncode} before the kill")
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        killed = time.monotonic()
        survivors = wait_until_gone(tag, 30)
        gone_after = round(time.monotonic() - killed, 1)
        shm_left = sorted(shm_entries() - shm_before)
    finally:
        kill_tagged(tag)  # what outlived it, and its group
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
    score, length = EVAL_RETURN.search(output), EVAL_LENGTH.search(output)
    playing = next((line for line in output.splitlines() if line.startswith("playing ")), "")
    details = {"command": " ".join(command[1:]), "exit_code": code, "playing": playing,
               "mean_return": float(score.group(1)) if score else None,
               "games": int(score.group(3)) if score else 0,
               "mean_length_frames": int(length.group(1).replace(",", "")) if length else None}
    if check.episode_frames is None and details["mean_length_frames"]:
        check.episode_frames = details["mean_length_frames"]  # the pure_episodes leg cuts episodes there
    if code != 0 or not score or f" on {check.args.device} " not in playing:
        return "failed", {"reason": f"exit code {code}; " + (output.strip().splitlines() or [""])[-1][:300], **details}
    return "passed", details


def json_in(output: str) -> dict | None:
    """The JSON object a script printed last (its lines from the last one that is exactly "{")."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line == "{"]
    for start in reversed(starts):
        ends = [i for i in range(len(lines) - 1, start, -1) if lines[i] == "}"]
        if ends:
            try:
                return json.loads("\n".join(lines[start:ends[0] + 1]))
            except json.JSONDecodeError:
                continue
    return None


def step_micro_policy(check: Check):
    """The policy worker's micro-benchmark, where this tree has it (another branch writes it)."""
    script = os.path.join(REPO, "bench", "bench_policy_worker.py")
    if not os.path.exists(script):
        return "skipped", {"reason": "bench/bench_policy_worker.py is not in this tree"}
    command = [sys.executable, script, "--device", check.args.device]
    code, output = check.command(command, timeout=60)
    details = {"command": " ".join(command[1:]), "exit_code": code, "output_tail": output.strip().splitlines()[-25:]}
    return ("passed" if code == 0 else "failed"), details


def learner_command(check: Check) -> list[str]:
    """bench_learner.py on doom_basic's model at batch 512, rollout 32 (a dry run: one step)."""
    quick = ["--seconds", "0", "--min_steps", "1", "--warmup_steps", "1"] if check.args.device == "cpu" else \
        ["--seconds", "5"]
    return [sys.executable, os.path.join(REPO, "bench", "bench_learner.py"), "--env", "doom_basic",
            "--device", check.args.device, "--batch_size", "512", "--rollout", "32", *quick, "--json"]


def step_micro_learner(check: Check):
    command = learner_command(check)
    code, output = check.command(command, timeout=240)
    figures = json_in(output)
    if code != 0 or figures is None:
        return "failed", {"reason": f"bench_learner exit code {code}", "command": " ".join(command[1:])}
    return "passed", {"command": " ".join(command[1:]), **figures}


def planned_legs(args, step: str) -> list[str]:
    """The legs of a bench step when all they need is there. Pure simulation depends on no trainer
    setting: measured once an env, with one policy worker per policy."""
    legs = ["pure"] * (BENCH_STEPS[step][1] == 1) + ["ours", "sf"] + \
        [leg for leg in args.extra_legs if step in EXTRA_LEGS[leg]]
    return [leg for leg in LEG_ORDER if leg in legs and leg not in args.skip_legs
            and f"{step}:{leg}" not in args.skip_legs]


def bench_legs(check: Check, step: str) -> tuple[list[str], dict[str, str]]:
    """The legs of one bench_throughput call, and each leg left out with the reason."""
    legs, left_out = [], {}
    for leg in planned_legs(check.args, step):
        if leg == "pure_episodes" and not check.episode_frames:
            left_out[leg] = "no episode length: eval gave none and --pure_episode_frames is unset"
        elif leg == "sf" and not check.sf_python:
            left_out[leg] = check.sf_missing or "no Sample Factory"
        else:
            legs.append(leg)
    return legs, left_out


def bench_command(check: Check, env_name: str, legs: list[str], policy_workers: int, partial: str) -> list[str]:
    """bench_throughput.py for these legs, its figures so far in `partial` after every leg."""
    args = check.args
    command = [sys.executable, os.path.join(REPO, "bench", "bench_throughput.py"), "--env", env_name,
               "--num_workers", str(args.num_workers), "--num_envs_per_worker", str(args.num_envs_per_worker),
               "--legs", ",".join(legs), "--seconds", str(args.bench_seconds), "--warmup", str(args.bench_warmup),
               "--report_every", str(args.report_every), "--policy_workers_per_policy", str(policy_workers), "--json",
               "--partial", partial]
    if "pure_episodes" in legs:
        command += ["--pure_episode_frames", str(check.episode_frames)]
    if "sf" in legs:
        command += ["--sf_python", check.sf_python, "--sf_first_line_s", str(args.sf_first_line_s)]
    return command + ["--", "--device", args.device]


def bench_seconds(args, legs: list[str]) -> float:
    """About how long bench_throughput takes for these legs on the H200 (EXPECTED_S): each leg's start,
    measured seconds (the trainers' after their warm-up, and until their next report) and stop."""
    seconds = {"pure": PURE_START_S + args.bench_seconds, "pure_episodes": PURE_START_S + args.bench_seconds,
               "gpu_time": 20,  # a forward pass and a learner step, timed for 6 s, after making the model
               "ours": OURS_FIRST_TRAINED_S + args.bench_warmup + args.bench_seconds + args.report_every + OURS_STOP_S,
               "sf": SF_FIRST_FPS_S + args.bench_warmup + args.bench_seconds + 10 + SF_STOP_S}  # (10: its report)
    seconds["ours_fp32"] = seconds["ours"]
    return BENCH_START_S + sum(seconds[leg] for leg in legs)


def expected_seconds(args, step: str) -> float:
    """About how long a step takes on the H200 under these flags, every leg it plans there."""
    if step in BENCH_STEPS:
        return bench_seconds(args, planned_legs(args, step))
    if step == "train":
        return args.train_seconds + OURS_STOP_S
    return EXPECTED_S[step]


def bench_details(figures: dict) -> dict:
    runs = figures["runs"]

    def first(leg):
        return runs[leg][0] if runs.get(leg) else {}

    ours, sf = first("ours"), first("sf")
    return {"envs": figures["num_envs"], "policy_workers_per_policy": figures.get("policy_workers_per_policy"),
            **{key: figures.get(key) for key in ("pure_sim_fps", "pure_episodes_fps", "ours_fps", "sf_fps",
                                                 "ours_over_pure_sim", "ours_over_pure_episodes", "ours_over_sf")},
            "ours_busy_percent": ours.get("busy_percent"), "ours_policy_lag": ours.get("lag_avg"),
            "ours_inference_batch": ours.get("inference_batch"), "ours_windows": ours.get("window_fps"),
            "ours_status_line": ours.get("status_line"),
            "sf_windows": sf.get("window_fps"), "sf_log_tail": sf.get("log_tail"),
            "pure_episode_frames": first("pure_episodes").get("episode_frames"), "gpu_time": first("gpu_time") or None,
            "ours_fp32_fps": figures.get("ours_fp32_fps"), "ours_fp32_over_sf": figures.get("ours_fp32_over_sf"),
            "ours_fp32_windows": first("ours_fp32").get("window_fps"),
            "ours_fp32_busy_percent": first("ours_fp32").get("busy_percent"), "precision": figures.get("precision"),
            "shm_left": {leg: leg_runs[0]["shm_left"] for leg, leg_runs in runs.items()
                         if leg_runs and leg_runs[0].get("shm_left")}}


def step_bench(check: Check, step: str):
    env_name, policy_workers = BENCH_STEPS[step]
    legs, left_out = bench_legs(check, step)
    partial = os.path.join(check.work, f"bench_{env_name}_{policy_workers}pw.json")
    command = bench_command(check, env_name, legs, policy_workers, partial)
    code, output = check.command(command, timeout=bench_seconds(check.args, legs) + 120)
    details = {"command": " ".join(command[1:]), "left_out": left_out}
    figures = json_in(output) if code == 0 else None
    if figures is None:  # failed or stopped part-way: the legs that finished are in the partial file
        figures = read_json(partial)
        last_line = (output.strip().splitlines() or [""])[-1][:300]
        finished = list(figures["runs"]) if figures else []
        reason = (f"bench_throughput exit code {code} ({last_line}); legs finished: "
                  f"{', '.join(finished) or 'none'}")
        return "failed", {"reason": reason, **details, **(bench_details(figures) if figures else {})}
    details.update(bench_details(figures))
    missing = [leg for leg, key in (("pure", "pure_sim_fps"), ("pure_episodes", "pure_episodes_fps"),
                                    ("ours", "ours_fps"), ("ours_fp32", "ours_fp32_fps"), ("sf", "sf_fps"))
               if leg in legs and not figures.get(key)]
    if missing:
        return "failed", {"reason": f"no figure from {', '.join(leg_and_error(figures, leg) for leg in missing)}",
                          **details}
    return "passed", details


def leg_and_error(figures: dict, leg: str) -> str:
    """The leg, and why it gave no figure where it says (Sample Factory never trained, say)."""
    error = (figures["runs"].get(leg) or [{}])[0].get("error")
    return f"{leg} ({error})" if error else leg


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


# ---------------------------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------------------------

ROW_HEADER = ("| env | GPU | cores | configuration | frames trained/s | pure simulation | share | pure simulation, "
              "cut episodes | share | Sample Factory | ours/SF | score |")


def gpu_row(results: dict[str, dict], args) -> str | None:
    """The GPU throughput row (docs/gpu.md): card, cores, configuration, ours, pure simulation of
    both kinds and Sample Factory, each ratio, and the train step's score."""
    machine, train, bench = results.get("machine", {}), results.get("train", {}), results.get("doom_1pw", {})
    if bench.get("status") != "passed":
        return None
    card = machine.get("gpu") or "no GPU (dry run)"
    cores, workers, envs = machine.get("cores"), args.num_workers, args.num_envs_per_worker
    score = train.get("score")

    def cell(key, ratio=False):
        value = bench.get(key)
        return "-" if value is None else f"{value:.2f}" if ratio else f"{value:,.0f}"

    return (f"| doom_basic | {card} | {cores} | {workers}x{envs} envs, batch 512, 1 policy worker, --device "
            f"{args.device} | {cell('ours_fps')} | {cell('pure_sim_fps')} | {cell('ours_over_pure_sim', True)} | "
            f"{cell('pure_episodes_fps')} | {cell('ours_over_pure_episodes', True)} | {cell('sf_fps')} | "
            f"{cell('ours_over_sf', True)} | "
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
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "appo.py", "env.py", "csrc", "bench", "scripts",
                            "tests"], cwd=REPO, capture_output=True, text=True).stdout.strip()
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
        lines += ["", ROW_HEADER, "|---" * ROW_HEADER.count(" | ") + "|---|", summary["row"]]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text)
    return text


STEP_FUNCTIONS = {"packages": step_packages, "machine": step_machine, "build": step_build,
                  "sample_factory": step_sample_factory, "cuda_tests": step_cuda_tests, "train": step_train,
                  "sigkill": step_sigkill, "eval": step_eval,  # eval plays the train step's checkpoint
                  **{step: lambda check, step=step: step_bench(check, step) for step in BENCH_STEPS},
                  "micro_policy": step_micro_policy, "micro_learner": step_micro_learner}


def needs(step: str) -> tuple[str, ...]:
    """The steps that must have passed for this one to start."""
    if step == "build":
        return ("machine",)
    return ("machine", "build") if step in STEPS else ()


def run(args) -> int:
    check = Check(args)
    if args.device == "cpu":
        check.say("dry run (--device cpu): every step runs on the CPU; the CUDA tests run with the CPU in the "
                  "GPU's place, which checks their logic, not CUDA")
    try:
        for step in ALWAYS + STEPS:
            # a bench step's legs as they stand now (Sample Factory's, say, left out where it did not import)
            expected_s = (bench_seconds(args, bench_legs(check, step)[0]) if step in BENCH_STEPS
                          else expected_seconds(args, step))
            check.step(step, lambda: STEP_FUNCTIONS[step](check), needs=needs(step), expected_s=expected_s)
    finally:
        text = write_summary(check)
        check.log.close()
        shutil.rmtree(check.work, ignore_errors=True)
    print("\n" + text)
    return 0 if all(result["status"] != "failed" for result in check.results) else 1


def plan(args) -> str:
    """Each step's expected start and end, in seconds from the check's start, if every step takes
    its expected time on the H200 (EXPECTED_S) with all its legs; which would not start, and why."""
    lines = [f"{'step':<15}{'start':>6}{'end':>6}  (expected seconds on the H200; --deadline_s "
             f"{args.deadline_s:g}, commands stopped at {args.deadline_s + 60:g})"]
    elapsed = 0.0
    for step in ALWAYS + STEPS:
        expected_s = expected_seconds(args, step)
        if step in STEPS and step not in args.steps:
            lines.append(f"{step:<15}{'-':>6}{'-':>6}  not in --steps")
        elif ends_in_time(args, elapsed, expected_s):
            legs = f"  legs {','.join(planned_legs(args, step))}" if step in BENCH_STEPS else ""
            lines.append(f"{step:<15}{elapsed:>6.0f}{elapsed + expected_s:>6.0f}{legs}")
            elapsed += expected_s
        else:
            lines.append(f"{step:<15}{'-':>6}{'-':>6}  would not start: its {expected_s:.0f} s from {elapsed:.0f} s "
                         f"would end at {elapsed + expected_s:.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command == "prepare":
        prepare(args)
        return 0
    if args.command == "plan":
        print(plan(args))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

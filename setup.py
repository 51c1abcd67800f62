"""Installs appo.py, env.py and the appo_ipc package: csrc/, its Python face (csrc/__init__.py) and the
C++ module it wraps (appo_ipc._native), built with pybind11's own helpers (no CMake, no torch)."""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ipc_extension = Pybind11Extension(
    "appo_ipc._native",
    sources=["csrc/ipc.cpp", "csrc/module.cpp"],
    depends=["csrc/ipc.h"],
    cxx_std=17,
    extra_compile_args=["-O2"],
)

setup(
    name="appo",
    version="0.1.0",
    description="Asynchronous PPO with V-trace (the Sample Factory architecture) in one readable file",
    py_modules=["appo", "env"],
    # csrc/ is the package appo_ipc: installed under that name, and reached in a checkout built in place
    # (python setup.py build_ext --inplace, then python appo.py from the root) through the symlink appo_ipc -> csrc
    packages=["appo_ipc"],
    package_dir={"appo_ipc": "csrc"},
    ext_modules=[ipc_extension],
    cmdclass={"build_ext": build_ext},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.1",
        "numpy>=1.24",
        "gymnasium>=1.0",
        "opencv-python-headless>=4.8",
        "tensorboard>=2.14",
    ],
    extras_require={
        "doom": ["vizdoom>=1.2.3"],
        "atari": ["ale-py>=0.9"],
        "test": ["vizdoom>=1.2.3", "ale-py>=0.9", "pytest>=7", "pytest-timeout>=2", "pytest-xdist>=3", "matplotlib",
                 "wandb", "imageio>=2.9", "imageio-ffmpeg>=0.4", "pettingzoo>=1.24", "gymnasium[mujoco]"],
        "pettingzoo": ["pettingzoo>=1.24", "mpe2"],  # --env pz:<module>:<factory>; mpe2: the docs' simple_spread, simple_tag
        "mujoco": ["gymnasium[mujoco]"],
        "box2d": ["gymnasium[box2d]"],
        "bench": ["faster-fifo", "matplotlib"],
        "wandb": ["wandb"],
        "sweep": ["optuna", "wandb"],  # scripts/tools/optuna_search.py, scripts/tools/wandb_sweep.yaml
        "video": ["imageio>=2.9", "imageio-ffmpeg>=0.4"],  # --save_video: H.264 through the ffmpeg they bring
        "plot": ["matplotlib"],  # scripts/tools/plot.py --out (it reads the summaries with tensorboard, installed anyway)
    },
)

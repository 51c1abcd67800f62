"""APPO: asynchronous PPO with V-trace, the Sample Factory architecture in one file.

    python appo.py --env doom_basic
    python appo.py --env atari_breakout --num_workers 8 --num_envs_per_worker 4

Rollout workers step envs and write observations into shared trajectory slots; policy workers
read them in batches, run the model and write actions back; every `--rollout` steps a slot goes
to the learner, which trains on it and publishes new weights. Queues carry slot indices only.

The file reads in the order data flows (docs/architecture.md has the diagram); each section's header
begins with its name:

    CONFIG: the research flags  model, algorithm, optimizer; ENV and MODEL HOOK <- edit here
    ALGO LOGIC: the model       encoders, core, action distributions        <- edit here
    ALGO LOGIC: the losses      V-trace, GAE, the PPO objective             <- edit here
    PLUMBING: config            the other flags, derived sizes, every check, before anything starts
    PLUMBING: shared memory     trajectory slots, published weights, run state
    PLUMBING: child processes   what every process does first
    PLUMBING: rollout worker -> policy worker -> learner -> runner (its seams: Extra, EXTRAS)
    ---- the core ends here; below it, the extras ----
    EXTRAS: reporting, multi-node (torchrun), population-based training, evaluation
    main

To fork: search for "ALGO LOGIC" (the model and the loss) and "HOOK" (where envs and models are made).
Each EXTRAS block is one optional part with its own flags and checks, attached at the runner's
and the learner's moments (class Extra); delete a block, its `EXTRAS.append` line last in it,
and the trainer runs without it (tests/test_extras.py does that for each).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import faulthandler
import fnmatch
import glob
import importlib.util
import inspect
import itertools
import json
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import queue
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import typing
import uuid
import zlib
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gymnasium import spaces

import appo_ipc
import env as envs
# the shared-memory wrappers, from csrc/'s Python face; named here, they are appo.X too (tests and scripts use them)
from appo_ipc import (ActionRequests, ActionStaging, BatchBuffers, InProcessQueue, RolloutSlots, SharedCounters,
                      SharedWeights, cuda_ipc_files, drain, remove_files)


# =============================================================================================
# CONFIG (edit here): the research flags: the model, the algorithm, the optimizer. The general, env
# and system flags, the parsing, the derived sizes and every check are in PLUMBING: config.
# =============================================================================================

def add_research_flags(parser: argparse.ArgumentParser):
    """The flags a researcher changes. `positive` and `at_least_0` mark the bounds that config_errors
    checks; a family in env.py may change a default (its `flag_defaults`; the run's second line says
    which). After adding a flag, regenerate docs/flags.md: python scripts/update_flag_docs.py."""
    model = parser.add_argument_group("model")
    positive(model.add_argument("--hidden_size", "--rnn_size", type=int, default=512,
                                help="width of the fully connected layer after the encoder and of the RNN "
                                     "(--rnn_size, Sample Factory's name, is the same flag)"))
    model.add_argument("--rnn_type", choices=["gru", "lstm", "none"], default="gru",
                       help="recurrent core; 'none' for a feed-forward policy")
    model.add_argument("--encoder", choices=list(CONV_ENCODERS), default="convnet_simple",
                       help="conv net for image observations: " + listed(
                           [f"{name}, {encoder.about}" for name, encoder in CONV_ENCODERS.items()], "; ", "; or "))
    model.add_argument("--encoder_mlp_layers", type=int, nargs="+", default=[128, 128],
                       help="widths of the MLP that encodes vector observations (Sample Factory's name)")
    model.add_argument("--nonlinearity", choices=["auto", "elu", "relu", "tanh"], default="auto",
                       help="activation of the vector MLP and the FC after the encoders; auto: the --encoder's "
                            f"({encoder_activations()})")
    model.add_argument("--normalize_input", action="switch", default=False,
                       help="normalise each observation element by its running mean and std")
    model.add_argument("--input_stats", choices=["sampled_before_sgd", "all_after_sgd"], default="sampled_before_sgd",
                       help="what --normalize_input's statistics take in from each training iteration: 256 random "
                            "rows before its SGD, or every valid step after it, so that its first epoch normalises "
                            "as acting did (SB3's VecNormalize updates at every env step)")
    model.add_argument("--actor_critic_share_weights", action="switch", default=True,
                       help="one encoder and FC for policy and value; off: the value gets its own (Sample "
                            "Factory's name; with --rnn_type none)")
    positive(model.add_argument("--initial_stddev", type=float, default=1.0,
                                help="the starting std of continuous (Box) actions (Sample Factory's name)"))
    positive(model.add_argument("--policy_head_gain", type=float, default=1.0,
                                help="the orthogonal gain of the policy head's weights (ActorCritic.initialize)"))
    model.add_argument("--policy_initialization", choices=["orthogonal", "torch_default"], default="orthogonal",
                       help="orthogonal: gain 1 (the policy head --policy_head_gain), zero biases; torch_default: "
                            "each layer as torch makes it, as SB3's with ortho_init off (Sample Factory's name)")

    algo = parser.add_argument_group("algorithm")
    positive(algo.add_argument("--rollout", type=int, default=32, help="env steps per trajectory slot (T)"))
    positive(algo.add_argument("--batch_size", type=int, default=2048,
                               help="samples per SGD step: one minibatch of whole trajectories, as in Sample Factory; "
                                    "a multiple of --rollout"))
    positive(algo.add_argument("--num_batches_per_epoch", type=int, default=1,
                               help="minibatches in a training iteration, as in Sample Factory: an iteration trains on "
                                    "batch_size x this samples, each minibatch computing its targets with the weights of "
                                    "the moment and making one optimiser step"))
    positive(algo.add_argument("--num_epochs", type=int, default=1, help="SGD passes over each iteration's samples"))
    algo.add_argument("--shuffle_minibatches", action="switch", default=False,
                      help="a new random partition of the batch into minibatches every epoch: of single steps where "
                           "nothing runs along a trajectory (--rnn_type none, GAE; --batch_size may then be less "
                           "than --rollout), as SB3 and CleanRL; of whole trajectories for V-trace or an RNN "
                           "(Sample Factory's name; the run says which)")
    algo.add_argument("--gamma", type=float, default=0.99, help="discount factor (default: the env's)")
    algo.add_argument("--with_vtrace", action="switch", default=True,
                      help="V-trace value targets and advantages; --no-with_vtrace uses GAE")
    positive(algo.add_argument("--vtrace_rho", type=float, default=1.0, help="V-trace rho_bar"))
    positive(algo.add_argument("--vtrace_c", type=float, default=1.0, help="V-trace c_bar"))
    algo.add_argument("--gae_lambda", type=float, default=0.95, help="GAE lambda (without V-trace)")
    algo.add_argument("--value_bootstrap", action="switch", default=False,
                      help="where a time limit cut the episode (gymnasium's truncated), the return goes on with "
                           "the critic's value of the observation it was cut at, not 0 as at a death (Sample "
                           "Factory's name; the rollout keeps that observation, see RolloutWorker.record_step)")
    positive(algo.add_argument("--ppo_clip_ratio", type=float, default=0.1,
                               help="PPO keeps the policy ratio within [1/(1+eps), 1+eps]"))
    positive(algo.add_argument("--ppo_clip_value", type=float, default=1.0,
                               help="clip of the value change against the behaviour policy's value"))
    at_least_0(algo.add_argument("--value_loss_coeff", type=float, default=0.5,
                                 help="weight of the critic's squared error (Sample Factory's definition and default)"))
    algo.add_argument("--exploration_loss", choices=["entropy", "symmetric_kl"], default="entropy",
                      help="entropy: a bonus for the policy's entropy; symmetric_kl: a penalty on its symmetric "
                           "KL divergence from the uniform policy, which grows without bound as an action's "
                           "probability goes to 0, so no head can collapse (Sample Factory's Doom default)")
    at_least_0(algo.add_argument("--exploration_loss_coeff", type=float, default=0.003,
                                 help="weight of the exploration term"))
    algo.add_argument("--scale_rewards", action="switch", default=False,
                      help="divide each agent's rewards by the running std of its discounted return, restarted at "
                           "every episode's end (time limits included), clipped to +-10 (RewardScaler; SB3's "
                           "VecNormalize, CleanRL's NormalizeReward); per env, restarted with its rollout worker; "
                           "true returns are reported unscaled")
    algo.add_argument("--normalize_advantage", action="switch", default=True,
                      help="normalise advantages to zero mean, unit std per minibatch (as Sample Factory)")
    algo.add_argument("--normalize_returns", action="switch", default=True,
                      help="the value head predicts returns scaled by their running mean and std, "
                           "so the critic sees unit-scale targets whatever the reward scale")
    positive(algo.add_argument("--max_policy_lag", type=int, default=100,
                               help="drop transitions made by a policy more than this many versions (batches) old"))
    algo.add_argument("--async_rl", action="switch", default=True,
                      help="rollout workers collect the next batch while the learner trains on this one, acting "
                           "with weights a version or two old; --no-async_rl takes turns, every batch acted by the "
                           "latest weights (Sample Factory's synchronous mode, the Atari and gym: families' default; "
                           "an iteration is then whole rollouts of every env: docs/architecture.md)")

    optim = parser.add_argument_group("optimizer")
    optim.add_argument("--optimizer", choices=["adam", "sgd", "rmsprop"], default="adam",
                       help="the learner's optimizer (make_optimizer: add yours there); the families' learning "
                            "rates were chosen for Adam")
    positive(optim.add_argument("--learning_rate", type=float, default=1e-4, help="the optimizer's learning rate"))
    optim.add_argument("--lr_schedule", choices=["constant", "linear_decay"], default="constant",
                       help="linear_decay: the learning rate falls linearly to 0 at --lr_decay_frames")
    positive(optim.add_argument("--lr_decay_frames", type=integer, default=None,
                                help="env frames at which linear_decay reaches 0 (default: --train_for_env_steps; Sample "
                                     "Factory's horizon is frameskip times longer, which on Atari made no difference "
                                     "beyond the seeds' spread: docs/results/ablations.md)"))
    optim.add_argument("--adam_beta1", type=float, default=0.9, help="Adam beta1")
    optim.add_argument("--adam_beta2", type=float, default=0.999, help="Adam beta2")
    positive(optim.add_argument("--adam_eps", type=float, default=1e-6, help="Adam epsilon"))
    at_least_0(optim.add_argument("--momentum", type=float, default=0.0,
                                  help="--optimizer sgd's and rmsprop's momentum (torch's default, 0)"))
    positive(optim.add_argument("--max_grad_norm", type=float, default=4.0, help="gradient norm clip"))


def make_env(cfg, env_index: int, render_mode: str | None = None) -> Agents:
    """ENV HOOK: every env the trainer steps is made here (env.py's create_env: add yours with
    env.register_env)."""
    return Agents(envs.create_env(cfg.env, cfg, env_index=env_index, render_mode=render_mode))


def make_model(obs_space: spaces.Space, action_space: spaces.Space, cfg) -> "ActorCritic":
    """MODEL HOOK: every model the trainer builds is made here, for the learner, the policy workers,
    the checks before a run starts and evaluation alike (a model of your own: return it here)."""
    return ActorCritic(obs_space, action_space, cfg)


# =============================================================================================
# ALGO LOGIC (edit here): the model
# =============================================================================================

# Flags that fix the model's shape (and its buffers' meaning), and env families' that change what it sees.
MODEL_FLAGS = ["hidden_size", "rnn_type", "encoder", "encoder_mlp_layers", "nonlinearity", "normalize_input",
               "normalize_returns", "actor_critic_share_weights", *envs.model_flags()]


class Categoricals:
    """Discrete actions: one categorical per head (Discrete: one head; MultiDiscrete: one per entry;
    MultiBinary: a two-way one per bit; a Tuple or Dict of these: their heads in order). The policy
    head's output ("logits") is every head's logits side by side; an action is one int per head."""

    action_dtype = np.dtype(np.int64)
    num_log_stds = 0  # learned log standard deviations that ActorCritic appends to the logits

    def __init__(self, head_sizes: list[int]):
        self.head_sizes = head_sizes
        self.num_outputs = sum(head_sizes)
        self.num_params = self.num_outputs  # the width of "logits", what the model hands the methods below
        self.action_shape = (len(head_sizes),)

    def log_softmax(self, logits: torch.Tensor) -> list[torch.Tensor]:
        return [F.log_softmax(head, dim=-1) for head in logits.split(self.head_sizes, dim=-1)]

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        # argmax(p / q), q ~ Exp(1): torch.multinomial's own algorithm for one sample, drawing the
        # same numbers, without its input checks, which read the GPU back twice per head
        actions = [(log_probs.exp() / torch.empty_like(log_probs).exponential_(1)).argmax(-1)
                   for log_probs in self.log_softmax(flat)]
        return torch.stack(actions, dim=-1).view(*logits.shape[:-1], len(self.head_sizes))

    def mode(self, logits: torch.Tensor) -> torch.Tensor:
        """The most likely action of every head."""
        return torch.stack([head.argmax(-1) for head in logits.split(self.head_sizes, dim=-1)], dim=-1)

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a) summed over the heads: [...]."""
        heads = self.log_softmax(logits)
        return sum(head.gather(-1, actions[..., i:i + 1]).squeeze(-1) for i, head in enumerate(heads))

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        return sum(-(head.exp() * head).sum(-1) for head in self.log_softmax(logits))

    def symmetric_kl_to_uniform(self, logits: torch.Tensor) -> torch.Tensor:
        """(KL(pi || U) + KL(U || pi)) / 2 per head, summed over the heads: [...]."""
        total = 0.0
        for log_probs in self.log_softmax(logits):
            log_uniform = -float(np.log(log_probs.shape[-1]))
            kl_to_uniform = (log_probs.exp() * (log_probs - log_uniform)).sum(-1)
            kl_from_uniform = (np.exp(log_uniform) * (log_uniform - log_probs)).sum(-1)
            total = total + 0.5 * (kl_to_uniform + kl_from_uniform)
        return total


class DiagonalGaussian:
    """Continuous actions (a Box of any shape, flattened; a Tuple or Dict of Boxes, side by side):
    one normal per dimension. The policy head gives the means; the log standard deviations are a
    learned vector that does not depend on the state (Sample Factory's default for continuous
    control). "logits" here is means and log-stds side by side. Actions are sampled and scored
    unclipped; env_action clips them to the Box and gives them its shape at the env."""

    action_dtype = np.dtype(np.float32)

    def __init__(self, dim: int):
        self.dim = dim
        self.num_outputs = dim  # the means; ActorCritic holds the log-stds
        self.num_log_stds = dim
        self.num_params = 2 * dim  # the width of "logits": means, then log-stds
        self.action_shape = (dim,)

    def split(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return logits[..., :self.dim], logits[..., self.dim:]

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.split(logits)
        return mean + log_std.exp() * torch.randn_like(mean)

    def mode(self, logits: torch.Tensor) -> torch.Tensor:
        return self.split(logits)[0]

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.split(logits)
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z * z - log_std - 0.5 * float(np.log(2 * np.pi))).sum(-1)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        return (self.split(logits)[1] + 0.5 * float(np.log(2 * np.pi * np.e))).sum(-1)


# MixedHeads, both kinds side by side for a Tuple or Dict that mixes them, is with the action spaces'
# parsing (PLUMBING: rollout worker)


# PettingZoo's convention: an observation key whose entries are 1 for the actions allowed now and
# 0 for those forbidden, one per logit of the discrete heads, in their order (Discrete n: n entries).
ACTION_MASK = "action_mask"
# A forbidden action's logit: probability 0, yet finite, so that 0 * log-prob stays 0 in the
# entropy and a forbidden action's log-prob never turns a ratio or a KL into NaN.
MASKED_LOGIT = -1e9


def action_distribution(action_space: spaces.Space) -> ActionDistribution:
    """Categorical heads for the discrete parts, a Gaussian for the continuous ones (action_parts and
    head_sizes, beside env_action, say how a space splits into them)."""
    parts = action_parts(action_space)
    heads = [size for part in parts for size in head_sizes(part)]
    dims = sum(continuous_dims(part) for part in parts)
    if not dims:
        return Categoricals(heads)
    if not heads:
        return DiagonalGaussian(dims)
    return MixedHeads(Categoricals(heads), DiagonalGaussian(dims))


def rnn_state_size(cfg) -> int:
    return {"gru": cfg.hidden_size, "lstm": 2 * cfg.hidden_size, "none": 1}[cfg.rnn_type]


class RewardScaler:
    """--scale_rewards, for one agent of one env: its rewards divided by the running std of its
    discounted return, clipped to +-10 (SB3's VecNormalize and CleanRL's NormalizeReward, their
    eps). The return runs back from each step as ret = gamma * ret + r, and restarts at every
    episode's end, a time limit's cut included. Not centred: a reward keeps its sign. The rollout
    worker applies it to what it writes to the slots; the true return it reports stays unscaled."""

    def __init__(self, gamma: float, clip: float = 10.0):
        self.gamma, self.clip = gamma, clip
        self.ret, self.mean, self.var, self.count = 0.0, 0.0, 1.0, 1e-4  # SB3's RunningMeanStd starts here

    def __call__(self, reward: float, episode_ended: bool) -> float:
        self.ret = self.gamma * self.ret + reward
        self.count += 1.0
        delta = self.ret - self.mean
        self.mean += delta / self.count
        self.var += (delta * (self.ret - self.mean) - self.var) / self.count  # Welford's, one sample at a time
        if episode_ended:
            self.ret = 0.0
        return float(np.clip(reward / np.sqrt(self.var + 1e-8), -self.clip, self.clip))


class RunningNormalizer(nn.Module):
    """Per-element running mean and variance of an input (e.g. every pixel), so that what never
    changes (a static background) reads as zero and what moves stands out. Its statistics are
    buffers: they travel with the weights to the policy workers and into checkpoints."""

    def __init__(self, shape: tuple[int, ...] = (), clip: float = 5.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(1e-4))
        self.clip = clip

    @torch.no_grad()
    def update(self, batch: torch.Tensor, scale: float = 1.0, rows: torch.Tensor | None = None):
        """Merges the statistics of `scale * batch` [N, *shape] (Chan et al.'s parallel formula),
        of its rows where `rows` [N] is nonzero if given. A batch with a NaN or Inf in a counted
        row is left out whole: it would poison the statistics for good.

        Integer batches (pixels) are scaled after the reduction, which saves a pass over them.
        """
        batch_mean, batch_var, n = self.moments(batch, rows)
        self.merge(batch_mean * scale, batch_var * scale ** 2, n)

    @staticmethod
    def moments(batch: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean, variance, count) of the counted rows, the count 0 if any of them is not finite.
        Rows are weighed, not selected, and the count stays a tensor: nothing here waits for the
        device to say how many rows there are."""
        weights = torch.ones(batch.shape[0], device=batch.device) if rows is None else (rows > 0).float()
        n, x = weights.sum(), batch.float()
        if rows is not None:  # a left-out row weighs 0, and its NaN must not reach the sums
            weights = weights.view(-1, *[1] * (batch.dim() - 1))
            x = torch.where(weights > 0, x, 0.0)
        if batch.is_floating_point():
            n = n * torch.isfinite(x).all()
        batch_mean = x.sum(0) / n.clamp(min=1.0)
        deviations = x - batch_mean if rows is None else (x - batch_mean) * weights
        return batch_mean, deviations.pow_(2).sum(0) / n.clamp(min=1.0), n

    def merge(self, batch_mean: torch.Tensor, batch_var: torch.Tensor, n: torch.Tensor):
        total = self.count + n
        delta = batch_mean - self.mean
        merged = (self.mean + delta * n / total,
                  (self.var * self.count + batch_var * n + delta ** 2 * self.count * n / total) / total, total)
        for statistic, value in zip((self.mean, self.var, self.count), merged):
            statistic.copy_(torch.where(n > 0, value, statistic))

    def forward(self, x: torch.Tensor, scale: float = 1.0, inplace: bool = False) -> torch.Tensor:
        """Normalises `scale * x` in one multiply-add, addcmul (the input may be a large batch of pixels)."""
        inverse_std = torch.rsqrt(self.var + 1e-5)
        shift, factor = (-self.mean * inverse_std).to(x.dtype), (inverse_std * scale).to(x.dtype)
        if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            # channels-last images: broadcast the statistics in the same (H, W, C) order, or the
            # multiply-add falls back to a slow strided loop
            x_hwc = x.permute(0, 2, 3, 1)
            normalized = torch.addcmul(shift.permute(1, 2, 0).contiguous(), x_hwc,
                                       factor.permute(1, 2, 0).contiguous(), out=x_hwc if inplace else None)
            return normalized.clamp_(-self.clip, self.clip).permute(0, 3, 1, 2)
        return torch.addcmul(shift, x, factor, out=x if inplace else None).clamp_(-self.clip, self.clip)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sqrt(self.var + 1e-5) + self.mean


def plain_convnet(layers: list[tuple[int, int, int]], activation: type[nn.Module]):
    """A stack of convs, (out channels, kernel, stride) per layer, each followed by `activation`."""
    def build(channels: int) -> nn.Sequential:
        modules = []
        for out_channels, kernel, stride in layers:
            modules += [nn.Conv2d(channels, out_channels, kernel, stride=stride), activation()]
            channels = out_channels
        return nn.Sequential(*modules, nn.Flatten())
    return build


class ResidualBlock(nn.Module):
    """relu -> conv 3x3 -> relu -> conv 3x3, added to the input (IMPALA's pre-activation block)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


def impala_resnet(channels: int) -> nn.Sequential:
    """The IMPALA paper's "deep" encoder (Espeholt et al. 2018, fig. 3), which the Sample Factory
    paper used for DMLab-30: three stages of conv 3x3, max-pool 3x3 stride 2 and two residual
    blocks, with 16, 32 and 32 channels, then a ReLU. Each stage halves the image's height and width."""
    modules = []
    for out_channels in (16, 32, 32):
        modules += [nn.Conv2d(channels, out_channels, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                    ResidualBlock(out_channels), ResidualBlock(out_channels)]
        channels = out_channels
    return nn.Sequential(*modules, nn.ReLU(), nn.Flatten())


class ConvEncoder(typing.NamedTuple):
    build: Callable[[int], nn.Module]  # from the input's channels to a module ending in a flat vector
    activation: type[nn.Module]  # the rest of the model's (the vector MLP, the FC after the encoders)
    about: str  # for --help


CONV_ENCODERS = {  # --encoder's choices and help come from here
    "convnet_simple": ConvEncoder(plain_convnet([(32, 8, 4), (64, 4, 2), (128, 3, 2)], nn.ELU), nn.ELU,
                                  "the Sample Factory paper's (32/64/128 channels, ELU)"),
    "convnet_atari": ConvEncoder(plain_convnet([(32, 8, 4), (64, 4, 2), (64, 3, 1)], nn.ReLU), nn.ReLU,
                                 "the DQN paper's Nature CNN (32/64/64 channels, ReLU, as in Sample Factory's and "
                                 "CleanRL's Atari configs)"),
    "resnet": ConvEncoder(impala_resnet, nn.ReLU, "the IMPALA paper's deep encoder (3 stages of conv, max-pool and "
                                                  "2 residual blocks, 16/32/32 channels, ReLU), the paper's choice for "
                                                  "DMLab"),
    "convnet_small": ConvEncoder(plain_convnet([(16, 2, 1), (32, 2, 1), (64, 2, 1)], nn.ReLU), nn.ReLU,
                                 "for small images from 4x4, such as MiniGrid's 7x7 views (three 2x2 convs, 16/32/64 "
                                 "channels, ReLU: rl-starter-files' MiniGrid encoder without its max-pool)"),
}


def register_encoder(name: str, build: Callable[[int], nn.Module], activation: type[nn.Module] = nn.ReLU,
                     about: str = "a registered encoder"):
    """Adds an image encoder that --encoder NAME then offers. `build(channels)` returns a module
    that takes images [N, C, H, W] scaled to [0, 1] (or normalised, --normalize_input), in
    channels-last memory (so reshape, not view) and in bfloat16 with --encoder_dtype bfloat16 (it
    runs under autocast; its weights stay float32), and returns flat features [N, F] (end in
    nn.Flatten(), as impala_resnet does). Call it at import time in your launcher, beside
    env.register_env, so that the worker processes, which run the launcher too, register it as
    well; run its evaluation with the same launcher (a run's last line names it)."""
    CONV_ENCODERS[name] = ConvEncoder(build, activation, about)


NONLINEARITIES = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh}


class ActorCritic(nn.Module):
    """Encoder -> (GRU | LSTM | nothing) -> action head (Categoricals, DiagonalGaussian or
    MixedHeads) + value. Images (uint8, CHW) go through the --encoder conv net, vectors (Doom's game
    variables, a gym: env's state) through an MLP (--encoder_mlp_layers), their features through one
    FC layer (--hidden_size). An "action_mask" observation masks the discrete heads' logits.

    The contract: what the rest of the file calls on the model, which a replacement must keep.
    - forward(obs, rnn_state) -> (logits, values, next_rnn_state): one step of N envs (policy
      workers, evaluation); forward_rollout(obs, first_rnn_state, dones) -> (logits, values) over
      [T+1, B] trajectories (the loss). Tests check that the two agree.
    - encoders: keyed by the observations the slots hold (obs_shapes' keys); the action mask's
      entry is an nn.Identity that encode() skips. With fc, the layers a policy worker holds in
      --encoder_dtype (encoder_in_compute_dtype).
    - action_dist: the distribution over policy_head's output (sample, mode, log_prob, entropy;
      num_params wide). core: the recurrent cell, which core_step calls (a cell of yours trains as
      it is).
    - rnn_state_size(cfg): the floats of recurrent state per env that the slots carry.
    - update_normalizers(obs): the learner, once per batch; normalize_returns, returns_normalizer
      and values_to_returns: the losses, with --normalize_returns.
    - state_dict(): the layout of the published weights (SharedWeights) and of checkpoints;
      MODEL_FLAGS lists the flags that fix it. learner_only: names of submodules that only the
      learner uses (an RND predictor, a world model): the policy workers never load them.
    """
    learner_only: tuple[str, ...] = ()

    def __init__(self, obs_space: spaces.Space, action_space: spaces.Space, cfg):
        super().__init__()
        self.rnn_type = cfg.rnn_type
        self.hidden_size = cfg.hidden_size
        self.action_dist = action_distribution(action_space)
        mask_error = action_mask_error(obs_space, action_space)
        if mask_error:
            raise ValueError(mask_error)
        self.masks_actions = ACTION_MASK in obs_shapes(obs_space)
        self.encoders, self.fc = self.trunk(obs_space, cfg)
        self.normalize_input = cfg.normalize_input
        self.obs_normalizers = nn.ModuleDict({key: RunningNormalizer(shape) for key, (shape, _)
                                              in obs_shapes(obs_space).items() if key != ACTION_MASK})
        self.normalize_returns = cfg.normalize_returns
        self.returns_normalizer = RunningNormalizer()
        if cfg.rnn_type == "gru":
            self.core = nn.GRUCell(cfg.hidden_size, cfg.hidden_size)
        elif cfg.rnn_type == "lstm":
            self.core = nn.LSTMCell(cfg.hidden_size, cfg.hidden_size)
        self.policy_head = nn.Linear(cfg.hidden_size, self.action_dist.num_outputs)
        if self.action_dist.num_log_stds:
            self.action_log_std = nn.Parameter(torch.zeros(self.action_dist.num_log_stds) + np.log(cfg.initial_stddev))
        self.value_head = nn.Linear(cfg.hidden_size, 1)
        self.shares_weights, self.policy_head_gain = cfg.actor_critic_share_weights, cfg.policy_head_gain
        self.policy_initialization = cfg.policy_initialization
        if not self.shares_weights:  # the value's own encoder and FC; the policy's drive the core
            self.critic_encoders, self.critic_fc = self.trunk(obs_space, cfg)
        self.initialize()
        encoder_precision(self, cfg)  # --encoder_dtype, and the convs' memory layout

    def trunk(self, obs_space: spaces.Space, cfg) -> tuple[nn.ModuleDict, nn.Sequential]:
        """An encoder per observation key (conv net, MLP, or nothing for an action mask) and the FC
        over their features side by side."""
        encoders, features = nn.ModuleDict(), 0
        image_encoder, activation, _ = CONV_ENCODERS[cfg.encoder]
        if cfg.nonlinearity != "auto":
            activation = NONLINEARITIES[cfg.nonlinearity]
        for key, (shape, _) in obs_shapes(obs_space).items():
            if key == ACTION_MASK:
                encoders[key] = nn.Identity()
            elif len(shape) == 3:
                encoders[key] = image_encoder(shape[0])
                with torch.no_grad():
                    features += encoders[key](torch.zeros(1, *shape)).shape[1]
            elif len(shape) == 1:
                layers, width = [], shape[0]
                for out_width in cfg.encoder_mlp_layers:
                    layers += [nn.Linear(width, out_width), activation()]
                    width = out_width
                encoders[key] = nn.Sequential(*layers)
                features += width
            else:
                raise ValueError(f"observation '{key}' of shape {shape}: expected an image (C, H, W) or a vector")
        return encoders, nn.Sequential(nn.Linear(features, cfg.hidden_size), activation())

    def initialize(self):
        """Orthogonal weights with gain 1 (the policy head's: --policy_head_gain) and zero biases. A tiny
        head (gain 0.01, common in PPO code) starves the encoder and the RNN of policy gradient early
        on: on doom_basic it delayed learning by a few hundred thousand frames. --policy_initialization
        torch_default keeps the weights torch drew as it built each layer."""
        if self.policy_initialization == "torch_default":
            return
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(module.weight, gain=self.policy_head_gain if module is self.policy_head else 1.0)
                nn.init.zeros_(module.bias)

    def encode(self, obs: dict[str, torch.Tensor], critic: bool = False) -> torch.Tensor:
        """Observations -> float32 features [N, hidden_size] (the value's own, `critic`, where the two
        do not share weights)."""
        features = []
        encoders, fc = (self.critic_encoders, self.critic_fc) if critic else (self.encoders, self.fc)
        with encoder_autocast(self, obs):
            for key, encoder in encoders.items():
                if key == ACTION_MASK:
                    continue
                scale = 1.0 / 255.0 if obs[key].dtype == torch.uint8 else 1.0
                x = encoder_input(obs[key], self.encoder_dtype)  # a copy: scaled in place
                if self.normalize_input:
                    x = self.obs_normalizers[key](x, scale, inplace=True)
                elif scale != 1.0:
                    x.mul_(scale)
                features.append(encoder(x))
            features = fc(torch.cat(features, dim=1))
        return features.float()

    def update_normalizers(self, obs: dict[str, torch.Tensor], max_samples: int | None = 256,
                           rows: torch.Tensor | None = None):
        """Learner only: fold a batch [N, ...] of observations into the input statistics, from a random
        `max_samples` rows: enough for running statistics, at a fraction of the learner's time (a batch
        of 512 Doom frames is 14 M values); with max_samples None, every row where `rows` [N] is
        nonzero (all of them without it)."""
        if self.normalize_input:
            for key, normalizer in self.obs_normalizers.items():
                x = obs[key]
                if max_samples is not None and x.shape[0] > max_samples:
                    x = x[torch.randint(x.shape[0], (max_samples,), device=x.device)]
                normalizer.update(x, 1.0 / 255.0 if x.dtype == torch.uint8 else 1.0,
                                  rows=rows if max_samples is None else None)

    def values_to_returns(self, values: torch.Tensor) -> torch.Tensor:
        """The value head's output in return units (it predicts normalised returns if asked to)."""
        return self.returns_normalizer.denormalize(values) if self.normalize_returns else values

    def core_step(self, features: torch.Tensor, rnn_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the recurrent core: (output, next state). It calls the cell the model holds,
        so a cell of your own (a module called as torch's are: GRU-like `cell(x, h) -> h`, or
        LSTM-like `cell(x, (h, c)) -> (h, c)` under --rnn_type lstm) is what acts and what trains."""
        if self.rnn_type == "none":
            return features, rnn_state
        if self.rnn_type == "lstm":  # the slots carry [hidden, cell] side by side
            hidden, cell = self.core(features, tuple(rnn_state.chunk(2, dim=1)))
            return hidden, torch.cat([hidden, cell], dim=1)
        hidden = self.core(features, rnn_state)
        return hidden, hidden

    def action_logits(self, core_out: torch.Tensor) -> torch.Tensor:
        """The action distribution's parameters (see Categoricals, DiagonalGaussian, MixedHeads)."""
        logits = self.policy_head(core_out)
        if self.action_dist.num_log_stds:
            log_stds = self.action_log_std.expand(*logits.shape[:-1], self.action_dist.num_log_stds)
            logits = torch.cat([logits, log_stds], dim=-1)
        return logits

    def mask_logits(self, logits: torch.Tensor, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """With an action_mask observation [..., n]: the first n logits (the discrete heads'), where
        the mask is 0, become MASKED_LOGIT, which no gradient flows through."""
        if not self.masks_actions:
            return logits
        allowed = obs[ACTION_MASK] > 0
        discrete = logits[..., :allowed.shape[-1]].masked_fill(~allowed, MASKED_LOGIT)
        return torch.cat([discrete, logits[..., allowed.shape[-1]:]], dim=-1)

    def forward(self, obs: dict[str, torch.Tensor], rnn_state: torch.Tensor):
        """One step for a batch: (action logits, value, next RNN state)."""
        core_out, next_state = self.core_step(self.encode(obs), rnn_state)
        critic = core_out if self.shares_weights else self.encode(obs, critic=True)
        return self.mask_logits(self.action_logits(core_out), obs), self.value_head(critic).squeeze(-1), next_state

    def forward_rollout(self, obs: dict[str, torch.Tensor], first_rnn_state: torch.Tensor, dones: torch.Tensor):
        """A whole rollout: obs [T, B, ...], dones [T, B] -> logits [T, B, A], values [T, B]."""
        obs_rows = {key: trajectory_major(value) for key, value in obs.items()}
        core_out = self.core_over_rollout(self.encode(obs_rows), first_rnn_state, dones)
        steps, batch = dones.shape  # the value's own features, [T, B, hidden] as the core's outputs
        critic = core_out if self.shares_weights else self.encode(obs_rows, critic=True).view(batch, steps, -1).transpose(0, 1)
        return self.mask_logits(self.action_logits(core_out), obs), self.value_head(critic).squeeze(-1)

    def core_over_rollout(self, features: torch.Tensor, first_rnn_state: torch.Tensor,
                          dones: torch.Tensor) -> torch.Tensor:
        """The core over a rollout: trajectory-major features [B * T, hidden] -> outputs [T, B, hidden].
        The RNN state is reset after every step whose episode ended (done), exactly as the rollout
        worker does when it acts, so training sees the same states as acting did. (For torch's own
        cells the learner runs the same numbers in one nn.GRU/nn.LSTM call: SegmentRNN.)"""
        steps, batch = dones.shape
        features = features.view(batch, steps, -1).transpose(0, 1)
        if self.rnn_type == "none":  # no state to carry: core_step's outputs are its inputs
            return features.contiguous()
        rnn_state, core_outs = first_rnn_state, []
        for t in range(steps):
            if t > 0:
                rnn_state = rnn_state * (1.0 - dones[t - 1]).unsqueeze(1)
            core_out, rnn_state = self.core_step(features[t], rnn_state)
            core_outs.append(core_out)
        return torch.stack(core_outs)


def trajectory_major(steps: torch.Tensor) -> torch.Tensor:
    """[T, B, ...] -> [B * T, ...], one trajectory after the other. The learner's batches are
    time-first views of trajectory-major memory (BatchBuffers.fill), so for them this is free,
    where flattening [T, B] would copy every image of the batch."""
    return steps.transpose(0, 1).flatten(0, 1)


def act(model: "ActorCritic", obs: dict[str, torch.Tensor], rnn_state: torch.Tensor
        ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One batched inference step: what the learner's batch will hold of it, by slot field (see
    acting_fields: the sampled actions, their log-probs, the values), and the next RNN states."""
    with torch.inference_mode():  # cheaper than no_grad: no version counters
        logits, values, next_state = model(obs, rnn_state)
        actions = model.action_dist.sample(logits)
        return {"actions": actions, "log_prob": model.action_dist.log_prob(logits, actions), "value": values}, next_state


def acting_fields(action_dist: ActionDistribution) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """act()'s outputs as per-step fields of the slots, name -> (shape, dtype) of a step. The policy
    workers write each, and the learner's batch holds it as batch[name], [T+1, B, ...], beside the
    observations, "rnn_state" (before the step), "reward", "done", "policy_version" and "valid"
    (rollout_buffer_specs), and steps_of(batch)[name], [T, B, ...], the steps that train. To carry
    one more quantity of the acting policy to the loss (say its logits, for an exact KL: shape
    (action_dist.num_params,), float32), add it here and to act()'s dict; the runner checks that
    the two agree before it starts anything."""
    return {"actions": (action_dist.action_shape, action_dist.action_dtype),
            "log_prob": ((), np.dtype(np.float32)),  # behaviour policy's log pi(action)
            "value": ((), np.dtype(np.float32))}  # behaviour policy's value estimate


def env_fields(cfg) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Per-step values an env reports in its step's `info` that the loss reads, as slot fields: name
    -> (shape, dtype) of a step. The rollout worker writes info[name] beside the step's reward (0
    where an info lacks it: a step no env took, a game's reset), and the learner's batch holds it as
    batch[name], [T+1, B, ...], and steps_of(batch)[name], [T, B, ...], masked by "valid" as every
    field is. None here; a constrained policy's cost: {"cost": ((), np.dtype(np.float32))}
    (docs/fork.md, "A per-step value from the env")."""
    return {}


# =============================================================================================
# ALGO LOGIC (edit here): the losses (pure functions; tests import them) and the update
# =============================================================================================

def vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0):
    """V-trace targets and policy-gradient advantages (IMPALA, Espeholt et al. 2018, eq. 1).

    Time is the first dimension: log_rhos, discounts, rewards, values are [T, ...] and
    bootstrap_value is [...]. Returns (vs, pg_advantages), both [T, ...], without gradient.
    """
    if not (log_rhos.shape == discounts.shape == rewards.shape == values.shape):
        raise ValueError(f"vtrace: log_rhos {tuple(log_rhos.shape)}, discounts {tuple(discounts.shape)}, "
                         f"rewards {tuple(rewards.shape)} and values {tuple(values.shape)} must have one shape")
    if log_rhos.dim() < 1 or bootstrap_value.shape != values.shape[1:]:
        raise ValueError(f"vtrace: bootstrap_value {tuple(bootstrap_value.shape)} must be values "
                         f"{tuple(values.shape)} without its first (time) dimension")
    with torch.no_grad():
        rhos = torch.exp(log_rhos)
        clipped_rhos = rhos.clamp(max=rho_bar)
        cs = rhos.clamp(max=c_bar)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
        deltas = clipped_rhos * (rewards + discounts * next_values - values)
        vs_minus_v = torch.zeros_like(values)
        acc = torch.zeros_like(bootstrap_value)
        for t in reversed(range(values.shape[0])):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_v[t] = acc
        vs = values + vs_minus_v
        next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)])
        pg_advantages = clipped_rhos * (rewards + discounts * next_vs - values)
    return vs, pg_advantages


def gae(rewards, values, discounts, bootstrap_value, gae_lambda):
    """Generalised advantage estimation: (returns, advantages), [T, ...], without gradient."""
    with torch.no_grad():
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)])
        deltas = rewards + discounts * next_values - values
        advantages = torch.zeros_like(values)
        acc = torch.zeros_like(bootstrap_value)
        for t in reversed(range(values.shape[0])):
            acc = deltas[t] + discounts[t] * gae_lambda * acc
            advantages[t] = acc
        returns = advantages + values
    return returns, advantages


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_policy_loss(log_probs, behaviour_log_probs, advantages, clip_ratio, mask):
    """Clipped surrogate; the ratio is kept within [1/(1+eps), 1+eps] as in Sample Factory."""
    ratio = torch.exp(log_probs - behaviour_log_probs)
    clipped = ratio.clamp(1.0 / (1.0 + clip_ratio), 1.0 + clip_ratio)
    surrogate = torch.min(ratio * advantages, clipped * advantages)
    return -masked_mean(surrogate, mask)


def value_loss(values, behaviour_values, targets, clip_value, mask):
    """Squared error, pessimistic over the value clipped to behaviour_values +- clip_value."""
    clipped = behaviour_values + (values - behaviour_values).clamp(-clip_value, clip_value)
    return masked_mean(torch.max((values - targets) ** 2, (clipped - targets) ** 2), mask)


def exploration_loss(logits, action_dist, mask, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(the exploration term to add to the loss, the policy's mean entropy for the stats)."""
    entropy = masked_mean(action_dist.entropy(logits), mask)
    if cfg.exploration_loss == "entropy":
        return -entropy, entropy
    # Sample Factory caps the mean at 30, so that a near-deterministic head cannot blow up the loss
    return masked_mean(action_dist.symmetric_kl_to_uniform(logits), mask).clamp(max=30.0), entropy


def steps_of(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The T+1 shift, done once: a trajectory of a batch is T+1 steps long, and its last index holds
    only what bootstraps it (the observation after step T-1 and the RNN state there). This is every
    per-step field of the T steps that train, each [T, B, ...]: the batch's [T+1, B, ...] fields
    less their last step (the observations too, as views), a field of your own from acting_fields
    among them; not "rnn_state" (steps 0 and T only) nor GAE's "target" and "advantage" ([T, B])."""
    horizon = batch["done"].shape[0]
    return {key: value[:-1] for key, value in batch.items() if key != "rnn_state" and value.shape[0] == horizon}


def loss_mask(steps: dict[str, torch.Tensor], policy_version: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, lag), [T, B]: a step counts in the loss when it is valid and its weights are at most
    --max_policy_lag versions older than the learner's."""
    lag = policy_version - steps["policy_version"]
    return ((lag <= cfg.max_policy_lag) & (steps["valid"] > 0)).float(), lag


def in_value_units(model: ActorCritic, returns: torch.Tensor) -> torch.Tensor:
    """Value targets in return units -> the value head's units (normalised with --normalize_returns)."""
    return model.returns_normalizer(returns) if model.normalize_returns else returns


def gae_targets(model: ActorCritic, batch: dict[str, torch.Tensor], policy_version: int, cfg
                ) -> dict[str, torch.Tensor]:
    """--no-with_vtrace: value targets and advantages for a whole batch, [T, B] each in return
    units, computed once before its SGD steps, as Sample Factory's learner does (_prepare_batch):
    every epoch and minibatch trains on the same targets.

    GAE runs over the values that acted. Step T holds only the bootstrap observation, which no
    policy worker evaluates (it becomes step 0 of the actor's next slot), so V(x_T) comes from the
    weights about to train on the batch, with the RNN state that acting left there.
    """
    steps = steps_of(batch)
    with torch.no_grad():
        _, bootstrap, _ = model({key: batch[key][-1] for key in model.encoders}, batch["rnn_state"][-1])
        values, bootstrap = model.values_to_returns(steps["value"]), model.values_to_returns(bootstrap)
        rewards, discounts = time_limit_bootstrap(steps, torch.cat([values[1:], bootstrap.unsqueeze(0)]), cfg)
        targets, advantages = gae(rewards, values, discounts, bootstrap, cfg.gae_lambda)
    return {"target": targets, "advantage": advantages}


def time_limit_bootstrap(steps: dict[str, torch.Tensor], next_returns: torch.Tensor, cfg
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, discounts), [T, B], that the targets run on: a return ends where the episode did,
    but where a time limit cut it (--value_bootstrap) it ends in the critic's value of the
    observation it was cut at, next_returns [T, B] (in return units) there."""
    cut = steps["truncated"] > 0
    rewards = torch.where(cut, steps["reward"] + cfg.gamma * next_returns, steps["reward"])
    return rewards, cfg.gamma * (1.0 - steps["done"]) * (1.0 - steps["truncated"])


def vtrace_targets(model: ActorCritic, steps: dict[str, torch.Tensor], values: torch.Tensor,
                   bootstrap_value: torch.Tensor, log_rhos: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """--with_vtrace: (value targets, advantages), [T, B] in return units, on the learner's own
    values of this minibatch."""
    returns, bootstrap_return = model.values_to_returns(values), model.values_to_returns(bootstrap_value)
    rewards, discounts = time_limit_bootstrap(steps, torch.cat([returns[1:], bootstrap_return.unsqueeze(0)]), cfg)
    vs, _ = vtrace(log_rhos, discounts, rewards, returns, bootstrap_return, cfg.vtrace_rho, cfg.vtrace_c)
    next_vs = torch.cat([vs[1:], bootstrap_return.unsqueeze(0)])
    return vs, rewards + discounts * next_vs - returns


def appo_loss(model: ActorCritic, batch: dict[str, torch.Tensor], policy_version: int, cfg):
    """The APPO objective on a batch of trajectories, each [T+1, B, ...] (time first). It changes
    nothing: the learner folds the value targets into the return statistics (sgd_update).

    V-trace targets are computed here, per minibatch, on the learner's own values (step T holds
    only the bootstrap observation, see gae_targets); with GAE the batch carries the targets and
    advantages that gae_targets computed for it ("target", "advantage", [T, B]). Returns (loss,
    aux): aux holds the loss's terms and the per-step tensors that loss_stats makes the figures
    of, and "returns", the value targets in return units.
    """
    if not cfg.with_vtrace and "target" not in batch:
        raise KeyError("appo_loss with GAE (--no-with_vtrace) trains on the batch's 'target' and 'advantage': "
                       "add them first with batch.update(gae_targets(model, batch, policy_version, cfg))")
    action_dist = model.action_dist
    logits, values = model.forward_rollout({key: batch[key] for key in model.encoders}, batch["rnn_state"][0],
                                           batch["done"])
    steps, bootstrap_value, logits, values = steps_of(batch), values[-1], logits[:-1], values[:-1]
    log_probs = action_dist.log_prob(logits, steps["actions"])
    behaviour_log_probs = steps["log_prob"]
    mask, lag = loss_mask(steps, policy_version, cfg)

    with torch.no_grad():
        if cfg.with_vtrace:
            returns, advantages = vtrace_targets(model, steps, values, bootstrap_value,
                                                 log_probs - behaviour_log_probs, cfg)
        else:
            returns, advantages = batch["target"], batch["advantage"]
        targets = in_value_units(model, returns)
        if cfg.normalize_advantage:
            mean = masked_mean(advantages, mask)
            std = masked_mean((advantages - mean) ** 2, mask).sqrt()
            advantages = (advantages - mean) / (std + 1e-8)

    policy_loss = ppo_policy_loss(log_probs, behaviour_log_probs, advantages, cfg.ppo_clip_ratio, mask)
    critic_loss = value_loss(values, steps["value"], targets, cfg.ppo_clip_value, mask)
    exploration, entropy = exploration_loss(logits, action_dist, mask, cfg)
    loss = policy_loss + cfg.value_loss_coeff * critic_loss + cfg.exploration_loss_coeff * exploration
    return loss, {"loss": loss, "policy_loss": policy_loss, "value_loss": critic_loss, "entropy": entropy,
                  "log_probs": log_probs, "behaviour_log_probs": behaviour_log_probs, "values": values,
                  "targets": targets, "returns": returns, "mask": mask, "lag": lag}


@torch.no_grad()
def loss_stats(model: ActorCritic, aux: dict, cfg) -> dict:
    """The figures the status line and TensorBoard show of a step, from appo_loss's aux: its numbers
    (0-dim tensors or floats) as they are, so a term of your own put there reaches TensorBoard as
    pN/NAME, and from its per-step tensors the valid share, the policy lag and PPO's health. The
    learner asks about once a second: they cost dozens of small kernels."""
    stats = {name: value.detach() if torch.is_tensor(value) else value for name, value in aux.items()
             if not torch.is_tensor(value) or value.dim() == 0}
    if "mask" not in aux:  # a loss of your own that keeps only its numbers
        return stats
    mask, lag, log_probs, behaviour_log_probs = aux["mask"], aux["lag"], aux["log_probs"], aux["behaviour_log_probs"]
    return {**stats, "valid_fraction": mask.mean(),
            "ratio_deviation": masked_mean((log_probs - behaviour_log_probs).exp().sub(1).abs(), mask),
            "value_mean": masked_mean(model.values_to_returns(aux["values"]), mask),
            "lag_min": lag.min().float(), "lag_avg": lag.float().mean(), "lag_max": lag.max().float(),
            **ppo_health(log_probs, behaviour_log_probs, aux["values"], aux["targets"], mask, cfg.ppo_clip_ratio)}


def ppo_health(log_probs, behaviour_log_probs, values, targets, mask, clip_ratio) -> dict[str, torch.Tensor]:
    """The three numbers PPO users look at first (CleanRL, Stable-Baselines3): how far the policy
    moved from the one that acted (approx_kl, the (r - 1) - log r estimator), the share of steps
    whose ratio the clip bounds (clip_fraction), and how much of the targets' variance the values
    explain (explained_variance: 1 is perfect, 0 no better than their mean, below 0 worse)."""
    log_ratio = log_probs - behaviour_log_probs
    ratio = log_ratio.exp()
    clipped = (ratio < 1.0 / (1.0 + clip_ratio)) | (ratio > 1.0 + clip_ratio)
    target_mean = masked_mean(targets, mask)
    target_var = masked_mean((targets - target_mean) ** 2, mask)
    error = targets - values
    error_var = masked_mean((error - masked_mean(error, mask)) ** 2, mask)
    explained = torch.where(target_var > 0, 1.0 - error_var / target_var, float("nan"))
    return {"approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "clip_fraction": masked_mean(clipped.float(), mask), "explained_variance": explained}


def scheduled_learning_rate(cfg, env_frames: int) -> float | None:
    """--lr_schedule linear_decay: the (PBT-mutable) learning rate times the share of
    --lr_decay_frames still to train; None for a constant rate (the optimiser keeps its own)."""
    if cfg.lr_schedule == "constant":
        return None
    horizon = cfg.lr_decay_frames or cfg.train_for_env_steps
    return cfg.learning_rate * max(0.0, 1.0 - env_frames / horizon)


def sgd_update(model: ActorCritic, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
               policy_version: int, cfg) -> tuple[dict, torch.Tensor]:
    """One training iteration on a batch [T+1, B, ...]: the input statistics (and with GAE the
    batch's targets, see gae_targets), then --num_epochs passes over the batch, each in
    --num_batches_per_epoch minibatches (minibatches), one optimiser step each. Every statistic
    counts the batch once: the return statistics take GAE's targets before the first step,
    V-trace's after each minibatch's step in the first epoch; the input statistics (--input_stats)
    a sample of the batch before the first step, or every valid step after the last. Returns (the
    last step's aux from appo_loss with its gradient norm, for loss_stats; the steps skipped at a
    non-finite loss or gradient, a 0-dim tensor)."""
    if cfg.input_stats == "sampled_before_sgd":
        model.update_normalizers({key: trajectory_major(batch[key]) for key in model.encoders})
    if not cfg.with_vtrace:
        batch = {**batch, **gae_targets(model, batch, policy_version, cfg)}
        fold_returns(model, batch["target"], loss_mask(steps_of(batch), policy_version, cfg)[0])
    skipped = torch.zeros((), device=batch["done"].device)
    for epoch in range(cfg.num_epochs):
        for minibatch in minibatches(batch, cfg):
            loss, aux = appo_loss(model, minibatch, policy_version, cfg)
            grad_norm, step_skipped = optimizer_step(model, optimizer, loss, cfg)
            skipped += step_skipped
            if cfg.with_vtrace and epoch == 0:
                fold_returns(model, aux["returns"], aux["mask"])
    if cfg.input_stats == "all_after_sgd":
        steps = steps_of(batch)
        model.update_normalizers({key: trajectory_major(steps[key]) for key in model.encoders}, max_samples=None,
                                 rows=trajectory_major(steps["valid"]))
    return {**aux, "grad_norm": grad_norm}, skipped


def minibatches(batch: dict[str, torch.Tensor], cfg) -> list[dict[str, torch.Tensor]]:
    """One epoch's minibatches of a batch [T+1, B, ...]. By default whole trajectories, the same
    contiguous ranges every epoch (views of the trajectory-major batch, no copies).

    --shuffle_minibatches draws a new partition every epoch. Where nothing runs along a trajectory
    (no recurrent core, GAE's targets computed for the whole batch: single_step_minibatches), of
    single steps across the batch, as SB3 and CleanRL do: each minibatch is then one pseudo-trajectory
    [n+1, 1] of its n steps, whose last row (a copy of the n-th) only stands where appo_loss expects
    the bootstrap observation, which GAE's targets no longer need. Otherwise (V-trace, an RNN) of
    whole trajectories in a new order."""
    trajectories = batch["done"].shape[1]
    size = trajectories // cfg.num_batches_per_epoch  # --batch_size / --rollout for a whole iteration
    if not cfg.shuffle_minibatches:
        if size == trajectories:
            return [batch]
        return [{key: value[:, start:start + size] for key, value in batch.items()}
                for start in range(0, trajectories, size)]
    if not single_step_minibatches(cfg):
        order = torch.rand_like(batch["done"][0]).argsort()  # a random order of the trajectories
        return [{key: value.index_select(1, rows) for key, value in batch.items()} for rows in order.split(size)]
    horizon = batch["done"].shape[0]  # T + 1
    order = torch.rand_like(batch["done"][:-1]).flatten().argsort()  # of the T x B steps
    chunks = []
    for rows in order.split(cfg.batch_size):
        chunk = {}
        for key, value in batch.items():
            if key == "rnn_state":  # no recurrent core: a state nothing reads
                chunk[key] = value[:, :1]
                continue
            steps = value[:horizon - 1] if value.shape[0] == horizon else value  # [T, B, ...]; targets are [T, B]
            picked = steps.reshape(-1, *steps.shape[2:]).index_select(0, rows)
            if value.shape[0] == horizon:
                picked = torch.cat([picked, picked[-1:]])
            chunk[key] = picked.unsqueeze(1)
        chunks.append(chunk)
    return chunks


def fold_returns(model: ActorCritic, returns: torch.Tensor, mask: torch.Tensor):
    """--normalize_returns: value targets [T, B] in return units into the running return statistics."""
    if model.normalize_returns:
        model.returns_normalizer.update(returns.reshape(-1), rows=mask.reshape(-1))


def make_optimizer(model: ActorCritic, cfg) -> torch.optim.Optimizer:
    """--optimizer: the learner's. optimizer_step skips a step whose loss or gradient is not finite,
    for any optimizer (one that takes torch's found_inf skips it by itself). Add yours here and to --optimizer's choices: it is checked before the run starts (a step that
    needs a closure, as LBFGS's does, is refused), kept across a resume, and PBT mutates only
    the hyperparameters it has."""
    parameters = model.parameters()
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=cfg.learning_rate, momentum=cfg.momentum, fused=True)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=cfg.learning_rate, momentum=cfg.momentum)
    return torch.optim.Adam(parameters, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, fused=True)


def optimizer_step(model: ActorCritic, optimizer: torch.optim.Optimizer, loss: torch.Tensor, cfg
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """One clipped step on `loss`, skipped if the loss or gradient is not finite. Returns (the
    gradient's norm, 1.0 if the step was skipped else 0.0), both 0-dim tensors. A fused optimizer
    takes the flag as torch's GradScaler hands it, and at 1 leaves weights and moments be."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    skipped = (~(torch.isfinite(loss) & torch.isfinite(grad_norm))).float()
    if optimizer.defaults.get("fused"):
        optimizer.found_inf = skipped
        optimizer.step()
        del optimizer.found_inf
    elif not skipped.item():
        optimizer.step()
    return grad_norm.detach(), skipped


# =============================================================================================
# PLUMBING: config: the command line, the general, env and system flags, the values derived from
# them, the hardware probes and every check on them (all before anything starts)
# =============================================================================================

HELP_HINT = "Run python appo.py --help for every flag, its values and its default."


class FlagParser(argparse.ArgumentParser):
    """argparse, but a mistake ends in two lines (the mistake, where to read more) instead of the
    whole usage block, and only a flag's full name is accepted: with prefix matching, a typo of a
    future flag (--encoder resnet before --encoder existed) silently set an old one (--encoder_dtype)."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message}\n{HELP_HINT}\n")


class Switch(argparse.Action):
    """A boolean flag: --name sets it and --no-name clears it, and --name=True / --name=False
    say the same (how Sample Factory's launcher and W&B sweeps pass booleans)."""

    WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

    def __init__(self, option_strings, dest, default=False, help=None, **kwargs):
        names = [name for option in option_strings for name in (option, "--no-" + option[2:])]
        super().__init__(names, dest, nargs="?", default=default, help=help, metavar="BOOL", **kwargs)

    def __call__(self, parser, namespace, value, option_string=None):
        if option_string.startswith("--no-"):
            if value is not None:
                parser.error(f"{option_string} takes no value: use --{option_string[5:]}={value} instead")
            setattr(namespace, self.dest, False)
        elif value is None:
            setattr(namespace, self.dest, True)
        elif value.lower() in self.WORDS:
            setattr(namespace, self.dest, self.WORDS[value.lower()])
        else:
            parser.error(f"{option_string}={value}: a switch takes True or False (or nothing: on)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _format_action_invocation(self, action):
        if isinstance(action, Switch):  # not "--name [NAME], --no-name [NAME]"
            return " / ".join(action.option_strings) + " (or =True / =False)"
        return super()._format_action_invocation(action)


def positive(action: argparse.Action) -> argparse.Action:
    """Marks a number flag that must be above 0 (config_errors checks every flag so marked)."""
    action.bound = "positive"
    return action


def at_least_0(action: argparse.Action) -> argparse.Action:
    """Marks a number flag that must be 0 or more."""
    action.bound = "at_least_0"
    return action


def join_negative_values(argv: list[str]) -> list[str]:
    """`--flag -1e-4` -> `--flag=-1e-4`: argparse reads a token that starts with '-' and is not a
    plain integer or decimal as a flag, so scientific notation and some negative numbers were
    "expected one argument" instead of a value (and the range check that names the flag)."""
    joined = []
    for token in argv:
        previous = joined[-1] if joined else ""
        if previous.startswith("--") and "=" not in previous and token.startswith("-") and _is_number(token):
            joined[-1] = f"{previous}={token}"
        else:
            joined.append(token)
    return joined


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def integer(text: str) -> int:
    """An int flag that also takes 1e6 or 2.5e9: frame budgets are written that way."""
    value = float(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


UNLIMITED_FRAMES, UNLIMITED_SECONDS = 10_000_000_000, 1e10  # the budgets' defaults: no budget


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(
        description="Asynchronous PPO with V-trace (Sample Factory's APPO) on one machine.",
        formatter_class=HelpFormatter,
    )
    parser.register("action", "switch", Switch)  # for env.py's family flags too
    general = parser.add_argument_group("general")
    modes = [extra for extra in EXTRAS if extra.mode]  # evaluation's "eval"
    general.add_argument("--mode", choices=["train", *(extra.mode for extra in modes)], default="train",
                         help="train" + "".join(f", or {extra.mode}: {extra.mode_help}" for extra in modes))
    general.add_argument("--env", default="doom_basic",
                         help=f"env name: {envs.names_help()}, or one added with env.register_env")
    general.add_argument("--experiment", default=None,
                         help="experiment name; results go to train_dir/experiment (default: the env name, "
                              "with ':' and '/' as '_')")
    general.add_argument("--train_dir", default="train_dir", help="folder that holds all experiments")
    general.add_argument("--restart_behavior", choices=["resume", "restart", "overwrite"], default="resume",
                         help="when the experiment's folder exists: resume its training; restart from scratch, "
                              "the old folder moved whole to EXPERIMENT_old0001 (then 0002, ...); or overwrite "
                              "it (deleted, then from scratch). Sample Factory's flag and meanings")
    at_least_0(general.add_argument("--seed", type=int, default=None,
                                    help="random seed (default: drawn at random; a run prints it and config.json "
                                         "keeps it); each process seeds from it, its role and its index"))
    positive(general.add_argument("--train_for_env_steps", type=integer, default=UNLIMITED_FRAMES,
                                  help="stop after this many env frames (frameskip included)"))
    positive(general.add_argument("--train_for_seconds", type=float, default=UNLIMITED_SECONDS,
                                  help="stop after this many seconds of training"))
    positive(general.add_argument("--save_every_sec", type=float, default=120.0,
                                  help="seconds between checkpoints (one is also written at exit)"))
    positive(general.add_argument("--keep_checkpoints", type=int, default=3,
                                  help="how many recent checkpoints to keep per policy"))
    positive(general.add_argument("--report_every_sec", type=float, default=5.0,
                                  help="seconds between status lines and TensorBoard summaries"))

    env_group = parser.add_argument_group("env")
    positive(env_group.add_argument("--env_frameskip", type=int, default=None,
                                    help="frames per agent step (default: the env's own, e.g. 4 for Doom)"))
    envs.add_flags(env_group)  # each env family's own flags (env.py declares and checks them)

    add_research_flags(parser)  # model, algorithm, optimizer: at the top of the file

    system = parser.add_argument_group("system")
    positive(system.add_argument("--num_workers", type=int, default=max(1, os.cpu_count() or 1),
                                 help="rollout worker processes"))
    positive(system.add_argument("--num_envs_per_worker", type=int, default=2, help="envs per rollout worker"))
    positive(system.add_argument("--worker_num_splits", type=int, default=2,
                                 help="groups of envs per worker: one steps while the other waits for actions"))
    positive(system.add_argument("--num_policies", type=int, default=1, help="policies trained at once"))
    positive(system.add_argument("--policy_workers_per_policy", type=int, default=1,
                                 help="inference processes per policy"))
    positive(system.add_argument("--remap_policies_every", type=int, default=5,
                                 help="with several policies: each env's agents are handed to new random policies "
                                      "after this many of its episodes (self-play meets every pairing)"))
    system.add_argument("--agent_policies", default=None,
                        help='pins agents to policies, "AGENT=POLICY,...": AGENT an agent of the env (a PettingZoo '
                             'agent\'s name, or a glob such as "adversary_*"; a Doom player\'s index, 0 first), '
                             "POLICY a policy's index (or, in --mode eval, random: uniform random actions); every agent "
                             "needs one, and a pinned agent keeps its policy (default: random policies of the agent's "
                             "group, drawn again every --remap_policies_every episodes)")
    system.add_argument("--init_policies", default=None,
                        help='starts policies from saved weights, "POLICY=CHECKPOINT,...": each named policy begins '
                             "at that checkpoint's model (a policy with checkpoints of its own in this experiment "
                             "resumes from them instead), e.g. a trained duellist in a new duel")
    system.add_argument("--frozen_policies", default=None,
                        help='policies that act but never train, "1,3": their learners take their batches and '
                             "count their frames but make no SGD step (with --init_policies: a trained policy held "
                             "against learning ones)")
    system.add_argument("--past_opponents_fraction", type=float, default=0.0,
                        help="multi-agent envs: the chance that an agent (not an env's first) plays a frozen past "
                             "version of the population instead of a learning policy, drawn at every remap")
    system.add_argument("--device", choices=["auto", "cpu", "cuda", "gpu"], default="auto",
                        help="where the learner and policy workers run; auto: cuda when torch sees a GPU, "
                             "otherwise cpu (rollout workers always run on the CPU); gpu, Sample Factory's "
                             "word, means cuda")
    positive(system.add_argument("--learner_threads", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 2)),
                                 help="torch threads of the learner (default: half the CPU cores, 1 to 4). More threads "
                                      "than cores left free by the workers waste time waiting for each other "
                                      "(docs/measurements.md)"))
    positive(system.add_argument("--policy_worker_threads", type=int, default=1,
                                 help="torch threads of each policy worker, and of --mode eval, which acts as one; "
                                      "its batches are small, so more threads mostly wait for each other "
                                      "(docs/measurements.md)"))
    positive(system.add_argument("--env_step_timeout", type=float, default=60.0,
                                 help="seconds a rollout or policy worker may go without progress (a hung env) "
                                      "before it is killed and restarted"))
    at_least_0(system.add_argument("--max_restarts", type=int, default=10,
                                   help="worker restarts allowed within 10 minutes; one more stops the run"))
    system.add_argument("--serial_mode", action="switch",
                        help="for debugging: rollout workers, policy workers and learners run in this one process, "
                             "in turn, with in-process queues (no child processes), so a debugger stops in any of "
                             "them (python -m pdb appo.py --serial_mode ...), and with --seed two runs train alike")
    system.add_argument("--set_workers_cpu_affinity", action="switch", default=False,
                        help="pin each rollout worker, with the game processes of its envs, to one core (round "
                             "robin) and lower its priority, so that learners and policy workers, which everyone "
                             "waits on, run first; a worker and its games then hand each step over on one core "
                             "(the Doom family's default: docs/measurements.md)")

    # auto rather than float32: on this project's learning bench bfloat16 showed no score cost at equal
    # frames on doom_basic and atari_space_invaders, and it trains faster (docs/results/ablations.md)
    system.add_argument("--encoder_dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                        help="precision of the encoder (convs and the FC after them), which is most of the compute; "
                             "the RNN, heads, losses and the weights themselves stay float32. auto: bfloat16 where "
                             "the hardware computes it natively (CPUs whose flags list avx512_bf16 or amx_bf16, "
                             "GPUs from Ampere on), float32 elsewhere (where bf16 would only be emulated too)")
    system.add_argument("--compile", action="switch", default=False,
                        help="torch.compile the model's encoder (the convolutions, most of the compute) in the "
                             "policy workers and the learners: the same code, fused by the compiler; each of "
                             "those processes compiles it first (tens of seconds; docs/results/throughput.md)")

    for extra in EXTRAS:  # the extras below the core: their own flags
        extra.add_flags(parser)
    return parser


def listed(items: list[str], separator: str = ", ", last: str = " and ") -> str:
    return separator.join(items[:-1]) + (last if len(items) > 1 else "") + items[-1]


def encoder_activations() -> str:
    """"ELU for convnet_simple, ReLU for convnet_atari and resnet": each encoder's activation."""
    by_activation: dict[str, list[str]] = {}
    for name, encoder in CONV_ENCODERS.items():
        by_activation.setdefault(encoder.activation.__name__, []).append(name)
    return ", ".join(f"{activation} for {listed(names)}" for activation, names in by_activation.items())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses flags; the env's own defaults (frameskip, gamma, ...) apply unless given."""
    parser = build_parser()
    argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
    # --env first, without --help: so that `--env atari_breakout --help` shows the Atari family's defaults
    env_only = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    env_only.add_argument("--env", default=parser.get_default("env"))
    known, _ = env_only.parse_known_args(argv)
    parser.set_defaults(**envs.env_defaults(known.env))
    cfg = parser.parse_args(argv)
    given = {arg.split("=")[0] for arg in argv if arg.startswith("--")}
    cfg.flags_given = sorted(action.dest for action in parser._actions if given & set(action.option_strings))
    if fits_batches(cfg) and envs.num_agents_of(cfg.env) is not None:  # else once the runner has made one
        fit_synchronous_batches(cfg, envs.num_agents_of(cfg.env))
    if cfg.device == "auto":
        cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg.device = "cuda" if cfg.device == "gpu" else cfg.device
    if cfg.env_frameskip is None:
        cfg.env_frameskip = 1
    if cfg.experiment is None:
        cfg.experiment = cfg.env.replace(":", "_").replace("/", "_")  # gym:MyFork/Reach-v0: one plain folder
    cfg.rank, cfg.world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
    if cfg.device == "cuda" and cfg.world_size > 1:
        cfg.device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"  # one GPU per rank on each node
    if cfg.seed is not None:
        cfg.seed += 7919 * cfg.rank  # every rank collects different experience
    if cfg.encoder_dtype == "auto":
        cfg.encoder_dtype = "bfloat16" if native_bfloat16(cfg.device) else "float32"
    return cfg


# The sizes derived from the flags, each computed here and nowhere else.

def samples_per_iteration(cfg) -> int:
    """What the learner trains on at once (its batch): --num_batches_per_epoch minibatches of
    --batch_size samples, Sample Factory's meanings."""
    return cfg.batch_size * cfg.num_batches_per_epoch


def single_step_minibatches(cfg) -> bool:
    """--shuffle_minibatches with nothing that runs along a trajectory in training (no recurrent
    core, GAE): minibatches of single steps, --batch_size of them, which need not be whole rollouts."""
    return cfg.shuffle_minibatches and cfg.rnn_type == "none" and not cfg.with_vtrace


def trajectories_per_batch(cfg) -> int:
    """The learner's batch is whole trajectories of --rollout steps, one per slot (config_errors
    checks that --rollout divides --batch_size)."""
    return samples_per_iteration(cfg) // cfg.rollout


def samples_per_rollout_of_every_env(cfg, num_agents: int) -> int:
    """What one rollout of every env of this rank gives: --no-async_rl collects whole multiples of it
    between two batches."""
    return cfg.num_workers * cfg.num_envs_per_worker * num_agents * cfg.rollout


def rollouts_per_batch(cfg, num_agents: int) -> int:
    """--no-async_rl: the rollouts each actor collects towards one batch."""
    return max(1, samples_per_iteration(cfg) // samples_per_rollout_of_every_env(cfg, num_agents))


def fits_batches(cfg) -> bool:
    """Are the batch sizes a family's synchronous default, to be fitted to the workers?"""
    return not cfg.async_rl and not {"async_rl", "batch_size", "num_batches_per_epoch"} & set(cfg.flags_given)


def fit_synchronous_batches(cfg, num_agents: int):
    """A family's synchronous default (Sample Factory's, for Atari and gym:) at any worker count.

    A synchronous iteration is whole rollouts of every env, so its size follows the machine: here
    it becomes the fewest rollouts of every env that hold the family's iteration and split into its
    minibatches (--batch_size, kept, as are the epochs; --num_batches_per_epoch follows). The SGD
    steps per sample stay the family's on 1 core or 64; what grows with the envs is the samples
    between two updates, as when Sample Factory or CleanRL run more envs. Sizes of your own are
    kept, and config_errors says if they do not fit. An env whose agents are known only once one is
    made (pz:, registered ones) is fitted by the runner, after its probe.
    """
    samples = samples_per_rollout_of_every_env(cfg, num_agents)
    if samples <= 0 or cfg.batch_size <= 0 or cfg.num_batches_per_epoch <= 0:
        return  # config_errors names the flag
    rollouts = max(1, -(-samples_per_iteration(cfg) // samples))  # ceiling division
    while rollouts * samples % cfg.batch_size:
        rollouts += 1  # ends by batch_size / gcd(samples, batch_size)
    cfg.num_batches_per_epoch = rollouts * samples // cfg.batch_size


def native_bfloat16(device: str) -> bool:
    """Does this hardware multiply bfloat16 natively? Emulated bf16 (AVX-512 CPUs without its BF16
    extension, GPUs before Ampere) is slower than float32, so `auto` must not pick it there."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.backends.mkldnn.is_available() and bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def distributed() -> bool:
    """Whether this process is one of torchrun's ranks (the EXTRAS block multi-node joined them)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere: float32 is the safe guess)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def config_errors(cfg: argparse.Namespace) -> list[str]:
    """Every problem with the flags, each naming the flag and the fix. Runs before any process."""
    errors = []
    env_problem = envs.env_error(cfg.env, cfg)
    if env_problem:
        errors.append(env_problem)
    errors += envs.flag_errors(cfg)
    for action in build_parser()._actions:  # the flags marked positive or at_least_0 where they are declared
        value, bound = getattr(cfg, action.dest, None), getattr(action, "bound", None)
        if bound == "positive" and value is not None and not value > 0:  # None: an optional flag left unset
            errors.append(f"--{action.dest} must be positive, got {value}")
        elif bound == "at_least_0" and value is not None and not value >= 0:
            errors.append(f"--{action.dest} must be 0 or more, got {value}")
    if any(width <= 0 for width in cfg.encoder_mlp_layers):
        errors.append(f"--encoder_mlp_layers must be positive widths, got {' '.join(map(str, cfg.encoder_mlp_layers))}")
    if not cfg.actor_critic_share_weights and cfg.rnn_type != "none":
        errors.append(f"--no-actor_critic_share_weights gives the value an encoder and FC of its own, not a recurrent "
                      f"core: use it with --rnn_type none (got {cfg.rnn_type})")
    if not 0 <= cfg.gae_lambda <= 1:
        errors.append(f"--gae_lambda must be in [0, 1], got {cfg.gae_lambda}")
    for flag in ["adam_beta1", "adam_beta2"]:
        if not 0 <= getattr(cfg, flag) < 1:
            errors.append(f"--{flag} must be in [0, 1), got {getattr(cfg, flag)}")
    if not 0 < cfg.gamma <= 1:
        errors.append(f"--gamma must be in (0, 1], got {cfg.gamma}")
    if errors:
        return errors
    if cfg.worker_num_splits > cfg.num_envs_per_worker:
        errors.append(f"--worker_num_splits {cfg.worker_num_splits} is larger than "
                      f"--num_envs_per_worker {cfg.num_envs_per_worker}: use at most as many splits as envs")
    elif cfg.num_envs_per_worker % cfg.worker_num_splits:
        errors.append(f"--num_envs_per_worker {cfg.num_envs_per_worker} is not divisible by "
                      f"--worker_num_splits {cfg.worker_num_splits}: make it a multiple")
    if single_step_minibatches(cfg):
        if samples_per_iteration(cfg) % cfg.rollout:
            errors.append(f"--batch_size {cfg.batch_size} x --num_batches_per_epoch {cfg.num_batches_per_epoch} "
                          f"samples an iteration is not a multiple of --rollout {cfg.rollout} (the learner takes whole "
                          "trajectories): change one of them")
    elif cfg.rollout > cfg.batch_size:
        errors.append(f"--rollout {cfg.rollout} is larger than --batch_size {cfg.batch_size}: "
                      "lower --rollout or raise --batch_size (or minibatches of single steps: --shuffle_minibatches "
                      "with --rnn_type none and --no-with_vtrace)")
    elif cfg.batch_size % cfg.rollout:
        errors.append(f"--batch_size {cfg.batch_size} is not a multiple of --rollout {cfg.rollout} (a minibatch "
                      f"is whole trajectories): use e.g. --batch_size {cfg.batch_size // cfg.rollout * cfg.rollout}")
    errors += policy_list_errors(cfg)
    if not 0 <= cfg.past_opponents_fraction <= 1:
        errors.append(f"--past_opponents_fraction must be in [0, 1], got {cfg.past_opponents_fraction}")
    elif cfg.past_opponents_fraction > 0 and envs.num_agents_of(cfg.env) == 1:
        errors.append(f"--past_opponents_fraction needs a multi-agent env (e.g. doom_duel); {cfg.env} has one agent")
    if not cfg.async_rl:
        errors += synchronous_errors(cfg, envs.num_agents_of(cfg.env))
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        errors.append("--device cuda but torch sees no GPU: use --device cpu or install a CUDA build of torch")
    for extra in EXTRAS:
        errors += extra.flag_errors(cfg)
    return errors


def synchronous_errors(cfg, num_agents: int | None) -> list[str]:
    """--no-async_rl's conditions; the batch's fit waits for the env's agent count where it is not
    known before making one (num_agents None: a registered env, checked again after the probe)."""
    if cfg.num_policies > 1 or cfg.past_opponents_fraction > 0:
        return ["--no-async_rl is for one policy: with several (or past opponents) an env's agents feed "
                "different learners, and no one batch waits for them all; drop --no-async_rl, or pass "
                "--async_rl where it is the env family's default"]
    if num_agents is None:
        return []
    samples, iteration = samples_per_rollout_of_every_env(cfg, num_agents), samples_per_iteration(cfg)
    if iteration % samples:
        agents = f" x {num_agents} agents" if num_agents > 1 else ""
        fits = next(n for n in itertools.count(1) if n * cfg.batch_size % samples == 0)
        return [f"--no-async_rl needs an iteration (--batch_size {cfg.batch_size} x --num_batches_per_epoch "
                f"{cfg.num_batches_per_epoch} = {iteration:,} samples) to be whole rollouts of every env: "
                f"--num_workers {cfg.num_workers} x --num_envs_per_worker {cfg.num_envs_per_worker}{agents} "
                f"x --rollout {cfg.rollout} = {samples:,} samples: use --num_batches_per_epoch "
                f"{fits * max(1, round(cfg.num_batches_per_epoch / fits))}, change those flags, or drop --no-async_rl"]
    return []


def init_policies(cfg) -> dict[int, str]:
    """--init_policies: policy -> the checkpoint it starts from."""
    rules = [rule.strip().partition("=") for rule in (cfg.init_policies or "").split(",") if rule.strip()]
    return {int(policy): path.strip() for policy, _, path in rules}


def frozen_policies(cfg) -> set[int]:
    return {int(policy) for policy in (cfg.frozen_policies or "").split(",") if policy.strip()}


def policy_list_errors(cfg) -> list[str]:
    """--init_policies' and --frozen_policies' form, their policies, and the checkpoints' files."""
    errors = []
    for rule in cfg.init_policies.split(",") if cfg.init_policies else []:
        policy, _, path = rule.strip().partition("=")
        if not (policy.strip().isdigit() and int(policy) < cfg.num_policies and path.strip()):
            errors.append(f'--init_policies: "{rule.strip()}" is not POLICY=CHECKPOINT with POLICY one of 0 to '
                          f"{cfg.num_policies - 1} (--num_policies {cfg.num_policies})")
        elif not os.path.isfile(path.strip()):
            errors.append(f"--init_policies: no file {path.strip()} for policy {policy.strip()}: name a checkpoint_*.pth")
    for policy in cfg.frozen_policies.split(",") if cfg.frozen_policies else []:
        if not (policy.strip().isdigit() and int(policy) < cfg.num_policies):
            errors.append(f'--frozen_policies: "{policy.strip()}" is not a policy index, 0 to {cfg.num_policies - 1} '
                          f"(--num_policies {cfg.num_policies}); give them as 1,3")
    if cfg.frozen_policies and getattr(cfg, "with_pbt", False):
        errors.append("--frozen_policies with --with_pbt: PBT would copy weights into a frozen policy; drop one")
    return errors


RANDOM_PLAY = -1  # --agent_policies' "random" in an evaluation: uniform random actions


def pinned_policies(cfg, agent_names: list[str]) -> tuple[list[int | None], list[str]]:
    """--agent_policies: (each agent's policy, in the env's order of agents; the mistakes): a rule that
    matches no agent, an agent that no rule or two rules with different policies match."""
    policies: list[int | None] = [None] * len(agent_names)
    errors = []
    for rule in cfg.agent_policies.split(","):
        pattern, _, policy = rule.strip().rpartition("=")
        policy = policy.strip()
        if policy == "random" and cfg.mode == "eval":
            policy = RANDOM_PLAY
        elif policy.isdigit() and int(policy) < cfg.num_policies:
            policy = int(policy)
        else:
            policy = None
        if not pattern or policy is None:
            also = " (or random, in --mode eval)" if cfg.mode == "eval" else ""
            errors.append(f'--agent_policies: "{rule.strip()}" is not AGENT=POLICY with POLICY one of 0 to '
                          f"{cfg.num_policies - 1} (--num_policies {cfg.num_policies}){also}")
            continue
        matched = [i for i, name in enumerate(agent_names) if fnmatch.fnmatchcase(name, pattern.strip())]
        if not matched:
            errors.append(f'--agent_policies: "{pattern.strip()}" names no agent of {cfg.env}, whose agents are '
                          f"{', '.join(agent_names)}")
        for i in matched:
            if policies[i] not in (None, policy):
                errors.append(f"--agent_policies: agent {agent_names[i]} is given policies {policies[i]} and {policy}")
            policies[i] = policy
    unpinned = [name for name, policy in zip(agent_names, policies) if policy is None]
    if unpinned and not errors:
        errors.append(f"--agent_policies gives no policy to agent(s) {', '.join(unpinned)} of {cfg.env}: "
                      "every agent needs one")
    return policies, errors


class SpaceGroups(typing.NamedTuple):
    """Agents with the same (observation space, action space) form a group, in the env's order of
    agents. Each policy acts for the agents of one group, with a model built from its spaces, and
    its learner trains on their steps only (predators and prey, a speaker and a listener)."""
    spaces: list[tuple[spaces.Space, spaces.Space]]  # each group's
    of_agent: list[int]                               # each agent's group
    of_policy: list[int]                              # each acting policy's group (past versions: group 0)

    def policy_spaces(self, policy_id: int) -> tuple[spaces.Space, spaces.Space]:
        return self.spaces[self.of_policy[policy_id]]

    def policies(self, group: int, cfg) -> list[int]:
        """The learning policies of a group: those an agent of it may be given."""
        return [policy for policy in range(cfg.num_policies) if self.of_policy[policy] == group]


def agent_groups(cfg, agent_spaces: list[tuple[spaces.Space, spaces.Space]], agent_names: list[str]
                 ) -> tuple[SpaceGroups, list[str]]:
    """(the env's groups and each policy's, the mistakes). A policy's group is its agents' under
    --agent_policies, else policy i serves group i % (number of groups)."""
    group_spaces, of_agent = envs.space_groups(agent_spaces)
    names = agent_names or [str(agent) for agent in range(len(agent_spaces))]
    members = [[name for name, group in zip(names, of_agent) if group == g] for g in range(len(group_spaces))]
    described = "; ".join(f"{', '.join(agents)}: {obs} and {action}"
                          for agents, (obs, action) in zip(members, group_spaces))
    of_policy, errors = [policy % len(group_spaces) for policy in range(num_acting_policies(cfg))], []
    if cfg.agent_policies:
        pinned = pinned_policies(cfg, names)[0]
        for policy in range(cfg.num_policies):
            groups = sorted({of_agent[agent] for agent, to in enumerate(pinned) if to == policy})
            if len(groups) > 1:
                errors.append(f"--agent_policies puts agents with different spaces in policy {policy}, and a policy "
                              f"has one model: {described}")
            elif not groups and None not in pinned and cfg.mode == "train":
                errors.append(f"--agent_policies gives policy {policy} no agent (--num_policies {cfg.num_policies}): "
                              "it would never train, and the run never reach its budget")
            else:
                of_policy[policy] = groups[0] if groups else 0
    elif cfg.num_policies < len(group_spaces):
        errors.append(f"{cfg.env}'s agents form {len(group_spaces)} groups with different spaces ({described}), "
                      f"and each group needs a policy of its own: --num_policies {len(group_spaces)} (or more), or "
                      "--agent_policies")
    sizes = [of_policy[:cfg.num_policies].count(group) for group in range(len(group_spaces))]
    if len(group_spaces) > 1 and getattr(cfg, "with_pbt", False) and max(sizes) < 2:
        errors.append(f"--with_pbt ranks the policies of a group against each other (policies of groups with "
                      f"different spaces cannot copy each other's weights), and {cfg.env}'s {len(group_spaces)} "
                      f"groups have {'/'.join(map(str, sizes))} policies: use --num_policies {2 * len(group_spaces)}")
    if len(group_spaces) > 1 and cfg.past_opponents_fraction > 0:
        errors.append(f"--past_opponents_fraction is for agents of one group, and {cfg.env}'s form "
                      f"{len(group_spaces)}: drop it")
    return SpaceGroups(group_spaces, of_agent, of_policy), errors


def probe_errors(cfg, probe: "EnvProbe", groups: SpaceGroups, group_errors: list[str]) -> list[str]:
    """Flag mistakes that only the env itself reveals (registered and gym: envs). `groups` and
    `group_errors`: agent_groups() of the probe's agents."""
    errors = []
    if not cfg.async_rl and envs.num_agents_of(cfg.env) is None:
        errors += synchronous_errors(cfg, probe.num_agents)
    if cfg.past_opponents_fraction > 0 and probe.num_agents < 2:
        errors.append(f"--past_opponents_fraction needs a multi-agent env (e.g. doom_duel); {cfg.env} has one agent")
    mapping_errors = pinned_policies(cfg, probe.agent_names)[1] if cfg.agent_policies else []
    if cfg.agent_policies and cfg.past_opponents_fraction > 0:
        mapping_errors.append("--past_opponents_fraction draws opponents when agents change policies, which "
                              "--agent_policies stops: drop one of them")
    errors += mapping_errors or group_errors  # the groups of a mapping with mistakes would mislead
    for obs_space, action_space in groups.spaces:
        try:
            continuous = not isinstance(action_distribution(action_space), Categoricals)
        except ValueError as error:
            return errors + [f"--env {cfg.env}: {error}"]
        mask_error = action_mask_error(obs_space, action_space)
        if mask_error:
            errors.append(f"--env {cfg.env}: {mask_error}")
        if continuous and cfg.exploration_loss == "symmetric_kl":
            errors.append(f"--exploration_loss symmetric_kl is for discrete actions; {cfg.env} has continuous ones: "
                          "use --exploration_loss entropy")
        elif ACTION_MASK in obs_shapes(obs_space) and cfg.exploration_loss == "symmetric_kl":
            errors.append(f"--exploration_loss symmetric_kl measures the policy against a uniform one over all "
                          f"actions, and {cfg.env} masks some: use --exploration_loss entropy")
    return list(dict.fromkeys(errors))


def encoder_errors(obs_space: spaces.Space, cfg) -> list[str]:
    """--encoder against the sizes of the images it is to see: one line each that it does not fit,
    with the smallest square image it takes (its convs' kernels and strides leave nothing)."""
    errors = []
    for key, (shape, _) in obs_shapes(obs_space).items():
        if len(shape) != 3 or key == ACTION_MASK:
            continue
        with torch.random.fork_rng(devices=[]):  # its weights are drawn from nothing the run draws from
            encoder = CONV_ENCODERS[cfg.encoder].build(shape[0])
        if encoder_fits(encoder, shape):
            continue
        smallest = next((side for side in range(1, 257) if encoder_fits(encoder, (shape[0], side, side))), None)
        needs = f"it needs at least {smallest}x{smallest}" if smallest else "it fits no image up to 256x256"
        errors.append(f"--encoder {cfg.encoder} does not fit observation '{key}', images of {shape[1]}x{shape[2]} "
                      f"({needs}): use --encoder convnet_small, made for small images")
    return errors


def encoder_fits(encoder: nn.Module, shape: tuple[int, ...]) -> bool:
    with torch.no_grad():
        try:
            encoder(torch.zeros(1, *shape))
            return True
        except RuntimeError:
            return False


def acting_errors(model: "ActorCritic", obs_space: spaces.Space, cfg) -> list[str]:
    """act() and acting_fields (a forker edits both to carry a quantity to the loss) must agree on
    every field's name and per-step shape: one zero observation through act() shows it here, not
    as a policy worker's crash in a copy that names no field."""
    obs = {key: torch.zeros((1, *shape), dtype=getattr(torch, dtype.name)) for key, (shape, dtype)
           in obs_shapes(obs_space).items()}
    with torch.random.fork_rng(devices=[]):  # its sample draws nothing from the run's seeded stream
        outputs, _ = act(model, obs, torch.zeros(1, rnn_state_size(cfg)))
    fields = acting_fields(model.action_dist)
    errors = [f"act() returns '{name}', which acting_fields lacks: add it there with its shape and dtype a step"
              for name in outputs if name not in fields]
    errors += [f"acting_fields has '{name}', which act() does not return: add it to act()'s dict"
               for name in fields if name not in outputs]
    return errors + [f"act() gives '{name}' of shape {tuple(outputs[name].shape[1:])} a step, acting_fields "
                     f"{tuple(shape)}: make them agree (a policy's logits are action_dist.num_params wide)"
                     for name, (shape, _) in fields.items()
                     if name in outputs and tuple(outputs[name].shape[1:]) != tuple(shape)]


def optimizer_errors(model: "ActorCritic", cfg) -> list[str]:
    """make_optimizer's optimizer (a forker edits it) must step without a closure: optimizer_step
    calls step() once a minibatch."""
    try:
        optimizer = make_optimizer(model, cfg)
    except (ValueError, TypeError, RuntimeError) as error:
        return [f"--optimizer {cfg.optimizer}: {error}"]
    closure = inspect.signature(optimizer.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        return [f"--optimizer {cfg.optimizer}: {type(optimizer).__name__}.step needs a closure (it evaluates the "
                "loss itself), which the learner's one step a minibatch cannot give: choose another optimizer"]
    return []


def experiment_dir(cfg) -> str:
    return os.path.join(cfg.train_dir, cfg.experiment)


def experiment_dir_error(cfg) -> str | None:
    """Can this run write its folder? Found out by making it, and a file in it, before anything
    starts: a --train_dir under a read-only mount or /proc, or through a regular file, otherwise
    failed later as a traceback."""
    name = cfg.experiment
    if name in ("", ".", "..") or "/" in name or (os.altsep and os.altsep in name):
        return (f"--experiment {name!r} is not a plain name: it names one folder inside --train_dir, "
                "so no '/' and not '.' or '..'")
    path = experiment_dir(cfg)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        return (f"--train_dir {cfg.train_dir}: cannot write the experiment folder {path} "
                f"({error.strerror or error}); give a folder you can write")
    return None


# The flags that fix the shape of the model and of the data: a resumed experiment must keep them.
IMMUTABLE_FLAGS = ["env", "num_policies", "optimizer"] + MODEL_FLAGS  # a checkpoint's optimizer state is its own


def saved_config_errors(cfg) -> list[str]:
    path = os.path.join(experiment_dir(cfg), "config.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        saved = json.load(f)
    saved.setdefault("optimizer", "adam")  # the one optimizer before 2026-12-05
    return [f"--{flag} {getattr(cfg, flag)} conflicts with {saved.get(flag)} saved in {path}: "
            f"use another --experiment or the saved value" for flag in IMMUTABLE_FLAGS
            if flag in saved and saved[flag] != getattr(cfg, flag)]


def checkout_errors(face: str = appo_ipc.__file__, native: str = appo_ipc._native.__file__) -> list[str]:
    """appo_ipc's Python face and its compiled module must come from one checkout (or one install).
    A fork whose module is not built yet silently takes another checkout's from an editable install
    of it (its finder answers for appo_ipc's missing child)."""
    face, native = (os.path.dirname(os.path.realpath(path)) for path in (face, native))
    if face == native:
        return []
    return [f"appo_ipc would run from {face} with its compiled module from {native}, another checkout's: build "
            "this one's in place, from its root: pip install pybind11 && python setup.py build_ext --inplace"]


def flag_errors(cfg) -> list[str]:
    """Every mistake in the flags, in the order a user can fix them; the run's folder is made
    (and tested) only when the flags are right."""
    errors = checkout_errors() + config_errors(cfg)
    if errors or cfg.mode != "train":
        return errors
    errors = saved_config_errors(cfg) if cfg.restart_behavior == "resume" else []  # else nothing is kept
    folder_error = None if errors else experiment_dir_error(cfg)
    return errors + ([folder_error] if folder_error else [])


def start_afresh(cfg) -> str | None:
    """--restart_behavior restart or overwrite: moves the experiment's folder aside or deletes it,
    if it holds anything; returns what it did, for the run's output."""
    path = experiment_dir(cfg)
    if cfg.restart_behavior == "resume" or cfg.rank != 0 or not os.path.isdir(path) or not os.listdir(path):
        return None
    if cfg.restart_behavior == "overwrite":
        shutil.rmtree(path)
        return f"deleted {path} (--restart_behavior overwrite); training from scratch"
    attempt = 1
    while os.path.exists(f"{path}_old{attempt:04d}"):
        attempt += 1
    os.rename(path, f"{path}_old{attempt:04d}")
    return f"moved {path} to {path}_old{attempt:04d} (--restart_behavior restart); training from scratch"


def print_errors(errors: list[str], most: int = 3):
    for error in errors[:most]:
        print(f"error: {error}", file=sys.stderr)
    more = f"({len(errors) - most} more errors after these.) " if len(errors) > most else ""
    print(f"{more}{HELP_HINT}", file=sys.stderr)


# =============================================================================================
# PLUMBING: shared memory: trajectory slots, published weights, run state, and who owns what
# =============================================================================================

# The wrappers over the shared memory (RolloutSlots, SharedWeights, SharedCounters, the queues) are
# appo_ipc's, csrc/__init__.py; here is what they hold for this trainer, their sizes, and who owns what.

def rollout_buffer_specs(obs_space, action_space, cfg) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every per-step field of a trajectory slot: name -> (shape, dtype). Each slot holds T+1 steps."""
    specs, action_dist = dict(obs_shapes(obs_space)), action_distribution(action_space)
    specs.update({
        "rnn_state": ((rnn_state_size(cfg),), np.dtype(np.float32)),  # state *before* this step
        **acting_fields(action_dist),                   # what the policy that acted gives the learner
        "reward": ((), np.dtype(np.float32)),
        "done": ((), np.dtype(np.float32)),            # the episode ended after this step: the core resets
        "truncated": ((), np.dtype(np.float32)),       # a time limit cut it here (done comes a step later)
        "policy_version": ((), np.dtype(np.int64)),    # SGD step of the weights that acted
        "valid": ((), np.dtype(np.float32)),           # 0: leave out of the loss
        **env_fields(cfg),                              # what the env reports of a step in its info
    })
    return specs


@contextlib.contextmanager
def beating(run: "RunState", process_index: int, every_s: float = 1.0):
    """This process's heartbeat from a thread while the block runs (a long step that cannot beat)."""
    done = threading.Event()

    def beat():
        while not done.wait(every_s):
            run.beat(process_index)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def encoder_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An observation as the encoder takes it, a copy of its own: images [N, C, H, W] in `dtype`
    and channels-last memory (oneDNN's fast conv layout), converted bytes first, which saves a
    float32 pass over the batch; vectors in float32."""
    if x.dim() == 4:
        return x.permute(0, 2, 3, 1).contiguous().to(dtype, copy=True).permute(0, 3, 1, 2)
    return x.to(torch.float32, copy=True)


def encoder_precision(model: "ActorCritic", cfg):
    """ActorCritic's __init__: --encoder_dtype (the precision encode computes in, encoder_autocast)
    and its conv weights in channels-last memory, oneDNN's fast layout on the CPU."""
    model.encoder_dtype = torch.bfloat16 if cfg.encoder_dtype == "bfloat16" else torch.float32
    model.to(memory_format=torch.channels_last)  # conv weights only


def encoder_autocast(model: "ActorCritic", obs: dict[str, torch.Tensor]) -> torch.autocast:
    """ActorCritic.encode's context: with --encoder_dtype bfloat16 the encoders and the FC run under
    autocast; the weights, their gradients and all after encode stay float32 (no loss scaling)."""
    device_type = next(iter(obs.values())).device.type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=model.encoder_dtype == torch.bfloat16)


def encoder_in_compute_dtype(model: "ActorCritic") -> "ActorCritic":
    """Policy workers only (they never train): the encoder's weights held in bfloat16 when it
    computes in bfloat16, so autocast does not convert them again at every forward pass."""
    if model.encoder_dtype != torch.float32:
        for trunk in ("encoders", "fc", "critic_encoders", "critic_fc"):
            if hasattr(model, trunk):
                getattr(model, trunk).to(model.encoder_dtype)
    return model


def compiled_encoder(model: "ActorCritic", cfg, fixed_shapes: bool) -> "ActorCritic":
    """--compile: the model's one encode path, wrapped by torch.compile (an attribute of this
    instance, so its state_dict and every other method are unchanged). A policy worker's batches
    vary in size (`fixed_shapes` False: one graph for every size); a learner's do not."""
    if cfg.compile:
        model.encode = torch.compile(model.encode, dynamic=not fixed_shapes)
    return model


def use_device(device: torch.device | str):
    """Makes `device` the calling thread's current CUDA device. Events record on the current device's
    stream: without this a process on cuda:1 (torchrun, LOCAL_RANK 1) would wait on cuda:0's. Plain
    "cuda" means the current device already (and set_device refuses it)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


class RunState(SharedCounters):
    """Small shared counters every process reads or writes without messages."""

    def __init__(self, num_workers: int, num_policies: int, num_processes: int):
        super().__init__({"stop": 1, "worker_frames": num_workers, "heartbeat": num_processes,
                          "learner_frames": num_policies, "learner_version": num_policies,
                          "resend_epoch": 1,  # bumped after a policy worker restart: re-send requests
                          "pids": num_processes,  # for the clean-up by rollout workers if the runner is killed
                          "runner_pid": 1,  # the same (a child's parent is the fork server, not the runner)
                          "all_ranks_frames": 1})  # under torchrun: frames collected by every rank
        self.runner_pid[0] = os.getpid()

    def should_stop(self) -> bool:
        return bool(self.stop[0])

    def beat(self, process_index: int):
        self.heartbeat[process_index] = time.monotonic_ns()


class PolicyHyperparams:
    """Per-policy hyperparameters that population-based training changes during the run.

    One row per policy: the learner's (learning rate, exploration coefficient, Adam beta1) and the
    env's reward-shaping weights (columns "reward/<name>"), with a version per row. The runner
    writes a row, then bumps its version; readers copy the row when the version moved, so a copy
    torn by a concurrent write is replaced on the next look. The runner also asks a learner to
    take over another policy's weights by naming it in copy_source and bumping copy_request.
    """

    def __init__(self, cfg, reward_shaping: dict[str, float] | None):
        # Adam's beta1 only where the optimizer has it
        learner_params = ["learning_rate", "exploration_loss_coeff"] + ["adam_beta1"] * (cfg.optimizer == "adam")
        self.names = learner_params + [f"reward/{name}" for name in (reward_shaping or {})]
        self.num_policies = cfg.num_policies
        self.buffer = appo_ipc.SharedBuffer(8 * cfg.num_policies * (len(self.names) + 3))
        self._make_views()
        defaults = [getattr(cfg, name) for name in learner_params] + list((reward_shaping or {}).values())
        self.values[:] = defaults
        self.copy_source[:] = -1

    def _make_views(self):
        flat = np.frombuffer(self.buffer, dtype=np.float64)
        count = self.num_policies * len(self.names)
        self.values = flat[:count].reshape(self.num_policies, len(self.names))
        counters = flat[count:].view(np.int64)
        self.version = counters[:self.num_policies]
        self.copy_source = counters[self.num_policies:2 * self.num_policies]
        self.copy_request = counters[2 * self.num_policies:]

    def row(self, policy_id: int) -> dict[str, float]:
        return dict(zip(self.names, self.values[policy_id].tolist()))

    def set_row(self, policy_id: int, row: dict[str, float]):
        self.values[policy_id] = [row[name] for name in self.names]
        self.version[policy_id] += 1

    def reward_shaping(self, policy_id: int) -> dict[str, float]:
        return {name[len("reward/"):]: value for name, value in self.row(policy_id).items()
                if name.startswith("reward/")}

    def request_copy(self, policy_id: int, source_policy: int):
        self.copy_source[policy_id] = source_policy
        self.copy_request[policy_id] += 1

    def __getstate__(self):
        return {"names": self.names, "num_policies": self.num_policies, "buffer": self.buffer}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_views()


@dataclass
class Shared:
    """Everything the processes share, handed to each at spawn."""
    slots: RolloutSlots
    weights: list[SharedWeights]           # per policy
    hyperparams: PolicyHyperparams         # per policy; population-based training changes them
    request_queues: list[appo_ipc.Queue]   # per policy: action_request messages, one a split
    learner_queues: list[appo_ipc.Queue]   # per policy: (slot, slot generation, worker) of finished trajectories
    stats_queue: appo_ipc.Queue            # pickled dicts for the runner
    run: RunState
    resumed_frames: int = 0                # env frames its checkpoints had trained, in a resumed run
    groups: SpaceGroups | None = None           # the env's groups of agents, and each policy's


def past_policy_id(cfg) -> int | None:
    """With --past_opponents_fraction, past versions act as one more policy that no learner trains."""
    return cfg.num_policies if cfg.past_opponents_fraction > 0 else None


def num_acting_policies(cfg) -> int:
    return cfg.num_policies + (past_policy_id(cfg) is not None)


def learner_owner(cfg, policy_id: int) -> int:
    """Owner id of slots on their way to or held by a learner (rollout workers own ids < num_workers)."""
    return cfg.num_workers + policy_id


def create_shared(cfg, model: ActorCritic, probe: EnvProbe, groups: SpaceGroups | None = None) -> Shared:
    """`model`: policy 0's, drawn first (the runner checked it); the others' are drawn here.
    `groups`: the runner's agent_groups() of the probe (found here when not given)."""
    groups = groups or agent_groups(cfg, probe.agent_spaces, probe.agent_names)[0]
    num_actors = cfg.num_workers * cfg.num_envs_per_worker * probe.num_agents
    slots_per_batch = trajectories_per_batch(cfg)
    # Each actor fills one slot, and each learner's next batch waits in slots of its own while the
    # learner trains (Learner.batcher copies it out only when the learner asks). No more: slots to
    # spare would let rollout workers run ahead of a slow learner, and every batch they fill ahead
    # adds a policy version of lag (Sample Factory also stops collecting when two batches wait).
    num_slots = num_actors + slots_per_batch * cfg.num_policies
    if cfg.serial_mode:  # no learner frees slots while a worker steps: room for every actor to fill one more
        num_slots += num_actors
    make_queue = (lambda capacity: InProcessQueue()) if cfg.serial_mode else appo_ipc.Queue
    specs = [rollout_buffer_specs(*group_spaces, cfg) for group_spaces in groups.spaces]
    weights_device = torch.device(cfg.device) if cfg.device.startswith("cuda") else None  # GPU: weights stay there
    weights, resumed_frames, starts = [], 0, init_policies(cfg)
    for policy_id in range(cfg.num_policies):
        # version 0, which the learner starts from too: weights of its own per policy, drawn from the run's seed
        model = model if policy_id == 0 else make_model(*groups.policy_spaces(policy_id), cfg)
        shared_weights = SharedWeights(model, weights_device)
        checkpoint = load_latest_checkpoint(cfg, policy_id)
        if checkpoint is None and policy_id in starts:  # version 0 is the named checkpoint's model
            start = load_checkpoint_file(starts[policy_id], "--init_policies")
            mismatch = checkpoint_mismatch(model, start["model"])
            if mismatch:
                raise CheckpointError(f"--init_policies: {starts[policy_id]} was made by a different "
                                      f"model than policy {policy_id}'s ({mismatch})")
            model.load_state_dict(start["model"])
            shared_weights.publish(model, 0)
        if checkpoint is not None:  # policy workers act with the resumed weights from the start
            resumed_frames += checkpoint["env_frames"]
            mismatch = checkpoint_mismatch(model, checkpoint["model"])
            if mismatch:
                raise CheckpointError(f"the checkpoint in {checkpoint_dir(cfg, policy_id)} was made by a different "
                                      f"model ({mismatch}): use another --experiment or the flags it was trained with")
            model.load_state_dict(checkpoint["model"])
            shared_weights.publish(model, checkpoint["policy_version"])
        weights.append(shared_weights)
    if past_policy_id(cfg) is not None:  # one group: the past versions' model is every policy's
        weights.append(SharedWeights(model, weights_device))  # until the population extra publishes a past checkpoint
    return Shared(
        slots=RolloutSlots(specs, num_slots, cfg.rollout, cfg.num_workers, cfg.worker_num_splits),
        weights=weights,
        hyperparams=PolicyHyperparams(cfg, probe.reward_shaping),
        request_queues=[make_queue(1 << 20) for _ in range(num_acting_policies(cfg))],
        learner_queues=[make_queue(1 << 20) for _ in range(cfg.num_policies)],
        stats_queue=make_queue(8 << 20),
        run=RunState(cfg.num_workers, cfg.num_policies, num_processes(cfg)),
        resumed_frames=resumed_frames,
        groups=groups,
    )


# =============================================================================================
# PLUMBING: child processes: what every one does first (names, signals, threads, engine output)
# =============================================================================================

class StageTimes:
    """Seconds a process spent in each stage of its loop since the last take(), for the status
    line's split of busy time and the perf/ tags: `with times("forward"): ...`. Each stage keeps
    its own clock, so two threads may time two stages at once. The stages named in `gpu_stages`
    (give them on a GPU only) also record CUDA events around each run, and take() adds the GPU time
    of the runs finished by then as "<stage>_gpu": the wall clock times only the launches."""

    def __init__(self, *stages: str, gpu_stages: tuple[str, ...] = ()):
        self.stages = {stage: Stage(stage in gpu_stages) for stage in stages}

    def __call__(self, stage: str) -> "Stage":
        return self.stages[stage]

    def take(self) -> dict[str, float]:
        seconds = {}
        for name, stage in self.stages.items():
            seconds[name], gpu_seconds = stage.take()
            if gpu_seconds is not None:
                seconds[f"{name}_gpu"] = gpu_seconds
        return seconds


class Stage:
    """One stage's clock in StageTimes (and its CUDA events, for a GPU stage)."""

    def __init__(self, on_gpu: bool):
        self.seconds, self.started, self.gpu_seconds = 0.0, 0.0, 0.0
        self.start_event, self.runs = None, [] if on_gpu else None  # runs: (start, end) events not yet read

    def __enter__(self):
        self.started = time.perf_counter()
        if self.runs is not None:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()

    def __exit__(self, *error):
        if self.runs is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.runs.append((self.start_event, end))
            if len(self.runs) > 64:  # where no one takes the times (--serial_mode), the list stays short
                self.read_finished_runs()
        self.seconds += time.perf_counter() - self.started

    def read_finished_runs(self):
        finished = [end.query() for _, end in self.runs]
        milliseconds = sum(start.elapsed_time(end) for (start, end), done in zip(self.runs, finished) if done)
        self.gpu_seconds += milliseconds / 1000.0
        self.runs = [run for run, done in zip(self.runs, finished) if not done]

    def take(self) -> tuple[float, float | None]:
        seconds, self.seconds = self.seconds, 0.0
        if self.runs is None:
            return seconds, None
        self.read_finished_runs()
        gpu_seconds, self.gpu_seconds = self.gpu_seconds, 0.0
        return seconds, gpu_seconds


def child_process_context():
    """Children fork from a server process that imported torch once (multiprocessing's
    "forkserver"). Spawned, each child imported torch itself (3-4 s of CPU), and since spawn hands a
    child its arguments only once it has imported the main module, the children of a run started one
    after another, seconds each, and every restart took as long. The server starts with the run's
    first child, so children see the environment of that moment, and stops with the run
    (stop_fork_server). Its children's parent is the server, which exits with the runner (see
    child_process_setup): their parent-death signal and `parent_alive` hold as before."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "numpy", "gymnasium"])  # what appo.py and env.py import
    fork_server_socket_in_a_short_folder()
    # A stop signalled to the whole process group (timeout, kill -- -PGID, Slurm) reaches the server
    # too, and its death would kill the learner before its final save (their parent-death signal).
    # An ignored signal stays ignored across exec, so the server, started here, ignores SIGTERM and
    # outlives the runner's save; it still exits with the runner (child_process_setup).
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return context


# A Unix socket's path holds at most 107 bytes. The fork server listens on one named like this,
# inside multiprocessing's temporary folder (made in $TMPDIR when first needed).
FORK_SERVER_SOCKET_NAME = os.path.join("pymp-12345678", "listener-12345678")


def fork_server_socket_in_a_short_folder():
    """Under a deep $TMPDIR (pytest-xdist's tmp_path folders: 108 bytes) the fork server could not
    start ("AF_UNIX path too long") and the run died. There, multiprocessing's temporary folder, which
    holds nothing but such sockets and is removed at exit, is made in /tmp instead; the run's own
    temporary files stay in $TMPDIR. Python 3.13's multiprocessing does the same by itself."""
    def fits(folder: str) -> bool:
        return len(os.path.join(folder, FORK_SERVER_SOCKET_NAME).encode()) <= 107

    if fits(tempfile.gettempdir()) or not os.access("/tmp", os.W_OK):
        return
    temp_dir, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        multiprocessing.util.get_temp_dir()  # made once a process, kept for the server's socket
    finally:
        tempfile.tempdir = temp_dir


def stop_fork_server():
    """Ends the run's fork server once its children have gone (it would otherwise outlive an
    in-process run, with the environment it started in). multiprocessing keeps one server a
    process and offers no public way to stop it; a later run starts a new one."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is not None and hasattr(server, "_stop"):
        server._stop()


def seed_process(seed: int, role: str, index: int):
    """Seeds this process's generators (torch's, NumPy's global one, Python's) from the run's
    --seed, the process's role and its index in the run. Children fork from a server that imported
    torch once, so unseeded each would start from the server's generator state: two policy workers
    drew the same action noise, and a run's sampling did not follow --seed. A restarted child
    draws its stream again from the start. --serial_mode runs every role in one process, on the
    one stream the runner seeds."""
    words = np.random.SeedSequence([seed, zlib.crc32(role.encode()), index]).generate_state(2)
    torch.manual_seed(int(words[0]) << 32 | int(words[1]))
    np.random.seed(int(words[0]))
    random.seed(int(words[1]))


def child_process_setup(role: str, threads: int = 1, owns_envs: bool = False, stack_file: str | None = None,
                        seed: tuple[int, int] | None = None):
    """Every child: a name that `ps`/`top` show (appo-<role>), die with the runner, leave Ctrl-C
    to the runner, few threads; with `stack_file`, SIGUSR1 appends every thread's Python stack
    there (the runner asks for it when the process falls silent); with `seed` (the run's --seed,
    the process's index), generators of its own (seed_process).

    A process that owns envs gets its own process group, so that the runner can kill it together
    with the env processes it started (VizDoom runs one per env), and it hears of the runner's
    death as SIGTERM, which it turns into a normal exit that closes its envs. The others leave
    SIGTERM to the runner as they leave Ctrl-C: a stop signalled to the whole process group
    (timeout, Slurm) must find the learner alive to save its final checkpoint.
    """
    death_signal = signal.SIGKILL
    if owns_envs:
        os.setpgid(0, 0)
        death_signal = signal.SIGTERM
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, death_signal)  # PR_SET_PDEATHSIG: the kernel signals us when our parent dies
        libc.prctl(15, f"appo-{role}".encode()[:15])  # PR_SET_NAME
    except OSError:
        pass
    # Our parent is the fork server, which exits once no process holds the write end of its "alive"
    # pipe. The runner holds one, and so does every child it forks: closed here, the server exits with
    # the runner, and its exit is the parent death signalled above (else a SIGKILLed runner left the
    # server and every child running).
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    if seed is not None:
        seed_process(seed[0], role, seed[1])
    if stack_file:
        os.makedirs(os.path.dirname(stack_file), exist_ok=True)
        global STACK_FILE  # faulthandler writes to its descriptor: it must stay open
        STACK_FILE = open(stack_file, "a")
        faulthandler.register(signal.SIGUSR1, file=STACK_FILE, all_threads=True)


STACK_FILE = None


def process_state(pid: int) -> str:
    """A process's state letter from /proc (R running, S sleeping, T stopped, ...); '' where gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def stack_path(cfg, process_index: int) -> str:
    """Where a learner's or policy worker's Python stacks go when the runner asks (SIGUSR1)."""
    return os.path.join(experiment_dir(cfg), "stacks", f"process_{process_index}.txt")


def engine_log_path(cfg, owner: str) -> str:
    """Where the engines of `owner`'s envs write (one file per rollout worker, and the runner's probe)."""
    return os.path.join(experiment_dir(cfg), "engine_logs", f"{owner}.log")


@contextlib.contextmanager
def engine_output_to(path: str):
    """Inside this block, file descriptors 1 and 2 (where engines write from C++ and from the
    processes they start: ViZDoom's console and multiplayer handshake, ALE's banner, DMLab) append
    to `path`, while Python's own prints (the trainer's lines, tracebacks) still reach the terminal.
    A doom_duel run otherwise buries its status lines under about 20 lines of chatter a second."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    python_streams = sys.stdout, sys.stderr
    terminal_fds = os.dup(1), os.dup(2)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in terminal_fds)
    try:
        yield
    finally:
        sys.stdout.close()  # flushes; closefd=False leaves the descriptor to os.close below
        sys.stderr.close()
        sys.stdout, sys.stderr = python_streams
        for target, fd in zip((1, 2), terminal_fds):
            os.dup2(fd, target)
            os.close(fd)


ROLLOUT_WORKER_NICENESS = 2  # enough for the scheduler to favour learner and policy workers


def pin_rollout_worker(worker_id: int, num_workers: int = 1):
    """--set_workers_cpu_affinity: rollout workers take the cores round robin and yield to the
    learner and policy workers, whose delays hold everyone up (the env processes a worker starts
    inherit both). Under torchrun, each rank on a machine (LOCAL_RANK) starts after the cores of
    the ranks before it, so that ranks do not pile their workers onto the first cores."""
    cores = sorted(os.sched_getaffinity(0))
    index = int(os.environ.get("LOCAL_RANK", 0)) * num_workers + worker_id
    os.sched_setaffinity(0, {cores[index % len(cores)]})
    os.nice(ROLLOUT_WORKER_NICENESS)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def process_group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":  # a zombie is dead, only not yet reaped
                members.append(int(entry))
    return members


def kill_process_group(pgid: int, spare: int | None = None):
    """SIGKILLs a rollout worker with every env process it started (or, sparing the worker
    itself, what its envs left running), then removes the shared memory files those env processes
    would have removed had they exited normally."""
    members = [pid for pid in process_group_members(pgid) if pid != spare]
    if not members:
        return
    leftovers = envs.shared_memory_of(members)
    if spare is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    else:
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while set(process_group_members(pgid)) - {spare} and time.monotonic() < deadline:
        time.sleep(0.05)  # exiting processes need a moment to leave the process table
    remove_files(leftovers)


# =============================================================================================
# PLUMBING: rollout worker: steps envs, writes obs into slots, asks for actions, hands full slots on
# =============================================================================================

class GroupFields(typing.NamedTuple):
    """What a rollout worker writes for the agents of one group: their slot fields (RolloutSlots.fields),
    observation keys and action space."""
    arrays: dict[str, np.ndarray]
    obs_keys: list[str]
    action_space: spaces.Space


class Actor:
    """One agent of one env: its current trajectory slot and step, and its group's slot fields."""

    def __init__(self, env_id: int, agent: int, policy_id: int, fields: GroupFields | None = None):
        self.env_id, self.agent, self.policy_id, self.fields = env_id, agent, policy_id, fields
        self.slot, self.step = -1, 0
        self.reward_shaping_version = -1  # version of its policy's hyperparameters the env applies
        self.reward_scaler: RewardScaler | None = None  # --scale_rewards
        # the policy version that acted the first step of its last handed-off slot, and how many in a row it acted
        self.handed_version, self.handed_count = -1, 0

    def handed_off(self, version: int):
        self.handed_count = self.handed_count + 1 if version == self.handed_version else 1
        self.handed_version = version


UNTAKEN = {"agent_left": True}  # the info of a position no env step filled: out of the loss, as a left agent's


def action_request(worker: int, split: int, generation: int, actors: list[Actor]) -> tuple[int, ...]:
    """One message asks for the actions of every actor of a split that one policy acts for:
    (worker, split, generation, slot, step, slot, step, ...). The queue and the policy worker pay
    their per-message costs once a split, not once an actor (Sample Factory's way too)."""
    return (worker, split, generation, *itertools.chain.from_iterable((actor.slot, actor.step) for actor in actors))


class SyncGate:
    """--no-async_rl for one rollout worker: once every actor of a split has handed off its share
    of a batch (rollouts_per_batch rollouts, acted by the latest weights), the split is parked,
    asking for no actions, until the learner publishes the weights trained on that batch. With
    --async_rl the gate never closes and a split always goes on."""

    def __init__(self, cfg, split_actors: list[list[Actor]], learner_version: np.ndarray, num_agents: int):
        self.asynchronous = cfg.async_rl
        self.rollouts_per_batch = rollouts_per_batch(cfg, num_agents)
        self.split_actors, self.learner_version = split_actors, learner_version
        self.parked: list[int] = []

    def has_share_of_batch(self, split: int) -> bool:
        """Has every actor of the split handed off its share of a batch, acted by the latest weights?
        Only when all of them have: an actor that restarted its slot (its env was remade after a
        fault) must not be held back, or its slot would be missing from the batch everyone waits for."""
        return all(actor.step == 0 and actor.handed_count >= self.rollouts_per_batch
                   and actor.handed_version >= int(self.learner_version[actor.policy_id])
                   for actor in self.split_actors[split])

    def lets_go(self, split: int) -> bool:
        """After a step of the split: may it ask for its next actions? If not, it is parked."""
        if self.asynchronous or not self.has_share_of_batch(split):
            return True
        self.parked.append(split)
        return False

    def released(self) -> list[int]:
        """The parked splits whose new weights have arrived, no longer parked."""
        released = [split for split in self.parked if not self.has_share_of_batch(split)]
        self.parked = [split for split in self.parked if split not in released]
        return released


# Spaces as the policy sees them: the observation's keys, an action space's parts and heads, and
# the check on an action mask.

def obs_shapes(obs_space: spaces.Space) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Observation keys with their per-step shape and dtype; a plain Box is the key 'obs'."""
    if isinstance(obs_space, spaces.Dict):
        return {key: (tuple(space.shape), np.dtype(space.dtype)) for key, space in obs_space.spaces.items()}
    return {"obs": (tuple(obs_space.shape), np.dtype(obs_space.dtype))}


ACTION_SPACES = "Discrete, MultiDiscrete, MultiBinary, Box, or a Tuple or Dict of them"


def action_parts(action_space: spaces.Space) -> list[spaces.Space]:
    """The Discrete, MultiDiscrete, MultiBinary and Box parts of an action space, depth first in
    the space's own order (a Dict's keys as it lists them)."""
    if isinstance(action_space, spaces.Tuple):
        return [part for subspace in action_space.spaces for part in action_parts(subspace)]
    if isinstance(action_space, spaces.Dict):
        return [part for subspace in action_space.spaces.values() for part in action_parts(subspace)]
    if isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary, spaces.Box)):
        return [action_space]
    raise ValueError(f"unsupported action space {action_space}: use {ACTION_SPACES}")


def head_sizes(part: spaces.Space) -> list[int]:
    """A discrete part's categorical heads: one for a Discrete, one per entry of a MultiDiscrete,
    a two-way one per bit of a MultiBinary (the same policy as one Bernoulli per bit, and an
    action mask can then forbid either value of a bit)."""
    if isinstance(part, spaces.Discrete):
        return [int(part.n)]
    if isinstance(part, spaces.MultiDiscrete):
        return [int(n) for n in part.nvec.reshape(-1)]
    if isinstance(part, spaces.MultiBinary):
        return [2] * int(np.prod(part.shape))
    return []  # a Box


def continuous_dims(part: spaces.Space) -> int:
    return int(np.prod(part.shape)) if isinstance(part, spaces.Box) else 0


class MixedHeads:
    """A Tuple or Dict with discrete and continuous parts: the heads of every discrete part in one
    Categoricals, the dimensions of every Box in one DiagonalGaussian; log-probabilities and
    entropies are summed over both. Its logits are the categoricals' then the Gaussian's (means,
    log-stds); an action is the heads' choices then the continuous values, all float32, since a
    slot field has one dtype (choices are exact in float32 up to 2**24)."""

    action_dtype = np.dtype(np.float32)

    def __init__(self, discrete: Categoricals, continuous: DiagonalGaussian):
        self.discrete, self.continuous = discrete, continuous
        self.num_outputs = discrete.num_outputs + continuous.num_outputs
        self.num_log_stds = continuous.num_log_stds
        self.num_params = discrete.num_params + continuous.num_params  # the width of "logits"
        self.action_shape = (len(discrete.head_sizes) + continuous.dim,)

    def split(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return logits[..., :self.discrete.num_outputs], logits[..., self.discrete.num_outputs:]

    def split_actions(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        heads = len(self.discrete.head_sizes)
        return actions[..., :heads].long(), actions[..., heads:]

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        discrete, continuous = self.split(logits)
        return torch.cat([self.discrete.sample(discrete).float(), self.continuous.sample(continuous)], dim=-1)

    def mode(self, logits: torch.Tensor) -> torch.Tensor:
        discrete, continuous = self.split(logits)
        return torch.cat([self.discrete.mode(discrete).float(), self.continuous.mode(continuous)], dim=-1)

    def log_prob(self, logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        (discrete, continuous), (choices, values) = self.split(logits), self.split_actions(actions)
        return self.discrete.log_prob(discrete, choices) + self.continuous.log_prob(continuous, values)

    def entropy(self, logits: torch.Tensor) -> torch.Tensor:
        discrete, continuous = self.split(logits)
        return self.discrete.entropy(discrete) + self.continuous.entropy(continuous)


ActionDistribution = Categoricals | DiagonalGaussian | MixedHeads


def discrete_logits(action_dist: ActionDistribution) -> int:
    """How many of the logits are categorical: they come first in every distribution."""
    if isinstance(action_dist, MixedHeads):
        return action_dist.discrete.num_outputs
    return action_dist.num_outputs if isinstance(action_dist, Categoricals) else 0


def action_mask_error(obs_space: spaces.Space, action_space: spaces.Space) -> str | None:
    """Why an action_mask observation cannot mask `action_space`'s logits, or None."""
    if not isinstance(obs_space, spaces.Dict) or ACTION_MASK not in obs_space.spaces:
        return None
    width, shape = discrete_logits(action_distribution(action_space)), tuple(obs_space[ACTION_MASK].shape)
    if width == 0:
        return (f"the observation '{ACTION_MASK}' masks discrete actions, and the action space {action_space} has "
                "none: rename the key if it is an input, or drop it")
    if shape != (width,):
        return (f"the observation '{ACTION_MASK}' has shape {shape}, and the action space {action_space} has {width} "
                f"discrete choices: make the mask a vector of {width}, one entry per choice of each discrete head "
                "in order (a MultiBinary bit: two, for 0 and 1)")
    return None


def env_action(action_space, action_row: np.ndarray):
    """A slot's action row as the env takes it: the heads' choices first, then the continuous values
    (action_distribution's layout), each part given its space's shape, dtype and offset."""
    if isinstance(action_space, spaces.Discrete):  # the common spaces first: this runs per agent per step
        return int(action_row[0]) + int(action_space.start)
    if isinstance(action_space, spaces.Box):
        return box_action(action_space, action_row)
    if isinstance(action_space, spaces.MultiDiscrete):
        return (action_row.reshape(action_space.shape) + action_space.start).astype(action_space.dtype)
    if isinstance(action_space, spaces.Tuple) and all(type(part) is spaces.Discrete for part in action_space.spaces):
        return tuple(int(choice + part.start) for choice, part in zip(action_row.tolist(), action_space.spaces))
    choices = sum(len(head_sizes(part)) for part in action_parts(action_space))
    return structured_action(action_space, iter(action_row[:choices]), iter(action_row[choices:]))


def box_action(box: spaces.Box, values: np.ndarray) -> np.ndarray:
    """The policy samples unbounded; the env gets its bounds."""
    return np.clip(values.reshape(box.shape), box.low, box.high).astype(box.dtype)


def structured_action(space: spaces.Space, choices, values):
    """`space`'s action from iterators over a row's choices and continuous values, each part
    taking its own from them in action_parts' order."""
    def take(source, n: int) -> np.ndarray:
        return np.array(list(itertools.islice(source, n)))
    if isinstance(space, spaces.Discrete):
        return int(next(choices)) + int(space.start)
    if isinstance(space, spaces.MultiDiscrete):  # choices arrive as float32 in a MixedHeads row
        return (take(choices, space.nvec.size).astype(np.int64).reshape(space.shape) + space.start).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return take(choices, int(np.prod(space.shape))).reshape(space.shape).astype(space.dtype)
    if isinstance(space, spaces.Box):
        return box_action(space, take(values, int(np.prod(space.shape))))
    if isinstance(space, spaces.Tuple):
        return tuple(structured_action(subspace, choices, values) for subspace in space.spaces)
    return {key: structured_action(subspace, choices, values) for key, subspace in space.spaces.items()}


class Agents:
    """An env as the trainer steps it: made at the ENV HOOK (make_env), single- and multi-agent
    alike, in lists of one entry per agent (observations, rewards, done and truncated flags,
    infos), so the rollout worker, the probe and evaluation have one path. env.py's envs keep
    gymnasium's API: single-agent ones return plain values, multi-agent ones (Doom matches) lists,
    with one terminated and truncated flag and info for all agents or one each."""

    def __init__(self, env):
        self.env, self.num_agents = env, envs.get_num_agents(env)
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.agent_spaces = envs.get_agent_spaces(env)  # each agent's (observation, action) spaces

    def reset(self) -> list:
        obs, _ = self.env.reset()
        return [obs] if self.num_agents == 1 else list(obs)

    def step(self, actions: list) -> tuple[list, list, list, list, list]:
        """(observations, rewards, dones, truncations, infos): an agent is done when its episode ended
        either way, and truncated when a time limit ended it (not a terminal state of the game)."""
        if self.num_agents == 1:
            obs, reward, terminated, truncated, info = self.env.step(actions[0])
            return [obs], [reward], [bool(terminated) or bool(truncated)], [bool(truncated) and not terminated], [info]
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        if not isinstance(terminated, (list, tuple)):
            terminated, truncated = [terminated] * self.num_agents, [truncated] * self.num_agents
        dones = [bool(t) or bool(u) for t, u in zip(terminated, truncated)]
        truncations = [bool(u) and not t for t, u in zip(terminated, truncated)]
        infos = info if isinstance(info, (list, tuple)) else [info] * self.num_agents
        return list(obs), list(rewards), dones, truncations, infos

    def render(self):
        return self.env.render()

    def close(self):
        self.env.close()


class RolloutWorker:
    def __init__(self, worker_id: int, process_index: int, cfg, shared: Shared):
        self.worker_id, self.process_index, self.cfg, self.shared = worker_id, process_index, cfg, shared
        self.slots, groups = shared.slots, shared.groups
        self.group_fields = [GroupFields(shared.slots.fields(rollout_buffer_specs(*pair, cfg))[0],
                                         list(obs_shapes(pair[0])), pair[1]) for pair in groups.spaces]
        self.group_policies = [groups.policies(group, cfg) for group in range(len(groups.spaces))]
        self.envs, self.actors = [], []
        self.rng = random.Random((cfg.seed or 0) * 1000 + worker_id)
        envs_per_split = cfg.num_envs_per_worker // cfg.worker_num_splits
        try:
            for i in range(cfg.num_envs_per_worker):
                env = self.make_env(i)
                self.envs.append(env)
                pinned = pinned_policies(cfg, envs.get_agent_names(env.env))[0] if cfg.agent_policies else None
                for agent in range(env.num_agents):
                    group = groups.of_agent[agent]
                    policy = self.draw_group_policy(group) if pinned is None else pinned[agent]
                    self.actors.append(Actor(i, agent, policy, self.group_fields[group]))
                    if cfg.scale_rewards:
                        self.actors[-1].reward_scaler = RewardScaler(cfg.gamma)
        except BaseException:  # a failed env or a stop request: close the envs made so far
            self.close()
            raise
        self.split_actors = [[a for a in self.actors if a.env_id // envs_per_split == s]
                             for s in range(cfg.worker_num_splits)]
        # per split: (env_id, that env's actors), so the hot loop does no searching
        self.split_envs = [[(env_id, [a for a in actors if a.env_id == env_id])
                            for env_id in sorted({a.env_id for a in actors})] for actors in self.split_actors]
        self.times = StageTimes("step")  # stepping envs, for the runner's share of busy time
        self.resend_epoch = int(shared.run.resend_epoch[0])
        self.episodes_per_env = [0] * len(self.envs)
        self.next_episode = [None] * len(self.envs)  # per env: its reset observations, a step after a cut
        self.past_policy = past_policy_id(cfg)
        self.has_reward_shaping = any(name.startswith("reward/") for name in shared.hyperparams.names)
        self.env_field_names = list(env_fields(cfg))
        self.gate = SyncGate(cfg, self.split_actors, shared.run.learner_version,
                             num_agents=len(self.actors) // len(self.envs))

    def make_env(self, env_id: int):
        self.shared.run.beat(self.process_index)  # env creation can be slow (DMLab compiles levels)
        env_index = self.worker_id * self.cfg.num_envs_per_worker + env_id
        return make_env(self.cfg, env_index)

    def remake_env(self, env_id: int, env_actors: list[Actor], error: Exception):
        """A failed env (in a step or a reset: a game process can die under either) is closed and
        made again, with its actors' reward shaping."""
        print(f"warning: rollout worker {self.worker_id}: env {env_id} failed ({type(error).__name__}: "
              f"{error}); recreating it; its engine's output is in "
              f"{engine_log_path(self.cfg, f'rollout_worker_{self.worker_id}')}", flush=True)
        self.shared.stats_queue.put({"type": "env_fault", "worker": self.worker_id})
        try:
            self.envs[env_id].close()
        except Exception:  # a crashed env often fails to close too; its process is gone anyway
            pass
        self.envs[env_id] = self.make_env(env_id)
        for actor in env_actors:
            actor.reward_shaping_version = -1  # the new env starts with the default weights
            self.apply_reward_shaping(actor)

    def replace_env(self, env_id: int, env_actors: list[Actor], error: Exception):
        """A failed env is made again; its actors restart their slots from step 0, so the partial
        trajectories (and whatever the env returned before failing) never reach the learner."""
        self.remake_env(env_id, env_actors, error)
        obs, self.next_episode[env_id] = self.envs[env_id].reset(), None
        for actor in env_actors:
            actor.step = 0
            self.write_obs(actor, obs[actor.agent])
            actor.fields.arrays["rnn_state"][actor.slot, 0] = 0.0

    def write_obs(self, actor: Actor, obs):
        arrays, obs_keys = actor.fields.arrays, actor.fields.obs_keys
        if len(obs_keys) == 1 and not isinstance(obs, dict):
            arrays["obs"][actor.slot, actor.step] = obs
        else:
            for key in obs_keys:
                arrays[key][actor.slot, actor.step] = obs[key]

    def start_slot(self, actor: Actor) -> bool:
        slot = None
        while slot is None:
            if self.shared.run.should_stop():
                return False
            self.shared.run.beat(self.process_index)  # waiting for a slow learner is not a hang
            slot = self.slots.control.acquire(self.worker_id, timeout=0.5)
        actor.slot, actor.step = slot, 0
        actor.fields.arrays["valid"][slot] = 1.0
        return True

    def request_actions(self, split: int):
        """Asks for the split's actions in a new generation: an answer to an earlier request of this
        split (one lost with its policy worker and asked again) no longer counts."""
        actors = self.split_actors[split]
        generation = self.slots.control.set_pending(self.worker_id, split, len(actors))
        by_policy = {}
        for actor in actors:
            by_policy.setdefault(actor.policy_id, []).append(actor)
        for policy_id, policy_actors in by_policy.items():
            self.shared.request_queues[policy_id].put(action_request(self.worker_id, split, generation, policy_actors))

    def reset_all(self):
        self.next_episode = [None] * len(self.envs)
        for actor in self.actors:
            self.apply_reward_shaping(actor)
        for env_id, env in enumerate(self.envs):
            env_actors = [a for a in self.actors if a.env_id == env_id]
            try:
                obs = env.reset()
            except Exception as error:
                self.remake_env(env_id, env_actors, error)
                obs = self.envs[env_id].reset()
            for actor in env_actors:
                if not self.start_slot(actor):
                    return False
                self.write_obs(actor, obs[actor.agent])
                actor.fields.arrays["rnn_state"][actor.slot, 0] = 0.0
        return True

    def finish_slot(self, actor: Actor) -> bool:
        """The slot holds T steps plus the bootstrap obs (or fewer, see hand_over): give it to the
        learner, continue in a new one from the last observation."""
        full_slot, last_step, arrays = actor.slot, actor.step, actor.fields.arrays
        if actor.policy_id == self.past_policy:  # no learner trains on a past version's steps: reuse the slot
            for key in actor.fields.obs_keys + ["rnn_state"]:
                arrays[key][full_slot, 0] = arrays[key][full_slot, last_step]
            arrays["valid"][full_slot] = 1.0
            actor.step = 0
            return True
        # The next slot starts from a copy: once handed off, the full slot may be trained on, freed
        # and taken by another worker while this one still waits for a free slot.
        carried = {key: arrays[key][full_slot, last_step].copy() for key in actor.fields.obs_keys + ["rnn_state"]}
        actor.handed_off(int(arrays["policy_version"][full_slot, 0]))  # the learner's test (Learner.fresh)
        # The slot stays this worker's until the learner takes it (Learner.claim): a death at any
        # line here leaves it either reclaimable by the runner or on its way to the learner.
        self.shared.learner_queues[actor.policy_id].put(
            (full_slot, self.slots.control.generation(full_slot), self.worker_id))
        if not self.start_slot(actor):
            return False
        for key, value in carried.items():
            arrays[key][actor.slot, 0] = value
        return True

    def ask_for_actions(self, split: int):
        """After a step of the split: its next actions, unless --no-async_rl parks it until new weights."""
        if self.gate.lets_go(split):
            self.request_actions(split)

    def resume_parked(self):
        """Asks for the actions of every parked split whose new weights have arrived."""
        for split in self.gate.released():
            self.request_actions(split)

    def step_split(self, split: int) -> bool:
        frames = 0
        for env_id, env_actors in self.split_envs[split]:
            env = self.envs[env_id]
            if self.next_episode[env_id] is not None:  # after a time limit's cut: a position nobody steps
                obs, self.next_episode[env_id] = self.next_episode[env_id], None
                frames += self.cfg.env_frameskip * len(env_actors)  # a position of the slots, as the learner counts
                steps = [(obs[actor.agent], 0.0, True, False, UNTAKEN) for actor in env_actors]
                if not self.record_env_step(env_id, env_actors, steps, episode_over=True):
                    return False
                continue
            actions = [env_action(a.fields.action_space, a.fields.arrays["actions"][a.slot, a.step]) for a in env_actors]
            try:
                with self.times("step"):
                    obs, rewards, dones, truncations, infos = env.step(actions)
                    cuts = [bool(cut) and self.cfg.value_bootstrap for cut in truncations]
                    if all(dones) and any(cuts):  # the final observations take the next position first
                        self.next_episode[env_id] = env.reset()
                    elif all(dones):
                        obs = env.reset()
            except Exception as error:
                self.replace_env(env_id, env_actors, error)
                continue
            frames += self.cfg.env_frameskip * len(env_actors)  # every agent's frames, as the learner counts them
            steps = []
            for actor in env_actors:
                agent, reward = actor.agent, rewards[actor.agent]
                if actor.reward_scaler is not None:
                    reward = actor.reward_scaler(reward, episode_ended=dones[agent])
                steps.append((obs[agent], reward, dones[agent] and not cuts[agent], cuts[agent], infos[agent]))
            episode_over = all(dones) and self.next_episode[env_id] is None  # else after the untaken position
            if not self.record_env_step(env_id, env_actors, steps, episode_over):
                return False
        self.shared.run.worker_frames[self.worker_id] += frames
        return True

    def record_env_step(self, env_id: int, env_actors: list[Actor], steps: list[tuple], episode_over: bool) -> bool:
        """One position for each of an env's actors, a full slot handed to the learner, then what
        comes between episodes if the env's episode is over. False: the run is stopping."""
        for actor, step in zip(env_actors, steps):
            self.record_step(actor, *step)
            if actor.step == self.cfg.rollout and not self.finish_slot(actor):
                return False
        return not episode_over or self.between_episodes(env_id, env_actors)

    def between_episodes(self, env_id: int, env_actors: list[Actor]) -> bool:
        """After an env's episode: every few episodes its agents go to new random policies (with
        several policies), and each agent's env takes its policy's latest reward shaping."""
        self.episodes_per_env[env_id] += 1
        if (num_acting_policies(self.cfg) > 1 and not self.cfg.agent_policies
                and self.episodes_per_env[env_id] % self.cfg.remap_policies_every == 0):
            for actor in env_actors:
                if not self.hand_over(actor, self.draw_policy(actor)):
                    return False
        for actor in env_actors:
            self.apply_reward_shaping(actor)
        return True

    def draw_policy(self, actor: Actor) -> int:
        """A random learning policy of the actor's group, or for an env's later agents sometimes the
        past versions (an env's first agent always learns, so no env plays for nothing)."""
        if self.past_policy is not None and actor.agent > 0 and self.rng.random() < self.cfg.past_opponents_fraction:
            return self.past_policy
        return self.draw_group_policy(self.shared.groups.of_agent[actor.agent])

    def draw_group_policy(self, group: int) -> int:
        policies = self.group_policies[group]
        return policies[self.rng.randrange(len(policies))]

    def hand_over(self, actor: Actor, policy_id: int) -> bool:
        """Moves an actor to another policy at an episode boundary. Its slot so far goes to the old
        policy's learner, the unused steps masked out; the new policy's trajectory starts in a new slot."""
        if policy_id == actor.policy_id:
            return True
        if actor.step > 0:
            slot, used, arrays = actor.slot, actor.step, actor.fields.arrays
            arrays["valid"][slot, used:] = 0.0
            arrays["done"][slot, used:] = 1.0     # nothing after the episode's end leaks into V-trace
            for name in ["truncated", "reward", *self.env_field_names]:  # what an env step writes
                arrays[name][slot, used:] = 0
            arrays["actions"][slot, used:] = 0    # stale actions could be out of range for the heads
            arrays["policy_version"][slot, used:] = arrays["policy_version"][slot, used - 1]  # lag stats
            if not self.finish_slot(actor):
                return False
        actor.policy_id, actor.reward_shaping_version = policy_id, -1
        return True

    def apply_reward_shaping(self, actor: Actor):
        """Gives the actor's env its policy's reward-shaping weights if they changed (PBT mutates them)."""
        if not self.has_reward_shaping or actor.policy_id == self.past_policy:
            return
        version = int(self.shared.hyperparams.version[actor.policy_id])
        if version != actor.reward_shaping_version:
            weights = self.shared.hyperparams.reward_shaping(actor.policy_id)
            envs.set_reward_shaping(self.envs[actor.env_id], actor.agent, weights)
            actor.reward_shaping_version = version

    def record_step(self, actor: Actor, obs, reward, done, truncated, info):
        """Writes a step's outcome and the next observation. A step a time limit cut (--value_bootstrap:
        `truncated`, and not done) is followed by the episode's final observation, which the policy
        acts on (its value bootstraps the cut step; the learner's core runs on into it) and no env
        step takes (UNTAKEN: out of the loss, done there); the new episode starts one position later."""
        arrays = actor.fields.arrays
        arrays["reward"][actor.slot, actor.step] = reward
        for name in self.env_field_names:
            arrays[name][actor.slot, actor.step] = info.get(name, 0)
        arrays["done"][actor.slot, actor.step] = float(done)
        arrays["truncated"][actor.slot, actor.step] = float(truncated)
        if info.get("agent_left"):  # an agent out of the game (env.PettingZooAgents): its action did nothing
            arrays["valid"][actor.slot, actor.step] = 0.0
        actor.step += 1
        self.write_obs(actor, obs)
        if done:  # the policy worker already wrote the next RNN state; a new episode starts fresh
            arrays["rnn_state"][actor.slot, actor.step] = 0.0
        if "true_return" in info and actor.policy_id != self.past_policy:
            self.shared.stats_queue.put({"type": "episode", "policy_id": actor.policy_id,
                                         "true_return": float(info["true_return"]),
                                         "true_objective": float(info.get("true_objective", info["true_return"])),
                                         "true_length": int(info["true_length"])})

    def start(self) -> bool:
        """Resets every env and asks for the first actions; False if the run stopped meanwhile."""
        if not self.reset_all():
            return False
        for split in range(self.cfg.worker_num_splits):
            self.request_actions(split)
        return True

    def work(self, timeout: float) -> bool | None:
        """One turn of the worker's loop, in its process (run) or in --serial_mode: asks again for
        lost requests, lets go the parked splits whose weights arrived, steps a split whose actions
        all arrived (waiting up to `timeout` for one) and asks for its next. None: no split was
        ready; False: the worker must stop (it found no free slot before the run stopped)."""
        self.resend_lost_requests()
        self.resume_parked()
        split = self.slots.control.wait_any(self.worker_id, timeout=timeout)
        if split is None:
            return None
        if not self.step_split(split):
            return False
        self.ask_for_actions(split)
        return True

    def run(self):
        parent = os.getppid()
        if not self.start():
            return
        last_report = time.monotonic()
        while not self.shared.run.should_stop() and parent_alive(parent):
            self.shared.run.beat(self.process_index)
            # a parked split waits for the learner, which wakes no one: look again soon
            worked = self.work(timeout=0.001 if self.gate.parked else 0.5)
            if worked is False:
                return
            if worked and time.monotonic() - last_report > 2.0:
                self.shared.stats_queue.put({"type": "timing", "component": "env", "busy_s": self.times.take()["step"]})
                last_report = time.monotonic()

    def resend_lost_requests(self):
        """After a policy worker restart the requests it had taken are lost: ask again for every
        split still waiting, in a new generation, so that a copy answered late (by a policy worker
        that had taken it before the runner emptied the queues) counts for nothing."""
        epoch = int(self.shared.run.resend_epoch[0])
        if epoch == self.resend_epoch:
            return
        self.resend_epoch = epoch
        for split in range(self.cfg.worker_num_splits):
            if self.slots.control.pending(self.worker_id, split) > 0:
                self.request_actions(split)

    def close(self):
        for env in self.envs:
            try:
                env.close()
            except Exception as error:
                print(f"warning: rollout worker {self.worker_id}: closing an env failed: {error}", flush=True)


def rollout_worker_main(worker_id: int, process_index: int, cfg, shared: Shared):
    child_process_setup("rollout", owns_envs=True, seed=(cfg.seed, process_index))
    if cfg.set_workers_cpu_affinity:
        pin_rollout_worker(worker_id, cfg.num_workers)
    worker, parent = None, os.getppid()
    with engine_output_to(engine_log_path(cfg, f"rollout_worker_{worker_id}")):
        try:
            worker = RolloutWorker(worker_id, process_index, cfg, shared)
            worker.run()
        except appo_ipc.Closed:
            pass
        finally:
            if worker is not None:
                worker.close()
            leave_nothing_behind(parent, shared.run)


def leave_nothing_behind(parent: int, run: RunState):
    """A rollout worker's last act: kill the env processes its envs' close missed (the GPU check
    once found VizDoom games alive after every worker had exited), and, if the runner was killed
    (the fork server, our parent, exits with it), remove the CUDA IPC files that its processes would
    have (the rollout workers are the last out)."""
    kill_process_group(os.getpid(), spare=os.getpid())
    if not parent_alive(parent):
        remove_files(cuda_ipc_files([int(run.runner_pid[0]), *run.pids]) + envs.orphaned_shared_memory())


# =============================================================================================
# PLUMBING: policy worker: batched inference for one policy; stateless (RNN states live in the slots)
# =============================================================================================

class PolicyWorker:
    """Batched inference for one policy: acts on requests (action_request: one message a split) by
    reading the observations and RNN states in the slots and writing actions, log-probs, values
    and next states back, then tells each split how many of its actors got their actions.

    A batch costs a fixed number of library calls whatever its size: one check of all its requests
    before the forward pass and one after, one index_select per input into staging buffers made
    once, and one index_copy_ per output. On a GPU the staging buffers are pinned, each input goes
    over in one non-blocking copy, and the outputs come back packed: one copy, one wait."""

    def __init__(self, policy_id: int, cfg, shared: Shared, spaces_pair):
        self.device = torch.device(cfg.device)
        self.on_gpu = self.device.type == "cuda"
        self.model = encoder_in_compute_dtype(make_model(*spaces_pair, cfg).to(self.device).eval())
        compiled_encoder(self.model, cfg, fixed_shapes=False)
        self.weights, self.requests = shared.weights[policy_id], shared.request_queues[policy_id]
        self.control = shared.slots.control
        self.obs_keys = list(self.model.encoders)
        self.steps_per_slot = shared.slots.rollout + 1
        # the copies to and from the model: its inputs, and act()'s outputs into their slot fields
        self.staging = ActionStaging(shared.slots, self.obs_keys, list(acting_fields(self.model.action_dist)),
                                     self.device, rollout_buffer_specs(*spaces_pair, cfg))
        self.version = -1
        # the runner's split of this worker's time ("wait" is policy_worker_main's), and its batches
        self.times = StageTimes("wait", "gather", "forward", "copy_back", "write",
                                gpu_stages=("forward",) if self.on_gpu else ())
        self.acted = Counter()

    def load_latest_weights(self):
        if self.weights.version != self.version:
            loaded = self.weights.load_into(self.model)  # on a GPU: device to device (SharedWeights)
            if loaded is not None:
                self.version = loaded

    def stale(self, requests: ActionRequests) -> list[int]:
        """The requests that no longer stand: their worker does not own the slot (one that died no
        longer does: the runner reclaimed its slots) or has asked for that split again since."""
        return self.control.stale(requests.workers, requests.splits, requests.generations, requests.slots)

    def serve(self, messages: list[tuple[int, ...]]):
        """Acts on a batch of requests with the latest weights, in its process or in --serial_mode."""
        # after the wait, not before it: requests that waited for new weights (--no-async_rl) get them
        self.load_latest_weights()
        self.act_on(messages)

    def act_on(self, messages: list[tuple[int, ...]]):
        times = self.times
        with times("gather"):
            requests = ActionRequests(messages, self.steps_per_slot)
            stale = self.stale(requests)
            if stale:
                requests, _ = requests.without(stale)
            if len(requests) == 0:
                return
            obs, rnn_state = self.staging.gather(requests.rows)
        with times("forward"):
            outputs = self.forward(obs, rnn_state)
        with times("copy_back"):
            if self.on_gpu:
                outputs = self.staging.to_host(outputs)
        with times("write"):
            # Checked again just before writing: a request that went stale during inference must not
            # overwrite what its split's new answer wrote (that window stays, a few instructions wide).
            stale = self.stale(requests)
            if stale:
                requests, kept = requests.without(stale)
                outputs = [output[kept] for output in outputs]
            self.staging.scatter(requests.rows, outputs, self.version)
            self.complete(requests)
        self.acted.update(samples=len(requests), batches=1)

    def forward(self, obs: dict[str, torch.Tensor], rnn_state: torch.Tensor) -> list[torch.Tensor]:
        """act() on a batch: its outputs in the staging's order (the slot fields, then the next states)."""
        outputs, next_state = act(self.model, obs, rnn_state)
        return [*(outputs[name] for name in self.staging.fields), next_state]

    def warm_up(self):
        """The model on a batch of 1 and one of 2 (torch.compile specialises size 1 and generalises
        from 2), so that --compile compiles before the first request, not during it. No action is
        sampled: the random numbers stay the run's."""
        inputs = self.staging.inputs
        with torch.inference_mode():
            for n in (1, 2):
                self.model({key: inputs[key][:n] for key in self.obs_keys}, inputs["rnn_state"][:n])

    def take_report(self) -> dict:
        """This worker's stage times (on a GPU also "forward_gpu", the forward passes' GPU time)
        and its samples and batches since the last report, for the runner."""
        acted, self.acted = dict(self.acted), Counter()
        return {"stages": self.times.take(), "acted": acted}

    def complete(self, requests: ActionRequests):
        """Counts the answered actors once per (worker, split, generation), as the split waits for them."""
        counts = {}
        for head, count in zip(requests.heads, requests.counts):
            if count:
                counts[head] = counts.get(head, 0) + count
        for (worker, split, generation), count in counts.items():
            self.control.complete(worker, split, generation, count)


def policy_worker_main(policy_id: int, process_index: int, cfg, shared: Shared, spaces_pair):
    child_process_setup("policy", cfg.policy_worker_threads, stack_file=stack_path(cfg, process_index),
                        seed=(cfg.seed, process_index))
    use_device(cfg.device)
    parent = os.getppid()
    worker = PolicyWorker(policy_id, cfg, shared, spaces_pair)
    if cfg.compile:
        with beating(shared.run, process_index):  # compiling is long and silent: the runner must not restart it
            worker.warm_up()
    busy_s, last_report = 0.0, time.monotonic()
    while not shared.run.should_stop() and parent_alive(parent):
        shared.run.beat(process_index)
        with worker.times("wait"):
            try:
                requests = worker.requests.get_many(timeout=0.5)
            except queue.Empty:
                continue
        start = time.perf_counter()
        worker.serve(requests)
        busy_s += time.perf_counter() - start
        if time.monotonic() - last_report > 2.0:
            shared.stats_queue.put({"type": "timing", "component": "inference", "busy_s": busy_s,
                                    **worker.take_report()})
            busy_s, last_report = 0.0, time.monotonic()
    for weights in shared.weights:
        weights.release()


# =============================================================================================
# PLUMBING: learner: batches finished slots in a background thread, trains, publishes weights,
# saves checkpoints
# =============================================================================================

def checkpoint_dir(cfg, policy_id: int) -> str:
    return os.path.join(cfg.train_dir, cfg.experiment, f"checkpoint_p{policy_id}")


def save_checkpoint(cfg, policy_id: int, state: dict) -> str:
    """Writes atomically (temporary file, fsync, rename) and keeps the newest --keep_checkpoints."""
    folder = checkpoint_dir(cfg, policy_id)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"checkpoint_{state['policy_version']:09d}_{state['env_frames']}.pth")
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException as error:  # e.g. a full disk: drop the partial file, the older checkpoints stay
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, Exception) and not isinstance(error, OSError):
            # torch.save reports a full disk as a RuntimeError from its zip writer
            raise OSError(f"could not write {temporary}: {error}") from error
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)
    for old in sorted(glob.glob(os.path.join(folder, "checkpoint_*.pth")))[:-cfg.keep_checkpoints]:
        os.remove(old)
    return path


def load_checkpoint_file(path: str, flag: str) -> dict:
    """A checkpoint a flag names, loaded on the CPU; a clear line if it is not one."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # missing, truncated, or not a checkpoint at all
        raise CheckpointError(f"{flag} {path} cannot be read ({str(error).splitlines()[0]}): name a "
                              "checkpoint_*.pth file") from None


class CheckpointError(RuntimeError):
    pass


def load_latest_checkpoint(cfg, policy_id: int, quiet: bool = False) -> dict | None:
    """The newest checkpoint that loads; older ones are tried when the newest is damaged.

    None when there is none; CheckpointError when there are some but none loads (starting afresh
    would silently throw the training away).
    """
    paths = sorted(glob.glob(os.path.join(checkpoint_dir(cfg, policy_id), "checkpoint_*.pth")), reverse=True)
    for path in paths:
        try:
            return {**torch.load(path, map_location="cpu", weights_only=True), "path": path}
        except Exception as error:  # a truncated or corrupt file: fall back to the one before
            if not quiet:
                print(f"warning: skipping unreadable checkpoint {path}: {str(error).splitlines()[0]}", flush=True)
    if paths:
        raise CheckpointError(f"none of the {len(paths)} checkpoints in {checkpoint_dir(cfg, policy_id)} can be "
                              "read: move them away to start afresh, or use another --experiment")
    return None


def checkpoint_mismatch(model: nn.Module, state_dict: dict) -> str | None:
    """Why `state_dict` cannot load into `model` (keys and shapes), or None if it can."""
    expected = model.state_dict()
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    reshaped = [f"{key} {tuple(state_dict[key].shape)} vs {tuple(value.shape)}" for key, value in expected.items()
                if key in state_dict and tuple(state_dict[key].shape) != tuple(value.shape)]
    problems = [f"{label}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}"
                for label, keys in [("missing keys", missing), ("unexpected keys", unexpected),
                                    ("shape mismatches (checkpoint vs model)", reshaped)] if keys]
    return "; ".join(problems) or None


def plain_value(value) -> bool:
    """A flag's value a checkpoint keeps: a number, a string, a bool, None, or a list of them
    (--encoder_mlp_layers, --obs_keys), so that evaluation plays with the model and env it trained."""
    if isinstance(value, (list, tuple)):
        return all(plain_value(item) and not isinstance(item, (list, tuple)) for item in value)
    return isinstance(value, (int, float, str, bool, type(None)))


MAX_NONFINITE_STEPS = 20  # consecutive skipped steps before the learner gives up


# How often the learner reads its loss statistics back (on a GPU each read waits for the queued
# kernels); the runner shows the latest every --report_every_sec.
LEARNER_STATS_EVERY_S = 1.0


class NonFiniteLoss(RuntimeError):
    pass


def rnn_in_full_float32():
    """cuDNN's RNN (the learner's segment path on a GPU) in full float32, as the policy workers'
    cell computes, instead of its default TF32. Since torch 2.9 that is a setting of its own and the
    convolutions keep theirs (mixing it with the older allow_tf32 then raises); before 2.9 the one
    older setting turns TF32 off for the convolutions too."""
    if hasattr(torch.backends.cudnn.rnn, "fp32_precision"):
        torch.backends.cudnn.rnn.fp32_precision = "ieee"
    else:
        torch.backends.cudnn.allow_tf32 = False


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict):
    """optimizer.load_state_dict, keeping this optimizer's own `fused`: torch restores each
    group's setting from the state, so a checkpoint saved by a plain Adam (the CPU's learner
    before 2026-11-28) would turn this fused Adam into one that refuses optimizer_step's
    `found_inf`. Loading with the group fused also moves Adam's step counts to the parameters'
    device, which fused Adam needs."""
    if "fused" in optimizer.defaults:
        fused = optimizer.defaults["fused"]
        state = {**state, "param_groups": [{**group, "fused": fused} for group in state["param_groups"]]}
    optimizer.load_state_dict(state)


class SegmentRNN:
    """The learner's path for torch's own GRUCell or LSTMCell core, on every device: it replaces this
    model instance's core_over_rollout (its state_dict and every other method unchanged) with the
    same numbers in one nn.GRU/nn.LSTM call on the cell's own weights, over the rollout cut into
    episode segments: a few steps of many segments instead of T steps of B trajectories (doom_basic's
    GRU, forward and backward on one CPU thread: 94 ms against 153 for the loop of 2026-12-04 at
    6-step episodes, 160 against 152 at 45-step ones; a few cuDNN kernels instead of a dozen a step
    on a GPU). Where it would not compute what the model's own loop computes (a cell of your own, an
    edited core_step) the loop trains: `for_model` checks.

    The segments are planned from the batch's host copy of the dones (BatchBuffers' "done_host",
    handed over by `use`), so nothing is read from the device. A minibatch's dones are a view of the
    batch's, and their offset in it names their columns; dones that are not such a view (the loss
    called outside sgd_update) take the model's loop."""

    def __init__(self, model: nn.Module):
        self.model, self.loop, cell = model, model.core_over_rollout, model.core
        self.lstm = type(cell) is nn.LSTMCell
        # a module of its own, not registered with the model: the cell's weights stay its only parameters
        # and state_dict keys. On a GPU a call may repack them in place into one cuDNN buffer
        # (flatten_parameters): the same values and keys
        self.rnn = (nn.LSTM if self.lstm else nn.GRU)(cell.input_size, cell.hidden_size, device="meta")
        self.dones, self.dones_host = None, None

    @classmethod
    def for_model(cls, model: nn.Module) -> "SegmentRNN | None":
        """One for `model` where it computes the model's own core_over_rollout (torch's own cell under
        the model's core_step: checked on random inputs, so an edit of either keeps the loop); else
        None, and the model's loop trains. The check compares the gradients too, of the features and
        of every parameter: an edit of core_step that adds nothing at the start (a skip or an adapter
        initialised to zero) gives the loop's outputs, but only the loop trains its weights."""
        if not hasattr(model, "core_over_rollout") or type(getattr(model, "core", None)) not in (nn.GRUCell,
                                                                                                nn.LSTMCell):
            return None
        segments = cls(model)
        generator = torch.Generator().manual_seed(0)
        steps, batch, cell = 6, 3, model.core
        dones = (torch.rand(steps, batch, generator=generator) < 0.3).float()
        features = torch.randn(batch * steps, cell.input_size, generator=generator)
        state = torch.randn(batch, cell.hidden_size * (2 if segments.lstm else 1), generator=generator)
        device = cell.weight_ih.device
        segments.use(dones.to(device), dones.numpy())
        features, state = features.to(device).requires_grad_(), state.to(device)
        wrt = [features, *(p for p in model.parameters() if p.requires_grad)]
        try:
            ours, loops = segments(features, state, segments.dones), segments.loop(features, state, segments.dones)
            if ours.shape != loops.shape or not torch.allclose(ours, loops, rtol=1e-4, atol=1e-5):
                return None
            upstream = torch.randn(ours.shape, generator=generator).to(device)
            gradients = [torch.autograd.grad(outputs, wrt, upstream, allow_unused=True) for outputs in (ours, loops)]
        except Exception:  # a core_step that wants another state layout, say
            return None
        finally:
            segments.use(None, None)
        for a, b, of in zip(*gradients, wrt):
            if not torch.allclose(torch.zeros_like(of) if a is None else a, torch.zeros_like(of) if b is None else b,
                                  rtol=1e-4, atol=1e-5):
                return None
        return segments

    def install(self) -> "SegmentRNN":
        object.__setattr__(self.model, "core_over_rollout", self)
        return self

    @staticmethod
    def path(model: nn.Module) -> str:
        """What trains the model's recurrent core, in words (a line at the run's start)."""
        if SegmentRNN.for_model(model) is not None:
            return f"{'nn.LSTM' if type(model.core) is nn.LSTMCell else 'nn.GRU'} over episode segments (SegmentRNN)"
        return "the model's own core_over_rollout (a loop of core_step)" if hasattr(model, "core") else "none"

    def use(self, dones: torch.Tensor, dones_host: np.ndarray | None):
        """The next batch's dones [T+1, B], on the device and their host copy (None: loop)."""
        self.dones, self.dones_host = dones, dones_host

    def host_copy(self, dones: torch.Tensor) -> np.ndarray | None:
        """The host copy of `dones` if they are columns of the batch's, else None."""
        full = self.dones
        if (self.dones_host is None or dones.shape[0] != full.shape[0] or dones.stride() != full.stride()
                or dones.untyped_storage().data_ptr() != full.untyped_storage().data_ptr()):
            return None
        start, rest = divmod(dones.storage_offset() - full.storage_offset(), full.stride(1))
        if rest or start < 0 or start + dones.shape[1] > full.shape[1]:
            return None
        return self.dones_host[:, start:start + dones.shape[1]]

    def __call__(self, features: torch.Tensor, first_rnn_state: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        """core_over_rollout's numbers: trajectory-major features [B * T, hidden] -> the RNN's outputs
        [T, B, hidden]. Each trajectory's first segment starts from its saved state, every later one
        (after a done) from zeros, as the loop's reset does. The segments run packed (torch's
        PackedSequence: each step runs only the segments still going, so the rows are the loop's)."""
        dones_host = self.host_copy(dones)
        if dones_host is None:
            return self.loop(features, first_rnn_state, dones)
        steps, batch = dones_host.shape
        plan = rnn_segments(dones_host)
        index = torch.from_numpy(plan.index)
        if features.device.type == "cuda":  # from pinned memory: a pageable copy would wait for the stream
            index = index.pin_memory().to(features.device, non_blocking=True)
        gather, scatter, sorted_indices, unsorted_indices = index.split([steps * batch] * 2 + [plan.num_segments] * 2)

        def initial(state):  # [1, segments, hidden]: the saved states, then zeros
            return torch.cat([state, state.new_zeros(plan.num_segments - batch, state.shape[1])]).unsqueeze(0)

        if self.lstm:
            hx = tuple(initial(half) for half in first_rnn_state.chunk(2, dim=1))  # [hidden, cell], as core_step
        else:
            hx = initial(first_rnn_state)
        weights = {f"{name}_l0": getattr(self.model.core, name)
                   for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
        # batch_sizes stays on the host, as torch wants it; the RNN orders hx by sorted_indices itself
        inputs = nn.utils.rnn.PackedSequence(features.index_select(0, gather), torch.from_numpy(plan.batch_sizes),
                                             sorted_indices, unsorted_indices)
        outputs, _ = torch.func.functional_call(self.rnn, weights, (inputs, hx))
        return outputs.data.index_select(0, scatter).view(steps, batch, -1)


class SegmentPlan(typing.NamedTuple):
    """rnn_segments' answer, as torch's PackedSequence lays the segments out: time first, at each
    step the segments still going, longest first. `index`: the gather index [T * B] (packed row ->
    trajectory-major row b * T + t), the scatter index [T * B] (where step t of trajectory b, in
    [T, B] order, finds its output among the packed ones), then the sorted indices (position ->
    segment, longest first) and their inverse, [num_segments] each. `batch_sizes` [max_len]: the
    segments going at each step."""
    index: np.ndarray
    max_len: int
    num_segments: int
    batch_sizes: np.ndarray


def rnn_segments(dones: np.ndarray) -> SegmentPlan:
    """Cuts trajectories [T, B] into episode segments, on the host: one starts at t = 0 and at every
    t whose dones[t - 1] is set. Segments 0..B-1 are the trajectories' first (in trajectory order),
    the later ones follow."""
    steps, batch = dones.shape
    starts = np.ones((batch, steps), dtype=bool)
    starts[:, 1:] = dones.T[:, :-1] > 0
    starts = starts.ravel()  # trajectory-major rows; every trajectory's row 0 starts one
    start_rows = np.flatnonzero(starts)
    segment_of_row = np.cumsum(starts) - 1  # in row order
    first = start_rows % steps == 0
    order = np.concatenate([np.flatnonzero(first), np.flatnonzero(~first)])
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    lengths = np.diff(start_rows, append=steps * batch)[order]
    num_segments, max_len = len(order), int(lengths.max())
    by_length = np.argsort(-lengths, kind="stable")  # sorted position -> segment
    sorted_rank = np.empty_like(by_length)
    sorted_rank[by_length] = np.arange(num_segments)
    batch_sizes = (lengths[None, :] > np.arange(max_len)[:, None]).sum(axis=1)
    step_start = np.concatenate([[0], np.cumsum(batch_sizes)[:-1]])
    packed_step = np.repeat(np.arange(max_len), batch_sizes)  # each packed row's step in its segment
    gather = start_rows[order][by_length[np.arange(steps * batch) - step_start[packed_step]]] + packed_step
    rows = np.arange(steps * batch)
    position = step_start[rows - start_rows[segment_of_row]] + sorted_rank[rank[segment_of_row]]
    scatter = position.reshape(batch, steps).T
    index = np.concatenate([gather, scatter.ravel(), by_length, sorted_rank]).astype(np.int64)
    return SegmentPlan(index, max_len, num_segments, batch_sizes.astype(np.int64))


class Learner:
    def __init__(self, policy_id: int, cfg, shared: Shared, spaces_pair):
        # a copy: population-based training changes this policy's learning rate and exploration coefficient
        self.policy_id, self.cfg, self.shared = policy_id, argparse.Namespace(**vars(cfg)), shared
        self.device = torch.device(cfg.device)
        self.model = compiled_encoder(make_model(*spaces_pair, cfg).to(self.device), cfg, fixed_shapes=True)
        self.optimizer = make_optimizer(self.model, cfg)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # the learner's shapes never change: tune the convolutions once
            rnn_in_full_float32()
        # torch's own cell trains over episode segments, planned from the batch's host copy of its dones
        self.segments = SegmentRNN.for_model(self.model)
        if self.segments is not None:
            self.segments.install()
        self.policy_version, self.env_frames = 0, 0
        checkpoint = load_latest_checkpoint(cfg, policy_id, quiet=True)  # the runner has warned already
        if checkpoint is None:  # version 0: the weights the runner drew and the policy workers act with
            shared.weights[policy_id].load_into(self.model)
        else:
            self.model.load_state_dict(checkpoint["model"])
            load_optimizer_state(self.optimizer, checkpoint["optimizer"])
            self.policy_version, self.env_frames = checkpoint["policy_version"], checkpoint["env_frames"]
            print(f"policy {policy_id} resumed from policy version {self.policy_version}, "
                  f"{self.env_frames:,} env frames ({checkpoint['path']})", flush=True)
        for extra in EXTRAS:
            extra.learner_start(self)
        self.batches: queue.Queue = queue.Queue(maxsize=1)
        self.slots_per_batch = trajectories_per_batch(cfg)
        self.slot_specs = rollout_buffer_specs(*spaces_pair, cfg)  # its group's fields of the slots
        self.frozen = policy_id in frozen_policies(cfg)  # --frozen_policies: it acts, and never trains
        # on the device, read when a report is due (sgd_step)
        self.skipped_steps = self.nonfinite_in_a_row = torch.zeros((), device=self.device)
        self.last_save, self.next_stats_at = time.monotonic(), 0.0
        self.times = StageTimes("wait", "copy", "sgd", "publish",
                                gpu_stages=("sgd",) if self.device.type == "cuda" else ())
        self.buffer_sets: list[BatchBuffers] = []  # take_batch's, made at the first batch
        self.batches_taken = 0
        self.batcher_stop = threading.Event()
        self.learner_waiting = threading.Event()  # the learner wants a batch: copy one out

    def batching(self) -> bool:
        return not (self.batcher_stop.is_set() or self.shared.run.should_stop())

    def batcher(self):
        """Background thread: collects finished slots, copies them out, frees them, queues the batch.

        It copies a batch out only when the learner asks for one: while the learner trains, the
        next batch's slots stay taken, and with the slot budget of create_shared the rollout
        workers then wait for free slots instead of running ahead. So the learner trains on data
        acted by the weights of one or two versions ago, however slow it is. The price is the
        copy, a few milliseconds a batch, on the learner's critical path.
        """
        use_device(self.device)  # a thread's current device is its own
        pending = []
        try:
            while self.batching():
                try:
                    if not self.collect(pending, timeout=0.5):
                        continue
                except appo_ipc.Closed:
                    return
                while self.batching() and not self.learner_waiting.wait(timeout=0.5):
                    pass
                if not self.batching():
                    return
                if not self.cfg.async_rl and len(pending := self.fresh(pending)) < self.slots_per_batch:
                    continue
                batch, pending = self.take_batch(pending), []
                self.learner_waiting.clear()
                while self.batching():  # the learner is waiting on the empty queue, unless its wait just timed out
                    try:
                        self.batches.put(batch, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        finally:  # at the end every slot is free or with a rollout worker (bench/chaos.py counts them)
            if pending:
                self.shared.slots.control.release(pending)

    def collect(self, pending: list[int], timeout: float) -> bool:
        """Adds to `pending` the finished slots in this learner's queue (waiting up to `timeout` for
        some), up to a batch, each claimed from its worker; True when `pending` holds a batch. The
        batcher's step, and --serial_mode's."""
        try:
            messages = self.shared.learner_queues[self.policy_id].get_many(
                max_messages=self.slots_per_batch - len(pending), timeout=timeout)
        except queue.Empty:
            return False
        pending += self.claim(messages)
        return len(pending) == self.slots_per_batch

    def fresh(self, pending: list[int]) -> list[int]:
        """--no-async_rl: a batch holds only slots acted from their first step by the weights it
        will be trained by (the learner waits, so its version is final). The one kind that can be
        older is a slot begun by a rollout worker restarted after its predecessor had handed its
        share, before the learner published: it is freed unused, and its actors are not parked
        (SyncGate counts a slot by its first step's weights), so their share at the new weights
        still comes. Kept, it would shift every later batch by a slot, each a version behind."""
        first_step_versions = self.shared.slots.fields(self.slot_specs)[0]["policy_version"][pending, 0]
        stale = [slot for slot, version in zip(pending, first_step_versions) if version < self.policy_version]
        self.shared.slots.control.release(stale)
        return [slot for slot in pending if slot not in stale]

    def claim(self, handed_off: list[tuple[int, int, int]]) -> list[int]:
        """Takes the slots that rollout workers handed off, each from the worker that sent it and in
        the life it was sent in: a slot whose worker died since was reclaimed (and maybe taken
        again) by the runner, and is skipped."""
        control, owner = self.shared.slots.control, learner_owner(self.cfg, self.policy_id)
        return [slot for slot, generation, worker in handed_off
                if control.transfer(slot, worker, generation, owner)]

    def take_batch(self, slot_indices: list[int]) -> dict[str, torch.Tensor]:
        """Copies the slots' trajectories out, once, into one of this learner's two sets of batch
        buffers (pinned, then one non-blocking copy each to the GPU if there is one), frees the
        slots and returns the batch, time first. Of the RNN states only steps 0 and T travel: the
        loss starts from step 0's, GAE's bootstrap from step T's.

        The batcher fills buffers only while the learner waits for a batch, so a set is never
        refilled under a step reading it; the second set covers the one batch the batcher may
        copy ahead (the learner's wait timed out just as a batch was being handed over)."""
        with self.times("copy"):
            index, tensors = torch.as_tensor(slot_indices, dtype=torch.long), self.shared.slots.fields(self.slot_specs)[1]
            if not self.buffer_sets or self.buffer_sets[0].host["done"].shape[0] != len(index):
                dones_on_host = self.segments is not None  # then a batch brings its dones on the host too
                self.buffer_sets = [BatchBuffers(tensors, len(index), self.device, dones_on_host) for _ in range(2)]
            buffers = self.buffer_sets[self.batches_taken % 2]
            self.batches_taken += 1
            batch = buffers.fill(tensors, index)
            self.shared.slots.control.release(slot_indices)
        return batch

    def next_batch(self, timeout: float):
        self.learner_waiting.set()
        batch = self.batches.get(timeout=timeout)
        self.learner_waiting.clear()  # the batcher copies into a set of buffers only while the learner waits
        return batch

    def train_step(self, batch, report: bool = True) -> dict:
        for extra in EXTRAS:
            extra.before_sgd(self)
        self.apply_lr_schedule()
        with self.times("sgd"):  # a frozen policy's batches count, and teach it nothing
            stats = {} if self.frozen else self.sgd_step(batch, report)
        for extra in EXTRAS:
            extra.after_sgd(self)
        self.policy_version += 1
        self.env_frames += samples_per_iteration(self.cfg) * self.cfg.env_frameskip * self.cfg.world_size  # all ranks
        with self.times("publish"):
            self.shared.weights[self.policy_id].publish(self.model, self.policy_version)
        self.shared.run.learner_frames[self.policy_id] = self.env_frames
        self.shared.run.learner_version[self.policy_id] = self.policy_version
        return stats

    def apply_lr_schedule(self):
        learning_rate = scheduled_learning_rate(self.cfg, self.env_frames)
        for group in self.optimizer.param_groups if learning_rate is not None else []:
            group["lr"] = learning_rate

    def sgd_step(self, batch, report: bool = True) -> dict:
        """sgd_update on the batch, counting the steps it skipped as non-finite. With `report`
        returns the last step's loss stats, the skipped steps so far and the learning rate the
        steps took (with --lr_schedule linear_decay it falls; TensorBoard shows it), all read
        back in one go, and stops the run after too many skipped steps in a row; else {}."""
        steps = self.cfg.num_epochs * self.cfg.num_batches_per_epoch
        batch = dict(batch)
        dones_host = batch.pop("done_host", None)  # BatchBuffers' host copy, for SegmentRNN
        if self.segments is not None:
            self.segments.use(batch["done"], dones_host)
        aux, skipped = sgd_update(self.model, self.optimizer, batch, self.policy_version, self.cfg)
        self.skipped_steps = self.skipped_steps + skipped
        # a batch whose every step was skipped extends the run of skipped steps; any step taken ends it
        self.nonfinite_in_a_row = (self.nonfinite_in_a_row + skipped) * (skipped == steps)
        if not report:
            return {}
        stats = loss_stats(self.model, aux, self.cfg)
        read_back = [*stats.values(), self.skipped_steps, self.nonfinite_in_a_row]  # a forker's stats may be floats
        *values, skipped_steps, in_a_row = torch.stack([torch.as_tensor(value, dtype=torch.float32, device=self.device)
                                                        for value in read_back]).tolist()
        stats = dict(zip(stats, values))
        if in_a_row >= MAX_NONFINITE_STEPS:
            raise NonFiniteLoss(
                f"learner {self.policy_id}: {MAX_NONFINITE_STEPS} steps in a row had a non-finite loss "
                f"({in_a_row:.0f} when it read the count; last: "
                f"{', '.join(f'{name} {stats[name]}' for name in ('loss', 'value_loss', 'grad_norm') if name in stats)}). "
                "Likely causes: NaN or Inf in the env's rewards or observations, rewards too large for the "
                "critic (scale them down), or a learning rate too high. The last checkpoint has the last "
                "good weights.")
        return {**stats, "skipped_steps": int(skipped_steps), "learning_rate": self.optimizer.param_groups[0]["lr"]}

    def checkpoint_state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "policy_version": self.policy_version, "env_frames": self.env_frames,
                "cfg": {k: v for k, v in vars(self.cfg).items() if plain_value(v)}}

    def save(self):
        if self.cfg.rank != 0:  # under torchrun, rank 0 writes the checkpoints
            return
        try:
            save_checkpoint(self.cfg, self.policy_id, self.checkpoint_state())
        except OSError as error:  # a full disk must not end a long run; the last checkpoint stays valid
            print(f"error: could not save checkpoint of policy {self.policy_id}: {error}", flush=True)

    def run(self, process_index: int):
        parent = os.getppid()
        self.shared.run.learner_frames[self.policy_id] = self.env_frames
        self.shared.run.learner_version[self.policy_id] = self.policy_version
        batcher = threading.Thread(target=self.batcher, daemon=True)
        batcher.start()
        try:
            self.train_loop(process_index, parent)
        finally:
            # The process must not exit while the batcher is inside a torch copy: that aborts
            # the interpreter ("terminate called without an active exception").
            self.batcher_stop.set()
            batcher.join(timeout=10.0)
        self.save()
        for extra in EXTRAS:
            extra.learner_stop(self)

    def train_and_report(self, batch: dict[str, torch.Tensor]):
        """One training step, its time and (when due) its statistics to the runner, and a
        checkpoint when one is due."""
        start = time.perf_counter()
        report = start >= self.next_stats_at
        if report:
            self.next_stats_at = start + LEARNER_STATS_EVERY_S
        stats = self.train_step(batch, report)
        self.shared.stats_queue.put({"type": "learner", "policy_id": self.policy_id,
                                     "train_s": time.perf_counter() - start, "stages": self.times.take(),
                                     "policy_version": self.policy_version, **stats})
        if time.monotonic() - self.last_save > self.cfg.save_every_sec:
            self.save()
            self.last_save = time.monotonic()

    def train_loop(self, process_index: int, parent: int):
        while True:
            self.shared.run.beat(process_index)
            stop = self.shared.run.should_stop() or not parent_alive(parent)
            batch = None
            if not stop:
                copy, wait = self.times("copy"), self.times("wait")
                copied_before = copy.seconds
                try:
                    with wait:
                        batch = self.next_batch(timeout=0.5)
                except queue.Empty:
                    continue
                finally:  # the batcher copies while the learner waits: that part counts as copying
                    wait.seconds -= copy.seconds - copied_before
            for extra in EXTRAS:  # torchrun: every rank trains this step, or every rank stops
                stop = extra.stop_now(self, stop)
            if stop:
                return
            self.train_and_report(batch)


def learner_main(policy_id: int, process_index: int, cfg, shared: Shared, spaces_pair):
    child_process_setup("learner", cfg.learner_threads, stack_file=stack_path(cfg, process_index),
                        seed=(cfg.seed, process_index))
    use_device(cfg.device)
    try:
        Learner(policy_id, cfg, shared, spaces_pair).run(process_index)
    except NonFiniteLoss as error:
        print(f"error: {error}", flush=True)
        sys.exit(3)
    except RuntimeError as error:
        if cfg.world_size == 1:
            raise
        # under torchrun: another rank died (its connection closed) or stayed silent too long
        print(f"error: rank {cfg.rank}'s learner lost the other ranks ({str(error).splitlines()[0]})", flush=True)
        sys.exit(4)
    finally:
        for weights in shared.weights:
            weights.release()


# =============================================================================================
# PLUMBING: runner: probes the env, spawns and supervises everything, prints status, writes
# summaries, stops cleanly
# =============================================================================================

# The runner's seams. An extra (TensorBoard, PBT, torchrun, evaluation: the EXTRAS blocks below
# the core) attaches here as an env family attaches to env.py: a class with its flags, their checks
# and what it does at the runner's moments, registered with one `EXTRAS.append(...)` line.

class Extra:
    """One optional part of the trainer. Every method is optional. The runner makes one of each
    registered class when the run starts (the shared state made, no child started yet) and calls
    it every round of its loop, whenever a report is due, and once when the run stops. Learners
    call `learner_start`, `before_sgd`, `after_sgd` and `learner_stop` in their own processes (in this one with
    --serial_mode), so those are static: what they keep, they keep on the learner."""

    mode: str | None = None  # a --mode of its own, e.g. "eval", run by main(cfg) instead of training
    mode_help = ""

    @staticmethod
    def main(cfg) -> int:
        """Its --mode: returns the exit code."""
        return 0

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        """Declares its flags, in an argument group of its own."""

    @staticmethod
    def flag_errors(cfg) -> list[str]:
        """Its checks of the flags, before anything starts."""
        return []

    @staticmethod
    def learner_start(learner: "Learner") -> None:
        """In a learner, once its model and optimiser exist (resumed from the checkpoint, if any)."""

    @staticmethod
    def stop_now(learner: "Learner", stop: bool) -> bool:
        """In a learner, with a batch in hand or its stop due: whether to stop instead of training
        (`stop` is the learner's own answer)."""
        return stop

    @staticmethod
    def before_sgd(learner: "Learner") -> None:
        """In a learner, before each training step."""

    @staticmethod
    def after_sgd(learner: "Learner") -> None:
        """In a learner, after each training step, before it publishes the weights."""

    @staticmethod
    def learner_stop(learner: "Learner") -> None:
        """In a learner, after its final checkpoint."""

    @staticmethod
    def scalars(run: "Run") -> dict[str, float]:
        """Figures it adds to each report's summaries (TensorBoard tag -> value)."""
        return {}

    def __init__(self, run: "Run"):
        """The run starts."""

    def round(self, run: "Run") -> None:
        """Every round of the runner's loop (10 a second)."""

    def report(self, run: "Run") -> None:
        """Every --report_every_sec, after the status line."""

    def stop(self, run: "Run") -> None:
        """The run ends (its workers stopped, its final status line printed), however it ends."""


EXTRAS: list[type[Extra]] = []  # filled in by the EXTRAS blocks below the core, in their order


@dataclass
class Run:
    """A training run as the runner's moments see it."""
    cfg: argparse.Namespace
    seed_drawn: bool
    shared: Shared
    model: ActorCritic  # a CPU copy that never trains: scratch space for an extra that loads weights
    stats: Stats
    workers: "Supervisor | SerialRun"
    start: float = 0.0
    elapsed: float = 0.0
    exit_code: int = 0
    result: "TrainResult | None" = None  # what train() returns; reporting fills in its figures


@dataclass
class EnvProbe:
    """What the runner learns from one env before starting anything."""
    spaces: tuple[spaces.Space, spaces.Space]    # (observation space, action space)
    num_agents: int
    reward_shaping: dict[str, float] | None      # the env's default shaping weights, if it has any
    agent_names: list[str] = dataclasses.field(default_factory=list)  # in the order of the env's lists
    agent_spaces: list[tuple[spaces.Space, spaces.Space]] = dataclasses.field(default_factory=list)  # each agent's

    def __post_init__(self):
        self.agent_spaces = self.agent_spaces or [self.spaces] * self.num_agents


def probe_env(cfg) -> EnvProbe:
    with engine_output_to(engine_log_path(cfg, "probe")):
        probe = make_env(cfg, env_index=0)
        try:
            return EnvProbe((probe.observation_space, probe.action_space), probe.num_agents,
                            envs.reward_shaping_weights(probe.env), envs.get_agent_names(probe.env),
                            probe.agent_spaces)
        finally:
            probe.close()


def num_processes(cfg) -> int:
    return cfg.num_policies + num_acting_policies(cfg) * cfg.policy_workers_per_policy + cfg.num_workers


class Stats:
    """What the runner knows: frame counts over time, recent episodes, learner and timing stats."""

    def __init__(self, num_policies: int):
        # the runner samples every 0.1 s: 4000 entries cover the status line's 300-s window
        self.frame_history = deque(maxlen=4000)  # (time, total frames collected)
        self.policy_frame_history = deque(maxlen=4000)  # (time, frames each policy trained on)
        self.episode_returns = [deque(maxlen=100) for _ in range(num_policies)]
        self.episode_lengths = [deque(maxlen=100) for _ in range(num_policies)]
        # what population-based training ranks by: e.g. 1 for a won duel, 0 otherwise (the return
        # counts frags; the training reward is shaped)
        self.episode_objectives = [deque(maxlen=100) for _ in range(num_policies)]
        self.separate_objective = False  # whether a game's objective ever differed from its return (duels)
        self.learner = [{} for _ in range(num_policies)]
        self.busy_s = {"env": 0.0, "inference": 0.0, "learner": 0.0}  # summed over processes
        # (kind, stage) -> seconds: where a kind's time goes, e.g. ("learner", "sgd"), ("inference", "forward")
        self.stage_s = Counter()
        self.busy_s_at_last_report, self.last_report_time = dict(self.busy_s), time.monotonic()
        self.stage_s_at_last_report = Counter()
        self.acted = Counter()  # policy workers' "samples" and "batches": their mean batch
        self.acted_at_last_report = Counter()
        self.mean_batch: float | None = None  # the policy workers' mean batch since the last report
        # the last report's shares of each kind's time, busy and per stage (TensorBoard writes them too)
        self.busy_shares: dict[str, float] = {}
        self.stage_shares: dict[tuple[str, str], float] = {}
        self.num_episodes = 0
        self.env_faults, self.restarts, self.skipped_steps = 0, 0, 0
        self.silent: dict[str, float] = {}  # the Supervisor's silent learners: name -> seconds

    def consume(self, message: dict):
        kind = message.pop("type")
        if kind == "episode":
            self.episode_returns[message["policy_id"]].append(message["true_return"])
            self.episode_lengths[message["policy_id"]].append(message["true_length"])
            self.episode_objectives[message["policy_id"]].append(message["true_objective"])
            self.separate_objective |= message["true_objective"] != message["true_return"]
            self.num_episodes += 1
        elif kind == "learner":  # the loss statistics come only every LEARNER_STATS_EVERY_S: keep the last
            self.add_stages("learner", message.pop("stages", {}))
            self.learner[message["policy_id"]].update(message)
            self.busy_s["learner"] += message["train_s"]
        elif kind == "env_fault":
            self.env_faults += 1
        elif kind == "timing":
            self.busy_s[message["component"]] += message["busy_s"]
            self.add_stages(message["component"], message.get("stages", {}))
            self.acted.update(message.get("acted", {}))

    def add_stages(self, kind: str, stages: dict[str, float]):
        for stage, seconds in stages.items():
            self.stage_s[kind, stage] += seconds

    def fps(self, window: float) -> float:
        """Env frames collected per second over the last `window` seconds."""
        return self.rate(self.frame_history, window)

    def policy_fps(self, policy_id: int, window: float) -> float:
        """Env frames per second that policy `policy_id`'s learner trained on."""
        return self.rate([(then, frames[policy_id]) for then, frames in self.policy_frame_history], window)

    @staticmethod
    def rate(history, window: float) -> float:
        if len(history) < 2:
            return 0.0
        now, frames = history[-1]
        for then, frames_then in history:
            if now - then <= window:
                return (frames - frames_then) / max(now - then, 1e-6)
        return 0.0

    def busy_fractions(self, cfg) -> dict[str, float]:
        """Share of each kind of process's time spent working since the last call (the rest is
        waiting): env stepping in rollout workers, forward passes in policy workers, SGD in learners.
        In serial mode, the share of the one process's time."""
        now = time.monotonic()
        interval = max(now - self.last_report_time, 1e-6)
        processes = {"env": cfg.num_workers, "inference": num_acting_policies(cfg) * cfg.policy_workers_per_policy,
                     "learner": cfg.num_policies}
        if cfg.serial_mode:
            processes = dict.fromkeys(processes, 1)
        # Processes report their busy time every ~2 s (a learner after each step), so a report can
        # cover time before this interval and a process busy throughout would read above 100%.
        # Capped; over many intervals the shares are unchanged.
        fractions = {kind: min(1.0, (self.busy_s[kind] - self.busy_s_at_last_report[kind]) / (interval * processes[kind]))
                     for kind in self.busy_s}
        stages = {(kind, stage): min(1.0, (seconds - self.stage_s_at_last_report[kind, stage]) / (interval * processes[kind]))
                  for (kind, stage), seconds in self.stage_s.items()}
        self.busy_s_at_last_report, self.stage_s_at_last_report, self.last_report_time = \
            dict(self.busy_s), Counter(self.stage_s), now
        self.busy_shares, self.stage_shares = fractions, stages
        acted = self.acted - self.acted_at_last_report
        self.mean_batch = acted["samples"] / acted["batches"] if acted["batches"] else None
        self.acted_at_last_report = Counter(self.acted)
        return fractions


@dataclass
class Child:
    """One process the runner started, and what it takes to start it again."""
    name: str
    kind: str                  # "learner", "policy worker" or "rollout worker"
    index: int                 # its heartbeat entry
    target: Callable
    args: tuple
    worker_id: int = -1        # rollout workers: the owner id of their slots
    process: multiprocessing.Process | None = None

    started_ns: int = 0        # when it was last started: its heartbeat until its first own beat

    def start(self, context, run: RunState):
        self.started_ns = time.monotonic_ns()
        run.heartbeat[self.index] = self.started_ns  # its silence counts from now
        self.process = context.Process(target=self.target, args=self.args, daemon=True)
        self.process.start()
        run.pids[self.index] = self.process.pid


def make_children(cfg, shared: Shared) -> list[Child]:
    children, index = [], 0
    for policy_id in range(num_acting_policies(cfg)):
        if policy_id < cfg.num_policies:  # the past versions have no learner
            children.append(Child(f"learner {policy_id}", "learner", index, learner_main,
                                  (policy_id, index, cfg, shared, shared.groups.policy_spaces(policy_id))))
            index += 1
        serves = "past versions" if policy_id == past_policy_id(cfg) else f"policy {policy_id}"
        for _ in range(cfg.policy_workers_per_policy):
            children.append(Child(f"policy worker {index} ({serves})", "policy worker", index, policy_worker_main,
                                  (policy_id, index, cfg, shared, shared.groups.policy_spaces(policy_id))))
            index += 1
    # Rollout workers never read the weights; on a GPU each process that unpickles them maps them
    # through CUDA IPC and so starts a CUDA context of its own (GPU memory and seconds of start-up).
    without_weights = dataclasses.replace(shared, weights=[])
    for worker_id in range(cfg.num_workers):
        children.append(Child(f"rollout worker {worker_id}", "rollout worker", index, rollout_worker_main,
                              (worker_id, index, cfg, without_weights), worker_id=worker_id))
        index += 1
    return children


def stop_child(child: Child) -> bool:
    """Ends one child for good, whatever state it is in; False if it is still alive after that."""
    if child.kind == "rollout worker":
        kill_process_group(child.process.pid)  # with the env processes it started
    if child.process.is_alive():  # a rollout worker that had not made its own group yet, or another child
        child.process.kill()
    child.process.join(timeout=5.0)
    return not child.process.is_alive()


class Supervisor:
    """Restarts dead or silent workers; says why the run must stop when that is the answer."""

    RESTART_WINDOW_S = 600.0
    # Starting (building the model, making the envs, compiling) is not an env step: a child gets at
    # least this long before its first heartbeat whatever --env_step_timeout says, or on a loaded
    # machine a short timeout restarts healthy workers as they start, again and again.
    START_UP_S = 60.0
    # A learner beats between steps and while it waits for a batch, and a step can be long (the first
    # compiles under --compile; a checkpoint is written between steps): silent this long, it is hung.
    # At half of it the runner warns, with its stack. Its state cannot be restarted: the run stops.
    LEARNER_SILENCE_S = 300.0

    def __init__(self, cfg, shared: Shared, children: list[Child], context):
        self.cfg, self.shared, self.children, self.context = cfg, shared, children, context
        self.recent_restarts: deque = deque()
        self.num_restarts = 0
        self.silent: dict[str, float] = {}  # learners silent past half their allowance, shown on the status line

    def start_all(self):
        for child in self.children:
            child.start(self.context, self.shared.run)

    def check(self) -> str | None:
        """One look at every child: None while training can go on, else the reason to stop."""
        now_ns = time.monotonic_ns()
        for child in self.children:
            if child.process.is_alive():
                beat = int(self.shared.run.heartbeat[child.index])
                silent_s = (now_ns - beat) / 1e9
                allowed_s = (max(self.cfg.env_step_timeout, self.START_UP_S) if beat == child.started_ns
                             else self.cfg.env_step_timeout)
                if child.kind == "learner":
                    allowed_s = max(self.cfg.env_step_timeout, self.LEARNER_SILENCE_S)
                    if silent_s < allowed_s / 2:
                        self.silent.pop(child.name, None)
                        continue
                    if child.name not in self.silent:
                        print(f"warning: {child.name} (pid {child.process.pid}) has sent no heartbeat for "
                              f"{silent_s:.0f} s, inside one step; the run stops if it stays silent for "
                              f"{allowed_s:.0f} s. Its Python stack: {self.stack(child)}", flush=True)
                    self.silent[child.name] = silent_s
                if silent_s < allowed_s:
                    continue
                problem = f"sent no heartbeat for {silent_s:.0f} s " + (
                    "(hung)" if child.kind == "learner" else f"(--env_step_timeout {self.cfg.env_step_timeout:g})")
                stack = f"; its Python stack: {self.stack(child)}" if child.kind != "rollout worker" else ""
            else:
                problem, stack = f"died (exit code {child.process.exitcode})", ""
            if child.kind == "learner":
                checkpoints = checkpoint_dir(self.cfg, child.args[0])
                return f"{child.name} {problem}; its last checkpoint is in {checkpoints}{stack}"
            now = time.monotonic()
            self.recent_restarts.append(now)
            while self.recent_restarts[0] < now - self.RESTART_WINDOW_S:
                self.recent_restarts.popleft()
            if len(self.recent_restarts) > self.cfg.max_restarts:
                return (f"{child.name} {problem}: more than --max_restarts {self.cfg.max_restarts} restarts in "
                        f"{self.RESTART_WINDOW_S / 60:.0f} minutes, giving up (see the warnings above for causes)")
            engine_log = (f"; its envs' engine output is in {engine_log_path(self.cfg, f'rollout_worker_{child.worker_id}')}"
                          if child.kind == "rollout worker" else "")
            print(f"warning: {child.name} {problem}; restarting it{engine_log}{stack}", flush=True)
            if not self.restart(child):
                return f"{child.name} {problem} and is still alive after SIGKILL (stuck in the kernel?)"
        return None

    def stop(self):
        shutdown(self.shared, self.children)
        stop_fork_server()

    def stack(self, child: Child, wait_s: float = 2.0) -> str:
        """A learner's or policy worker's Python stack, every thread (faulthandler on SIGUSR1, see
        child_process_setup), or why there is none."""
        path, pid = stack_path(self.cfg, child.index), child.process.pid
        if process_state(pid) == "T":
            # Not signalled: a SIGUSR1 pending at SIGCONT runs faulthandler's all-threads dump while
            # every thread resumes at once, and that read of other threads' frames crashed (SIGSEGV).
            return (f"none: it is stopped (SIGSTOP or a debugger; py-spy dump --pid {pid} reads its stack where "
                    "py-spy is installed)")
        written = os.path.getsize(path) if os.path.exists(path) else 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if os.path.exists(path) and os.path.getsize(path) > written:
                time.sleep(0.2)  # the rest of it
                with open(path) as f:
                    f.seek(written)
                    return f"(also in {path})\n" + f.read().rstrip()
        return (f"none within {wait_s:g} s (one stuck outside Python: py-spy dump --pid {pid} "
                "reads it where py-spy is installed)")

    def restart(self, child: Child) -> bool:
        """Ends the child, frees what it held, starts it again; False if it would not end (then
        its slots stay its own: freed, they could be written by two processes)."""
        if not stop_child(child):
            return False
        self.num_restarts += 1
        if child.kind == "rollout worker":  # nothing answered or handed off for the dead process counts
            self.shared.slots.control.reclaim(child.worker_id)
            self.shared.slots.control.reset_splits(child.worker_id)
        else:  # the requests it had taken are lost: empty the queues, then every worker asks again
            for request_queue in self.shared.request_queues:
                drain(request_queue)
            self.shared.run.resend_epoch[0] += 1
        child.start(self.context, self.shared.run)
        return True


class SerialRun:
    """--serial_mode: the run's learners, policy workers and rollout workers as objects in this
    process, driven in turn by the runner's loop (SerialRun.check), with in-process queues. The
    same code as the parallel run minus the processes: a debugger stops anywhere in it, and with
    --seed two runs take the same steps. It stands in for the Supervisor (start_all, check, stop)."""

    num_restarts = 0  # nothing runs apart, so nothing is restarted or falls silent
    silent: dict[str, float] = {}

    def __init__(self, cfg, shared: Shared):
        # Engine output stays on the terminal here: a debugger writes through the file descriptor
        # that engine_output_to would point at a log file.
        self.cfg, self.shared, spaces_of = cfg, shared, shared.groups.policy_spaces
        self.learners = [Learner(policy_id, cfg, shared, spaces_of(policy_id)) for policy_id in range(cfg.num_policies)]
        self.policy_workers = [PolicyWorker(policy_id, cfg, shared, spaces_of(policy_id))
                               for policy_id in range(num_acting_policies(cfg))]
        self.rollout_workers = [RolloutWorker(worker_id, 0, cfg, shared) for worker_id in range(cfg.num_workers)]
        self.pending: list[list[int]] = [[] for _ in self.learners]  # finished slots per learner

    def start_all(self):
        for worker in self.rollout_workers:
            worker.start()

    def check(self) -> str | None:
        """One round, each step the one the processes take: each policy acts on every request, each
        split whose actions all arrived steps once and asks again, each learner trains on every
        complete batch. Like the Supervisor's, a reason to stop or None."""
        started = time.perf_counter()
        for policy_worker in self.policy_workers:
            policy_worker.serve(drain(policy_worker.requests))
        acted = time.perf_counter()
        for worker in self.rollout_workers:
            while (worked := worker.work(timeout=0)):
                pass
            if worked is False:
                return f"rollout worker {worker.worker_id} found no free slot"
        for component, busy_s in (("inference", acted - started), ("env", time.perf_counter() - acted)):
            self.shared.stats_queue.put({"type": "timing", "component": component, "busy_s": busy_s})
        for learner, pending in zip(self.learners, self.pending):
            while learner.collect(pending, timeout=0):
                learner.train_and_report(learner.take_batch(pending))
                pending.clear()
        return None

    def stop(self):
        for learner in self.learners:
            learner.save()
        for worker in self.rollout_workers:
            worker.close()
        shutdown(self.shared, [])


def frames_collected(cfg, shared: Shared) -> int:
    """Env frames collected so far: by this machine's workers, or under torchrun by every rank's."""
    if cfg.world_size > 1:
        return int(shared.run.all_ranks_frames[0])
    return int(shared.run.worker_frames.sum())


def experiment_frames(cfg, shared: Shared) -> int:
    """Env frames collected since the experiment began: what its checkpoints had trained when this
    run resumed, and this run's (the status line's frames and TensorBoard's step)."""
    return shared.resumed_frames + frames_collected(cfg, shared)


MOST_POLICIES_SHOWN = 2  # each one's figures on the status line; with more, their aggregate


def status_line(cfg, stats: Stats, shared: Shared, elapsed: float) -> str:
    frames = experiment_frames(cfg, shared)  # since the experiment began, as "trained"
    parts = [f"[{elapsed:7.0f}s] frames {frames:,}",
             "FPS 10s/60s/300s " + "/".join(f"{stats.fps(w):,.0f}" for w in (10, 60, 300)),
             f"samples/s {stats.fps(60) / cfg.env_frameskip:,.0f}"]
    if cfg.num_policies > MOST_POLICIES_SHOWN:
        parts.append(population_summary(cfg, stats))
    else:
        for policy_id in range(cfg.num_policies):
            parts += policy_parts(cfg, stats, shared, policy_id)
    busy = stats.busy_fractions(cfg)
    if any(busy.values()):
        parts.append("busy " + " ".join(f"{kind} {fraction:.0%}" for kind, fraction in busy.items()))
    if any(stats.stage_shares.values()):
        parts += stage_parts(stats.stage_shares, stats.mean_batch)
    skipped = sum(learner.get("skipped_steps", 0) for learner in stats.learner)
    if stats.env_faults or stats.restarts or skipped:
        parts.append(f"faults: env {stats.env_faults} restarts {stats.restarts} skipped steps {skipped}")
    if stats.silent:
        parts.append("silent " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in stats.silent.items()))
    budget = progress(cfg, stats, shared, elapsed)
    if budget:
        parts.append(budget)
    return " | ".join(parts)


def stage_parts(stage_shares: dict[tuple[str, str], float], mean_batch: float | None = None) -> list[str]:
    """Where each kind of process's time went, e.g. "learner wait 20% copy 3% sgd 70% publish 5%",
    and the policy workers' mean batch: the stage that fills a busy process is the one to make cheaper."""
    parts = []
    for kind in dict.fromkeys(kind for kind, _ in stage_shares):
        batch = f"batch {mean_batch:.0f} " if kind == "inference" and mean_batch is not None else ""
        parts.append(f"{kind} {batch}" + " ".join(f"{stage} {share:.0%}" for (of, stage), share in stage_shares.items()
                                                  if of == kind))
    return parts


def policy_parts(cfg, stats: Stats, shared: Shared, policy_id: int) -> list[str]:
    """One policy's figures on the status line: its FPS (of several), lag, frames trained, returns."""
    learner, returns = stats.learner[policy_id], stats.episode_returns[policy_id]
    prefix = f"p{policy_id} " if cfg.num_policies > 1 else ""
    parts = []
    if cfg.num_policies > 1:
        parts.append(f"{prefix}FPS {stats.policy_fps(policy_id, 60):,.0f}")
    if learner:  # a replaced objective may report no lag (docs/fork.md): the rest still shows
        lag = (f"lag {learner['lag_min']:.0f}/{learner['lag_avg']:.1f}/{learner['lag_max']:.0f} "
               if "lag_min" in learner else "")
        parts.append(f"{prefix}{lag}trained {int(shared.run.learner_frames[policy_id]):,}")
    if returns:
        parts.append(f"{prefix}avg return {np.mean(returns):.2f} ({len(returns)} ep)")
    if stats.episode_objectives[policy_id] and cfg.num_policies > 1:
        parts.append(f"{prefix}objective {np.mean(stats.episode_objectives[policy_id]):.2f}")
    return parts


def population_summary(cfg, stats: Stats) -> str:
    """Many policies in one part of the status line, as long for 3 as for 100: the highest lag, the
    best and the median average return, and the objective's where it is not the return (duels)."""
    parts = []
    lags = [learner["lag_max"] for learner in stats.learner if "lag_max" in learner]
    if lags:
        parts.append(f"lag max {max(lags):.0f}")
    returns = best_and_median(stats.episode_returns)
    if returns:
        parts.append(f"avg return {returns}")
    objectives = best_and_median(stats.episode_objectives) if stats.separate_objective else None
    if objectives:
        parts.append(f"objective {objectives}")
    return f"{cfg.num_policies} policies" + (": " + ", ".join(parts) if parts else "")


def best_and_median(histories: list[deque]) -> str | None:
    """`best 12.34 (p3) median 5.67`: the leading policy's mean and the median of the policies' means."""
    means = {policy_id: float(np.mean(history)) for policy_id, history in enumerate(histories) if history}
    if not means:
        return None
    leader = max(means, key=means.get)
    return f"best {means[leader]:.2f} (p{leader}) median {np.median(list(means.values())):.2f}"


def progress(cfg, stats: Stats, shared: Shared, elapsed: float) -> str | None:
    """Where the run stands against its budget: the share of --train_for_env_steps trained and the
    time left at the last minute's rate, or the time left of --train_for_seconds if that ends first."""
    left = []
    if cfg.train_for_seconds < UNLIMITED_SECONDS:
        left.append(max(0.0, cfg.train_for_seconds - elapsed))
    share = None
    if cfg.train_for_env_steps < UNLIMITED_FRAMES:
        trained = int(shared.run.learner_frames.min())
        share = min(1.0, trained / cfg.train_for_env_steps)
        rate = min(stats.policy_fps(policy_id, 60) for policy_id in range(cfg.num_policies))
        if rate > 0:
            left.append(max(0.0, (cfg.train_for_env_steps - trained) / rate))
    if share is None and not left:
        return None
    parts = [f"{share:.0%} of {cfg.train_for_env_steps:,}"] if share is not None else []
    if left:
        parts.append(f"{duration(min(left))} left")
    return ", ".join(parts)


def duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass
class TrainResult:
    """What train() returns: the run's figures at its end, for a caller in Python (a hyperparameter
    search) that would otherwise read them back from TensorBoard. Lists hold one entry per policy;
    NaN where a policy has no figure (no game finished, or never 100 games at a status line)."""
    exit_code: int  # main()'s: 0 ran to its budget or was stopped, 1 failed, 2 a flag mistake the env revealed
    seconds: float = 0.0  # wall time of the training loop
    frames_collected: int = 0  # env frames this run collected (a resumed run counts from 0), all policies'
    frames_trained: list[int] = dataclasses.field(default_factory=list)  # since the experiment began
    average_returns: list[float] = dataclasses.field(default_factory=list)  # over the last (up to) 100 games
    games_averaged: list[int] = dataclasses.field(default_factory=list)  # how many games that is
    # the best 100-game average at a status line: a run's peak, where the last average may be past it
    best_average_returns: list[float] = dataclasses.field(default_factory=list)
    checkpoints: list[str | None] = dataclasses.field(default_factory=list)  # each policy's latest
    # policy versions trained after that checkpoint: 0 where the final save landed, more where the
    # learner was gone before it (killed by something other than the runner's stop)
    versions_unsaved: list[int] = dataclasses.field(default_factory=list)


def save_config(cfg):
    os.makedirs(experiment_dir(cfg), exist_ok=True)
    path = os.path.join(experiment_dir(cfg), "config.json")
    with open(path + ".tmp", "w") as f:
        json.dump(vars(cfg), f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)


def start_line(cfg, seed_drawn: bool = False) -> str:
    """A run's first line: what runs where, how to follow it, how to stop and resume it."""
    folder = experiment_dir(cfg)
    ranks = f" (rank {cfg.rank} of {cfg.world_size})" if cfg.world_size > 1 else ""
    processes = "in one process (--serial_mode)" if cfg.serial_mode else f"with {num_processes(cfg)} processes"
    seed = f"seed {cfg.seed}" + (f" (drawn: --seed {cfg.seed} repeats it)" if seed_drawn else "")
    return (f"training {cfg.env} on {cfg.device} {processes}{ranks} in {folder}; "
            f"follow it with tensorboard --logdir {folder}; {seed}; Ctrl-C saves and stops, the same command resumes")


def groups_line(groups: SpaceGroups, agent_names: list[str], cfg) -> str:
    """Which agents each group holds, and which policies play them."""
    parts = []
    for group, (obs_space, action_space) in enumerate(groups.spaces):
        agents = [name for name, of in zip(agent_names, groups.of_agent) if of == group]
        policies = ", ".join(f"p{policy}" for policy in groups.policies(group, cfg))
        seen = ", ".join(f"{key} {shape}" for key, (shape, _) in obs_shapes(obs_space).items())
        parts.append(f"{', '.join(agents)} (seeing {seen}; acting in {action_space}) played by {policies}")
    return f"{len(groups.spaces)} groups of agents, each with policies of its own: " + "; ".join(parts)


class StopRequested(Exception):
    pass


class Tee:
    """A text stream that writes to two: the terminal's and a log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding: the terminal's
        return getattr(self.stream, name)


@contextlib.contextmanager
def lines_also_to(path: str):
    """Inside this block the runner's own lines (start, status, warnings, errors, the summary) go
    to `path` as well as to the terminal; its children's go to the terminal only."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", buffering=1) as log:
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Tee(sys.stdout, log), Tee(sys.stderr, log)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = streams


def train(cfg, watch: Callable[[Shared, "Supervisor | SerialRun", Stats], None] | None = None) -> TrainResult:
    """Runs a whole training; returns its exit code and final figures (TrainResult). Its lines also
    go to train.log in the experiment's folder. From Python: cfg = parse_args([...flags]), then
    flag_errors(cfg) and start_afresh(cfg) (what main() does first), then train(cfg); see
    scripts/tools/optuna_search.py. `watch`, if given, is called every round of the runner's loop with
    the shared state, the workers and the runner's stats (bench/chaos.py kills processes from
    there and checks that the run recovers)."""
    log = "train.log" if cfg.rank == 0 else f"train_rank{cfg.rank}.log"
    with lines_also_to(os.path.join(experiment_dir(cfg), log)):
        return run_training(cfg, watch)


def run_training(cfg, watch) -> TrainResult:
    """train() without its log file: every check and the shared state, then the run watched to its end."""
    run = start_run(cfg)
    return run if isinstance(run, TrainResult) else supervise(run, watch)


def start_run(cfg) -> "Run | TrainResult":
    """The seed, the env probed, every check that needs it and every group's model built, then the
    shared state and the workers made (none started). A TrainResult: the run was refused."""
    if cfg.serial_mode:  # before any weights are drawn: the thread count can change their last bits
        torch.set_num_threads(cfg.learner_threads)
    seed_drawn = cfg.seed is None
    if seed_drawn:  # drawn here, printed and saved in config.json: every run can be repeated
        cfg.seed = random.randrange(2**31)
    torch.manual_seed(cfg.seed)
    print(start_line(cfg, seed_drawn), flush=True)
    try:
        probe = probe_env(cfg)
    except Exception as error:  # the env itself is broken: no worker would do better
        print(f"error: {cfg.env} failed to start ({type(error).__name__}: {error}); its engine's output is in "
              f"{engine_log_path(cfg, 'probe')}", file=sys.stderr)
        return TrainResult(exit_code=1)
    if fits_batches(cfg) and envs.num_agents_of(cfg.env) is None:  # its agents are known only now
        fit_synchronous_batches(cfg, probe.num_agents)
    groups, group_errors = agent_groups(cfg, probe.agent_spaces, probe.agent_names)
    errors = probe_errors(cfg, probe, groups, group_errors)
    if not errors:
        errors = [error for obs_space, _ in groups.spaces for error in encoder_errors(obs_space, cfg)]
    if errors:
        print_errors(list(dict.fromkeys(errors)))
        return TrainResult(exit_code=2)
    try:  # every group's model, before anything starts: an edit that cannot build is one line here
        model = make_model(*groups.policy_spaces(0), cfg)
        errors = acting_errors(model, groups.policy_spaces(0)[0], cfg) + optimizer_errors(model, cfg)
        for obs_space, action_space in groups.spaces[1:]:  # with a fork's acting fields, each group's model
            with torch.random.fork_rng(devices=[]):  # the run's weights are drawn as without groups
                errors += acting_errors(make_model(obs_space, action_space, cfg), obs_space, cfg)
    except Exception as error:
        origin = traceback.extract_tb(error.__traceback__)[-1]
        print(f"error: the model for {cfg.env} could not be built ({type(error).__name__} at "
              f"{os.path.basename(origin.filename)}:{origin.lineno}: {str(error).splitlines()[0] if str(error) else ''})",
              file=sys.stderr)
        return TrainResult(exit_code=2)
    if errors:
        print_errors(list(dict.fromkeys(errors)))
        return TrainResult(exit_code=2)
    shared = create_shared(cfg, model, probe, groups)  # checks the checkpoints, if any
    if len(groups.spaces) > 1 and cfg.rank == 0:
        print(groups_line(groups, probe.agent_names, cfg), flush=True)
    for policy in sorted(frozen_policies(cfg)) if cfg.rank == 0 else ():
        start = init_policies(cfg).get(policy, "its own checkpoint, or version 0")
        print(f"policy {policy} is frozen: it acts with the weights of {start}, and never trains", flush=True)
    if cfg.serial_mode:
        workers = SerialRun(cfg, shared)
    else:
        workers = Supervisor(cfg, shared, make_children(cfg, shared), child_process_context())
    return Run(cfg, seed_drawn, shared, model, Stats(cfg.num_policies), workers, start=time.monotonic())


def supervise(run: Run, watch) -> TrainResult:
    """Starts the workers and the extras, then watches: stats, failures, reports, the budget, a stop
    signal. Whatever ends it, the workers stop (the learners save) and every extra closes."""
    cfg, shared, workers, extras = run.cfg, run.shared, run.workers, []

    def request_stop(signum, frame):
        raise StopRequested()

    previous_handlers = {signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        for extra in EXTRAS:
            extras.append(extra(run))
        if cfg.rank == 0:  # under torchrun, rank 0 writes config, summaries and checkpoints
            print(f"the learner's recurrent core: {SegmentRNN.path(run.model)}", flush=True)
            if cfg.shuffle_minibatches:
                print("minibatches: " + ("single steps, shuffled across the batch every epoch"
                                         if single_step_minibatches(cfg) else "whole trajectories (V-trace or the RNN "
                                         "runs along them), shuffled every epoch"), flush=True)
            save_config(cfg)
        run.start = last_report = time.monotonic()
        workers.start_all()
        while True:
            if not cfg.serial_mode:
                time.sleep(0.1)  # the children work meanwhile
            for message in drain(shared.stats_queue):
                run.stats.consume(message)
            now = time.monotonic()
            run.stats.frame_history.append((now, frames_collected(cfg, shared)))
            run.stats.policy_frame_history.append((now, shared.run.learner_frames.copy()))
            if shared.run.should_stop():  # under torchrun: another rank ended the run
                break
            stop_reason = workers.check()  # serial mode: one round of the work itself
            if stop_reason:
                print(f"error: {stop_reason}; stopping", flush=True)
                run.exit_code = 1
                break
            run.stats.restarts, run.stats.silent = workers.num_restarts, workers.silent
            if watch is not None:
                watch(shared, workers, run.stats)
            for extra in extras:
                extra.round(run)
            if now - last_report >= cfg.report_every_sec and cfg.rank == 0:
                print(status_line(cfg, run.stats, shared, now - run.start), flush=True)
                for extra in extras:
                    extra.report(run)
                last_report = now
            if shared.run.learner_frames.min() >= cfg.train_for_env_steps or now - run.start >= cfg.train_for_seconds:
                break
    except StopRequested:
        print("stop requested: saving and shutting down", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            workers.stop()
            run.elapsed = time.monotonic() - run.start
            if cfg.rank == 0:
                print(status_line(cfg, run.stats, shared, run.elapsed), flush=True)
            for extra in reversed(extras):
                extra.stop(run)
        finally:
            for signum, handler in previous_handlers.items():  # for a caller in this process (tests, serial mode)
                signal.signal(signum, handler)
    return run.result or TrainResult(exit_code=run.exit_code, seconds=run.elapsed)


def shutdown(shared: Shared, children: list[Child], grace_s: float = 8.0, learner_grace_s: float = 30.0):
    """Asks every process to stop (the learners save a checkpoint), then ends stragglers and
    whatever env processes a killed rollout worker left behind.

    Learners get longer: one stops after the batch in hand, and then writes the final checkpoint.
    An Atari batch (16 minibatch steps) on two cores shared with other jobs outlasted 8 s once,
    and the killed learner lost the weights trained since its last periodic checkpoint."""
    shared.run.stop[0] = 1
    start = time.monotonic()
    graces = [learner_grace_s if child.kind == "learner" else grace_s for child in children]
    for child, grace in zip(children, graces):
        child.process.join(timeout=max(0.0, start + grace - time.monotonic()))
    for child, grace in zip(children, graces):
        if child.process.is_alive():
            print(f"warning: {child.name} did not stop in {grace:.0f}s; killing it", flush=True)
        stop_child(child)
    shared.slots.control.close()
    for q in shared.request_queues + shared.learner_queues + [shared.stats_queue]:
        q.close()
    remove_files(cuda_ipc_files([child.process.pid for child in children]) +
                 cuda_ipc_files([os.getpid()], reference_counters=False) + envs.orphaned_shared_memory())


# =============================================================================================
# EXTRAS: reporting: TensorBoard and W&B summaries, the run's lines on its defaults and on what it
# resumes, and its closing lines and figures (TrainResult)
# =============================================================================================

class Reporting(Extra):
    """Summaries at every report and at the end, the lines around the status lines, and the
    figures train() returns."""

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser):
        group = parser.add_argument_group("reporting")
        group.add_argument("--with_wandb", action="switch",
                           help="also send the summaries and the config to Weights & Biases (pip install wandb; "
                                "WANDB_MODE=offline works without an account)")
        group.add_argument("--wandb_project", default="appo", help="W&B project")
        group.add_argument("--wandb_group", default=None, help="W&B group, e.g. one per sweep")
        group.add_argument("--wandb_tags", nargs="*", default=[], help="W&B tags")

    @staticmethod
    def flag_errors(cfg) -> list[str]:
        if cfg.with_wandb and importlib.util.find_spec("wandb") is None:
            return ["--with_wandb needs the wandb package: pip install wandb"]
        return []

    def __init__(self, run: Run):
        for line in (family_line(run.cfg), resumed_line(run.cfg), policies_line(run.cfg)):  # before config.json is saved
            if line:
                print(line, flush=True)
        self.summaries = Summaries(run.cfg)
        # (mean, standard error) of the first 100 games at a status line, and of the best: see did_not_learn
        self.first_windows: list[tuple[float, float] | None] = [None] * run.cfg.num_policies
        self.best_windows: list[tuple[float, float] | None] = [None] * run.cfg.num_policies

    def report(self, run: Run):
        self.count_toward_best(run)
        self.first_windows = [first or best for first, best in zip(self.first_windows, self.best_windows)]
        self.summaries.write(run)

    def count_toward_best(self, run: Run):
        for policy_id, returns in enumerate(run.stats.episode_returns):
            if len(returns) == returns.maxlen and (self.best_windows[policy_id] is None
                                                   or np.mean(returns) > self.best_windows[policy_id][0]):
                self.best_windows[policy_id] = (float(np.mean(returns)), float(np.std(returns) / np.sqrt(len(returns))))

    def stop(self, run: Run):
        cfg = run.cfg
        self.count_toward_best(run)  # the last status line, printed just before, is one too
        best_returns = [window[0] if window else float("-inf") for window in self.best_windows]
        run.result = final_result(cfg, run.stats, run.shared, run.elapsed, best_returns, run.exit_code)
        if cfg.rank == 0:
            self.summaries.write(run)
            if run.exit_code == 0:
                rivals_learn = cfg.num_policies > 1 and len(run.shared.groups.of_agent) > 1  # other policies in its games
                print("\n".join(end_of_run_lines(cfg, run.result, self.first_windows, rivals_learn, self.best_windows)),
                      flush=True)
        self.summaries.close()


def final_result(cfg, stats: Stats, shared: Shared, elapsed: float, best_returns: list[float],
                 exit_code: int) -> TrainResult:
    """The figures of a finished run, read once: the summary lines are written from them."""
    saved = [sorted(glob.glob(os.path.join(checkpoint_dir(cfg, policy_id), "checkpoint_*.pth")))
             for policy_id in range(cfg.num_policies)]
    saved_versions = [int(os.path.basename(paths[-1]).split("_")[1]) if paths else 0 for paths in saved]
    return TrainResult(
        exit_code=exit_code, seconds=elapsed, frames_collected=frames_collected(cfg, shared),
        frames_trained=[int(frames) for frames in shared.run.learner_frames],
        average_returns=[float(np.mean(returns)) if returns else float("nan") for returns in stats.episode_returns],
        games_averaged=[len(returns) for returns in stats.episode_returns],
        best_average_returns=[float(best) if np.isfinite(best) else float("nan") for best in best_returns],
        checkpoints=[paths[-1] if paths else None for paths in saved],
        versions_unsaved=[max(0, int(trained) - version) for trained, version
                          in zip(shared.run.learner_version, saved_versions)])


def did_not_learn(first_window: tuple[float, float] | None, best_window: tuple[float, float] | None) -> bool:
    """Did the best 100-game average of a run stay within two standard errors of the difference
    from its first one ((mean, standard error) of each window of 100 games at a status line)?
    Random play's score moves that much between windows, so a run that never did better likely
    learned nothing. Both windows' errors count: where every first game scored the same
    (MountainCar's -200), one lucky game later is not learning."""
    if first_window is None or best_window is None:
        return False
    (first_mean, first_error), (best_mean, best_error) = first_window, best_window
    return best_mean - first_mean <= 2 * np.hypot(first_error, best_error)


def end_of_run_lines(cfg, result: TrainResult, first_windows: list | None = None,
                     rivals_learn: bool = False, best_windows: list | None = None) -> list[str]:
    """The run's last lines: what it trained, how well, where it saved, how to watch it play, and
    which flags to try where a policy's score never rose above its first 100 games'. With
    rivals_learn (other policies act in the same games) a flat or falling training return may be
    their learning, not a failure: predators' prey learns to flee, so the hint points to eval."""
    lines = []
    for policy_id in range(cfg.num_policies):
        best = result.best_average_returns[policy_id]
        best = f" (best 100-game average at a status line {best:.2f})" if np.isfinite(best) else ""
        score = (f"average return {result.average_returns[policy_id]:.2f} over the last "
                 f"{result.games_averaged[policy_id]} games{best}" if result.games_averaged[policy_id]
                 else "no game finished")
        prefix = f"policy {policy_id}: " if cfg.num_policies > 1 else ""
        lines.append(f"done: {prefix}{result.frames_trained[policy_id]:,} frames trained in "
                     f"{duration(result.seconds)}; {score}; checkpoint {result.checkpoints[policy_id] or 'none'}")
        first = (first_windows or [None] * cfg.num_policies)[policy_id]
        if did_not_learn(first, (best_windows or [None] * cfg.num_policies)[policy_id]):
            flat = f"{prefix}the 100-game average never rose above its first ({first[0]:.2f})"
            lines.append(f"{flat}, but the other policies in its games learned too: compare it against random "
                         "play, --mode eval --agent_policies with =random (docs/multi_policy.md)" if rivals_learn else
                         f"{flat}; flags to try: a longer --train_for_env_steps, --exploration_loss_coeff 0.01 "
                         "(sparse rewards), --gamma 0.999 (long games), --learning_rate 0.0003 "
                         "(docs/environments.md, \"When a run does not learn\")")
    if any(result.checkpoints):  # never a command for a checkpoint that does not exist
        lines.append(f"watch it play: python {LAUNCHER} --mode eval --env {cfg.env} --train_dir {cfg.train_dir} "
                     f"--experiment {cfg.experiment} --save_video")
    for policy_id, unsaved in enumerate(result.versions_unsaved):
        if unsaved:
            prefix = f"policy {policy_id}'s " if cfg.num_policies > 1 else "the "
            newest = result.checkpoints[policy_id]
            lines.append(f"warning: {prefix}learner was gone before its final save, and the last {unsaved} policy "
                         f"versions it trained are lost; " + (f"the newest checkpoint is {newest}" if newest
                                                                else "it saved no checkpoint"))
    return lines



class Summaries:
    """TensorBoard event files under the experiment, mirrored to Weights & Biases with --with_wandb.
    Under torchrun only rank 0 writes them."""

    def __init__(self, cfg):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(experiment_dir(cfg), "tb")) if cfg.rank == 0 else None
        self.wandb_run = start_wandb(cfg) if cfg.with_wandb and cfg.rank == 0 else None

    def write(self, run: Run):
        if self.writer is None:
            return
        cfg, stats, shared = run.cfg, run.stats, run.shared
        frames = experiment_frames(cfg, shared)  # a resumed run's curves go on from where they stopped
        scalars = {"perf/fps": stats.fps(60), "perf/env_faults": stats.env_faults, "perf/restarts": stats.restarts,
                   **{f"perf/busy_{kind}": share for kind, share in stats.busy_shares.items()},
                   **{f"perf/{kind}_{stage}": share for (kind, stage), share in stats.stage_shares.items()}}
        if stats.mean_batch is not None:
            scalars["perf/inference_batch"] = stats.mean_batch
        for policy_id in range(cfg.num_policies):
            if stats.episode_returns[policy_id]:
                scalars[f"p{policy_id}/true_return"] = float(np.mean(stats.episode_returns[policy_id]))
            if stats.episode_objectives[policy_id]:  # emptied when PBT replaces the policy
                scalars[f"p{policy_id}/true_objective"] = float(np.mean(stats.episode_objectives[policy_id]))
                scalars[f"p{policy_id}/episode_frames"] = float(np.mean(stats.episode_lengths[policy_id]))
            for key, value in stats.learner[policy_id].items():
                if isinstance(value, (int, float)) and key != "policy_id":
                    scalars[f"p{policy_id}/{key}"] = value
            scalars[f"p{policy_id}/fps"] = stats.policy_fps(policy_id, 60)
            # the step is frames collected; Sample Factory's curves are against frames trained
            scalars[f"p{policy_id}/frames_trained"] = int(shared.run.learner_frames[policy_id])
        for extra in EXTRAS:  # e.g. PBT's hyperparameters
            scalars.update(extra.scalars(run))
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, frames)
        if self.wandb_run is not None:
            self.wandb_run.log({**scalars, "env_frames": frames})

    def close(self):
        if self.writer is not None:
            self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def start_wandb(cfg):
    """One W&B run per experiment: a resumed experiment continues the same run (its id is saved).
    W&B writes only in the experiment's folder: its run files under wandb/, and its service's own
    logs (otherwise in ~/.cache/wandb) under wandb/cache/, unless WANDB_CACHE_DIR says elsewhere."""
    os.environ.setdefault("WANDB_CACHE_DIR", os.path.join(os.path.abspath(experiment_dir(cfg)), "wandb", "cache"))
    import wandb
    id_path = os.path.join(experiment_dir(cfg), "wandb_run_id")
    if os.path.exists(id_path):
        with open(id_path) as f:
            run_id = f.read().strip()
    else:  # a W&B sweep's agent names the run it started us for: a run of another id is not the sweep's
        run_id = os.environ.get("WANDB_RUN_ID") or uuid.uuid4().hex[:12]
        with open(id_path, "w") as f:
            f.write(run_id)
    run = wandb.init(project=cfg.wandb_project, group=cfg.wandb_group, tags=cfg.wandb_tags, name=cfg.experiment,
                     id=run_id, resume="allow", config=vars(cfg), dir=experiment_dir(cfg))
    # every chart against env frames, as in TensorBoard: W&B's own step counts log calls, so runs
    # of another speed or --report_every_sec would not line up
    run.define_metric("env_frames")
    run.define_metric("*", step_metric="env_frames")
    return run


def family_line(cfg) -> str | None:
    """A run's second line: the defaults its env family set, and where this run's flags differ."""
    family, defaults = envs.family_of(cfg.env), envs.env_defaults(cfg.env)
    if family is None or not defaults:
        return None

    def shown(value) -> str:
        return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    parts = []
    for flag, value in defaults.items():
        now = getattr(cfg, flag)
        if flag in cfg.flags_given:
            parts.append(f"--{flag} {shown(value)} (yours: {shown(now)})")
        else:
            parts.append(f"--{flag} {shown(value)}" + (f" (now {shown(now)})" if now != value else ""))
    return f"defaults of {family.title}: " + ", ".join(parts)


def resumed_line(cfg) -> str | None:
    """A run in an experiment folder that has run before (--restart_behavior resume): which flags
    differ from that run's (its config.json), so that a changed flag is never a silent change."""
    path = os.path.join(experiment_dir(cfg), "config.json")
    if cfg.rank != 0 or not os.path.exists(path):
        return None
    with open(path) as f:
        saved = json.load(f)
    bookkeeping = {"flags_given", "rank", "world_size"} | ({"seed"} - set(cfg.flags_given))  # a drawn seed is new
    differ = [f"--{flag} {value} (saved: {saved[flag]})" for flag, value in sorted(vars(cfg).items())
              if flag in saved and flag not in bookkeeping and json.loads(json.dumps(value)) != saved[flag]]
    return (f"resuming the experiment in {experiment_dir(cfg)}; "
            + ("flags that differ from its saved config.json: " + ", ".join(differ) if differ
               else "its flags are the saved ones"))


def policies_line(cfg) -> str | None:
    """A run's line on where each policy's figures are, when the status line shows their aggregate."""
    if cfg.num_policies <= MOST_POLICIES_SHOWN:
        return None
    return (f"{cfg.num_policies} policies: status lines show the highest lag and the best and median average "
            f"return; each policy's figures are in TensorBoard under p0/ to p{cfg.num_policies - 1}/")


EXTRAS.append(Reporting)


# =============================================================================================
# EXTRAS: multi-node (torchrun): each rank runs the whole trainer on its own experience; the
# learners average their gradients every step (DD-PPO's scheme), so the weights stay identical
# =============================================================================================

class Torchrun(Extra):
    """Under torchrun (WORLD_SIZE above 1): joins the ranks' learners, starts them all from rank 0's
    state, and at the end says what each rank did."""

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser):
        group = parser.add_argument_group("multi-node (torchrun)")
        positive(group.add_argument("--distributed_timeout", type=float, default=300.0,
                                     help="under torchrun: seconds a learner waits for the other ranks' learners before "
                                          "giving up (their first batches can take a while)"))

    @staticmethod
    def flag_errors(cfg) -> list[str]:
        errors = []
        if cfg.world_size > 1 and cfg.serial_mode:
            errors.append("--serial_mode under torchrun: serial mode is one process on one machine; drop one of them")
        if cfg.world_size > 1 and cfg.num_policies != 1:
            errors.append(f"--num_policies {cfg.num_policies} under torchrun: multi-node training is for one policy; "
                          "use --num_policies 1")
        return errors

    @staticmethod
    def learner_start(learner: Learner):
        if learner.cfg.world_size > 1:
            init_distributed(learner.cfg)
            broadcast_training_state(learner)
            learner.shared.weights[learner.policy_id].publish(learner.model, learner.policy_version)  # rank 0's
            average_gradients_in_backward(learner.model)
            for normalizer in learner.model.modules():
                if isinstance(normalizer, RunningNormalizer):
                    merge_over_all_ranks(normalizer)
            learner.rank0_state = state_buffers(learner.model)

    @staticmethod
    def after_sgd(learner: Learner):
        """The model's other buffers (a fork's Lagrange multiplier, a counter) are state each rank
        changes from its own batch: rank 0's, to every rank, before the weights are published."""
        broadcast_from_rank0(getattr(learner, "rank0_state", []))

    @staticmethod
    def stop_now(learner: Learner, stop: bool) -> bool:
        """Every rank trains this step, or every rank stops (and the runners with them)."""
        if not distributed():
            return stop
        stop, frames = exchange_progress(stop, int(learner.shared.run.worker_frames.sum()))
        learner.shared.run.all_ranks_frames[0] = frames
        if stop:
            learner.shared.run.stop[0] = 1
        return stop

    @staticmethod
    def learner_stop(learner: Learner):
        if distributed():
            print(f"rank {learner.cfg.rank}: policy version {learner.policy_version}, weights checksum "
                  f"{weights_checksum(learner.model)}", flush=True)
            torch.distributed.destroy_process_group()

    def stop(self, run: Run):
        if run.cfg.world_size > 1:
            print(f"rank {run.cfg.rank} collected {int(run.shared.run.worker_frames.sum()):,} env frames", flush=True)


def init_distributed(cfg):
    """Joins the learners of all ranks (torchrun's MASTER_ADDR/PORT, RANK, WORLD_SIZE)."""
    import datetime
    # small control tensors stay on the CPU (gloo); with CUDA, gradients go through NCCL
    backend = "cpu:gloo,cuda:nccl" if cfg.device.startswith("cuda") else "gloo"
    torch.distributed.init_process_group(backend, rank=cfg.rank, world_size=cfg.world_size,
                                         timeout=datetime.timedelta(seconds=cfg.distributed_timeout))


def broadcast_from_rank0(tensors):
    """Each tensor takes rank 0's value, in place, on every rank."""
    for tensor in tensors:
        contiguous = tensor.contiguous()  # channels-last conv weights are not, and gloo needs it
        torch.distributed.broadcast(contiguous, src=0)
        tensor.copy_(contiguous)


def broadcast_training_state(learner: "Learner"):
    """Rank 0's weights, normaliser statistics, optimiser state and counters, to every rank."""
    broadcast_from_rank0(learner.model.state_dict().values())
    state = [learner.optimizer.state_dict(), learner.policy_version, learner.env_frames]
    torch.distributed.broadcast_object_list(state, src=0)  # pickled, but only between our own ranks
    load_optimizer_state(learner.optimizer, state[0])
    learner.policy_version, learner.env_frames = state[1], state[2]


def state_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The model's buffers that are not the running statistics merge_over_all_ranks keeps equal
    (none in appo.py's own model): under torchrun they follow rank 0 (Torchrun.after_sgd). A
    statistic of your own that should count every rank's batch: a RunningNormalizer, or an
    all_reduce where you update it."""
    merged = {id(buffer) for module in model.modules() if isinstance(module, RunningNormalizer)
              for buffer in module.buffers(recurse=False)}
    return [buffer for buffer in model.buffers() if id(buffer) not in merged]


def average_gradients_in_backward(model: nn.Module):
    """Each parameter's gradient, once backward has accumulated it, becomes its mean over the ranks
    (every rank's backward runs the same graph, so the ranks reduce the parameters in the same order).
    optimizer_step then clips the same gradient on every rank, and a non-finite loss, which makes a
    non-finite gradient, reaches every rank through the mean: all skip that step together."""
    world_size = torch.distributed.get_world_size()

    def average(parameter: torch.Tensor):
        torch.distributed.all_reduce(parameter.grad)
        parameter.grad.div_(world_size)

    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(average)


def merge_over_all_ranks(normalizer: "RunningNormalizer"):
    """The normaliser merges the statistics of the union of every rank's batch (this instance's
    merge, wrapped), so all ranks keep equal statistics."""
    merge = normalizer.merge
    normalizer.merge = lambda mean, var, n: merge(*all_ranks_moments(mean, var, n))


def all_ranks_moments(mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, variance and count of the union of every rank's batch, from each rank's (mean, var, n),
    all on the device."""
    count = n.to(torch.float64).reshape(1)
    sums = torch.cat([count, (mean.double() * count).reshape(-1), ((var.double() + mean.double() ** 2) * count).reshape(-1)])
    torch.distributed.all_reduce(sums)
    total, size = sums[0], mean.numel()
    all_mean = sums[1:1 + size] / total.clamp(min=1.0)
    all_var = (sums[1 + size:] / total.clamp(min=1.0) - all_mean ** 2).clamp_(min=0.0)
    return all_mean.view_as(mean).to(mean.dtype), all_var.view_as(var).to(var.dtype), total.to(n.dtype)


def exchange_progress(stop: bool, frames: int) -> tuple[bool, int]:
    """Once per step: whether any rank wants to stop, and the frames all ranks have collected."""
    values = torch.tensor([1 if stop else 0, frames], dtype=torch.int64)
    torch.distributed.all_reduce(values)
    return bool(values[0].item()), int(values[1].item())


def weights_checksum(model: nn.Module) -> str:
    """SHA-256 of every weight and statistic: equal on all ranks when they are in sync."""
    import hashlib
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


EXTRAS.append(Torchrun)


# =============================================================================================
# EXTRAS: population-based training and past-version opponents: every period the runner ranks the
# policies by their true objective, the worst take over the weights and hyperparameters of one of
# the best, and everyone outside the best mutates. Learners and rollout workers pick the changes up
# from PolicyHyperparams.
# =============================================================================================

def pbt_best_and_worst(objectives: list[float], replace_fraction: float) -> tuple[list[int], list[int]]:
    """Policy ids of the best and of the worst `replace_fraction` of the population (one at least)."""
    ranked = sorted(range(len(objectives)), key=lambda policy_id: objectives[policy_id], reverse=True)
    count = max(1, int(len(objectives) * replace_fraction))
    return ranked[:count], ranked[-count:]


def pbt_mutate(row: dict[str, float], rng: random.Random, rate: float, factor: float):
    """Each hyperparameter changes with probability `rate`, multiplied or divided by `factor`.
    Returns the new row and {name: (old, new)} of what changed."""
    new_row, changes = dict(row), {}
    for name, old in row.items():
        if rng.random() >= rate:
            continue
        scale = factor if rng.random() < 0.5 else 1.0 / factor
        if name == "adam_beta1":  # scale the distance to 1, so beta1 stays below 1
            new = 1.0 - min(0.999, (1.0 - old) * scale)
        else:
            new = old * scale
        new_row[name], changes[name] = new, (old, new)
    return new_row, changes


def pbt_round(objectives: list[float], rows: list[dict], rng: random.Random, cfg) -> tuple[list[dict], list[dict]]:
    """One PBT decision for the whole population: new hyperparameter rows, and the events (one dict
    per replacement or mutation) that say what happened and why."""
    rows = [dict(row) for row in rows]
    best, worst = pbt_best_and_worst(objectives, cfg.pbt_replace_fraction)
    events = []
    for policy_id in worst:
        if policy_id in best:
            continue
        source = rng.choice(best)
        gap = objectives[source] - objectives[policy_id]
        if gap >= cfg.pbt_replace_reward_gap:
            rows[policy_id] = dict(rows[source])
            events.append({"policy_id": policy_id, "event": "replaced", "source": source,
                           "objective": objectives[policy_id], "source_objective": objectives[source]})
    for policy_id in range(len(rows)):
        if policy_id in best:
            continue
        rows[policy_id], changes = pbt_mutate(rows[policy_id], rng, cfg.pbt_mutation_rate, cfg.pbt_mutation_factor)
        if changes:
            events.append({"policy_id": policy_id, "event": "mutated", "objective": objectives[policy_id],
                           "changes": {name: list(change) for name, change in changes.items()}})
    return rows, events


class PopulationBasedTraining:
    """The runner's side of PBT: when to hold a round, carrying out its decisions, and one JSON file
    per policy (train_dir/experiment/checkpoint_p<i>/pbt.json: hyperparameters, the frames of the
    next round, every event) from which a restarted run resumes."""

    def __init__(self, cfg, hyperparams: PolicyHyperparams):
        self.cfg, self.hyperparams = cfg, hyperparams
        self.rng = random.Random(cfg.seed)
        self.next_round_frames = cfg.pbt_period_env_steps
        self.history: list[list[dict]] = [[] for _ in range(cfg.num_policies)]
        for policy_id in range(cfg.num_policies):
            saved = self.load(policy_id)
            if saved is not None:
                row = hyperparams.row(policy_id)
                row.update({name: value for name, value in saved["hyperparameters"].items() if name in row})
                hyperparams.set_row(policy_id, row)
                print(f"pbt: policy {policy_id} resumes with " + ", ".join(f"{name} {value:.4g}" for name, value
                                                                        in row.items()), flush=True)
                self.history[policy_id] = saved["history"]
                self.next_round_frames = saved["next_round_frames"]

    def path(self, policy_id: int) -> str:
        return os.path.join(checkpoint_dir(self.cfg, policy_id), "pbt.json")

    def load(self, policy_id: int) -> dict | None:
        if not os.path.exists(self.path(policy_id)):
            return None
        with open(self.path(policy_id)) as f:
            return json.load(f)

    def save(self):
        for policy_id in range(self.cfg.num_policies):
            os.makedirs(checkpoint_dir(self.cfg, policy_id), exist_ok=True)
            state = {"policy_id": policy_id, "hyperparameters": self.hyperparams.row(policy_id),
                     "next_round_frames": self.next_round_frames, "history": self.history[policy_id]}
            with open(self.path(policy_id) + ".tmp", "w") as f:
                json.dump(state, f, indent=2)
            os.replace(self.path(policy_id) + ".tmp", self.path(policy_id))

    def step(self, stats: Stats, shared: Shared):
        """Holds a round once every policy has trained on the period's frames and played an episode."""
        frames = int(shared.run.learner_frames.min())
        if frames < self.next_round_frames or not all(stats.episode_objectives):
            return
        objectives = [float(np.mean(recent)) for recent in stats.episode_objectives]
        rows = [self.hyperparams.row(policy_id) for policy_id in range(self.cfg.num_policies)]
        new_rows, events = list(rows), []
        for group in range(len(shared.groups.spaces)):  # ranked within a group: its models' shapes differ
            members = shared.groups.policies(group, self.cfg)
            if len(members) < 2:
                continue
            group_rows, group_events = pbt_round([objectives[p] for p in members], [rows[p] for p in members],
                                                 self.rng, self.cfg)
            for member, row in zip(members, group_rows):
                new_rows[member] = row
            for event in group_events:  # its policy ids, from the group's numbering to the run's
                event.update({key: members[event[key]] for key in ("policy_id", "source") if key in event})
            events += group_events
        print(f"pbt: round at {frames:,} frames, objectives "
              + " ".join(f"p{i} {objective:.2f}" for i, objective in enumerate(objectives)), flush=True)
        for event in events:
            policy_id = event["policy_id"]
            if event["event"] == "replaced":
                shared.hyperparams.request_copy(policy_id, event["source"])
                stats.episode_objectives[policy_id].clear()  # the next round judges the new weights
                print(f"pbt: policy {policy_id} (objective {event['objective']:.2f}) takes the weights and "
                      f"hyperparameters of policy {event['source']} ({event['source_objective']:.2f})", flush=True)
            else:
                print(f"pbt: policy {policy_id} mutates " + ", ".join(
                    f"{name} {old:.4g} -> {new:.4g}" for name, (old, new) in event["changes"].items()), flush=True)
            self.history[policy_id].append({"frames": frames, **event})
        for policy_id, row in enumerate(new_rows):
            if row != rows[policy_id]:
                self.hyperparams.set_row(policy_id, row)
        self.next_round_frames = frames + self.cfg.pbt_period_env_steps
        self.save()


class Population(Extra):
    """PBT's rounds and the past-version opponents' refresh, at the runner's rounds; the learners
    follow PBT's decisions before each step."""

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser):
        pbt = parser.add_argument_group("self-play and population-based training")
        pbt.add_argument("--past_opponent_refresh_sec", type=float, default=120.0,
                         help="seconds between draws of the past version: a random saved checkpoint of a random policy")
        pbt.add_argument("--with_pbt", action="switch",
                         help="rank the policies by their true objective every --pbt_period_env_steps; mutate "
                              "the hyperparameters of the weaker ones and replace the weakest with copies of the best")
        pbt.add_argument("--pbt_period_env_steps", type=integer, default=5_000_000,
                         help="env frames every policy trains on between two PBT rounds")
        pbt.add_argument("--pbt_mutation_rate", type=float, default=0.15,
                         help="chance that each hyperparameter of a policy outside the best ones mutates")
        pbt.add_argument("--pbt_mutation_factor", type=float, default=1.2,
                         help="a mutation multiplies or divides a hyperparameter by this")
        pbt.add_argument("--pbt_replace_fraction", type=float, default=0.3,
                         help="share of the population that counts as best (copied from) and as worst (replaced)")
        pbt.add_argument("--pbt_replace_reward_gap", type=float, default=0.35,
                         help="a worst policy is replaced only if a best one leads it by at least this much "
                              "true objective (win rate in self-play, frags against bots)")


    @staticmethod
    def flag_errors(cfg) -> list[str]:
        errors = []
        if cfg.with_pbt and cfg.num_policies < 2:
            errors.append(f"--with_pbt needs a population: use --num_policies 2 or more (got {cfg.num_policies})")
        if cfg.with_pbt and not (0 <= cfg.pbt_mutation_rate <= 1 and cfg.pbt_mutation_factor > 1
                                 and 0 < cfg.pbt_replace_fraction <= 0.5 and cfg.pbt_period_env_steps > 0):
            errors.append("PBT flags out of range: --pbt_mutation_rate in [0, 1], --pbt_mutation_factor above 1, "
                          "--pbt_replace_fraction in (0, 0.5], --pbt_period_env_steps positive")
        return errors

    @staticmethod
    def learner_start(learner: Learner):
        learner.hyperparams_version, learner.copy_request = -1, 0  # what PolicyHyperparams asked of it so far

    @staticmethod
    def before_sgd(learner: Learner):
        if learner.cfg.with_pbt:
            follow_population(learner)

    def __init__(self, run: Run):
        self.pbt = PopulationBasedTraining(run.cfg, run.shared.hyperparams) if run.cfg.with_pbt else None  # resumes
        self.next_past_opponent, self.rng = time.monotonic(), random.Random(run.cfg.seed)

    def round(self, run: Run):
        if self.pbt is not None:
            self.pbt.step(run.stats, run.shared)
        if past_policy_id(run.cfg) is not None and time.monotonic() >= self.next_past_opponent:
            path = refresh_past_opponent(run.cfg, run.shared, run.model, self.rng)
            # no checkpoint yet: soon
            self.next_past_opponent = time.monotonic() + (run.cfg.past_opponent_refresh_sec if path else 5.0)
            if path:
                print(f"past-version opponents now play {path}", flush=True)

    @staticmethod
    def scalars(run: Run) -> dict[str, float]:
        if not run.cfg.with_pbt:
            return {}
        return {f"p{policy_id}/hyperparams/{name}": value for policy_id in range(run.cfg.num_policies)
                for name, value in run.shared.hyperparams.row(policy_id).items()}


def follow_population(learner: Learner):
    """Takes the hyperparameters and, when asked, the weights that population-based training chose."""
    hyperparams = learner.shared.hyperparams
    if int(hyperparams.copy_request[learner.policy_id]) != learner.copy_request:
        learner.copy_request = int(hyperparams.copy_request[learner.policy_id])
        source = int(hyperparams.copy_source[learner.policy_id])
        while learner.shared.weights[source].load_into(learner.model) is None:  # the source learner was writing
            time.sleep(0.001)
        # Adam's moments describe the old weights' loss surface, not the copied ones'
        learner.optimizer.state.clear()
        print(f"policy {learner.policy_id} now trains a copy of policy {source}'s weights", flush=True)
    if int(hyperparams.version[learner.policy_id]) != learner.hyperparams_version:
        learner.hyperparams_version = int(hyperparams.version[learner.policy_id])
        row = hyperparams.row(learner.policy_id)
        learner.cfg.learning_rate, learner.cfg.exploration_loss_coeff = row["learning_rate"], row["exploration_loss_coeff"]
        for group in learner.optimizer.param_groups:
            group["lr"] = row["learning_rate"]
            if "adam_beta1" in row:
                group["betas"] = (row["adam_beta1"], learner.cfg.adam_beta2)


def refresh_past_opponent(cfg, shared: Shared, model: ActorCritic, rng: random.Random) -> str | None:
    """Publishes a random saved checkpoint of a random policy as the past-version opponent (its
    policy workers pick it up like new weights). Returns the checkpoint's path, None if none loaded."""
    paths = [path for policy_id in range(cfg.num_policies)
             for path in glob.glob(os.path.join(checkpoint_dir(cfg, policy_id), "checkpoint_*.pth"))]
    if not paths:
        return None
    path = rng.choice(paths)
    try:
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["model"])
    except Exception:  # rotated away by --keep_checkpoints in the meantime: next time
        return None
    past_weights = shared.weights[past_policy_id(cfg)]
    past_weights.publish(model, past_weights.version + 1)
    return path


EXTRAS.append(Population)


# =============================================================================================
# EXTRAS: evaluation: play a saved policy, print its scores, record what it sees
# =============================================================================================

class Evaluation(Extra):
    """--mode eval."""

    mode, mode_help = "eval", "play a saved policy, print its scores, optionally record a video"

    @staticmethod
    def main(cfg) -> int:
        return evaluate(cfg)

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser):
        evaluation = parser.add_argument_group("evaluation (--mode eval)")
        evaluation.add_argument("--checkpoint", default=None,
                                help="checkpoint file to play (default: the experiment's latest of --policy_index)")
        at_least_0(evaluation.add_argument("--policy_index", type=int, default=0, help="which policy of the experiment to play"))
        positive(evaluation.add_argument("--max_num_episodes", type=int, default=10, help="games to play"))
        evaluation.add_argument("--eval_deterministic", action="switch",
                                help="take the most likely action instead of sampling")
        evaluation.add_argument("--save_video", action="switch",
                                help="write an H.264 MP4 of the agent's view at the game's resolution, with the score "
                                     "(pip install imageio imageio-ffmpeg)")
        positive(evaluation.add_argument("--video_frames", type=int, default=10**9, help="stop the video after this many frames"))
        evaluation.add_argument("--video_path", default=None,
                                help="where the MP4 goes (default: train_dir/experiment/eval_<policy>.mp4)")

    @staticmethod
    def flag_errors(cfg) -> list[str]:
        errors = []
        if cfg.mode == "train":
            eval_flags = {"checkpoint": cfg.checkpoint is not None, "save_video": cfg.save_video,
                          "video_path": cfg.video_path is not None, "eval_deterministic": cfg.eval_deterministic}
            errors += [f"--{flag} is for --mode eval (training resumes from the experiment's latest checkpoint)"
                       for flag, given in eval_flags.items() if given]
        if cfg.save_video and not all(importlib.util.find_spec(name) for name in ("imageio", "imageio_ffmpeg")):
            errors.append("--save_video needs the imageio and imageio-ffmpeg packages (they write H.264): "
                          "pip install imageio imageio-ffmpeg")
        return errors


def load_policy_for_eval(cfg) -> dict:
    """The checkpoint to play (--checkpoint or the experiment's latest); its model and env flags override
    cfg's, with a note for each one the command line gave otherwise."""
    if cfg.checkpoint is not None:
        checkpoint = load_checkpoint_file(cfg.checkpoint, "--checkpoint")
    else:
        checkpoint = load_latest_checkpoint(cfg, cfg.policy_index)
        if checkpoint is None:
            raise CheckpointError(f"no checkpoint in {checkpoint_dir(cfg, cfg.policy_index)}: train the experiment "
                                  "first, or name a file with --checkpoint")
    saved = checkpoint.get("cfg", {})
    if saved.get("env", cfg.env) != cfg.env:
        raise CheckpointError(f"the checkpoint was trained on {saved['env']}, not --env {cfg.env}: "
                              f"use --env {saved['env']}")
    # the model and env it was trained with, and its policies (each group of agents plays its own)
    for flag in MODEL_FLAGS + ["env_frameskip", "num_policies", *envs.trained_flags(cfg.env)]:
        if flag in saved:
            if flag in cfg.flags_given and getattr(cfg, flag) != saved[flag]:  # never a silent change
                print(f"note: --{flag} {getattr(cfg, flag)} from the command line replaced by the checkpoint's "
                      f"{saved[flag]}", flush=True)
            setattr(cfg, flag, saved[flag])
    if cfg.encoder not in CONV_ENCODERS:
        raise CheckpointError(f"the checkpoint's encoder {cfg.encoder} is not registered in this process: evaluate "
                              "with the launcher that trained it (the one that calls appo.register_encoder)")
    return checkpoint


class VideoWriter:
    """An H.264 MP4 of rendered frames with the running score written in the corner. H.264 in
    yuv420p is what browsers, GitHub and W&B play (OpenCV's mp4v was MPEG-4 part 2, which they
    do not); imageio-ffmpeg brings its own ffmpeg with libx264."""

    def __init__(self, path: str, fps: float, max_frames: int):
        self.path, self.fps, self.max_frames = path, fps, max_frames
        self.writer, self.num_frames, self.size = None, 0, None

    def add(self, frame: np.ndarray, score: str):
        if self.num_frames >= self.max_frames or frame is None:
            return
        image = even_sized(with_score(frame, score))
        if self.writer is None:
            import imageio
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self.size = (image.shape[1], image.shape[0])
            # macro_block_size 1: imageio would otherwise scale every frame up to a multiple of 16
            # pixels, with only a warning; faststart puts the index first, so a browser plays the
            # file while it downloads
            self.writer = imageio.get_writer(self.path, format="FFMPEG", mode="I", fps=self.fps, codec="libx264",
                                             pixelformat="yuv420p", macro_block_size=1,
                                             output_params=["-movflags", "+faststart"])
        self.writer.append_data(image)
        self.num_frames += 1

    def close(self):
        if self.writer is not None:
            self.writer.close()


def with_score(frame: np.ndarray, score: str) -> np.ndarray:
    """A copy of an RGB frame with `score` in its top-left corner, sized to the frame."""
    import cv2
    image = np.array(frame, dtype=np.uint8, order="C")  # a copy: putText draws in place, and the frame is the env's
    scale = max(0.3, frame.shape[0] / 400)
    cv2.putText(image, score, (4, int(14 * scale / 0.35)), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 1)
    return image


def even_sized(image: np.ndarray) -> np.ndarray:
    """`image` with one edge row or column repeated where its height or width is odd: yuv420p
    stores colour at half resolution in both directions, so libx264 refuses odd sizes."""
    height, width = image.shape[:2]
    if height % 2 == 0 and width % 2 == 0:
        return image
    return np.pad(image, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def evaluate(cfg) -> int:
    """Plays --max_num_episodes games with one policy and prints each agent's true score."""
    # a batch of one game's agents, small as a policy worker's: more threads would mostly wait for each
    # other, and on cores shared with a training, for whichever of them is descheduled
    torch.set_num_threads(cfg.policy_worker_threads)
    checkpoint = load_policy_for_eval(cfg)
    if cfg.seed is not None:  # with --eval_deterministic, the same seed plays the same games
        torch.manual_seed(cfg.seed)
    env = make_env(cfg, env_index=0, render_mode="rgb_array" if cfg.save_video else None)
    video = None
    if cfg.save_video:
        path = cfg.video_path or os.path.join(experiment_dir(cfg), f"eval_p{cfg.policy_index}.mp4")
        video = VideoWriter(path, envs.game_fps(cfg.env) / cfg.env_frameskip, cfg.video_frames)
    try:
        pinned, groups = eval_policies(cfg, env)
        models = {RANDOM_PLAY: None}
        for policy in sorted(set(pinned) - {RANDOM_PLAY}):
            saved = checkpoint if policy == cfg.policy_index else load_latest_checkpoint(cfg, policy)
            if saved is None:
                raise CheckpointError(f"no checkpoint in {checkpoint_dir(cfg, policy)} for --agent_policies' policy "
                                      f"{policy}: train the experiment with it first")
            model = make_model(*groups.policy_spaces(policy), cfg).eval()
            mismatch = checkpoint_mismatch(model, saved["model"])
            if mismatch:
                raise CheckpointError(f"the checkpoint does not fit {cfg.env}'s model ({mismatch})")
            model.load_state_dict(saved["model"])  # checkpoints load on the CPU, wherever they were saved
            models[policy] = model.to(cfg.device)
            which = f"policy {policy}'s version" if len(set(pinned)) > 1 or cfg.agent_policies else "policy version"
            print(f"playing {cfg.env} on {cfg.device} with {which} {saved['policy_version']} "
                  f"({saved['env_frames']:,} env frames of training)", flush=True)
        games = play_games(cfg, env, [models[policy] for policy in pinned], video)
    finally:
        env.close()
        if video is not None:
            video.close()
    returns = np.array([game["returns"] for game in games])  # [games, agents]
    lengths = np.array([game["length"] for game in games])
    several = cfg.agent_policies or len(groups.spaces) > 1
    for agent in range(returns.shape[1]):
        prefix = f"agent {agent} " if returns.shape[1] > 1 else ""
        prefix += f"(policy {'random' if pinned[agent] == RANDOM_PLAY else pinned[agent]}) " if several else ""
        print(f"{prefix}mean return {returns[:, agent].mean():.2f} +- {returns[:, agent].std():.2f} over "
              f"{len(games)} games; mean length {lengths.mean():,.0f} env frames", flush=True)
    names = envs.get_agent_names(env.env)
    for group in range(len(groups.spaces)) if len(groups.spaces) > 1 else ():  # an agent's mean, per group
        agents = [agent for agent, of in enumerate(groups.of_agent) if of == group]
        print(f"group {group} ({', '.join(names[agent] for agent in agents)}; policy "
              f"{'/'.join(str(p) if p != RANDOM_PLAY else 'random' for p in sorted({pinned[agent] for agent in agents}))}"
              f"): mean return "
              f"{returns[:, agents].mean():.2f} an agent", flush=True)
    if video is not None and video.num_frames:
        print(f"video: {video.num_frames} frames of {video.size[0]}x{video.size[1]} at {video.fps:g} fps "
              f"in {video.path}", flush=True)
    return 0


def eval_policies(cfg, env: Agents) -> tuple[list[int], SpaceGroups]:
    """Each agent's policy in an evaluation, and the env's groups: --agent_policies' mapping, else
    --policy_index for the agents of its group and each other group's first policy for theirs."""
    groups, errors = agent_groups(cfg, env.agent_spaces, envs.get_agent_names(env.env))
    if cfg.agent_policies:
        pinned, pin_errors = pinned_policies(cfg, envs.get_agent_names(env.env))
        errors = pin_errors or errors
    elif cfg.policy_index >= cfg.num_policies:
        errors = [f"--policy_index {cfg.policy_index}: the experiment trained policies 0 to {cfg.num_policies - 1}"]
    else:
        pinned = [cfg.policy_index if group == groups.of_policy[cfg.policy_index] else groups.policies(group, cfg)[0]
                  for group in groups.of_agent]
    if errors:
        raise CheckpointError(errors[0])
    return pinned, groups


def random_action(space: spaces.Space, obs, rng: np.random.Generator):
    """A uniform random action of `space`; a discrete one among those the obs's mask allows."""
    if isinstance(obs, dict) and ACTION_MASK in obs and hasattr(space, "n"):
        allowed = np.flatnonzero(np.asarray(obs[ACTION_MASK]).reshape(-1)[:space.n] > 0)
        return int(space.start + rng.choice(allowed))
    return space.sample()


def play_games(cfg, env: Agents, models: list[ActorCritic | None], video: VideoWriter | None) -> list[dict]:
    """Steps `env` until --max_num_episodes games ended, each agent acting with its model in `models`
    (one may act for several: those of a group; None: random play); returns each game's per-agent
    true return."""
    num_agents, device = env.num_agents, torch.device(cfg.device)
    rng = np.random.default_rng(cfg.seed)
    for agent, model in enumerate(models):
        if model is None:  # random play, seeded as the run
            env.agent_spaces[agent][1].seed(None if cfg.seed is None else cfg.seed + agent)
    rnn_state = torch.zeros(num_agents, rnn_state_size(cfg), device=device)
    teams = {}  # a model and the agents it acts for
    for agent, model in enumerate(models):
        teams.setdefault(id(model), (model, []))[1].append(agent)
    teams = [(model, torch.as_tensor(agents, device=device)) for model, agents in teams.values()]
    obs = env.reset()
    games, finished_returns = [], [None] * num_agents
    while len(games) < cfg.max_num_episodes:
        if video is not None:
            video.add(env.render(), f"score {game_score(env.env):g}")
        actions = [random_action(env.agent_spaces[agent][1], obs[agent], rng) if model is None else None
                   for agent, model in enumerate(models)]
        with torch.no_grad():
            for model, agents in teams:
                if model is None:
                    continue
                team_obs = [obs[agent] for agent in agents.tolist()]  # a model's agents share its spaces
                obs_batch = {key: torch.as_tensor(np.stack([o[key] if isinstance(o, dict) else o for o in team_obs]))
                             .to(device) for key in model.encoders}
                logits, _, rnn_state[agents] = model(obs_batch, rnn_state[agents])
                chosen = model.action_dist.mode(logits) if cfg.eval_deterministic else model.action_dist.sample(logits)
                for agent, row in zip(agents.tolist(), chosen.cpu().numpy()):
                    actions[agent] = row
        env_actions = [action if model is None else env_action(env.agent_spaces[agent][1], action)
                       for agent, (model, action) in enumerate(zip(models, actions))]
        obs, rewards, dones, _, infos = env.step(env_actions)
        for agent, info in enumerate(infos):
            if "true_return" in info:
                finished_returns[agent] = (float(info["true_return"]), int(info["true_length"]))
        if all(dones):
            obs = env.reset()
        rnn_state = rnn_state * torch.as_tensor([0.0 if done else 1.0 for done in dones], device=device).unsqueeze(1)
        if all(result is not None for result in finished_returns):  # a whole game ended for everyone
            games.append({"returns": [r for r, _ in finished_returns], "length": finished_returns[0][1]})
            returns = ", ".join(f"agent {agent} return {r:.2f}" for agent, r in enumerate(games[-1]["returns"]))
            if num_agents == 1:
                returns = returns.removeprefix("agent 0 ")
            print(f"game {len(games)}: {returns}, {games[-1]['length']:,} env frames", flush=True)
            finished_returns = [None] * num_agents
    return games


def game_score(env) -> float:
    """The raw score of the game in progress, where the env keeps one (env.GameStatsRecorder)."""
    try:
        return float(env.get_wrapper_attr("game_return"))
    except AttributeError:
        return float("nan")


EXTRAS.append(Evaluation)


# =============================================================================================
# main
# =============================================================================================

LAUNCHER = "appo.py"  # the script whose command line a run's last line gives for evaluation


def main(argv: list[str] | None = None) -> int:
    """The command line: appo.py's own, or a forker's launcher's, which registers its envs or
    encoders and then calls this from its own __main__ (evaluation needs them too)."""
    global LAUNCHER
    if sys._getframe(1).f_globals.get("__name__") == "__main__" and os.path.basename(sys.argv[0]) != "appo.py":
        LAUNCHER = sys.argv[0]
    cfg = parse_args(argv)
    errors = flag_errors(cfg)
    if errors:
        print_errors(errors)
        return 2
    if cfg.mode == "train":
        done = start_afresh(cfg)
        if done:
            print(done, flush=True)
    try:
        if cfg.mode == "train":
            return train(cfg).exit_code
        return next(extra for extra in EXTRAS if extra.mode == cfg.mode).main(cfg)
    except CheckpointError as error:
        print_errors([str(error)])
        return 2


if __name__ == "__main__":
    sys.exit(main())

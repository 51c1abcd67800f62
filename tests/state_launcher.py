"""A fork's launcher whose model keeps state of its own: a buffer the loss sets from each batch
(here the mean of the batch's observations, as a PPO-Lagrangian multiplier follows the batch's
mean cost), which under torchrun each rank would set from its own batch. Every process runs this
module (children start from it too), so each one's make_model and appo_loss are these."""
import sys

import torch

import appo

plain_model, plain_loss = appo.make_model, appo.appo_loss


def make_model(obs_space, action_space, cfg):
    model = plain_model(obs_space, action_space, cfg)
    model.register_buffer("batch_obs_mean", torch.zeros(()))
    return model


def appo_loss(model, batch, policy_version, cfg):
    with torch.no_grad():
        model.batch_obs_mean.copy_(appo.steps_of(batch)["obs"].float().mean())
    return plain_loss(model, batch, policy_version, cfg)


appo.make_model, appo.appo_loss = make_model, appo_loss

if __name__ == "__main__":
    sys.exit(appo.main())

"""A forker's launcher (docs/fork.md, "Swap the encoder"): registers an image encoder of its own,
then runs appo.py's command line. tests/test_eval.py trains and evaluates with it."""
import sys

import torch.nn as nn

import appo


def one_layer_convnet(channels: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(channels, 8, 8, stride=8), nn.ReLU(), nn.Flatten())


appo.register_encoder("one_layer", one_layer_convnet, nn.ReLU, "one 8x8 conv of 8 channels")  # at import: workers too
if __name__ == "__main__":
    sys.exit(appo.main(sys.argv[1:]))

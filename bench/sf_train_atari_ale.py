"""Sample Factory's Atari launcher with ale-py's Atari ids registered: `python -m sf_train_atari_ale`.

ale-py 0.9 registers the Atari ids (BreakoutNoFrameskip-v4, ...) only when imported, and Sample
Factory's spawned workers re-import the launcher module (as __mp_main__), so a `python -c` wrapper
is not enough. bench/gpu_check.py copies this file into the Sample Factory packages it installs;
bench/setup_sample_factory.sh writes the same module into .venv-sf from a heredoc of its own. That
copy stays: bench_learning.py keys every saved Sample Factory run by a hash of the setup script
("setup" in docs/bench's result files), so any edit to it sets those runs apart as another
configuration. Fold the two when Sample Factory's runs are redone anyway."""
import sys

import ale_py  # noqa: F401  (registers the ALE ids with gymnasium)

from sf_examples.atari.train_atari import main

if __name__ == "__main__":
    sys.exit(main())

"""compress-dqn: train, compress, export and measure DQN policies.

tfmot only works with Keras 2, so the legacy-Keras switch must be set before anything imports
TensorFlow. Setting it here (and nothing heavier) keeps `import compress_dqn` cheap.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"

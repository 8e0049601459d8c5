"""Run as `python -m compress_dqn.convert.saved_model_probe PATH STEPS`: the memory probe of a SavedModel policy
(TensorFlow imported, as serving one does); evaluation.memory_probe is the TFLite one."""

from compress_dqn.deploy.litert.policy import Policy
from compress_dqn.evaluation.memory_probe import probe


def load_saved_model(path: str) -> Policy:
    # Imported after the probe measured the process floor: TensorFlow's import is the runtime's cost.
    from compress_dqn.convert.saved_model import SavedModelPolicy

    return SavedModelPolicy(path)


if __name__ == "__main__":
    probe("saved_model", load_saved_model)

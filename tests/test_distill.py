import numpy as np

from compress_dqn.compress.build import build_variant
from compress_dqn.networks import count_params

from conftest import variant


def test_student_is_smaller_and_learns_the_teacher(trained_tiny):
    recipe, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(1000)).observations
    teacher_q = result.model(obs).numpy()
    short = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 5}),
                          result.model, result.replay, recipe, result.info, quiet=True)
    long = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 600, "learning_rate": 3e-3}),
                         result.model, result.replay, recipe, result.info, quiet=True)
    assert long.params < count_params(result.model)[0] / 10
    error_short = np.mean((short.export_model(obs).numpy() - teacher_q) ** 2)
    error_long = np.mean((long.export_model(obs).numpy() - teacher_q) ** 2)
    assert error_long < 0.2 * error_short
    assert long.details["fine_tune"] == {"method": "distill", "gradient_steps": 600,
                                         "final_loss": long.details["fine_tune"]["final_loss"]}

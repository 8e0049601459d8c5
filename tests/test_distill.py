import numpy as np

from compress_dqn.compress.build import build_variant
from compress_dqn.networks import count_params, q_from_outputs

from conftest import variant


def q_of(model, obs):
    return q_from_outputs(model(obs)).numpy()


def test_student_is_smaller_and_learns_the_teacher(trained_tiny):
    recipe, result = trained_tiny
    obs = result.replay.gather(result.replay.sample_indices(1000)).observations
    teacher_q = result.model(obs).numpy()
    short = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 5}),
                          result.model, result.replay, recipe, result.info, quiet=True)
    long = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 600, "learning_rate": 3e-3}),
                         result.model, result.replay, recipe, result.info, quiet=True)
    assert long.params < count_params(result.model)[0] / 10
    error_short = np.mean((q_of(short.export_model, obs) - teacher_q) ** 2)
    error_long = np.mean((q_of(long.export_model, obs) - teacher_q) ** 2)
    assert error_long < 0.2 * error_short
    agreement = np.mean(q_of(long.export_model, obs).argmax(1) == teacher_q.argmax(1))
    assert agreement > 0.9
    assert long.details["fine_tune"]["method"] == "distill"
    assert long.details["fine_tune"]["gradient_steps"] == 600


def test_mse_loss_is_available(trained_tiny):
    recipe, result = trained_tiny
    built = build_variant(variant(recipe, student={"net_arch": [8]}, fine_tune={"steps": 50, "loss": "mse"}),
                          result.model, result.replay, recipe, result.info, quiet=True)
    assert np.isfinite(built.details["fine_tune"]["final_loss"])

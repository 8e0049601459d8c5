import numpy as np

from compress_dqn.compress.build import build_variant
from compress_dqn.convert.conversion import convert_policy, export_saved_model

from conftest import variant


def test_clustered_layers_have_at_most_k_values_after_export(trained_tiny, tmp_path):
    recipe, result = trained_tiny
    v = variant(recipe, cluster={"clusters": 6, "exclude": ["q_values"]}, fine_tune={"steps": 100})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    uniques = built.details.unique_kernel_values
    assert uniques["hidden_0"] <= 6 and uniques["hidden_1"] <= 6
    assert uniques["advantage"] > 6 and uniques["value"] > 6  # the excluded output layer, as exported (split)
    from compress_dqn._tf import tf

    path = export_saved_model(built.export_model, (4,), np.float32, tmp_path / "sm")
    kernels = [w.numpy() for w in tf.saved_model.load(str(path)).weights if w.shape.rank == 2 and w.shape[1] == 32]
    assert kernels and all(len(np.unique(k)) <= 6 for k in kernels)


def test_a_clustered_student_is_distilled_in_float_then_clustered_with_its_own_steps(trained_tiny, tmp_path):
    recipe, result = trained_tiny
    v = variant(recipe, student={"net_arch": [16]}, fine_tune={"steps": 60},
                cluster={"clusters": 4, "exclude": ["q_values"], "steps": 40, "learning_rate": 3e-4},
                quantize={"mode": "qat", "qat_steps": 20, "preserve": True})
    built = build_variant(v, result.model, result.replay, recipe, result.info, quiet=True)
    details = built.details
    # The distillation ran unwrapped for fine_tune.steps, the clustered fine-tune for cluster.steps.
    assert details.fine_tune.gradient_steps == 60 and details.cluster_fine_tune.gradient_steps == 40
    assert details.unique_kernel_values["hidden_0"] <= 4
    assert details.qat.preserve == "clusters"
    # In the file, each output unit of the hidden layer still reads at most 4 distinct int8 weights.
    convert_policy(built.export_model, result.info, tmp_path, built, result.replay.sample_observations(100))
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(tmp_path / "policy.tflite"))
    hidden = [interp.get_tensor(t["index"]) for t in interp.get_tensor_details()
              if np.dtype(t["dtype"]) == np.int8 and tuple(t["shape"]) == (16, 4)]
    assert len(hidden) == 1 and max(len(np.unique(row)) for row in hidden[0]) <= 4, hidden


def test_a_clustered_students_build_cost_counts_its_distillation_and_its_clustered_steps():
    """A parallel build starts the costliest first: a clustered student pays for both phases."""
    from compress_dqn.compress.recovery import STEP_COST, build_cost
    from compress_dqn.recipe.schema import Recipe

    recipe = Recipe.model_validate({"env": {"id": "CartPole-v1"}})
    student = {"student": {"net_arch": [16]}, "fine_tune": {"steps": 1000}}
    plain = build_cost(variant(recipe, **student), recipe)
    clustered = build_cost(variant(recipe, **student, cluster={"clusters": 4, "steps": 300}), recipe)
    assert plain == 1000 * STEP_COST["distill"]
    assert clustered == plain + 300 * STEP_COST["cluster"]

"""An outsider's player: a .tflite policy played with LiteRT's public API alone, as a deployment would.

Imports only ai_edge_litert, numpy and gymnasium (and minatar for its ids; no compress_dqn): raw observation in, quantized
with the input tensor's own scale and zero point where the input is integer, the signature's
`action` output out (the greedy action the file documents). Run as `python outsider_player.py
POLICY ENV_ID FIRST_SEED EPISODES [action|q_values]` (which output it plays; action unless told); prints JSON {"returns": [...], "actions": [[...] per episode],
"q_argmax_differs": steps where argmax of the `q_values` output is another action}.

Why `action` unless told: it is the policy. `q_values` plays an outside client that takes argmax of
the Q-values, which must give the same action (compress_dqn/deploy/tflite/outputs.py: a split int8 head's
Q-values were once requantized on the sum of two ranges, coarse enough to tie the actions).
"""

import json
import sys

import gymnasium as gym
import numpy as np
from ai_edge_litert.interpreter import Interpreter


def player(path: str):
    """act(observation) -> action for the policy file, on one thread with LiteRT's default kernels."""
    interpreter = Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    runner = interpreter.get_signature_runner("serving_default")
    (inp,) = runner.get_input_details().values()
    outputs = runner.get_output_details()
    q_index, action_index = outputs["q_values"]["index"], outputs["action"]["index"]
    del runner  # a live signature runner makes invoke() refuse to run
    dtype, (scale, zero_point) = np.dtype(inp["dtype"]), inp["quantization"]

    def act(observation) -> tuple[int, int]:
        """(the action output, argmax of the q_values output)."""
        x = np.asarray(observation, np.float32)[None]
        if dtype.kind in "iu" and scale:
            x = np.clip(np.round(x / scale + zero_point), np.iinfo(dtype).min, np.iinfo(dtype).max)
        interpreter.set_tensor(inp["index"], x.astype(dtype))
        interpreter.invoke()
        return int(interpreter.get_tensor(action_index)[0]), int(np.argmax(interpreter.get_tensor(q_index)[0]))

    return act


def make(env_id: str) -> gym.Env:
    """The environment as its package publishes it (MinAtar registers its ids on request)."""
    if env_id.startswith("MinAtar/"):
        from minatar.gym import register_envs

        register_envs()
    return gym.make(env_id)


def play(path: str, env_id: str, first_seed: int, episodes: int, by: str = "action") -> dict:
    act = player(path)
    returns, actions, differs = [], [], 0
    for seed in range(first_seed, first_seed + episodes):
        env = make(env_id)  # a fresh environment per episode: MinAtar carries an episode's last action into the next
        observation, _ = env.reset(seed=seed)
        total, done, taken = 0.0, False, []
        while not done:
            action, q_argmax = act(observation)
            differs += action != q_argmax
            action = q_argmax if by == "q_values" else action
            taken.append(action)
            observation, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        actions.append(taken)
    return {"returns": returns, "actions": actions, "q_argmax_differs": differs}


if __name__ == "__main__":
    print(json.dumps(play(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])))

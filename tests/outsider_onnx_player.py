"""An outsider's ONNX player: an .onnx policy played with onnxruntime's public API alone, as a deployment would.

Imports only onnxruntime, numpy and gymnasium (and minatar for its ids; no compress_dqn): the raw
observation in (the model normalizes and quantizes it itself), the `action` output out. Run as
`python outsider_onnx_player.py POLICY.onnx ENV_ID FIRST_SEED EPISODES`; prints JSON {"returns": [...],
"actions": [[...] per episode], "q_argmax_differs": steps where argmax of `q_values` is another action}.
"""

import json
import sys

import gymnasium as gym
import numpy as np
import onnxruntime as ort


def player(path: str):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    dtype = np.uint8 if inp.type == "tensor(uint8)" else np.float32

    def act(observation) -> tuple[int, int]:
        action, q = session.run(["action", "q_values"], {inp.name: np.asarray(observation, dtype)[None]})
        return int(action[0]), int(np.argmax(q[0]))

    return act


def make(env_id: str) -> gym.Env:
    if env_id.startswith("MinAtar/"):
        from minatar.gym import register_envs

        register_envs()
    return gym.make(env_id)


def play(path: str, env_id: str, first_seed: int, episodes: int) -> dict:
    act = player(path)
    returns, actions, differs = [], [], 0
    for seed in range(first_seed, first_seed + episodes):
        env = make(env_id)  # a fresh environment per episode: MinAtar carries an episode's last action into the next
        observation, _ = env.reset(seed=seed)
        total, done, taken = 0.0, False, []
        while not done:
            action, q_argmax = act(observation)
            differs += action != q_argmax
            taken.append(action)
            observation, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        actions.append(taken)
    return {"returns": returns, "actions": actions, "q_argmax_differs": differs}


if __name__ == "__main__":
    print(json.dumps(play(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))

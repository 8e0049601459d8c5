"""An outsider's C client: the `export --target c` files compiled with gcc and played through ctypes, as a deployment would.

Imports only ctypes, numpy and gymnasium (and minatar for its ids; no compress_dqn): NAME.c and NAME.h
compiled with `gcc -std=c99 -O2 -ffp-contract=off -shared`, NAME_act called on the raw observation
(float32, or uint8 where the header says so), its action played. Run as `python outsider_c_player.py
NAME.c ENV_ID FIRST_SEED EPISODES`; prints JSON {"returns": [...], "actions": [[...] per episode]}.
"""

import ctypes
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np


def player(source: str):
    """act(observation) -> action of the C policy, compiled by gcc into a shared library of its own."""
    c_file = Path(source).resolve()
    name = c_file.stem
    header = c_file.with_suffix(".h").read_text()
    uint8 = re.search(rf"int {name}_act\(const uint8_t \*observation\);", header) is not None
    folder = Path(tempfile.mkdtemp(prefix="outsider-c-"))
    lib = folder / f"lib{name}.so"
    subprocess.run(["gcc", "-std=c99", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-I", str(c_file.parent),
                    "-o", str(lib), str(c_file)], check=True)
    fn = getattr(ctypes.CDLL(str(lib)), f"{name}_act")
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p]
    dtype = np.uint8 if uint8 else np.float32

    def act(observation) -> int:
        x = np.ascontiguousarray(observation, dtype=dtype)
        return int(fn(x.ctypes.data))

    return act


def make(env_id: str) -> gym.Env:
    """The environment as its package publishes it (MinAtar registers its ids on request)."""
    if env_id.startswith("MinAtar/"):
        from minatar.gym import register_envs

        register_envs()
    return gym.make(env_id)


def play(source: str, env_id: str, first_seed: int, episodes: int) -> dict:
    act = player(source)
    returns, actions = [], []
    for seed in range(first_seed, first_seed + episodes):
        env = make(env_id)  # a fresh environment per episode: MinAtar carries an episode's last action into the next
        observation, _ = env.reset(seed=seed)
        total, done, taken = 0.0, False, []
        while not done:
            action = act(observation)
            taken.append(action)
            observation, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        actions.append(taken)
    return {"returns": returns, "actions": actions}


if __name__ == "__main__":
    print(json.dumps(play(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))

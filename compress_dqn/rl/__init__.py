"""Reinforcement learning: environments, the Q-network, the DQN trainer and its update step, callbacks and train state.
"""

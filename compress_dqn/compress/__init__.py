"""Compression techniques, one per module: prune, quantize, cluster, distill.

Each wraps or converts a trained tf_keras Q-network; the recovery fine-tune that follows
(distillation or TD) runs through the training loops, which take tf_keras callbacks (compress_dqn.rl.callbacks).
"""

"""The bounded, preallocated replay buffer: storage (ring, index, frames) apart from transition logic (writer, buffer) and the byte budget.
"""

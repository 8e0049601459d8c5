"""Policies trained elsewhere: load them, check them against the environment, and gather data to compress them with.
"""

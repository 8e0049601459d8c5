"""Judging policies: episodes and paired verdicts, size/latency/memory measurements, typed results and the report.
"""

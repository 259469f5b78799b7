"""The harness's own event loop and pacing: a fair loop, its lag clock, paced garbage
collection, the turn lane. Imports nothing of the harness.
"""

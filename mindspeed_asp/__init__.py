"""mindspeed-asp: the Adaptive Scheduling Pipeline (ASP) for MindSpeed-RL.

Importing the package must stay cheap (no torch, Ray or vLLM): plans are built on login nodes.
"""

__version__ = "0.1.0"

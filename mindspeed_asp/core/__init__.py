"""The pure domain core: the lag policy, the planning problem, the metric definitions, the fluid bounds.

Why a package of its own: the simulator, the planner, the runtime and the MindSpeed-RL integration all decide
by these rules, so they import nothing but `mindspeed_asp.errors` and each other (tests/test_layering.py keeps
it so) and run without torch, Ray or vLLM.
"""

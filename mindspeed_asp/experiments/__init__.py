"""Experiments over the layers below: planners x workloads x seeds run through the simulator.

The top of the scheduling stack (docs/design.md#layering): it imports the scheduler, the simulator and the
workloads; nothing below imports it.
"""

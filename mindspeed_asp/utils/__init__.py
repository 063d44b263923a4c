"""File, text and command-line helpers every layer shares: atomic writes, strict UTF-8 and JSON Lines readers,
argparse types with bounds, the run directory, optional-extra hints, plot saving and start-up lines.

Why apart from `mindspeed_asp.core`: these touch files and terminals, the core decides; a helper may use the
core's bounds (`core.limits`), never the other way round.
"""

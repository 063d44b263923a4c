"""The two things every plot of the project needs: a headless pyplot and a save that frees the figure.

matplotlib is imported lazily (plots are optional output; `asp plan` must start fast) and always with the Agg
backend, since runs happen on headless nodes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Union


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Union[str, Path], dpi: int = 110) -> Path:
    """Lay out, write (atomically: temp file + rename) and close `fig` (closing matters in long sweeps);
    returns the path written."""
    import matplotlib.pyplot as plt

    from mindspeed_asp.utils.atomic import atomic_path

    path = Path(path)
    try:
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    return path

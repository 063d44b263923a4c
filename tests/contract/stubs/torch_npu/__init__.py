"""Test-only stand-in for torch_npu (Ascend's PyTorch adapter), so MindSpeed-RL's data-path modules import
and run on a CPU machine. MindSpeed-RL imports it at module top; the data path touches only the profiling
markers of `mstx_timer_decorator` (`torch_npu.npu.mstx.range_start/range_end`), which are no-ops here.
It only lives under tests/contract/ and is never used by the project."""
import types

__version__ = "0.0.0+contract-test-stub"


def _range_start(name):
    return 0


def _range_end(range_id):
    return None


npu = types.SimpleNamespace(mstx=types.SimpleNamespace(range_start=_range_start, range_end=_range_end))

"""The kernel table: one record per kernel, read by every executor, the builders, the device model and the profiler."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.kernels.table import ATTENTION_KERNELS, KERNELS, OPTIONAL_AXES, PROFILE_AXES, kernel_cost


def test_every_record_is_whole():
    """A kernel runs and says what it writes; a profiled one has its axes and the call a profile times; a kernel
    costed on a decode shape is never an attention block (those are costed per block)."""
    for k in KERNELS.values():
        assert callable(k.run) and callable(k.writes), k.name
        assert (k.profile is None) == (not k.axes), k.name
        assert k.optional_axes < max(1, len(k.axes)), k.name
        assert (k.cost is None) == (k.name in ("attn-fwd", "attn-merge", "attn-final", "attn-delta", "attn-bwd",
                                               "concat", "slice-heads", "slice-rows", "add")), k.name
    assert PROFILE_AXES == {"attend": ("kv_bytes", "head_dim", "group", "rows"), "merge": ("elems",),
                            "rescale": ("elems",), "finalize": ("elems",), "finalize-flat": ("elems",),
                            "attn-fwd": ("row_heads", "span", "head_dim", "density"),
                            "attn-bwd": ("row_heads", "span", "head_dim", "density")}
    assert OPTIONAL_AXES == {"attend": 1} and ATTENTION_KERNELS == {"attn-fwd": "forward", "attn-bwd": "backward"}


def test_a_prefill_block_has_no_decode_cost():
    from simulator.workloads.shape import DecodeShape

    with pytest.raises(ValueError, match="costed per block by PrefillShape"):
        kernel_cost("attn-fwd", DecodeShape(batch=1, heads=2, kv_heads=2, head_dim=8, context=16, dtype="fp32"), 4)


POINTS = {"attend": (2.0**12, 32.0, 2.0), "merge": (256.0,), "rescale": (256.0,), "finalize": (256.0,),
          "finalize-flat": (256.0,), "attn-fwd": (64.0, 32.0, 16.0, 0.5), "attn-bwd": (64.0, 32.0, 16.0, 1.0)}


@pytest.mark.parametrize("name", sorted(PROFILE_AXES))
def test_every_profiled_call_runs_on_numpy_as_on_torch(name):
    """The profiled call is array-API code: on numpy arrays it gives what it gives on torch tensors of the same
    values (the profiler builds it with torch)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    drawn: list[np.ndarray] = []

    def rand_np(*shape: int) -> np.ndarray:
        drawn.append(rng.standard_normal(shape))
        return drawn[-1]

    made: list[torch.Tensor] = []

    def rand_torch(*shape: int) -> torch.Tensor:  # the same values, in the same order
        made.append(torch.from_numpy(drawn[len(made)]).clone())
        return made[-1]

    np_out = KERNELS[name].profile(POINTS[name], "fp64", rand_np)()
    torch_out = KERNELS[name].profile(POINTS[name], "fp64", rand_torch)()
    assert len(made) == len(drawn) > 0
    if np_out is None:  # the backward adds into its gradients in place
        return
    for a, b in zip(_arrays(np_out), _arrays(torch_out), strict=True):
        np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-12, atol=1e-12)


def _arrays(value):
    return (value.o, value.l, value.m) if hasattr(value, "o") else (value,)

"""Host synchronisations, found without a GPU.

A call that reads a GPU tensor's value on the host (``.item()``, ``bool(t)``, ``int(t)``, ``t.tolist()``,
``torch.nonzero``, a copy to the CPU) makes the host wait for the GPU: in a sampling loop that is a stall per
step, and under CUDA graphs an error. :func:`host_syncs` runs a function on *fake* accelerator tensors
(``FakeTensorMode``: shapes, dtypes and devices, no values and no GPU) and returns every operation that would have
synchronised. On a fake tensor such a read cannot be answered at all (torch raises ``DataDependentOutputException``
or ``DynamicOutputShapeException``), so a read that the recorder does not list still fails the call.

The device. A CPU-only build of torch cannot index a fake ``cuda`` tensor (Python indexing asks for a CUDA device
guard, which such a build does not have: "PyTorch is not linked with support for cuda devices"), so the fake
tensors live on :data:`DEVICE`, torch's spare accelerator type (``privateuse1``) registered under that name with a
no-op device guard. posenc decides whether it may read values by ``device.type == "cpu"`` alone
(``posenc._checks.values_checkable``), so a tensor on any other device type takes the path a CUDA tensor takes;
``tests/test_checks.py`` checks that decision for ``cuda`` itself.

What this checks, and what it does not: the operations posenc asks torch for, on a non-CPU device. It does not
run CUDA kernels, so a synchronisation inside a kernel launch or the caching allocator is not seen; the GPU tests
(``tests/deployment/test_gpu.py``, ``make gpu-check``) run the real thing where a GPU is lent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: The device type of the fake tensors (see the module's docstring).
DEVICE = "fakegpu"


def _register_device() -> None:
    """Register :data:`DEVICE` once per process (torch allows one name for ``privateuse1``)."""
    if torch._C._get_privateuse1_backend_name() == DEVICE:
        return
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(DEVICE)


#: Operations whose result the host needs at once: each is a device-to-host synchronisation on CUDA.
SYNC_OPS = {
    aten._local_scalar_dense.default,  # .item(), bool(t), int(t), float(t), t.tolist()
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,  # output shape depends on values
    aten.masked_select.default,
    aten._unique2.default,
}


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "cpu"


class _Recorder(TorchDispatchMode):
    """Records the synchronising operations, and copies from the device to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        on_device = any(_on_device(t) for t in tensors)
        if on_device and func in SYNC_OPS:
            self.syncs.append(str(func))
        elif func in (aten._to_copy.default, aten.copy_.default) and on_device:
            target = kwargs.get("device")
            if func is aten.copy_.default:
                target = args[0].device
            if target is not None and torch.device(target).type == "cpu":
                self.syncs.append(f"{func} to the host")
        return func(*args, **kwargs)


def host_syncs(fn: Callable[..., Any], *make_args: Callable[[], Any]) -> list[str]:
    """The host synchronisations of ``fn(*args)`` on fake accelerator tensors.

    Args:
        fn: the call to check, e.g. ``lambda t: posenc.timestep_embedding(t, 320)``.
        make_args: one function per argument, called inside the fake mode, that builds it
            (e.g. ``lambda: torch.arange(8, device=DEVICE)``): tensors made there are fake.

    Returns:
        The synchronising operations, in call order (empty: none). A value read that torch cannot answer on a
        fake tensor is reported as the exception's operation.
    """
    _register_device()
    recorder = _Recorder()
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [make() for make in make_args]
        try:
            with recorder:
                fn(*args)
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            if not recorder.syncs or recorder.syncs[-1] != str(e.func):
                recorder.syncs.append(f"{e.func} (a value read)")
    return recorder.syncs

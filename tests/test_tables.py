"""posenc/_tables.py (book/19_deployment.ipynb): what may be kept in a module's table cache, and how it is filled."""

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from posenc._tables import cached_table, storable


class _Counting(nn.Module):
    """A module that uses the cache: counts how often its table is built."""

    def __init__(self) -> None:
        super().__init__()
        self._tables = {}
        self.builds = 0

    def _build_table(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        self.builds += 1
        return torch.arange(4, device=device).to(dtype)


def test_a_real_tensor_s_table_is_built_once_per_device_and_dtype():
    module = _Counting()
    x = torch.zeros(2)
    first = cached_table(module, x)
    assert cached_table(module, x) is first and module.builds == 1
    assert cached_table(module, x.double()).dtype == torch.float64
    assert module.builds == 2 and set(module._tables) == {
        (x.device, torch.float32),
        (x.device, torch.float64),
    }


def test_nothing_is_kept_for_meta_fake_traced_or_vmapped_inputs():
    module = _Counting()
    assert cached_table(module, torch.zeros(2, device="meta")) is None
    with FakeTensorMode():
        assert cached_table(module, torch.zeros(2)) is None
    seen = []
    torch.jit.trace(
        lambda t: seen.append(cached_table(module, t)) or t,
        (torch.zeros(2),),
        check_trace=False,
    )
    torch.func.vmap(lambda t: seen.append(storable(t)) or t)(torch.zeros(3, 2))
    assert seen == [None, False]
    assert module._tables == {} and module.builds == 0


def test_a_table_built_in_inference_mode_serves_autograd_later():
    module = _Counting()
    with torch.inference_mode():
        cached_table(module, torch.zeros(2))
    (table,) = module._tables.values()
    assert not table.is_inference()

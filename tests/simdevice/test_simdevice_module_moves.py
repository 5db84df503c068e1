"""Every module of PyTorch's own ModuleInfo database that holds parameters or buffers moves to a
simulated device after a forward pass on the CPU whose output is kept, as CUDA's ``Module.to`` moves
it.

The oracle is PyTorch's ``torch.testing._internal.common_modules.module_db`` (in the wheel; it needs
the ``expecttest`` package): its constructors and inputs, not ours. For each module and each of its
float32 inputs: the CPU forward's output is kept (its autograd graph holds the parameters), a weak
reference to a parameter is held, then ``module.to("sim:1")``; the module's Parameter objects are
the same objects after the move, they are on ``sim:1``, and a forward there gives the CPU's values.
Before, PyTorch's parameter swap refused such a move (``_apply(): Couldn't swap Linear.weight``).
"""

from __future__ import annotations

import weakref

import pytest
import torch

import simdevice as sim

common_modules = pytest.importorskip(
    "torch.testing._internal.common_modules", reason="needs expecttest"
)


@pytest.fixture(scope="module", autouse=True)
def two_devices():
    return sim.enable(2)


def _inputs(info):
    """The module's float32 sample inputs on the CPU, for evaluation mode (PyTorch's own): no
    dropout, so the two forwards compare value for value."""
    return info.module_inputs_func(
        info, device="cpu", dtype=torch.float32, requires_grad=False, training=False
    )


def _state(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(_cpu(item) for item in value)
    return value


def _on(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_on(item, device) for item in value)
    if isinstance(value, dict):
        return {key: _on(item, device) for key, item in value.items()}
    return value


def _moves(info) -> bool:
    """Whether a sample of ``info`` builds a module that holds parameters or buffers, and no tensor
    given to its constructor (which ``Module.to`` leaves where it is, on CUDA too)."""
    for sample in _inputs(info)[:3]:
        given = [*sample.constructor_input.args, *sample.constructor_input.kwargs.values()]
        if sample.forward_input is not None and not any(
            isinstance(value, torch.Tensor) for value in given
        ):
            module = info.module_cls(
                *sample.constructor_input.args, **sample.constructor_input.kwargs
            )
            if _state(module):
                return True
    return False


# Lazy modules hold no parameters until their first forward; once it has run they are their eager
# forms.
MODULES = [
    info
    for info in common_modules.module_db
    if not info.name.startswith("nn.Lazy") and _moves(info)
]


def test_the_database_holds_the_modules_a_course_moves():
    names = {info.name for info in MODULES}
    assert (
        len(MODULES) >= 25
        and {
            "nn.Linear",
            "nn.Conv2d",
            "nn.BatchNorm2d",
            "nn.LSTM",
            "nn.GRU",
            "nn.TransformerEncoderLayer",
            "nn.Embedding",
        }
        <= names
    ), sorted(names)


@pytest.mark.parametrize("info", MODULES, ids=lambda info: info.name)
def test_a_module_moves_after_a_kept_cpu_forward(info):
    for sample in _inputs(info)[:3]:
        given = [*sample.constructor_input.args, *sample.constructor_input.kwargs.values()]
        if sample.forward_input is None or any(isinstance(value, torch.Tensor) for value in given):
            continue
        torch.manual_seed(0)
        module = info.module_cls(
            *sample.constructor_input.args, **sample.constructor_input.kwargs
        ).train(False)
        inputs = sample.forward_input
        kept = module(*inputs.args, **inputs.kwargs)  # its graph holds the parameters
        before = [id(t) for t in module.parameters()]
        first = next(iter(module.parameters()), None)
        held = weakref.ref(first) if first is not None else None
        module.to("sim:1")
        assert [id(t) for t in module.parameters()] == before, "a Parameter object was replaced"
        assert held is None or held() is first
        assert all(
            t.device == torch.device("sim:1") for t in _state(module) if t.is_floating_point()
        )
        there = module(*_on(inputs.args, "sim:1"), **_on(inputs.kwargs, "sim:1"))
        torch.testing.assert_close(_cpu(there), _cpu(kept), equal_nan=True)


def test_backward_through_a_graph_made_before_the_move_says_so():
    """As PyTorch says of a module whose parameters it swapped: the old graph's gradient would reach
    the CPU tensor the graph held, never the moved parameter."""
    module = torch.nn.Linear(2, 2)
    kept = module(torch.ones(1, 2)).sum()
    module.to("sim:0")
    with pytest.raises(
        RuntimeError, match="backward through a graph made before its module's parameters moved"
    ):
        kept.backward()
    module(torch.ones(1, 2, device="sim:0")).sum().backward()
    assert module.weight.grad.device == torch.device("sim:0")

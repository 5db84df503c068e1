import torch

from devcourse import best_device
from devcourse.grading import simulated_cuda


def test_best_device_is_the_first_gpu_when_there_is_one():
    with simulated_cuda(2):
        assert best_device() == torch.device("cuda", 0)


def test_best_device_falls_back_to_a_device_that_exists_here():
    with simulated_cuda(0):
        device = best_device()
    assert device.type in ("cpu", "mps")
    torch.zeros(1, device=device)  # a tensor can live there

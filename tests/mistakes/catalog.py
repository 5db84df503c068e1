"""Device-management mistakes that people really made, written into the course's answer cells.

Each entry names a public thread (GitHub issue or pull request) where someone made the
mistake, says in one sentence what they did and what happened, and gives the whole source
of one answer cell of the course (``solutions/NN_topic/NN_topic.ipynb``, the cell whose
nbgrader ``grade_id`` is ``answer``) as a student who makes the same mistake would write
it. Some entries also give ``fix``: another correct way to write the same answer, different
from the course's own solution, that earns every point.

The facts come from the threads; the code is written for this course and copies nothing
from them. ``tests/mistakes/check_catalog.py`` checks that every mistake loses points on the
exercise's tests (cpu, sim:0 and sim:1 on a machine without CUDA) and that every fix
passes them all, hidden tests included.

Plain standard-library module: importing it runs no PyTorch code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    id: str  # short snake_case, unique
    url: str  # the public thread where someone made this mistake
    summary: str  # one sentence: what they did and what happened
    assignment: str  # e.g. "01_device_placement"
    answer: str  # grade_id of the answer cell this mistake is written into
    code: str  # the whole new source of that answer cell, with the mistake
    fix: str | None = None  # optionally, another correct way to write the same answer


# ---------------------------------------------------------------------------------------------
# 00_environment

_LIST_DEVICES_HEAD = '''\
def list_devices() -> list[torch.device]:
    """Every device a tensor can be created on here: cpu, cuda:0, cuda:1, ..., then mps:0 if available."""
'''

_RESOLVE_HEAD = '''\
def resolve_device(request: str = "auto") -> torch.device:
    """The torch.device that `request` names, checked against this machine."""
'''


def _resolve(auto: str, mps: str = 'torch.device("mps", 0)') -> str:
    """A resolve_device answer: `auto` is the body of the "auto" case, `mps` what "mps" becomes."""
    return (
        _RESOLVE_HEAD
        + auto
        + """\
    device = torch.device(request)
    if device.type == "mps":
        return """
        + mps
        + """
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = 0 if device.index is None else device.index
    if index >= count:
        raise ValueError(f"{request!r}: no such GPU, this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)
"""
    )


MISTAKES_00 = [
    Mistake(
        id="auto_device_is_cuda_or_cpu",
        url="https://github.com/ludwig-ai/ludwig/pull/3072",
        summary=(
            "get_torch_device() returned 'cuda' if torch.cuda.is_available() else 'cpu', so on a"
            " Mac everything ran on the CPU; the pull request added an MPS branch."
        ),
        assignment="00_environment",
        answer="resolve_device",
        code=_resolve("""\
    if request == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
"""),
        fix=_resolve("""\
    if request == "auto":  # the accelerator PyTorch names, whichever it is
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        if accelerator is None:
            return torch.device("cpu")
        return torch.device(accelerator.type, torch.accelerator.current_device_index())
"""),
    ),
    Mistake(
        id="mps_request_without_index",
        url="https://github.com/qthequartermasterman/hypothesis-torch/pull/66",
        summary=(
            "Generated torch.device('mps') as a device, but torch.device('mps') !="
            " torch.device('mps:0') while tensors on either report mps:0, so device comparisons"
            " failed."
        ),
        assignment="00_environment",
        answer="resolve_device",
        code=_resolve(
            """\
    if request == "auto":
        return best_device()
""",
            mps='torch.device("mps")',
        ),
    ),
    Mistake(
        id="auto_device_without_index",
        url="https://github.com/pytorch/pytorch/pull/144796",
        summary=(
            "Code built torch.device('mps') (or 'cuda') without an index where tensors report"
            " mps:0, and devices that name the same GPU compared unequal until the index was"
            " filled in."
        ),
        assignment="00_environment",
        answer="resolve_device",
        code=_resolve("""\
    if request == "auto":
        return torch.device(best_device().type)  # the type is enough
"""),
    ),
    Mistake(
        id="auto_device_mps_when_built",
        url="https://github.com/jeffheaton/app_deep_learning/issues/2",
        summary=(
            "The suggested device check chose 'mps' whenever torch.backends.mps.is_built() was"
            " true, which a Mac whose macOS cannot run MPS also reports (pytorch/pytorch#78343), so"
            " work went to a device that is not there."
        ),
        assignment="00_environment",
        answer="resolve_device",
        code=_resolve("""\
    if request == "auto":
        if torch.backends.mps.is_built():
            return torch.device("mps", 0)
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
"""),
    ),
    Mistake(
        id="device_list_knows_only_cuda",
        url="https://github.com/nrflynn2/ml-drug-discovery/pull/28",
        summary=(
            "get_device() only checked torch.cuda.is_available(), so MPS (and XPU) machines"
            " silently fell back to the CPU; the fix asks torch.accelerator instead."
        ),
        assignment="00_environment",
        answer="list_devices",
        code=_LIST_DEVICES_HEAD
        + """\
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return devices
""",
        fix=_LIST_DEVICES_HEAD
        + """\
    devices = [torch.device("cpu")]
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None:
        devices += [torch.device(accelerator.type, i) for i in range(torch.accelerator.device_count())]
    return devices
""",
    ),
    Mistake(
        id="device_list_mps_without_index",
        url="https://github.com/SonySemiconductorSolutions/mct-model-optimization/issues/1483",
        summary=(
            "The suggested device check returned torch.device('mps') without an index, which"
            " compares unequal to the mps:0 that the Mac's tensors report."
        ),
        assignment="00_environment",
        answer="list_devices",
        code=_LIST_DEVICES_HEAD
        + """\
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        devices.append(torch.device("mps"))
    return devices
""",
    ),
    Mistake(
        id="device_list_from_accelerator_type",
        url="https://github.com/pytorch/tutorials/issues/3876",
        summary=(
            "The tutorial's suggested modern pattern takes"
            " torch.accelerator.current_accelerator().type, a device type without an index, as the"
            " device: one device of that type, never cuda:1."
        ),
        assignment="00_environment",
        answer="list_devices",
        code=_LIST_DEVICES_HEAD
        + """\
    devices = [torch.device("cpu")]
    if torch.accelerator.is_available():
        devices.append(torch.device(torch.accelerator.current_accelerator().type))
    return devices
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 01_device_placement

_MOVE_BATCH_HEAD = '''\
def move_batch(batch, device, dtype=None):
    """A copy of `batch` (nested dicts, lists, tuples, named tuples) with every tensor on `device`.

    When `dtype` is given, floating-point tensors are cast to it; other tensors keep their dtype.
    """
'''

_MODEL_DEVICES_HEAD = '''\
def model_devices(model: nn.Module) -> set[torch.device]:
    """The devices of all parameters and buffers of `model`, submodules included."""
'''

_CAUSAL_MASK_HEAD = '''\
def causal_mask(scores: torch.Tensor) -> torch.Tensor:
    """A (T, T) bool mask on scores.device, True strictly above the diagonal, for scores of shape (..., T, T)."""
'''

MISTAKES_01 = [
    Mistake(
        id="tensor_to_result_discarded",
        url="https://github.com/huggingface/accelerate/issues/2251",
        summary=(
            "Called t.to(batch.device) on tensors without assigning the result, as one does for "
            "modules; the tensors stayed on the CPU because Tensor.to returns a new tensor."
        ),
        assignment="01_device_placement",
        answer="move_batch",
        code=_MOVE_BATCH_HEAD
        + """\
    if isinstance(batch, torch.Tensor):
        if dtype is not None and batch.is_floating_point():
            batch.to(dtype)
        batch.to(device)  # like model.to(device)
        return batch
    if isinstance(batch, dict):
        return {key: move_batch(value, device, dtype) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_batch(value, device, dtype) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_batch(value, device, dtype) for value in batch)
    return batch
""",
        fix="""\
from collections.abc import Mapping


"""
        + _MOVE_BATCH_HEAD
        + """\
    if torch.is_tensor(batch):
        wanted = dtype if dtype is not None and torch.is_floating_point(batch) else batch.dtype
        return batch.to(device=device, dtype=wanted)
    if isinstance(batch, Mapping):
        return type(batch)({key: move_batch(value, device, dtype) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_make"):  # a named tuple rebuilds itself from an iterable
        return batch._make(move_batch(value, device, dtype) for value in batch)
    if isinstance(batch, (list, tuple)):
        return type(batch)([move_batch(value, device, dtype) for value in batch])
    return batch
""",
    ),
    Mistake(
        id="named_tuple_becomes_plain_tuple",
        url="https://github.com/Lightning-AI/utilities/issues/199",
        summary=(
            "The recursive move-to-device helper rebuilt every tuple with tuple(...), so a"
            " named-tuple batch came back as a plain tuple and batch.features raised"
            " AttributeError."
        ),
        assignment="01_device_placement",
        answer="move_batch",
        code=_MOVE_BATCH_HEAD
        + """\
    if isinstance(batch, torch.Tensor):
        if dtype is not None and batch.is_floating_point():
            return batch.to(device, dtype)
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: move_batch(value, device, dtype) for key, value in batch.items()}
    if isinstance(batch, list):
        return [move_batch(value, device, dtype) for value in batch]
    if isinstance(batch, tuple):
        return tuple(move_batch(value, device, dtype) for value in batch)
    return batch
""",
    ),
    Mistake(
        id="dtype_cast_applied_to_integer_tensors",
        url="https://github.com/NVlabs/alpamayo/pull/37",
        summary=(
            "A to_device() helper cast every tensor to the requested dtype, so integer input_ids"
            " and attention masks became floats and the model inputs broke under mixed precision."
        ),
        assignment="01_device_placement",
        answer="move_batch",
        code=_MOVE_BATCH_HEAD
        + """\
    if isinstance(batch, torch.Tensor):
        return batch.to(device, dtype) if dtype is not None else batch.to(device)
    if isinstance(batch, dict):
        return {key: move_batch(value, device, dtype) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_batch(value, device, dtype) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_batch(value, device, dtype) for value in batch)
    return batch
""",
    ),
    Mistake(
        id="device_from_first_parameter",
        url="https://github.com/huggingface/sentence-transformers/pull/2614",
        summary=(
            "Took the model's device from next(model.parameters()).device, which raised"
            " StopIteration for a model without parameters and ignores buffers on other devices."
        ),
        assignment="01_device_placement",
        answer="model_devices",
        code=_MODEL_DEVICES_HEAD
        + """\
    return {next(model.parameters()).device}
""",
        fix=_MODEL_DEVICES_HEAD
        + """\
    devices = set()
    for module in model.modules():  # every submodule, each looked at without recursing again
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            devices.add(tensor.device)
    return devices
""",
    ),
    Mistake(
        id="device_check_ignores_buffers",
        url="https://github.com/neuralmagic/sparseml/pull/1874",
        summary=(
            "Inferred a module's device from its parameters only, falling back to the CPU when it"
            " had none, so a module whose tensors were buffers got the wrong device."
        ),
        assignment="01_device_placement",
        answer="model_devices",
        code=_MODEL_DEVICES_HEAD
        + """\
    return {parameter.device for parameter in model.parameters()}
""",
    ),
    Mistake(
        id="causal_mask_built_on_cpu",
        url="https://github.com/InfiniTensor/llaisys/pull/11",
        summary=(
            "Built the attention mask with torch.ones(L, S, dtype=torch.bool).tril(...) on the"
            " default device, so masking CUDA scores failed with 'expected self and mask to be on"
            " the same device'."
        ),
        assignment="01_device_placement",
        answer="causal_mask",
        code=_CAUSAL_MASK_HEAD
        + """\
    T = scores.shape[-1]
    return torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
""",
        fix=_CAUSAL_MASK_HEAD
        + """\
    positions = torch.arange(scores.shape[-1], device=scores.device)
    return positions.unsqueeze(0) > positions.unsqueeze(1)  # column index > row index
""",
    ),
    Mistake(
        id="causal_mask_hardcoded_cuda",
        url="https://github.com/xinntao/ESRGAN/issues/88",
        summary=(
            "The script hard-coded the 'cuda' device instead of following the data, so running it"
            " on a machine without a usable CUDA GPU failed with 'Torch not compiled with CUDA"
            " enabled'."
        ),
        assignment="01_device_placement",
        answer="causal_mask",
        code=_CAUSAL_MASK_HEAD
        + """\
    T = scores.size(-1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.triu(torch.ones(T, T, device=device), diagonal=1).bool()
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 02_cross_device_errors

_FIND_MISPLACED_HEAD = '''\
def find_misplaced(model: nn.Module, device: torch.device, *inputs) -> list[str]:
    """Names of the parameters, buffers and inputs ("input 0", ...) that are not on `device`."""
'''

_PREPARE_BATCH_HEAD = '''\
def prepare_batch(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (data, label) pair of `batch`, both moved to `device` with non_blocking=True."""
'''


def _standardize(init: str, forward: str) -> str:
    return (
        '''\
class Standardize(nn.Module):
    """(x - mean) / std, with mean and std kept as buffers: moved by .to(), saved by state_dict()."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
'''
        + init
        + """
    def forward(self, x: torch.Tensor) -> torch.Tensor:
"""
        + forward
    )


MISTAKES_02 = [
    Mistake(
        id="misplaced_check_skips_buffers",
        url="https://github.com/pytorch/pytorch/issues/117217",
        summary=(
            "Inspected only model.named_parameters() to check a loaded model, which led to a wrong"
            " conclusion because BatchNorm's running_mean and running_var are buffers, not"
            " parameters."
        ),
        assignment="02_cross_device_errors",
        answer="find_misplaced",
        code=_FIND_MISPLACED_HEAD
        + """\
    device = torch.device(device)
    misplaced = [name for name, parameter in model.named_parameters() if parameter.device != device]
    misplaced += [f"input {i}" for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.device != device]
    return misplaced
""",
        fix="""\
from itertools import chain


"""
        + _FIND_MISPLACED_HEAD
        + """\
    wanted = torch.device(device)
    tensors = chain(model.named_parameters(), model.named_buffers(),
                    ((f"input {i}", x) for i, x in enumerate(inputs) if torch.is_tensor(x)))
    return [name for name, tensor in tensors if tensor.device != wanted]
""",
    ),
    Mistake(
        id="constants_kept_as_plain_attributes",
        url="https://github.com/pytorch/audio/pull/457",
        summary=(
            "TimeStretch stored phase_advance as a plain tensor attribute, so after .cuda() it"
            " stayed on the CPU and the forward pass failed with 'expected device cuda:0 but got"
            " device cpu'."
        ),
        assignment="02_cross_device_errors",
        answer="standardize",
        code=_standardize(
            """\
        self.mean = mean
        self.std = std
""",
            """\
        return (x - self.mean) / self.std
""",
        ),
        fix=_standardize(
            """\
        self.mean = nn.Buffer(mean)  # nn.Buffer: registered on assignment, like nn.Parameter
        self.std = nn.Buffer(std)
""",
            """\
        return torch.div(x - self.mean, self.std)
""",
        ),
    ),
    Mistake(
        id="constants_as_frozen_parameters",
        url="https://github.com/jmclong/random-fourier-features-pytorch/issues/6",
        summary=(
            "Kept a fixed tensor as nn.Parameter(..., requires_grad=False) instead of a buffer, so"
            " it showed up among the trainable parameters and a later requires_grad_(True) made it"
            " trainable."
        ),
        assignment="02_cross_device_errors",
        answer="standardize",
        code=_standardize(
            """\
        self.mean = nn.Parameter(mean, requires_grad=False)
        self.std = nn.Parameter(std, requires_grad=False)
""",
            """\
        return (x - self.mean) / self.std
""",
        ),
    ),
    Mistake(
        id="constants_moved_in_forward",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/1978",
        summary=(
            "Moved a tensor created in __init__ to the input's device inside forward() on every"
            " step, instead of registering it as a buffer that .to() moves and state_dict() saves."
        ),
        assignment="02_cross_device_errors",
        answer="standardize",
        code=_standardize(
            """\
        self.mean = mean
        self.std = std
""",
            """\
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        return (x - mean) / std
""",
        ),
    ),
    Mistake(
        id="target_left_on_cpu",
        url="https://github.com/JieyuZ2/wrench/issues/4",
        summary=(
            "Moved the model outputs to the GPU but not the targets, so cross_entropy failed with"
            " 'Expected all tensors to be on the same device ... (when checking argument for"
            " argument target)'."
        ),
        assignment="02_cross_device_errors",
        answer="prepare_batch",
        code=_PREPARE_BATCH_HEAD
        + """\
    data, label = batch
    return data.to(device, non_blocking=True), label  # the model only sees the data
""",
        fix=_PREPARE_BATCH_HEAD
        + """\
    data, label = (tensor.to(device=device, non_blocking=True) for tensor in batch)
    return data, label
""",
    ),
    Mistake(
        id="batch_moved_with_cuda_call",
        url="https://github.com/marco-rudolph/AST/issues/4",
        summary=(
            "Training code moved tensors with .cuda() although the config said device=cpu, so it "
            "failed on a CPU-only machine with 'Torch not compiled with CUDA enabled'."
        ),
        assignment="02_cross_device_errors",
        answer="prepare_batch",
        code=_PREPARE_BATCH_HEAD
        + """\
    data, label = batch
    return data.cuda(non_blocking=True), label.cuda(non_blocking=True)
""",
    ),
    Mistake(
        id="every_batch_pinned",
        url="https://github.com/karpathy/nanoGPT/pull/120",
        summary=(
            "Training code pinned every batch with .pin_memory() before its non_blocking copy,"
            " which failed when training on the CPU or on a Mac's GPU."
        ),
        assignment="02_cross_device_errors",
        answer="prepare_batch",
        code=_PREPARE_BATCH_HEAD
        + """\
    data, label = batch
    return data.pin_memory().to(device, non_blocking=True), label.pin_memory().to(device, non_blocking=True)
""",
        fix=_PREPARE_BATCH_HEAD
        + """\
    data, label = batch
    if torch.device(device).type == "cuda":  # page-locked memory speeds up copies to a CUDA GPU only
        data, label = data.pin_memory(), label.pin_memory()
    return data.to(device, non_blocking=True), label.to(device, non_blocking=True)
""",
    ),
    Mistake(
        id="integer_ids_left_on_cpu",
        url="https://github.com/yangjianxin1/GPT2-chitchat/issues/8",
        summary=(
            "Left the integer input_ids on the CPU while the model was on the GPU, so the"
            " embedding's index_select failed with 'Expected object of device type cuda but got"
            " device type cpu'."
        ),
        assignment="02_cross_device_errors",
        answer="prepare_batch",
        code=_PREPARE_BATCH_HEAD
        + """\
    # only floating-point tensors feed the layers; integer class ids are just indices
    data, label = (t.to(device, non_blocking=True) if t.is_floating_point() else t for t in batch)
    return data, label
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 03_saving_and_loading

_SAVE_CHECKPOINT_HEAD = '''\
def save_checkpoint(path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler, epoch: int) -> None:
    """Write everything needed to resume training after `epoch` into one file at `path`."""
'''

_RESUME_HEAD = '''\
def resume(path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> int:
    """Restore a run from the checkpoint at `path` into a freshly built one; return the epoch to continue with."""
'''

_LOAD_WEIGHTS_HEAD = '''\
def load_weights_safely(path) -> dict:
    """The model state dict in the file at `path`, on the CPU, loaded with weights_only=True.

    Raises ValueError, naming the globals the file needs, when weights_only=True refuses it.
    """
'''

MISTAKES_03 = [
    Mistake(
        id="checkpoint_pickles_the_model_object",
        url="https://github.com/chenxie95/deeplearning_course_sjtu/issues/28",
        summary=(
            "Saved the model object itself with torch.save(model) rather than model.state_dict(),"
            " so loading needed the class at the same import path and failed with AttributeError."
        ),
        assignment="03_saving_and_loading",
        answer="save_checkpoint",
        code=_SAVE_CHECKPOINT_HEAD
        + """\
    torch.save({
        "model": model,  # the whole model: architecture and weights together
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "epoch": epoch,
        "rng_state": torch.get_rng_state(),
        "cuda_rng_states": torch.cuda.get_rng_state_all(),
    }, path)
""",
        fix=_SAVE_CHECKPOINT_HEAD
        + """\
    checkpoint = dict(
        model=model.state_dict(),
        optimizer=optimizer.state_dict(),
        scaler=scaler.state_dict(),
        epoch=int(epoch),
        rng_state=torch.random.get_rng_state(),
        cuda_rng_states=[torch.cuda.get_rng_state(index) for index in range(torch.cuda.device_count())],
    )
    with open(path, "wb") as file:
        torch.save(checkpoint, file)
""",
    ),
    Mistake(
        id="checkpoint_forgets_grad_scaler",
        url="https://github.com/huggingface/transformers/pull/11663",
        summary=(
            "Checkpoints held the model, optimizer and scheduler but not the AMP GradScaler state,"
            " so a resumed mixed-precision run did not match an uninterrupted one."
        ),
        assignment="03_saving_and_loading",
        answer="save_checkpoint",
        code=_SAVE_CHECKPOINT_HEAD
        + """\
    torch.save({
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "rng_state": torch.get_rng_state(),
        "cuda_rng_states": torch.cuda.get_rng_state_all(),
    }, path)
""",
    ),
    Mistake(
        id="resume_without_map_location",
        url="https://github.com/Juyong/CaricatureFace/issues/2",
        summary=(
            "Loaded a checkpoint written on cuda:1 with a bare torch.load(path) on a one-GPU"
            " machine and got 'Attempting to deserialize object on CUDA device 1 but"
            " torch.cuda.device_count() is 1'."
        ),
        assignment="03_saving_and_loading",
        answer="resume",
        code=_RESUME_HEAD
        + """\
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])
    torch.set_rng_state(checkpoint["rng_state"])
    if len(checkpoint["cuda_rng_states"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(checkpoint["cuda_rng_states"])
    return checkpoint["epoch"] + 1
""",
        fix=_RESUME_HEAD
        + """\
    # map_location as a function: every storage stays where torch.load first reads it, the CPU
    checkpoint = torch.load(path, map_location=lambda storage, location: storage, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])  # moves the state next to the parameters
    scaler.load_state_dict(checkpoint["scaler"])
    torch.random.set_rng_state(checkpoint["rng_state"])
    cuda_states = checkpoint["cuda_rng_states"]
    if len(cuda_states) == torch.cuda.device_count():
        for index, state in enumerate(cuda_states):
            torch.cuda.set_rng_state(state, index)
    return int(checkpoint["epoch"]) + 1
""",
    ),
    Mistake(
        id="rng_state_mapped_to_gpu",
        url="https://github.com/lanl/hippynn/pull/12",
        summary=(
            "Restored a checkpoint with map_location set to a GPU, which also moved the saved CPU"
            " RNG state there, and torch.random.set_rng_state failed with 'RNG state must be a"
            " torch.ByteTensor'."
        ),
        assignment="03_saving_and_loading",
        answer="resume",
        code=_RESUME_HEAD
        + """\
    device = next(model.parameters()).device
    checkpoint = torch.load(path, map_location=device, weights_only=True)  # straight onto the model's device
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])
    torch.set_rng_state(checkpoint["rng_state"])
    if len(checkpoint["cuda_rng_states"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(checkpoint["cuda_rng_states"])
    return checkpoint["epoch"] + 1
""",
    ),
    Mistake(
        id="unsafe_fallback_after_weights_only_error",
        url="https://github.com/gpoesia/minimo/pull/21",
        summary=(
            "Answered PyTorch 2.6's 'Weights only load failed' error by loading with"
            " weights_only=False, which the error message itself warns can execute arbitrary code"
            " from the file."
        ),
        assignment="03_saving_and_loading",
        answer="load_weights_safely",
        code=_LOAD_WEIGHTS_HEAD
        + """\
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        content = torch.load(path, map_location="cpu", weights_only=False)  # what the error message suggests
    if isinstance(content, dict) and isinstance(content.get("model"), dict):
        return content["model"]
    return content
""",
        fix=_LOAD_WEIGHTS_HEAD
        + """\
    needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)  # reads the pickle, runs nothing
    if needed:
        raise ValueError(f"refusing {Path(path).name}: it needs {', '.join(needed)}")
    content = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    model = content.get("model") if isinstance(content, dict) else None
    return model if isinstance(model, dict) else content
""",
    ),
    Mistake(
        id="training_checkpoint_returned_whole",
        url="https://github.com/aotumanbiu/Pytorch-Mask-RCNN/issues/4",
        summary=(
            "Passed a whole training checkpoint to load_state_dict and got 'Unexpected key(s) in "
            'state_dict: "model", "optimizer", "lr_scheduler", "args", "epoch"\'.'
        ),
        assignment="03_saving_and_loading",
        answer="load_weights_safely",
        code=_LOAD_WEIGHTS_HEAD
        + """\
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        raise ValueError(f"{Path(path).name} needs {', '.join(needed)}") from None
""",
    ),
    Mistake(
        id="weights_loaded_without_map_location",
        url="https://github.com/Sujit-O/pykg2vec/issues/223",
        summary=(
            "Trained on a GPU machine and loaded the model on a CPU machine without map_location,"
            " and got 'Attempting to deserialize object on a CUDA device but"
            " torch.cuda.is_available() is False'."
        ),
        assignment="03_saving_and_loading",
        answer="load_weights_safely",
        code=_LOAD_WEIGHTS_HEAD
        + """\
    try:
        content = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        raise ValueError(f"{Path(path).name} needs {', '.join(needed)}") from None
    if isinstance(content, dict) and isinstance(content.get("model"), dict):
        return content["model"]
    return content
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 04_map_location

_LOAD_ON_CPU_HEAD = '''\
def load_on_cpu(path) -> dict:
    """The checkpoint at `path`, loaded with weights_only=True, every tensor on the CPU."""
'''


def _gpu_remap(remap_body: str, map_body: str) -> str:
    return (
        '''\
def remap_tag(location: str, gpu_count: int) -> str:
    """Where a storage tagged `location` goes on a machine with `gpu_count` GPUs."""
'''
        + remap_body
        + '''

def gpu_remap(gpu_count: int):
    """A map_location function that moves each storage to remap_tag(its tag, gpu_count)."""
'''
        + map_body
    )


_GPU_REMAP_MAP = """\
    def map_location(storage, location):
        return storage.to(device=remap_tag(location, gpu_count))
    return map_location
"""

_LOAD_BIG_HEAD = '''\
def load_big(path, factory) -> nn.Module:
    """factory()'s model, built on meta and given the checkpoint's tensors (mmap=True, assign=True), on the CPU."""
'''

MISTAKES_04 = [
    Mistake(
        id="cpu_load_without_map_location",
        url="https://github.com/xl-sr/THOR/issues/5",
        summary=(
            "Loaded GPU-saved weights on a CPU-only machine with torch.load(model_path) and failed"
            " with 'Attempting to deserialize object on a CUDA device'; the fix was"
            " map_location='cpu'."
        ),
        assignment="04_map_location",
        answer="load_on_cpu",
        code=_LOAD_ON_CPU_HEAD
        + """\
    return torch.load(path, weights_only=True)
""",
        fix=_LOAD_ON_CPU_HEAD
        + """\
    keep_where_read = lambda storage, location: storage  # storages are read onto the CPU first
    return torch.load(path, map_location=keep_where_read, weights_only=True)
""",
    ),
    Mistake(
        id="map_location_dict_lists_one_gpu",
        url="https://github.com/zijundeng/BDRAR/issues/12",
        summary=(
            "Worked around 'Attempting to deserialize object on CUDA device 1' with a map_location"
            " dict naming only the GPUs of that one file, which does not cover storages tagged with"
            " any other GPU."
        ),
        assignment="04_map_location",
        answer="load_on_cpu",
        code=_LOAD_ON_CPU_HEAD
        + """\
    return torch.load(path, map_location={"cuda:0": "cpu"}, weights_only=True)
""",
    ),
    Mistake(
        id="weights_only_false_to_silence_warning",
        url="https://github.com/mayuelala/FollowYourCanvas/pull/14",
        summary=(
            "Added weights_only=False to every torch.load call to stop the FutureWarning, opting"
            " into full unpickling, which can run arbitrary code from the file."
        ),
        assignment="04_map_location",
        answer="load_on_cpu",
        code=_LOAD_ON_CPU_HEAD
        + """\
    return torch.load(path, map_location="cpu", weights_only=False)  # no more FutureWarning
""",
    ),
    Mistake(
        id="gpu_index_kept_on_smaller_machine",
        url="https://github.com/zeruniverse/neural-colorization/issues/11",
        summary=(
            "Loaded weights saved on cuda:1 on a machine with a single GPU and got 'Attempting to "
            "deserialize object on CUDA device 1 but torch.cuda.device_count() is 1'."
        ),
        assignment="04_map_location",
        answer="gpu_remap",
        code=_gpu_remap(
            """\
    if location.startswith("cuda") and gpu_count == 0:
        return "cpu"
    return location  # a GPU machine: the same GPU as when it was saved
""",
            _GPU_REMAP_MAP,
        ),
        fix=_gpu_remap(
            """\
    device = torch.device(location)
    if device.type != "cuda":
        return location
    if gpu_count <= 0:
        return "cpu"
    return str(torch.device("cuda", (device.index or 0) % gpu_count))
""",
            """\
    def map_location(storage, location):
        target = remap_tag(location, gpu_count)
        return storage if str(storage.device) == target else storage.to(device=target)
    return map_location
""",
        ),
    ),
    Mistake(
        id="every_gpu_tag_mapped_to_cuda0",
        url="https://github.com/Juyong/CaricatureFace/issues/12",
        summary=(
            "Fixed the cuda:1 deserialization error by loading with map_location='cuda:0', which"
            " puts every tensor on the first GPU whatever GPUs the machine has."
        ),
        assignment="04_map_location",
        answer="gpu_remap",
        code=_gpu_remap(
            """\
    if not location.startswith("cuda"):
        return location
    return "cuda:0" if gpu_count > 0 else "cpu"
""",
            _GPU_REMAP_MAP,
        ),
    ),
    Mistake(
        id="meta_model_loaded_without_assign",
        url="https://github.com/LLaVA-VL/LLaVA-NeXT/issues/494",
        summary=(
            "Loaded a checkpoint into a model built on the meta device with plain load_state_dict"
            " and got 'copying from a non-meta parameter ... to a meta parameter ... which is a"
            " no-op'."
        ),
        assignment="04_map_location",
        answer="load_big",
        code=_LOAD_BIG_HEAD
        + """\
    with torch.device("meta"):
        model = factory()
    state = torch.load(path, mmap=True, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model
""",
    ),
    Mistake(
        id="assign_keeps_checkpoint_dtype",
        url="https://github.com/huggingface/transformers/pull/36447",
        summary=(
            "Switching to load_state_dict(..., assign=True) into a meta model gave the model the "
            "checkpoint's dtypes instead of its own, so the tensors had to be cast before loading."
        ),
        assignment="04_map_location",
        answer="load_big",
        code=_LOAD_BIG_HEAD
        + """\
    with torch.device("meta"):
        model = factory()
    state = torch.load(path, mmap=True, map_location="cpu", weights_only=True)
    model.load_state_dict(state, assign=True)
    return model
""",
    ),
    Mistake(
        id="mmap_load_without_map_location",
        url="https://github.com/LikeLy-Journey/SegmenTron/issues/44",
        summary=(
            "Loaded a pretrained checkpoint without map_location on a CPU machine and hit"
            " 'Attempting to deserialize object on a CUDA device'; the fix passed map_location to"
            " torch.load."
        ),
        assignment="04_map_location",
        answer="load_big",
        code=_LOAD_BIG_HEAD
        + """\
    with torch.device("meta"):
        model = factory()
    state = torch.load(path, mmap=True, weights_only=True)  # mmap: nothing is read until it is used
    wanted = model.state_dict()
    state = {key: value.to(wanted[key].dtype) if key in wanted and value.is_floating_point() else value
             for key, value in state.items()}
    model.load_state_dict(state, assign=True)
    return model
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 05_module_prefix

_STRIP_HEAD = '''\
def strip_wrapper_prefixes(state_dict: dict) -> dict:
    """A new dict without the wrapper prefixes (module., _orig_mod.) that every key shares, nested ones too.

    Keys keep their order; values are the input's own tensors. The input is not modified.
    """
'''

_UNWRAP_HEAD = '''\
def unwrap(model: nn.Module) -> nn.Module:
    """The innermost module under any nesting of DataParallel, DistributedDataParallel and torch.compile."""
'''

_LOAD_CHECKED_HEAD = '''\
def load_checked(model: nn.Module, state_dict: dict) -> nn.Module:
    """Load state_dict (wrapper prefixes stripped) into model strictly, or raise KeyError and change nothing."""
'''

MISTAKES_05 = [
    Mistake(
        id="prefix_removed_with_str_replace",
        url="https://github.com/openvinotoolkit/model_preparation_algorithm/issues/90",
        summary=(
            "Stripped a prefix from state-dict keys with str.replace, which also removed it from"
            " the middle of names: head.aux_head.weight became aux_weight and the checkpoint was"
            " corrupted."
        ),
        assignment="05_module_prefix",
        answer="strip_wrapper_prefixes",
        code=_STRIP_HEAD
        + """\
    return {key.replace("module.", "").replace("_orig_mod.", ""): value for key, value in state_dict.items()}
""",
        fix=_STRIP_HEAD
        + """\
    wrappers = ("module.", "_orig_mod.")
    keys = list(state_dict)
    while keys:
        head = keys[0].split(".", 1)[0] + "."  # the first key's first component
        if head not in wrappers or not all(key.startswith(head) for key in keys):
            break
        keys = [key[len(head):] for key in keys]
    return {new: state_dict[old] for new, old in zip(keys, state_dict)}
""",
    ),
    Mistake(
        id="prefix_removed_by_slicing_seven",
        url="https://github.com/nnizhang/VST/issues/10",
        summary=(
            "Loading code dropped the first seven characters of every key (name = k[7:]) to remove "
            "DataParallel's 'module.', which only works when every key carries exactly that prefix."
        ),
        assignment="05_module_prefix",
        answer="strip_wrapper_prefixes",
        code=_STRIP_HEAD
        + """\
    return {key[7:]: value for key, value in state_dict.items()}  # remove `module.`
""",
    ),
    Mistake(
        id="compiled_prefix_not_stripped",
        url="https://github.com/FareedKhan-dev/train-llm-from-scratch/issues/36",
        summary=(
            "The prefix-stripping code handled DDP's 'module.' but not torch.compile's"
            " '_orig_mod.', so compiled checkpoints loaded with 163 missing keys and random"
            " weights."
        ),
        assignment="05_module_prefix",
        answer="strip_wrapper_prefixes",
        code=_STRIP_HEAD
        + """\
    if state_dict and all(key.startswith("module.") for key in state_dict):
        return {key[len("module."):]: value for key, value in state_dict.items()}
    return dict(state_dict)
""",
    ),
    Mistake(
        id="unwrap_by_module_attribute",
        url="https://github.com/huggingface/accelerate/issues/1207",
        summary=(
            "unwrap_model peeled DataParallel and DDP through their .module attribute but did not"
            " know torch.compile's OptimizedModule, so a compiled model came back still wrapped."
        ),
        assignment="05_module_prefix",
        answer="unwrap",
        code=_UNWRAP_HEAD
        + """\
    while hasattr(model, "module"):
        model = model.module
    return model
""",
        fix=_UNWRAP_HEAD
        + """\
    if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
        return unwrap(model.module)
    if isinstance(model, OptimizedModule):
        return unwrap(model._orig_mod)
    return model
""",
    ),
    Mistake(
        id="unwrap_one_level_only",
        url="https://github.com/huggingface/accelerate/issues/3281",
        summary=(
            "Accelerator.unwrap_model on a model wrapped by both DeepSpeed/DDP and torch.compile"
            " returned the distributed wrapper instead of the plain model."
        ),
        assignment="05_module_prefix",
        answer="unwrap",
        code=_UNWRAP_HEAD
        + """\
    if isinstance(model, OptimizedModule):
        return model._orig_mod
    if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
        return model.module
    return model
""",
    ),
    Mistake(
        id="strict_false_hides_missing_keys",
        url="https://github.com/pytorch/examples/issues/1029",
        summary=(
            "Loaded a Lightning checkpoint whose keys carried a 'model.' prefix with strict=False;"
            " it loaded without an error but none of the weights matched and the outputs were"
            " nonsense."
        ),
        assignment="05_module_prefix",
        answer="load_checked",
        code=_LOAD_CHECKED_HEAD
        + """\
    model.load_state_dict(strip_wrapper_prefixes(state_dict), strict=False)
    return model
""",
        fix=_LOAD_CHECKED_HEAD
        + """\
    state = strip_wrapper_prefixes(state_dict)
    own = model.state_dict()
    missing = [key for key in own if key not in state]
    unexpected = [key for key in state if key not in own]
    if missing or unexpected:
        raise KeyError(f"missing keys {missing}, unexpected keys {unexpected}")
    model.load_state_dict(state, strict=True)
    return model
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 06_mixed_precision

_AMP_STEP_HEAD = '''\
def amp_step(model: nn.Module, batch: torch.Tensor, target: torch.Tensor, optimizer: torch.optim.Optimizer,
             scaler: torch.amp.GradScaler, amp_dtype: torch.dtype | None,
             max_norm: float | None = None) -> torch.Tensor:
    """One training step under autocast for batch's device type (amp_dtype None: float32), gradients clipped
    to max_norm if given. Returns the detached loss."""
'''

_OUTPUT_DTYPES_HEAD = '''\
def output_dtypes(model: nn.Module, x: torch.Tensor, dtype: torch.dtype | None) -> dict[str, torch.dtype]:
    """{leaf module name: output dtype} for model(x) under autocast for x's device type (dtype None: disabled)."""
'''

_CAST_FLOATING_HEAD = '''\
def cast_floating(state_dict: dict, dtype: torch.dtype) -> dict:
    """A new dict with the floating-point tensors converted to dtype; every other value is kept as it is."""
'''


def _output_dtypes(autocast_block: str) -> str:
    return (
        _OUTPUT_DTYPES_HEAD
        + """\
    dtypes = {}

    def recorder(name):
        def hook(module, inputs, output):
            dtypes[name] = output.dtype
        return hook

    handles = [module.register_forward_hook(recorder(name))
               for name, module in model.named_modules() if next(module.children(), None) is None]
    try:
"""
        + autocast_block
        + """\
    finally:
        for handle in handles:
            handle.remove()
    return dtypes
"""
    )


_TIME_ON_DEVICE_HEAD = '''\
def time_on_device(fn, device: torch.device, warmup: int = 3, repeat: int = 10) -> float:
    """Milliseconds per call of fn on device: warmup untimed calls, then the average of repeat timed calls."""
'''

MISTAKES_06 = [
    Mistake(
        id="autocast_device_type_with_index",
        url="https://github.com/speechbrain/speechbrain/issues/2881",
        summary=(
            "Passed the device string 'cuda:0' as autocast's device_type and got 'User specified an"
            " unsupported autocast device_type 'cuda:0''; autocast wants the type, 'cuda'."
        ),
        assignment="06_mixed_precision",
        answer="amp_step",
        code=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(str(batch.device), dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
""",
        fix=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad()
    use_amp = amp_dtype is not None
    with torch.autocast(device_type=batch.device.type, dtype=amp_dtype if use_amp else None, enabled=use_amp):
        logits = model(batch)
        loss = F.cross_entropy(logits, target)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # explicit: the gradients are true gradients from here on
    if max_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)      # skips the step if they hold inf or NaN
    scaler.update()
    return loss.detach()
""",
    ),
    Mistake(
        id="gradients_clipped_before_unscale",
        url="https://github.com/milesial/Pytorch-UNet/issues/468",
        summary=(
            "The training loop clipped the gradients right after scaler.scale(loss).backward(),"
            " while they were still multiplied by the scale; scaler.unscale_(optimizer) has to come"
            " first."
        ),
        assignment="06_mixed_precision",
        answer="amp_step",
        code=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(batch.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()
    if max_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # unscales, then steps
    scaler.update()
    return loss.detach()
""",
    ),
    Mistake(
        id="scaler_update_missing",
        url="https://github.com/Azure/MS-AMP/pull/45",
        summary=(
            "An MNIST example called scaler.step(optimizer) without scaler.update(), which failed"
            " on the next step with 'step() has already been called since the last update()'."
        ),
        assignment="06_mixed_precision",
        answer="amp_step",
        code=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(batch.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    return loss.detach()
""",
    ),
    Mistake(
        id="scaled_gradients_stepped_directly",
        url="https://github.com/nerfstudio-project/nerfacc/issues/307",
        summary=(
            "The example used the GradScaler only to scale the loss and then called"
            " optimizer.step() itself, so the optimizer applied gradients 1024 times too large"
            " instead of unscaled ones."
        ),
        assignment="06_mixed_precision",
        answer="amp_step",
        code=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(batch.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()  # scaled, so float16 gradients do not underflow
    optimizer.step()
    return loss.detach()
""",
    ),
    Mistake(
        id="cuda_amp_autocast_on_cpu",
        url="https://github.com/ai-forever/Real-ESRGAN/issues/12",
        summary=(
            "Decorated the model's forward with @torch.cuda.amp.autocast(), which always asks for"
            " CUDA autocast; on a CPU run it only warned 'CUDA is not available. Disabling'."
        ),
        assignment="06_mixed_precision",
        answer="output_dtypes",
        code=_output_dtypes("""\
        with torch.cuda.amp.autocast(dtype=dtype or torch.float16, enabled=dtype is not None):
            model(x)
"""),
        fix="""\
from torch.nn.modules.module import register_module_forward_hook


"""
        + _OUTPUT_DTYPES_HEAD
        + """\
    leaves = {module: name for name, module in model.named_modules() if not list(module.children())}
    dtypes = {}

    def record(module, inputs, output):
        if module in leaves:
            dtypes[leaves[module]] = output.dtype

    handle = register_module_forward_hook(record)  # one global hook, removed below whatever happens
    try:
        with torch.autocast(device_type=x.device.type, dtype=dtype, enabled=dtype is not None):
            model(x)
    finally:
        handle.remove()
    return dtypes
""",
    ),
    Mistake(
        id="half_model_instead_of_autocast",
        url="https://github.com/arcee-ai/mergekit/issues/175",
        summary=(
            "Ran a model cast to float16 on the CPU instead of using autocast, and inference failed"
            " with '\"addmm_impl_cpu_\" not implemented for 'Half''."
        ),
        assignment="06_mixed_precision",
        answer="output_dtypes",
        code=_output_dtypes("""\
        if dtype is not None:  # lower precision: cast the model and the input
            model = model.to(dtype)
            x = x.to(dtype)
        model(x)
"""),
    ),
    Mistake(
        id="autocast_hardcoded_cuda",
        url="https://github.com/kornia/kornia/issues/4094",
        summary=(
            'Wrapped a block in torch.autocast("cuda", ...) regardless of the input\'s device, so'
            " every CPU run warned 'User provided device_type of 'cuda', but CUDA is not available'"
            " and ran uncast."
        ),
        assignment="06_mixed_precision",
        answer="output_dtypes",
        code=_output_dtypes("""\
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            model(x)
"""),
    ),
    Mistake(
        id="integer_buffers_cast_to_half",
        url="https://github.com/huggingface/transformers/pull/18471",
        summary=(
            "Loading with torch_dtype=torch.float16 cast every buffer, including integer and bool"
            " ones such as causal masks, which broke the model; the fix skips non-floating tensors."
        ),
        assignment="06_mixed_precision",
        answer="cast_floating",
        code=_CAST_FLOATING_HEAD
        + """\
    return {key: value.to(dtype) if isinstance(value, torch.Tensor) else value
            for key, value in state_dict.items()}
""",
        fix=_CAST_FLOATING_HEAD
        + """\
    cast = {}
    for key, value in state_dict.items():
        if torch.is_tensor(value) and torch.is_floating_point(value):
            value = value.to(dtype=dtype)  # the same tensor back when it already has that dtype
        cast[key] = value
    return cast
""",
    ),
    Mistake(
        id="clock_stopped_before_the_gpu_finished",
        url="https://github.com/pytorch/pytorch/issues/21286",
        summary=(
            "Timed a model on a GPU with a clock around the call and no torch.cuda.synchronize(),"
            " and got fluctuating, too-small times: only the launches were measured, not the work."
        ),
        assignment="06_mixed_precision",
        answer="time_on_device",
        code=_TIME_ON_DEVICE_HEAD
        + """\
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) * 1000 / repeat
""",
        fix=_TIME_ON_DEVICE_HEAD
        + """\
    def wait():
        if device.type != "cpu":
            torch.accelerator.synchronize(device)

    for _ in range(warmup):
        fn()
    wait()
    total = 0.0
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        wait()
        total += time.perf_counter() - started
    return 1000 * total / repeat
""",
    ),
    Mistake(
        id="clock_started_with_warmup_queued",
        url="https://github.com/llmpass/RSTT/issues/3",
        summary=(
            "Synchronized only after the timed loop, not before starting the clock, so work still"
            " queued from before was counted in the timing."
        ),
        assignment="06_mixed_precision",
        answer="time_on_device",
        code=_TIME_ON_DEVICE_HEAD
        + """\
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1000 / repeat
""",
    ),
    Mistake(
        id="synchronized_only_on_cuda",
        url="https://github.com/mmcdermott/MEDS_EIC_AR/issues/132",
        summary=(
            "Added a synchronize before each timer read only when the device type is 'cuda', so"
            " timings on any other accelerator (MPS, XPU) still measured the launches alone."
        ),
        assignment="06_mixed_precision",
        answer="time_on_device",
        code=_TIME_ON_DEVICE_HEAD
        + """\
    def maybe_sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    maybe_sync()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    maybe_sync()
    return (time.perf_counter() - start) * 1000 / repeat
""",
    ),
    Mistake(
        id="scaler_update_skipped_with_the_step",
        url="https://github.com/Haian-Jin/LVSM/pull/19",
        summary=(
            "Skipped the optimizer step when the clipped gradient norm was too large or not finite,"
            " and scaler.update() with it; the next unscale_() raised 'unscale_() has already been"
            " called on this optimizer since the last update()'."
        ),
        assignment="06_mixed_precision",
        answer="amp_step",
        code=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad()
    with torch.autocast(batch.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if not torch.isfinite(norm):  # a bad step: skip it
            return loss.detach()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
""",
        fix=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=batch.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)  # skips the step itself when the gradients hold inf or NaN
    scaler.update()  # on every step, skipped or not: that is what lowers the scale
    return loss.detach()
""",
    ),
    Mistake(
        id="event_elapsed_time_before_end_completed",
        url="https://github.com/pytorch/pytorch/issues/85796",
        summary=(
            "Timed a model with CUDA events but called start.elapsed_time(end) right after"
            " end.record(), before the GPU had reached the end event, and got 'RuntimeError: CUDA"
            " error: device not ready'."
        ),
        assignment="06_mixed_precision",
        answer="time_on_device",
        code=_TIME_ON_DEVICE_HEAD
        + """\
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type == "cpu":  # events keep no time on the CPU
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - start) * 1000 / repeat
    begin = torch.Event(device=device, enable_timing=True)
    end = torch.Event(device=device, enable_timing=True)
    begin.record()
    for _ in range(repeat):
        fn()
    end.record()
    return begin.elapsed_time(end) / repeat
""",
        fix=_TIME_ON_DEVICE_HEAD
        + """\
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type == "cpu":  # events keep no time on the CPU
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        return (time.perf_counter() - start) * 1000 / repeat
    begin = torch.Event(device=device, enable_timing=True)
    end = torch.Event(device=device, enable_timing=True)
    begin.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()  # wait until the device has passed the end event (pytorch/tutorials#3166)
    return begin.elapsed_time(end) / repeat
""",
    ),
    Mistake(
        id="clipping_raises_on_overflow",
        url="https://github.com/pytorch/pytorch/issues/46849",
        summary=(
            "Asked for clip_grad_norm_ to raise when the gradient norm is not finite"
            " (error_if_nonfinite came of it); under a GradScaler an overflowing step then raises"
            " instead of being skipped."
        ),
        assignment="06_mixed_precision",
        answer="amp_step",
        code=_AMP_STEP_HEAD
        + """\
    optimizer.zero_grad()
    with torch.autocast(batch.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        loss = F.cross_entropy(model(batch), target)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm, error_if_nonfinite=True)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 07_multi_device_training

_SETUP_HEAD = '''\
def setup_distributed() -> tuple[int, int, torch.device]:
    """Join the process group of a torchrun run; return (rank, world_size, device) of this process."""
'''


def _make_loader(loader_body: str, epoch_body: str) -> str:
    return (
        '''\
def make_loader(dataset, batch_size: int, seed: int) -> DataLoader:
    """A DataLoader over this process's share of dataset, shuffled with seed."""
'''
        + loader_body
        + '''

def epoch_batches(loader: DataLoader, epoch: int) -> list:
    """The batches loader yields in epoch number `epoch`."""
'''
        + epoch_body
    )


_SAVE_RANK0_HEAD = '''\
def save_on_rank0(model: DDP, path) -> None:
    """Rank 0 saves the unwrapped model's state_dict to path; every rank returns once the file is written."""
'''

MISTAKES_07 = [
    Mistake(
        id="gpu_chosen_by_global_rank",
        url="https://github.com/meta-llama/llama-cookbook/issues/90",
        summary=(
            "Called torch.cuda.set_device(rank) with the global rank, which is 'invalid device"
            " ordinal' on every node but the first of a multi-node run; it must be the local rank."
        ),
        assignment="07_multi_device_training",
        answer="setup_distributed",
        code=_SETUP_HEAD
        + """\
    rank = int(os.environ["RANK"])
    accelerator = torch.accelerator.current_accelerator()
    if (accelerator is not None and accelerator.type != "mps"
            and torch.accelerator.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])):
        device = torch.device(accelerator.type, rank)
        torch.accelerator.set_device_index(rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(dist.get_default_backend_for_device(device))
    return dist.get_rank(), dist.get_world_size(), device
""",
        fix=_SETUP_HEAD
        + """\
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    processes_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    kind = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    one_each = kind is not None and kind.type != "mps" and torch.accelerator.device_count() >= processes_here
    device = torch.device(f"{kind.type}:{local_rank}") if one_each else torch.device("cpu")
    if one_each:
        torch.accelerator.set_device_index(device)
    dist.init_process_group(backend=dist.get_default_backend_for_device(device.type))
    return dist.get_rank(), dist.get_world_size(), device
""",
    ),
    Mistake(
        id="current_device_never_set",
        url="https://github.com/pytorch/examples/pull/1142",
        summary=(
            "Placed each rank's model on cuda:LOCAL_RANK but never made it the current device; work"
            " that names no device number went to GPU 0 from every rank (hangs, extra memory on GPU"
            " 0) until PyTorch's own DDP examples added torch.cuda.set_device."
        ),
        assignment="07_multi_device_training",
        answer="setup_distributed",
        code=_SETUP_HEAD
        + """\
    local_rank = int(os.environ["LOCAL_RANK"])
    accelerator = torch.accelerator.current_accelerator()
    if (accelerator is not None and accelerator.type != "mps"
            and torch.accelerator.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"])):
        device = torch.device(accelerator.type, local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(dist.get_default_backend_for_device(device))
    return dist.get_rank(), dist.get_world_size(), device
""",
    ),
    Mistake(
        id="nccl_backend_without_gpus",
        url="https://github.com/meta-llama/llama3/issues/127",
        summary=(
            "Called init_process_group with the 'nccl' backend on a machine whose PyTorch had no"
            " NCCL and got 'Distributed package doesn't have NCCL built in'; 'gloo' was the way"
            " out."
        ),
        assignment="07_multi_device_training",
        answer="setup_distributed",
        code=_SETUP_HEAD
        + """\
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device
""",
    ),
    Mistake(
        id="set_epoch_never_called",
        url="https://github.com/pytorch/pytorch/issues/31771",
        summary=(
            "Iterated a DataLoader with a shuffling DistributedSampler for several epochs without "
            "calling sampler.set_epoch, and every epoch gave the samples in the same order."
        ),
        assignment="07_multi_device_training",
        answer="make_loader",
        code=_make_loader(
            """\
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
""",
            """\
    return list(loader)  # the sampler shuffles by itself
""",
        ),
        fix=_make_loader(
            """\
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(),
                                 shuffle=True, seed=seed, drop_last=False)
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=sampler)
""",
            """\
    sampler = loader.sampler
    sampler.set_epoch(epoch)  # the shuffle is seeded with seed + epoch
    return [batch for batch in loader]
""",
        ),
    ),
    Mistake(
        id="shuffle_passed_with_distributed_sampler",
        url="https://github.com/ultralytics/yolov3/issues/231",
        summary=(
            "Passed shuffle=True to the DataLoader together with a DistributedSampler and got "
            "'ValueError: sampler option is mutually exclusive with shuffle'."
        ),
        assignment="07_multi_device_training",
        answer="make_loader",
        code=_make_loader(
            """\
    sampler = DistributedSampler(dataset, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, sampler=sampler)
""",
            """\
    loader.sampler.set_epoch(epoch)
    return list(loader)
""",
        ),
    ),
    Mistake(
        id="every_rank_saves_the_checkpoint",
        url="https://github.com/bytedance/ibot/issues/15",
        summary=(
            "In DDP training every process saved the checkpoint to the same file, and the"
            " concurrent writes left checkpoints that torch.load could not read."
        ),
        assignment="07_multi_device_training",
        answer="save_on_rank0",
        code=_SAVE_RANK0_HEAD
        + """\
    torch.save(model.module.state_dict(), path)  # every rank holds the same weights anyway
    dist.barrier()
""",
    ),
    Mistake(
        id="no_barrier_after_rank0_save",
        url="https://github.com/KempnerInstitute/KempnerForge/issues/49",
        summary=(
            "save() returned on the other ranks before rank 0 had written the checkpoint files, so"
            " readers raced the writes; the fix ends save() with dist.barrier()."
        ),
        assignment="07_multi_device_training",
        answer="save_on_rank0",
        code=_SAVE_RANK0_HEAD
        + """\
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), path)
""",
    ),
    Mistake(
        id="checkpoint_saved_by_local_rank_0",
        url="https://github.com/NVIDIA/apex/issues/886",
        summary=(
            "Saved the checkpoint when local_rank == 0, which is one process per node: with more"
            " than one node, several processes wrote the same file and corrupted it ('storage has"
            " wrong size')."
        ),
        assignment="07_multi_device_training",
        answer="save_on_rank0",
        code=_SAVE_RANK0_HEAD
        + """\
    if int(os.environ["LOCAL_RANK"]) == 0:
        torch.save(model.module.state_dict(), path)
    dist.barrier()
""",
    ),
    Mistake(
        id="sampler_rank_from_local_rank",
        url="https://github.com/vllm-project/speculators/pull/427",
        summary=(
            "Passed local_rank instead of the global rank to the distributed batch sampler, so on"
            " two nodes the processes with the same local rank got the same shard; one node hid it."
        ),
        assignment="07_multi_device_training",
        answer="make_loader",
        code=_make_loader(
            """\
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(),
                                 rank=int(os.environ["LOCAL_RANK"]), shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
""",
            """\
    loader.sampler.set_epoch(epoch)
    return list(loader)
""",
        ),
        fix=_make_loader(
            """\
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), shuffle=True, seed=seed)  # the global rank
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
""",
            """\
    loader.sampler.set_epoch(epoch)
    return [batch for batch in loader]
""",
        ),
    ),
    Mistake(
        id="sampler_replicas_from_processes_on_the_node",
        url="https://github.com/jasperzhong/GNNFlow/pull/57",
        summary=(
            "Sized the data sampler by the number of processes (GPUs) on this node rather than the"
            " world size, which holds only on one node; the fix stopped using the local device"
            " count."
        ),
        assignment="07_multi_device_training",
        answer="make_loader",
        code=_make_loader(
            """\
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["LOCAL_WORLD_SIZE"]),
                                 rank=dist.get_rank() % int(os.environ["LOCAL_WORLD_SIZE"]),
                                 shuffle=True, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
""",
            """\
    loader.sampler.set_epoch(epoch)
    return list(loader)
""",
        ),
    ),
    Mistake(
        id="checkpoint_saved_once_per_node",
        url="https://github.com/pytorch/examples/issues/655",
        summary=(
            "The ImageNet example saved when rank % ngpus_per_node == 0, which is true once per"
            " node, so with two nodes two processes saved the checkpoint."
        ),
        assignment="07_multi_device_training",
        answer="save_on_rank0",
        code=_SAVE_RANK0_HEAD
        + """\
    if dist.get_rank() % int(os.environ["LOCAL_WORLD_SIZE"]) == 0:  # the first process of the node
        torch.save(model.module.state_dict(), path)
    dist.barrier()
""",
        fix=_SAVE_RANK0_HEAD
        + """\
    state = model.module.state_dict()  # every rank takes it; one writes it
    if dist.get_rank(group=dist.group.WORLD) == 0:  # global rank 0 (pytorch/examples#1357)
        torch.save(state, str(path))
    dist.barrier()
""",
    ),
    Mistake(
        id="process_device_cuda_or_cpu",
        url="https://github.com/McGill-NLP/llm2vec/pull/39",
        summary=(
            "The code assumed the device was either 'cuda' or 'cpu'; with the 'mps' device it"
            " failed until the pull request added support for devices other than those two."
        ),
        assignment="07_multi_device_training",
        answer="setup_distributed",
        code=_SETUP_HEAD
        + """\
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device
""",
    ),
]

# ---------------------------------------------------------------------------------------------
# 08_portable_models_and_memory

_EXPORT_HEAD = '''\
def export_portable(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    """Export a float32 CPU copy of model, in eval mode, with a dynamic batch dimension."""
'''

_FALLBACK_HEAD = '''\
def predict_with_fallback(model: nn.Module, batch: torch.Tensor,
                          chunk_size: int | None = None) -> tuple[torch.Tensor, int]:
    """Outputs of model on batch, computed in chunks that halve whenever one runs out of memory."""
'''

_LOAD_FOR_INFERENCE_HEAD = '''\
def load_for_inference(path, model_factory, device=None) -> nn.Module:
    """A model from model_factory() with the checkpoint at path loaded, in eval mode, on device (default:
    best_device())."""
'''


def _load_for_inference(
    *,
    weights_only: bool = True,
    check_keys: bool = True,
    strict: bool = True,
    eval_mode: bool = True,
    map_location: str = '"cpu"',
    resolve: str | None = None,
) -> str:
    """A student's load_for_inference; each keyword switches one of the mistakes on (``resolve``:
    the code that sets ``device``, ``map_location``: the expression torch.load is given)."""
    load = (
        """\
        loaded = torch.load(path, map_location="""
        + map_location
        + """, weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise UnsafeCheckpoint(f"{path.name} holds more than tensors: not loaded", []) from err
        raise NotACheckpoint(f"{path.name} is not a PyTorch checkpoint: {err}") from err
"""
        if weights_only
        else """\
        loaded = torch.load(path, map_location="cpu", weights_only=False)  # also opens whole pickled models
    except pickle.UnpicklingError as err:
        raise NotACheckpoint(f"{path.name} is not a PyTorch checkpoint: {err}") from err
"""
    )
    unpickled = (
        ""
        if weights_only
        else """\
    if isinstance(loaded, nn.Module):
        loaded = loaded.state_dict()
"""
    )
    keys = (
        """\
    expected = model.state_dict()
    wrong = sorted(set(expected) ^ set(state))
    wrong += [key for key in expected if key in state and state[key].shape != expected[key].shape]
    if wrong:
        raise KeyMismatch(f"{path.name} does not fit the model: {', '.join(wrong)}", [], [], wrong)
"""
        if check_keys
        else ""
    )
    resolve = (
        resolve
        or """\
    device = best_device() if device is None else torch.device(device)
"""
    )
    return (
        _LOAD_FOR_INFERENCE_HEAD
        + """\
    import pickle
    path = Path(path)
"""
        + resolve
        + """\
    if not path.is_file():
        raise CheckpointNotFound(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise EmptyCheckpoint(f"{path.name} is empty")
    try:
"""
        + load
        + """\
    except (RuntimeError, EOFError, ValueError, IndexError) as err:
        raise TruncatedCheckpoint(f"{path.name} could not be read: {err}") from err
"""
        + unpickled
        + """\
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        loaded = loaded["model"]
    if not isinstance(loaded, dict) or not loaded or not all(torch.is_tensor(v) for v in loaded.values()):
        raise NotACheckpoint(f"{path.name} holds no state dict")
    state = strip_prefixes(loaded)
    model = model_factory()
"""
        + keys
        + """\
    model.load_state_dict(state"""
        + ("" if strict else ", strict=False")
        + """)
    model = model.to(device)
"""
        + (
            """\
    return model.eval()
"""
            if eval_mode
            else """\
    return model
"""
        )
    )


MISTAKES_08 = [
    Mistake(
        id="export_on_the_training_device",
        url="https://github.com/pytorch/pytorch/issues/121761",
        summary=(
            "Exported a model with torch.export on one device and then ran the ExportedProgram on"
            " another, which failed because export bakes the devices it saw into the graph."
        ),
        assignment="08_portable_models_and_memory",
        answer="export_portable",
        code=_EXPORT_HEAD
        + """\
    model.eval()
    return export(model, (example,), dynamic_shapes=({0: Dim("batch")},))
""",
        fix=_EXPORT_HEAD
        + """\
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.device.type == "meta" for t in tensors):
        raise ValueError("model is on the meta device: there are no weights to export")
    portable = copy.deepcopy(model).float().to("cpu").train(False)
    example = example.detach().cpu().float()
    return torch.export.export(portable, (example,), dynamic_shapes={"x": {0: Dim("batch")}})
""",
    ),
    Mistake(
        id="export_keeps_half_precision_on_cpu",
        url="https://github.com/pytorch/pytorch/issues/72175",
        summary=(
            "Moved a float16 model to the CPU for export without casting it to float32, and the"
            " export failed with '\"unfolded2d_copy\" not implemented for 'Half''."
        ),
        assignment="08_portable_models_and_memory",
        answer="export_portable",
        code=_EXPORT_HEAD
        + """\
    if any(t.is_meta for t in list(model.parameters()) + list(model.buffers())):
        raise ValueError("the model is on the meta device: it has no weights to export")
    portable = copy.deepcopy(model).cpu().eval()
    return export(portable, (example.detach().cpu(),), dynamic_shapes=({0: Dim("batch")},))
""",
    ),
    Mistake(
        id="oom_detected_by_cuda_message",
        url="https://github.com/Lightning-AI/pytorch-lightning/issues/6819",
        summary=(
            "is_cuda_out_of_memory looked for the single string 'CUDA out of memory.' in the error,"
            " so other out-of-memory messages went undetected and batch-size tuning failed."
        ),
        assignment="08_portable_models_and_memory",
        answer="predict_with_fallback",
        code=_FALLBACK_HEAD
        + """\
    chunk_size = chunk_size or batch.shape[0]
    outputs = []
    start = 0
    with torch.no_grad():
        while start < batch.shape[0]:
            ran_out = False
            try:
                outputs.append(model(batch[start:start + chunk_size]))
            except RuntimeError as err:
                if "CUDA out of memory" not in str(err) or chunk_size == 1:
                    raise
                ran_out = True
            if ran_out:
                chunk_size //= 2
                continue
            start += chunk_size
    return torch.cat(outputs), chunk_size
""",
    ),
    Mistake(
        id="oom_retry_inside_except",
        url="https://github.com/pytorch/pytorch/issues/18853",
        summary=(
            "Retried a smaller batch from inside the except clause after a CUDA OOM; the tensors of"
            " the failed attempt stay alive until the exception is gone, so the retry ran out of"
            " memory too."
        ),
        assignment="08_portable_models_and_memory",
        answer="predict_with_fallback",
        code=_FALLBACK_HEAD
        + """\
    def run(rows, size):
        try:
            return [model(rows[i:i + size]) for i in range(0, rows.shape[0], size)], size
        except RuntimeError as err:
            if not is_out_of_memory(err) or size == 1:
                raise
            return run(rows, size // 2)  # try again with half the rows

    with torch.no_grad():
        outputs, used = run(batch, chunk_size or batch.shape[0])
    return torch.cat(outputs), used
""",
        fix=_FALLBACK_HEAD
        + '''\
    def attempt(rows):
        """(output, False), or (None, True) when the rows do not fit; the except block is over on return."""
        try:
            return model(rows), False
        except RuntimeError as err:
            if not is_out_of_memory(err) or rows.shape[0] == 1:
                raise
            return None, True

    size = chunk_size or batch.shape[0]
    pieces, start = [], 0
    with torch.no_grad():
        while start < batch.shape[0]:
            piece, too_big = attempt(batch[start:start + size])
            if too_big:
                size //= 2  # the failed attempt was freed when attempt() returned
                continue
            pieces.append(piece)
            start += piece.shape[0]
    return torch.cat(pieces), size
''',
    ),
    Mistake(
        id="inference_without_no_grad",
        url="https://github.com/serend1p1ty/SeqNet/pull/14",
        summary=(
            "Ran inference without torch.no_grad(), so every output kept its autograd graph and GPU"
            " memory ran out; wrapping the model call in torch.no_grad() fixed it."
        ),
        assignment="08_portable_models_and_memory",
        answer="predict_with_fallback",
        code=_FALLBACK_HEAD
        + """\
    chunk_size = chunk_size or batch.shape[0]
    outputs = []
    start = 0
    while start < batch.shape[0]:
        ran_out = False
        try:
            outputs.append(model(batch[start:start + chunk_size]))
        except RuntimeError as err:
            if not is_out_of_memory(err) or chunk_size == 1:
                raise
            ran_out = True
        if ran_out:
            chunk_size //= 2
            continue
        start += chunk_size
    return torch.cat(outputs), chunk_size
""",
    ),
    Mistake(
        id="strict_false_at_inference_load",
        url="https://github.com/pytorch/executorch/pull/2191",
        summary=(
            "Loaded the state dict with strict=False, which silently ignores a state dict that does"
            " not match the model; the pull request switched to strict loading to stop these silent"
            " failures."
        ),
        assignment="08_portable_models_and_memory",
        answer="load_for_inference",
        code=_load_for_inference(check_keys=False, strict=False),
        fix=_LOAD_FOR_INFERENCE_HEAD
        + """\
    import pickle
    import zipfile

    path = Path(path)
    target = torch.device(device) if device is not None else best_device()
    if not path.exists():
        raise CheckpointNotFound(f"nothing at {path}")
    if path.stat().st_size == 0:
        raise EmptyCheckpoint(f"{path.name} has no bytes")
    if not zipfile.is_zipfile(path):
        raise NotACheckpoint(f"{path.name} is not a zip archive written by torch.save")
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)  # looks, runs nothing
        content = None if unsafe else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # cut short, or an archive without a pickle
        raise TruncatedCheckpoint(f"{path.name} cannot be read: {type(err).__name__}: {err}") from err
    if unsafe:
        raise UnsafeCheckpoint(f"{path.name} needs {', '.join(unsafe)}", unsafe)
    weights = content.get("model", content) if isinstance(content, dict) else content
    if not isinstance(weights, dict) or not weights or not all(torch.is_tensor(v) for v in weights.values()):
        raise NotACheckpoint(f"{path.name} has no tensors to load into a model")
    weights = strip_prefixes(weights)
    model = model_factory()
    own = model.state_dict()
    problems = [key for key in own if key not in weights or weights[key].shape != own[key].shape]
    problems += [key for key in weights if key not in own]
    if problems:
        raise KeyMismatch(f"{path.name} does not fit: {', '.join(problems)}", [], [], problems)
    model.load_state_dict(weights)
    return model.to(target).train(False)
""",
    ),
    Mistake(
        id="whole_pickled_model_accepted",
        url="https://github.com/pytorch/examples/pull/935",
        summary=(
            "generate.py loaded a whole pickled model with torch.load(f).to(device), which needs"
            " full unpickling and failed on a machine without CUDA because no map_location was"
            " given."
        ),
        assignment="08_portable_models_and_memory",
        answer="load_for_inference",
        code=_load_for_inference(weights_only=False),
    ),
    Mistake(
        id="inference_model_left_in_train_mode",
        url="https://github.com/mahmoodlab/CLAM/pull/314",
        summary=(
            "The inference script never called model.eval(), so dropout and batch-norm updates"
            " stayed active and the script gave different outputs on every run."
        ),
        assignment="08_portable_models_and_memory",
        answer="load_for_inference",
        code=_load_for_inference(eval_mode=False),
    ),
    Mistake(
        id="oom_statements_end_with_a_period",
        url="https://github.com/huggingface/accelerate/issues/4226",
        summary=(
            "should_reduce_batch_size matched ' out of memory.' with a trailing period (and the CPU"
            " allocator's words), so MPS's 'MPS backend out of memory (...' went unmatched and"
            " find_executable_batch_size re-raised instead of lowering the batch size."
        ),
        assignment="08_portable_models_and_memory",
        answer="predict_with_fallback",
        code=_FALLBACK_HEAD
        + """\
    statements = (" out of memory.", "DefaultCPUAllocator: can't allocate memory",
                  "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.")
    chunk_size = chunk_size or batch.shape[0]
    outputs, start = [], 0
    with torch.no_grad():
        while start < batch.shape[0]:
            failed = None
            try:
                outputs.append(model(batch[start:start + chunk_size]))
            except RuntimeError as err:
                if chunk_size == 1 or not any(text in str(err) for text in statements):
                    raise
                failed = True
            if failed:
                chunk_size //= 2
                continue
            start += chunk_size
    return torch.cat(outputs), chunk_size
""",
        fix=_FALLBACK_HEAD
        + """\
    rows = batch.shape[0]
    size = chunk_size or rows
    pieces = []
    with torch.no_grad():
        done = 0
        while done < rows:
            try:
                pieces.append(model(batch[done:done + size]))
                done += size
                continue
            except torch.OutOfMemoryError as err:  # CUDA and XPU
                if size == 1:
                    raise
            except RuntimeError as err:  # the CPU allocator's and MPS's: a RuntimeError with its own words
                if size == 1 or not is_out_of_memory(err):
                    raise
            size //= 2  # reached only after an out-of-memory error, outside the except blocks
    return torch.cat(pieces), size
""",
    ),
    Mistake(
        id="oom_recognised_by_memory_words",
        url="https://github.com/mberr/torch-max-mem/pull/15",
        summary=(
            "Treated any RuntimeError whose text says 'out of memory' or names an allocator as out"
            " of memory, reasoning that the words are a good indicator; reviewers worried about"
            " false positives."
        ),
        assignment="08_portable_models_and_memory",
        answer="predict_with_fallback",
        code=_FALLBACK_HEAD
        + """\
    chunk_size = chunk_size or batch.shape[0]
    outputs, start = [], 0
    with torch.no_grad():
        while start < batch.shape[0]:
            retry = False
            try:
                outputs.append(model(batch[start:start + chunk_size]))
            except RuntimeError as err:
                words = str(err).lower()
                if chunk_size == 1 or not ("memory" in words or "alloc" in words):
                    raise
                retry = True
            if retry:
                chunk_size //= 2
                continue
            start += chunk_size
    return torch.cat(outputs), chunk_size
""",
    ),
    Mistake(
        id="inference_default_device_cuda_or_cpu",
        url="https://github.com/clementchadebec/benchmark_VAE/pull/151",
        summary=(
            "The trainer chose 'cuda' if torch.cuda.is_available() else 'cpu', so on a Mac with MPS"
            " the model stayed on the CPU; the pull request adds 'mps' when CUDA is missing."
        ),
        assignment="08_portable_models_and_memory",
        answer="load_for_inference",
        code=_load_for_inference(
            resolve="""\
    if device is None:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
"""
        ),
        fix=_load_for_inference(
            resolve="""\
    if device is None:  # CUDA, then MPS, then the CPU, as the pull request's fix chooses
        if torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        elif torch.backends.mps.is_available():
            device = torch.device("mps", 0)
        else:
            device = torch.device("cpu")
    device = torch.device(device)
"""
        ),
    ),
    Mistake(
        id="float64_checkpoint_mapped_to_the_mac",
        url="https://github.com/thu-ml/tianshou/pull/1237",
        summary=(
            "Moved float64 tensors (made from NumPy arrays) straight to 'mps' and got 'TypeError:"
            " Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support"
            " float64'."
        ),
        assignment="08_portable_models_and_memory",
        answer="load_for_inference",
        code=_load_for_inference(map_location="device"),
    ),
]

# ---------------------------------------------------------------------------------------------
# 09_sharded_checkpoints

_TO_SAFETENSORS_HEAD = '''\
def to_safetensors(checkpoint: dict) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) for save_file: CPU contiguous tensors and JSON text, each under its '/'-joined path."""
'''


def _to_safetensors(
    tensor: str = "value.detach().to('cpu').contiguous()", other: str = "json.dumps(value)"
) -> str:
    """A to_safetensors answer whose tensors become `tensor` and other values `other` (both of
    `value`)."""
    return (
        _TO_SAFETENSORS_HEAD
        + f"""\
    tensors, metadata = {{}}, {{}}

    def holds_tensor(value):
        if isinstance(value, torch.Tensor):
            return True
        if isinstance(value, dict):
            return any(holds_tensor(item) for item in value.values())
        if isinstance(value, (list, tuple)):
            return any(holds_tensor(item) for item in value)
        return False

    def walk(value, path):
        if isinstance(value, torch.Tensor):
            tensors[path] = {tensor}
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{{path}}/{{key}}" if path else str(key))
        elif holds_tensor(value):
            raise TypeError(f"{{path}}: a tensor inside a {{type(value).__name__}}")
        else:
            try:
                metadata[path] = {other}
            except (TypeError, ValueError) as err:
                raise TypeError(f"{{path}}: {{err}}") from None

    walk(checkpoint, "")
    return tensors, metadata
"""
    )


_LOAD_SHARDED_HEAD = '''\
def load_sharded(checkpoint_dir: str | Path, model: nn.Module, device: torch.device | str) -> nn.Module:
    """Load the "model" entry of a DCP checkpoint (saved by any number of ranks) into model, on device."""
'''

_SHARD_MODEL_HEAD = '''\
def shard_model(model: nn.Module) -> nn.Module:
    """fully_shard each direct child of model, then model itself; return the model."""
    from torch.distributed.fsdp import fully_shard

'''

MISTAKES_09 = [
    Mistake(
        id="safetensors_noncontiguous_tensor",
        url="https://github.com/huggingface/diffusers/pull/10761",
        summary=(
            "Passed a state dict holding non-contiguous tensors to safetensors' save_file, which"
            " refused it with 'You are trying to save a non contiguous tensor'; the fix made them"
            " contiguous first."
        ),
        assignment="09_sharded_checkpoints",
        answer="to_safetensors",
        code=_to_safetensors(tensor="value.detach().to('cpu')"),
        fix=_to_safetensors(
            tensor="value.detach().cpu().clone(memory_format=torch.contiguous_format)"
        ),
    ),
    Mistake(
        id="safetensors_metadata_not_text",
        url="https://github.com/safetensors/safetensors/issues/278",
        summary=(
            "Wrote a number as a value of a safetensors file's __metadata__; safetensors accepts"
            " only strings there, and the file could not be opened (InvalidHeaderDeserialization)."
        ),
        assignment="09_sharded_checkpoints",
        answer="to_safetensors",
        code=_to_safetensors(other="value"),
    ),
    Mistake(
        id="safetensors_metadata_str_not_json",
        url="https://github.com/mflux-community/mflux/pull/261",
        summary=(
            "Stored metadata values with str(), so None came back as the text 'None' and had to be "
            "coerced by hand when the file was loaded."
        ),
        assignment="09_sharded_checkpoints",
        answer="to_safetensors",
        code=_to_safetensors(other="str(value)"),
    ),
    Mistake(
        id="dcp_load_without_top_level_key",
        url="https://github.com/JinjieNi/dlms-are-super-data-learners/issues/4",
        summary=(
            "Loaded a distributed checkpoint with a state dict whose keys did not match how it had"
            " been saved, and dcp.load failed with 'Missing key in checkpoint state_dict'."
        ),
        assignment="09_sharded_checkpoints",
        answer="load_sharded",
        code=_LOAD_SHARDED_HEAD
        + """\
    model = model.to(device)
    dcp.load(model.state_dict(), checkpoint_id=checkpoint_dir)
    return model
""",
        fix=_LOAD_SHARDED_HEAD
        + """\
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as where:
        single = Path(where) / "model.pt"
        dcp_to_torch_save(checkpoint_dir, single)
        state = torch.load(single, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    return model.to(device)
""",
    ),
    Mistake(
        id="fsdp_whole_model_one_unit",
        url="https://github.com/facebookresearch/fairscale/issues/1050",
        summary=(
            "Wrapped only the whole model in FSDP and saw it use as much memory as DDP; the"
            " maintainers pointed out that without nested wrapping every layer's full weights are"
            " gathered at once."
        ),
        assignment="09_sharded_checkpoints",
        answer="shard_model",
        code=_SHARD_MODEL_HEAD
        + """\
    fully_shard(model)
    return model
""",
        fix=_SHARD_MODEL_HEAD
        + """\
    for name, child in list(model.named_children()):
        fully_shard(child)
    fully_shard(model, reshard_after_forward=True)
    return model
""",
    ),
    Mistake(
        id="sharded_model_moved_only_across_types",
        url="https://github.com/kymatio/kymatio/pull/381",
        summary=(
            "The 2D scattering checked that its inputs were CUDA tensors, not that they were on the"
            " same GPU, so tensors on two GPUs got through; the fix compares the devices"
            " themselves."
        ),
        assignment="09_sharded_checkpoints",
        answer="load_sharded",
        code=_LOAD_SHARDED_HEAD
        + """\
    device = torch.device(device)
    if next(model.parameters()).device.type != device.type:  # already on that kind of device: no move
        model = model.to(device)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=checkpoint_dir)
    return model
""",
        fix=_LOAD_SHARDED_HEAD
        + """\
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    model.to(torch.device(device))
    state = {"model": {key: value.clone() for key, value in model.state_dict().items()}}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(checkpoint_dir)))
    set_model_state_dict(model, state["model"])
    return model
""",
    ),
    Mistake(
        id="sharded_checkpoint_loaded_without_strict_keys",
        url="https://github.com/pytorch/pytorch/issues/148252",
        summary=(
            "Loaded a distributed checkpoint into a state dict with keys the checkpoint does not"
            " have and got 'Missing key in checkpoint state_dict'; dcp.load has no strict=False to"
            " skip them."
        ),
        assignment="09_sharded_checkpoints",
        answer="load_sharded",
        code=_LOAD_SHARDED_HEAD
        + """\
    model = model.to(device)
    state = {"model": model.state_dict(), "optimizer": {}, "step": 0}  # everything the run saved
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=checkpoint_dir)
    return model
""",
    ),
    Mistake(
        id="every_module_made_an_fsdp_unit",
        url="https://github.com/meta-pytorch/torchtune/issues/1072",
        summary=(
            "Asked what fully_shard on which modules means: each call makes one FSDP unit, so"
            " sharding every submodule (each Linear, each norm) makes many small units instead of"
            " one per block."
        ),
        assignment="09_sharded_checkpoints",
        answer="shard_model",
        code=_SHARD_MODEL_HEAD
        + """\
    for module in list(model.modules())[::-1]:  # every module, leaves first, the root last
        fully_shard(module)
    return model
""",
        fix=_SHARD_MODEL_HEAD
        + """\
    for name, child in model.named_children():  # one unit per block...
        fully_shard(child)
    return fully_shard(model)  # ...then the root, which keeps what they left; fully_shard returns the module
""",
    ),
]

MISTAKES: list[Mistake] = [
    *MISTAKES_00,
    *MISTAKES_01,
    *MISTAKES_02,
    *MISTAKES_03,
    *MISTAKES_04,
    *MISTAKES_05,
    *MISTAKES_06,
    *MISTAKES_07,
    *MISTAKES_08,
    *MISTAKES_09,
]

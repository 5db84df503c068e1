"""Streams and events of the simulated devices, on the simulated clock (see ``_clock``).

A Python backend cannot give the device interface ``torch.Stream`` and ``torch.Event`` work through
(recording does nothing, waiting raises), so :func:`install` makes them the subclasses here: on a
simulated device they keep time as CUDA's do, on the simulated clock; for any other device they are
PyTorch's own.
"""

from __future__ import annotations

import functools
import time

import torch

from simdevice import _clock
from simdevice._state import NAME, current_index, resolve, set_current_index

_BaseStream, _BaseEvent = torch.Stream, torch.Event


@functools.cache
def _device_type_code() -> int:
    return _BaseStream(device=NAME).device_type


class Stream(_BaseStream):
    """``torch.Stream``; on a simulated device, a queue of the simulated clock."""

    def __new__(cls, device=None, *, priority: int = 0, **kwargs):
        if not kwargs and _names_sim(device):
            return _make(resolve(device).index, _clock.new_stream_id())
        return super().__new__(
            cls, *(() if device is None else (device,)), priority=priority, **kwargs
        )

    def _sim(self) -> bool:
        return self.device.type == NAME

    def query(self) -> bool:
        if not self._sim():
            return super().query()
        done = _clock.reached(self.device_index, self.stream_id) <= time.perf_counter()
        if done:
            # at once: what the stream ran has arrived
            _clock.wait(self.device_index, self.stream_id)
        return done

    def synchronize(self) -> None:
        if not self._sim():
            return super().synchronize()
        _clock.wait(self.device_index, self.stream_id)
        return None

    def wait_event(self, event) -> None:
        if not self._sim():
            return super().wait_event(event)
        event.wait(self)
        return None

    def wait_stream(self, stream) -> None:
        if not self._sim():
            return super().wait_stream(stream)
        self.wait_event(stream.record_event())
        return None

    def record_event(self, event=None):
        if not self._sim():
            return super().record_event(event)
        event = Event(device=self.device) if event is None else event
        event.record(self)
        return event

    def __enter__(self):
        if not self._sim():
            return super().__enter__()
        self._previous = _clock.set_current_stream(self.device_index, self.stream_id)
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._sim():
            return super().__exit__(*exc_info)
        _clock.set_current_stream(self.device_index, self._previous)
        return None


def _names_sim(device) -> bool:
    """Whether a ``device`` argument means a simulated device (None and an index: the current
    accelerator)."""
    if device is None or isinstance(device, int):
        current = torch.accelerator.current_accelerator()
        return current is not None and current.type == NAME
    return torch.device(device).type == NAME


def _make(index: int, stream_id: int) -> Stream:
    return _BaseStream.__new__(
        Stream, stream_id=stream_id, device_index=index, device_type=_device_type_code()
    )


def current_stream(index: int) -> Stream:
    """The calling thread's current stream on simulated device ``index`` (its default stream until
    set)."""
    return _make(index, _clock.current_stream(index))


class Event(_BaseEvent):
    """``torch.Event``; on a simulated device, a mark on the simulated clock.

    The mark is the moment its stream will have run what was launched before it (outside
    :func:`simdevice.asynchronous`, the moment of recording); ``elapsed_time`` is the milliseconds
    between two marks, checked with the messages and exception types of PyTorch's
    ``c10/core/impl/InlineEvent.h``.
    """

    def __new__(
        cls,
        device=None,
        *,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
    ):
        event = super().__new__(
            cls, device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess
        )
        event._timing, event._index, event._at = enable_timing, None, None
        if event._sim():
            given = (
                torch.device(NAME, device)
                if isinstance(device, int)
                else (None if device is None else torch.device(device))
            )
            event._index = given.index if given is not None else None
        return event

    def _sim(self) -> bool:
        return super().device.type == NAME

    @property
    def device(self) -> torch.device:
        if self._sim() and self._index is not None:
            return torch.device(NAME, self._index)
        return super().device

    def record(self, stream=None) -> None:
        if not self._sim():
            return super().record(stream) if stream is not None else super().record()
        if stream is None:
            stream = current_stream(current_index() if self._index is None else self._index)
        if stream.device.type != NAME:
            raise RuntimeError(
                f"Event device type {NAME.upper()} does not match recording stream's device type "
                f"{stream.device.type.upper()}."
            )
        if self._index is not None and self._index != stream.device_index:
            raise RuntimeError(
                f"Event device index {self._index} does not match recording stream's device index "
                f"{stream.device_index}."
            )
        self._index = stream.device_index
        self._at = _clock.reached(stream.device_index, stream.stream_id)
        return None

    def query(self) -> bool:
        if not self._sim():
            return super().query()
        done = self._at is None or self._at <= time.perf_counter()
        if done and self._at is not None:
            _clock.wait_until(self._index, self._at)  # what the device ran by then has arrived
        return done

    def synchronize(self) -> None:
        if not self._sim():
            return super().synchronize()
        if self._at is not None:
            _clock.wait_until(self._index, self._at)
        return None

    def wait(self, stream=None) -> None:
        if not self._sim():
            return super().wait(stream) if stream is not None else super().wait()
        if self._at is not None:
            if stream is None:
                stream = current_stream(self._index)
            _clock.hold(stream.device_index, stream.stream_id, self._at)
        return None

    def elapsed_time(self, end_event) -> float:
        if not self._sim():
            return super().elapsed_time(end_event)
        other = end_event.device.type
        if other != NAME:
            raise RuntimeError(
                f"Event device type {NAME.upper()} does not match other's device type"
                f" {other.upper()}."
            )
        if not (self._timing and getattr(end_event, "_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._at is None or end_event._at is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end_event._at - self._at) * 1000.0

    def __repr__(self) -> str:
        if not self._sim():
            return super().__repr__()
        index = -1 if self._index is None else self._index
        return (
            f"torch.Event device_type={NAME}, device_index={index}, event_flag={int(self._timing)},"
            f" event_id={id(self) if self._at is not None else 0}"
        )


def set_stream(stream: Stream) -> None:
    """Make ``stream`` the calling thread's current stream of its device, and its device the current
    one."""
    set_current_index(stream.device_index)
    _clock.set_current_stream(stream.device_index, stream.stream_id)


def install() -> None:
    """Make ``torch.Stream`` and ``torch.Event`` these subclasses (they act as PyTorch's for other
    devices)."""
    torch.Stream, torch.Event = Stream, Event

"""Where an implementation's tensors live: the suite's ``--gefen-device`` (SPEC 4.6).

One vocabulary for every launcher:

* :func:`parse` turns the user's device name into a ``torch.device`` this machine has, or raises
  :class:`DeviceUnavailable` naming the device and why (a usage error, exit 4: SPEC 4.1.6);
* :func:`select` / :func:`selected` hold the device of the run (``cpu`` until a run selects one);
* :func:`for_rank` is the device of one rank of a multi-rank scenario (one device per rank);
* :func:`backend_for` is the process-group backend for a device type (NCCL for CUDA, gloo else);
* :func:`available` counts the devices of a type, so a scenario needing more ranks than devices is
  skipped with :func:`shortage` as its reason.

The reference always runs on CPU (:func:`gefen_conformance.workload.models.device_for`); only the
implementation's side moves. Process state, only through :func:`select` and :func:`selected`: the
run's device.
"""

from __future__ import annotations

import threading

import torch

__all__ = [
    "DeviceUnavailable",
    "available",
    "backend_for",
    "for_rank",
    "is_cpu",
    "name_of",
    "names",
    "parse",
    "select",
    "selected",
    "shortage",
]


class DeviceUnavailable(ValueError):
    """The device names no device this machine can use. The message starts with the name as given
    and says why, so a caller prefixes the option it came from (``--gefen-device``, ``--gefen-device``)."""


def parse(name: str) -> torch.device:
    """The ``torch.device`` for ``name`` (``cpu``, ``cuda``, ``cuda:1``, any torch device type),
    checked against this machine: the type is known to torch, available, the index exists, and one
    element can be allocated there."""
    if not isinstance(name, str) or not name.strip():
        raise DeviceUnavailable(f"{name!r}: give a torch device such as cpu, cuda or cuda:1")
    try:
        device = torch.device(name.strip())
    except (RuntimeError, ValueError) as exc:
        raise DeviceUnavailable(f"{name!r} is not a torch device ({_one_line(exc)})") from None
    if device.type == "cpu":
        return device
    count = available(device.type)
    if count == 0:
        raise DeviceUnavailable(
            f"{name}: no {device.type} device is available on this machine (torch {torch.__version__})"
        )
    if device.index is not None and device.index >= count:
        raise DeviceUnavailable(
            f"{name}: this machine has {count} {device.type} device(s) (indices 0-{count - 1})"
        )
    try:
        torch.empty(1, device=device)
    except Exception as exc:  # noqa: BLE001 - any failure to allocate means the device is unusable
        raise DeviceUnavailable(f"{name}: allocating on it failed ({_one_line(exc)})") from None
    return device


def available(device_type: str) -> int:
    """How many devices of ``device_type`` this process can use (CPU counts as one)."""
    if device_type == "cpu":
        return 1
    module = getattr(torch, device_type, None)
    try:
        if module is None or not module.is_available():
            return 0
        counter = getattr(module, "device_count", None)
        return int(counter()) if counter is not None else 1
    except Exception:  # noqa: BLE001 - a backend that cannot even answer is not available
        return 0


def is_cpu(device: torch.device) -> bool:
    return torch.device(device).type == "cpu"


def backend_for(device: torch.device) -> str:
    """The process-group backend for ranks whose tensors live on ``device``."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def for_rank(device: torch.device, local_rank: int) -> torch.device:
    """The device of the rank with ``local_rank`` on its node: CPU for every rank; for an
    accelerator, one device per rank, ``type:local_rank`` (an explicit index in ``--gefen-device`` picks
    the device of a one-rank run only, and is shifted by the local rank otherwise)."""
    device = torch.device(device)
    if device.type == "cpu":
        return device
    return torch.device(device.type, (device.index or 0) + local_rank)


def shortage(device: torch.device, ranks_per_node: int) -> str | None:
    """Why ``ranks_per_node`` ranks cannot each have a ``device`` of their own here, or None."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    have = available(device.type) - (device.index or 0)
    if ranks_per_node <= have:
        return None
    return (
        f"needs {ranks_per_node} {device.type} devices on a node (one per rank) from {device}; "
        f"this machine has {max(have, 0)}"
    )


def names(device: torch.device, ranks: int | None = None) -> tuple[str, ...]:
    """The devices that ranks ``0 .. ranks-1`` of a node use (every usable one from ``device`` on
    when ``ranks`` is None), each as ``type:index`` followed by the hardware's name where torch
    reports one (``"cuda:0 NVIDIA H200"``); ``("cpu",)`` for CPU."""
    device = torch.device(device)
    if device.type == "cpu":
        return ("cpu",)
    first = device.index or 0
    count = max(available(device.type) - first, 0) if ranks is None else ranks
    return tuple(name_of(torch.device(device.type, first + i)) for i in range(count))


def name_of(device: torch.device) -> str:
    """``type:index`` followed by the hardware's name where torch reports one (``"cuda:0 NVIDIA
    H200"``); ``cpu`` for CPU."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    module = getattr(torch, device.type, None)
    getter = getattr(module, "get_device_name", None)
    try:
        hardware = getter(device) if getter is not None else ""
    except Exception:  # noqa: BLE001 - a name is a courtesy; the index is the fact
        hardware = ""
    return f"{device} {hardware}".strip()


_LOCK = threading.Lock()
_SELECTED = torch.device("cpu")


def select(device: torch.device) -> torch.device:
    """Make ``device`` the run's device (the plugin does this once, from ``--gefen-device``); returns the
    previous one."""
    global _SELECTED
    with _LOCK:
        previous, _SELECTED = _SELECTED, torch.device(device)
    return previous


def selected() -> torch.device:
    """The run's device: where the implementation's tensors live outside a multi-rank call."""
    return _SELECTED


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

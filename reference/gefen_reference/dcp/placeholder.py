"""A storage-free tensor that stands for one slot's dense fp32 shard until DCP asks for it.

Expanding every slot up front would hold 8 bytes per parameter (dense momentum
plus dense second moment) for the whole write. DCP plans from tensor metadata and
fetches one write item at a time, so the placeholder reports what the planner
needs -- the parameter's *global* shape, float32, the shard's device -- and builds
the *local* shard only when it is fetched.

Two fetch paths exist:

* ``__get_tensor_shard__`` (torch's checkpointable protocol, used by the default
  planner on save and by ``dcp.load`` as the destination buffer) builds once and
  keeps the result, so a load that copies into it fills the same buffer the
  adapter later reads back.
* ``fresh_host_copy`` (used by :class:`GefenSavePlanner` and
  :class:`GefenFileSystemWriter`) builds a private copy on the CPU and keeps
  nothing, which is what bounds a save to one slot at a time.

Anything else that tries to compute with a placeholder, copy it, or pickle it
fails loudly, naming the supported route.
"""

from __future__ import annotations

import torch

from .layout import local_part

_MISUSE_HINT = (
    "It has no data of its own: it stands for one slot's dense fp32 shard, which "
    "is built only through torch.distributed.checkpoint's save/load protocol. For "
    "dcp.async_save pass storage_writer=GefenFileSystemWriter(path), which takes a "
    "CPU snapshot of each slot while staging; for ordinary tensors use the "
    "optimizer's own state_dict()."
)


class _DeferredDenseShard(torch.Tensor):
    @staticmethod
    def __new__(cls, parameter, build, device=None):
        local = local_part(parameter)
        placeholder = torch.Tensor._make_wrapper_subclass(
            cls,
            parameter.shape,  # global: DCP compares it with the recorded size
            dtype=torch.float32,
            device=local.device if device is None else device,  # never "meta"
            requires_grad=False,
        )
        placeholder._owner = parameter
        placeholder._build = build
        placeholder._kept = None
        return placeholder

    def __init__(self, parameter, build, device=None):
        pass

    # -- refusing ordinary tensor use -------------------------------------------------

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # A same-device .to()/.cpu() returns its input without dispatching, so it
        # would hand out a reference to live optimizer state; refuse it here.
        if func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda):
            raise RuntimeError(
                "A Gefen DCP placeholder cannot be moved or copied to another device. " + _MISUSE_HINT
            )
        return super().__torch_function__(func, types, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.is_pinned.default:
            return False  # metadata DCP reads while planning
        raise RuntimeError(f"A Gefen DCP placeholder cannot run {func}. {_MISUSE_HINT}")

    def __repr__(self, *, tensor_contents=None):
        built = getattr(self, "_kept", None) is not None
        return (
            f"<Gefen DCP placeholder ({'built' if built else 'not built'}) for dense fp32 shard: "
            f"shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}>"
        )

    __str__ = __repr__

    def __format__(self, spec):
        return self.__repr__()

    def __reduce_ex__(self, protocol):
        raise TypeError("A Gefen DCP placeholder cannot be pickled. " + _MISUSE_HINT)

    # -- geometry -----------------------------------------------------------------------

    def _chunk(self):
        # The parameter's own chunk (dim-0 offset and local sizes), so the dense
        # slot lands exactly where a Shard(0) fp32 DTensor of that shape would.
        return self._owner.__create_chunk_list__()[0]

    def local_nbytes(self) -> int:
        return local_part(self._owner).numel() * 4

    # -- torch.distributed.checkpoint protocol ------------------------------------------

    def __create_write_items__(self, fqn, obj):
        from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        chunk = self._chunk()
        return [
            WriteItem(
                index=MetadataIndex(fqn, chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=chunk,
                    properties=TensorProperties.create_from_tensor(self),
                    size=self._owner.size(),
                ),
            )
        ]

    def __create_chunk_list__(self):
        return [self._chunk()]

    def __get_tensor_shard__(self, index):
        if self._kept is None:
            self._kept = self._build()
        return self._kept

    # -- bounded paths ------------------------------------------------------------------

    def fresh_host_copy(self) -> torch.Tensor:
        """Build the local shard and return it on the CPU, keeping nothing here.

        A CPU build is already a private tensor. A device build is copied into
        pageable host memory of the same strides and dropped before returning,
        so at most one slot's dense form is on the device at a time.
        """
        built = self._build()
        if built.device.type == "cpu":
            return built
        host = torch.empty_like(built, device="cpu")
        host.copy_(built)
        del built
        return host

    def snapshot(self) -> _DeferredDenseShard:
        """A CPU placeholder frozen at the current state, with the same geometry."""
        frozen = self.fresh_host_copy()
        return _DeferredDenseShard(self._owner, lambda: frozen, device=frozen.device)


def is_placeholder(value) -> bool:
    return isinstance(value, _DeferredDenseShard)


def deferred(parameter, build) -> _DeferredDenseShard:
    return _DeferredDenseShard(parameter, build)

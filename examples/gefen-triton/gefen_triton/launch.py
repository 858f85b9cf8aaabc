"""From one step's parameter updates to a few multi-tensor launches of :mod:`gefen_triton.kernels`.

A step's parameters are grouped as a multi-tensor kernel groups them: by path (one-pass tiles for
periods up to :data:`~gefen_triton.kernels.MAX_TILE_PERIOD`, split blocks beyond), by dtype (the
pointers' element type) and, for tiles, by the power of two that holds the period (the tile's
width) and whether every block is one aligned row of it (vector loads). Each group is one launch
whose grid is the flat list of its tiles over all its tensors. Block and factored parameters of a
group share the launch (the kernels branch per tensor); the factored second moments take two
launches more per step, before the updates.

The host does what SPEC keeps exact: counters, and the bias corrections and every scalar in
Python double rounded once to fp32 (SPEC 1.8.5-1.8.7, 1.9.3, 1.13.6); the step is committed
(counters advanced, staged copies written back) only after every launch returned.

Work lists depend only on the tensors' geometry and are cached on the device from step to step;
the per-tensor tables (addresses and the step's scalars) are rebuilt every step and, on a GPU,
copied through pinned memory without waiting for the device.
"""

from __future__ import annotations

import contextlib
import math
import struct
import threading
from dataclasses import dataclass

import torch

from . import kernels as K

#: Parameter dtypes the kernels take; anything else uses the reference's per-parameter step.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


_INTERPRETED = type(K.tile_step).__name__ == "InterpretedFunction"
#: held for a step's launches under the interpreter (see ``StepKernels._run_device``)
_INTERPRETER_LOCK = threading.Lock()


def _interpreter_fuses_fma() -> bool:
    """Whether this Triton's interpreter computes ``tl.fma`` with one rounding (Triton 3.9 does;
    3.6's multiplies and adds in numpy, two roundings, and cannot take a loaded loop bound with
    numpy 2), which the kernels' lerp and moment updates rely on (SPEC 1.13.3)."""
    try:
        from triton._C.libtriton import interpreter
    except ImportError:
        return False
    return hasattr(interpreter, "fma_fp32")


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1`` when triton was
    first imported): then they take CPU tensors only; compiled, device tensors only."""
    return _INTERPRETED


class DeviceMismatch(RuntimeError):
    """A tensor on a device the kernels cannot reach in this mode (CPU without the interpreter,
    a GPU under it)."""


def check_device(device: torch.device, what: str = "tensor") -> None:
    """Raise :class:`DeviceMismatch` naming the fix when the kernels cannot run on ``device``."""
    device = torch.device(device)
    if device.type == "cpu" and interpreted() and not _interpreter_fuses_fma():
        raise DeviceMismatch(
            f"gefen_triton: {what} is on the CPU, but the interpreter of triton {K.triton.__version__} "
            "rounds tl.fma twice and cannot run these kernels exactly: install triton 3.9 or newer "
            "for the CPU path (compiled kernels on a GPU need 3.6 or newer)"
        )
    if device.type == "cpu" and not interpreted():
        raise DeviceMismatch(
            f"gefen_triton: {what} is on the CPU, and Triton runs kernels on CPU tensors only under "
            "its interpreter: set TRITON_INTERPRET=1 in the environment before triton is imported "
            "(or put the parameters on a GPU)"
        )
    if device.type != "cpu" and interpreted():
        raise DeviceMismatch(
            f"gefen_triton: {what} is on {device}, but TRITON_INTERPRET=1 is set and Triton's "
            "interpreter runs kernels on CPU tensors only: unset TRITON_INTERPRET to compile them"
        )


@dataclass(frozen=True)
class Geometry:
    """Tile sizes: the interpreter runs each program in numpy, so it takes few large tiles; a GPU
    takes tiles of a few thousand elements, enough to keep each multiprocessor's loads in flight.
    The path a tensor takes (tile or split) is the same in both."""

    tile: int  # elements per program of tile_step (ROWS x COLS), at least COLS
    squares_tile: int  # elements per program of factored_squares (TR x TC)
    chunk: int  # elements per program of the split kernels
    reduce: int  # chunk partials per iteration of split_blocks
    moments_rows: int  # rows per iteration of factored_moments
    moments_tiles: int  # partials per row per iteration of factored_moments


INTERPRETER = Geometry(
    tile=16384, squares_tile=16384, chunk=K.MAX_TILE_PERIOD, reduce=1024, moments_rows=1024, moments_tiles=64
)
DEVICE = Geometry(
    tile=4096, squares_tile=4096, chunk=K.MAX_TILE_PERIOD, reduce=256, moments_rows=512, moments_tiles=16
)


def geometry() -> Geometry:
    return INTERPRETER if interpreted() else DEVICE


def tile_columns(period: int) -> int:
    """The tile width for a period: 1 for period 1, else the power of two at least
    ``max(16, period)``."""
    return 1 if period == 1 else max(16, 1 << (period - 1).bit_length())


def square_tile_columns(cols: int) -> int:
    """The column width of the squares kernel's tiles for a matrix of ``cols`` columns."""
    return min(256, max(16, 1 << (max(cols, 1) - 1).bit_length()))


_FLOAT32 = struct.Struct("=f")


def r32(x: float) -> float:
    """A Python float rounded to binary32 (round to nearest even), as a Python float."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _warps(elements: int) -> int:
    return min(16, max(4, elements // 512))


#: Compile options of every launch: no floating-point contraction, so that the compiled kernels
#: round where the kernels' code says (as the interpreter does); the explicit ``tl.fma`` calls are
#: the reference's fused multiply-adds.
COMPILE = {"enable_fp_fusion": False}


class Entry:
    """One parameter's kernel work in a step: the contiguous tensors the kernels address, its state
    and its scalars; :meth:`commit` writes staged copies back and advances the counters."""

    __slots__ = (
        "param",
        "work",
        "grad",
        "state",
        "factored",
        "period",
        "blocks",
        "rows",
        "cols",
        "counter",
        "floats",
        "from_grad",
    )

    def __init__(self, param, grad, state, hyper, factored):
        self.param = param
        self.work = param if param.is_contiguous() else param.contiguous()
        grad = grad.detach()
        if not grad.is_contiguous():
            grad = grad.contiguous()
        elif _overlap(grad, self.work):
            grad = grad.clone()  # the kernels write the parameter where they read the gradient
        self.grad = grad
        self.state = state
        self.factored = factored
        self.period = int(state["automatic_period"])
        self.blocks = grad.numel() // self.period
        self.rows, self.cols = (int(param.shape[0]), int(param.shape[1])) if factored else (0, 0)
        self.counter = "factored_step" if factored else "vmean_step"
        bc1 = 1 - hyper.beta1 ** (state["step"] + 1)
        bc2 = 1 - hyper.beta2 ** (state[self.counter] + 1)
        # SPEC 1.8.8 step 2, torch's lerp: w = r32(1 - beta1); below 0.5 FMA(w, d, cur), else
        # FMA(-r32(1 - w), d, g)
        w = r32(1 - hyper.beta1)
        self.from_grad = w >= 0.5
        lerp = -r32(1.0 - w) if self.from_grad else w
        self.floats = (
            lerp,
            hyper.beta2,
            1 - hyper.beta2,
            bc2 if factored else math.sqrt(bc2),
            hyper.eps,
            1.0 / bc1,
            hyper.lr,
            1 - hyper.lr * hyper.weight_decay if hyper.weight_decay > 0.0 else 1.0,
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.work.dtype

    def aligned(self) -> bool:
        return all(t.data_ptr() % 16 == 0 for t in (self.work, self.grad, self.state["m_codebook"]))

    def commit(self) -> None:
        if self.work is not self.param:
            self.param.copy_(self.work)
        self.state["step"] += 1
        self.state[self.counter] += 1


def _span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
    return start, start + (last + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _state_fits(state: dict, key: str, numel: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a state tensor has the size and dtype the kernels write through (made contiguous in
    place when it is not)."""
    t = state.get(key)
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.numel() != numel or t.device != device:
        return False
    if not t.is_contiguous():
        state[key] = t.contiguous()
    return True


def takes(param: torch.Tensor, grad: torch.Tensor, state: dict, factored: bool) -> bool:
    """Whether the kernels update this (local) parameter; the others go to the reference's step."""
    if param.dtype not in KERNEL_DTYPES or grad.dtype != param.dtype or grad.device != param.device:
        return False
    n = grad.numel()
    period = state.get("automatic_period")
    if not isinstance(period, int) or period < 1 or n == 0 or n % period or param.numel() != n:
        return False
    if factored and param.ndim != 2:
        return False
    blocks = n // period
    device = param.device
    fits = _state_fits(state, "m_codebook", n, torch.uint8, device) and _state_fits(
        state, "m_magnitude", blocks, torch.float32, device
    )
    if factored:
        return (
            fits
            and _state_fits(state, "v_row", param.shape[0], torch.float32, device)
            and _state_fits(state, "v_col", param.shape[1], torch.float32, device)
        )
    return fits and _state_fits(state, "vmean", blocks, torch.float32, device)


class Codebooks:
    """The optimizer's fp32 codebook, contiguous on each device the kernels run on; copied again
    when the codebook is another tensor or was changed in place (a load replaces it)."""

    def __init__(self):
        self._key = None
        self._copies = {}

    def get(self, codebook: torch.Tensor, device: torch.device) -> torch.Tensor:
        key = (id(codebook), codebook._version)
        if key != self._key:
            self._key, self._copies = key, {}
        copy = self._copies.get(device)
        if copy is None:
            copy = self._copies[device] = (
                codebook.detach().to(device=device, dtype=torch.float32).contiguous()
            )
        return copy


#: Alignment, in elements, of every work list's start and every scratch region: Triton specialises
#: a kernel on whether each pointer and integer argument is a multiple of 16 (bytes for pointers),
#: so aligned slices and offsets keep every launch on the variants :func:`warmup.prepare` compiled.
ALIGN = 16


class _Int64Buffer:
    """int64 values gathered on the host, then one tensor on the device; each list starts at a
    multiple of :data:`ALIGN` elements."""

    def __init__(self):
        self.values: list[int] = []

    def add(self, values) -> int:
        self.values.extend([0] * (-len(self.values) % ALIGN))
        start = len(self.values)
        self.values.extend(values)
        return start


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        # the caching host allocator keeps a pinned block busy until its copy ran: no wait here
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


class Plan:
    """One launch plan for the entries of one device; built per step, its work lists cached by the
    entries' geometry (see :class:`StepKernels`)."""

    def __init__(self, entries: list, geom: Geometry):
        self.entries = entries
        self.geom = geom
        self.layout = []  # per entry: the geometry-dependent int fields 6..19
        self.lists = _Int64Buffer()
        self.launches = []  # (kind, key, offset, count, extra)
        self.scratch = 0
        tiles: dict[tuple, list] = {}
        split: dict[torch.dtype, list] = {}
        squares: dict[tuple, list] = {}
        factored_slots = []
        split_blocks = []
        chunks = 0
        block_rows = 0
        fields = []
        for slot, e in enumerate(entries):
            f = dict(blocks=e.blocks, period=e.period, rows=e.rows, cols=e.cols, factored=int(e.factored))
            if e.factored:
                tc = square_tile_columns(e.cols)
                tr = max(1, geom.squares_tile // tc)
                ncb, nrb = -(-e.cols // tc), -(-e.rows // tr)
                f.update(row_part=self._take(e.rows * ncb), col_part=self._take(nrb * e.cols))
                f.update(row_scale=self._take(e.rows), col_tiles=ncb, row_tiles=nrb)
                squares.setdefault((e.dtype, tc, tr), []).extend(
                    v for r in range(nrb) for c in range(ncb) for v in (slot, r, c)
                )
                factored_slots.append(slot)
            if e.period <= K.MAX_TILE_PERIOD:
                cols = tile_columns(e.period)
                rows = max(1, geom.tile // cols)
                even = cols >= 16 and e.period == cols and e.aligned()
                tiles.setdefault((e.dtype, cols, rows, even), []).extend(
                    v for b in range(0, e.blocks, rows) for v in (slot, b)
                )
            else:
                per_block = -(-e.period // geom.chunk)
                f.update(chunk0=chunks, chunks=per_block, block0=block_rows)
                split.setdefault(e.dtype, []).extend(
                    v for b in range(e.blocks) for c in range(per_block) for v in (slot, b, c)
                )
                split_blocks.extend(v for b in range(e.blocks) for v in (slot, b))
                chunks += e.blocks * per_block
                block_rows += e.blocks
            fields.append(f)
        self.fields = fields
        for (dtype, tc, tr), values in squares.items():
            self.launches.append(("squares", (dtype, tr, tc), self.lists.add(values), len(values) // 3))
        if factored_slots:
            self.launches.append(("moments", None, self.lists.add(factored_slots), len(factored_slots)))
        for (dtype, cols, rows, even), values in tiles.items():
            self.launches.append(
                ("tile", (dtype, rows, cols, even), self.lists.add(values), len(values) // 2)
            )
        if split:
            self.parts0 = self._take(2 * chunks)
            self.block_scratch0 = self._take(2 * block_rows)
            starts = {}
            for dtype, values in split.items():
                starts[dtype] = (self.lists.add(values), len(values) // 3)
            blocks_at = self.lists.add(split_blocks)
            for dtype, (at, count) in starts.items():
                self.launches.append(("split_stats", dtype, at, count))
            self.launches.append(("split_blocks", None, blocks_at, len(split_blocks) // 2))
            for dtype, (at, count) in starts.items():
                self.launches.append(("split_apply", dtype, at, count))
        self.device_lists = None

    def _take(self, n: int) -> int:
        start = self.scratch + (-self.scratch % ALIGN)
        self.scratch = start + n
        return start

    def ints(self) -> list[int]:
        out = []
        for e, f in zip(self.entries, self.fields):
            st = e.state
            v = st["v_row"] if e.factored else st["vmean"]
            out += [
                e.work.data_ptr(),
                e.grad.data_ptr(),
                st["m_codebook"].data_ptr(),
                st["m_magnitude"].data_ptr(),
                v.data_ptr(),
                st["v_col"].data_ptr() if e.factored else 0,
                f["blocks"],
                f["period"],
                f["rows"],
                f["cols"],
                int(e.from_grad),
                f["factored"],
                f.get("row_scale", 0),
                f.get("chunk0", 0),
                f.get("chunks", 0),
                f.get("block0", 0),
                f.get("row_part", 0),
                f.get("col_part", 0),
                f.get("col_tiles", 0),
                f.get("row_tiles", 0),
            ]
        return out


def plan_key(entries: list) -> tuple:
    """What a plan depends on besides addresses and scalars."""
    return tuple(
        (
            e.dtype,
            e.period,
            e.blocks,
            e.factored,
            e.rows,
            e.cols,
            e.period <= K.MAX_TILE_PERIOD and e.aligned(),
        )
        for e in entries
    )


class StepKernels:
    """The launches of one optimizer's steps; keeps the last plan per device while the entries'
    geometry stays the same."""

    def __init__(self):
        self.codebooks = Codebooks()
        self._plans = {}

    def run(self, entries: list, codebook: torch.Tensor) -> None:
        by_device: dict[torch.device, list] = {}
        for e in entries:
            by_device.setdefault(e.work.device, []).append(e)
        for device, group in by_device.items():
            self._run_device(device, group, codebook)
        for e in entries:
            e.commit()

    def _plan(self, device, entries):
        key = plan_key(entries)
        cached = self._plans.get(device)
        if cached is not None and cached[0] == key:
            plan = cached[1]
            plan.entries = entries
            return plan
        plan = Plan(entries, geometry())
        plan.device_lists = _to_device(torch.tensor(plan.lists.values or [0], dtype=torch.int64), device)
        self._plans[device] = (key, plan)
        return plan

    def _run_device(self, device, entries, codebook) -> None:
        # Triton's interpreter keeps a launch's grid in process-wide state: ranks run as threads of
        # one process (the suite's thread launcher) take turns launching; compiled launches do not
        with _INTERPRETER_LOCK if interpreted() else contextlib.nullcontext():
            self._launch_all(device, entries, codebook)

    def _launch_all(self, device, entries, codebook) -> None:
        check_device(device, "a parameter")
        plan = self._plan(device, entries)
        ints = _to_device(torch.tensor(plan.ints(), dtype=torch.int64), device)
        floats = _to_device(torch.tensor([x for e in entries for x in e.floats], dtype=torch.float32), device)
        scratch = torch.empty(max(1, plan.scratch), dtype=torch.float32, device=device)
        lists = plan.device_lists
        cb = self.codebooks.get(codebook, device)
        geom = plan.geom
        options = {} if interpreted() else COMPILE
        for kind, key, at, count in plan.launches:
            work = lists[at:]
            if kind == "tile":
                dtype, rows, cols, even = key
                K.tile_step[(count,)](
                    work,
                    ints,
                    floats,
                    scratch,
                    cb,
                    DT=_TL[dtype],
                    ROWS=rows,
                    COLS=cols,
                    EVEN=even,
                    num_warps=_warps(rows * cols),
                    **options,
                )
            elif kind == "squares":
                dtype, tr, tc = key
                K.factored_squares[(count,)](
                    work, ints, scratch, DT=_TL[dtype], TR=tr, TC=tc, num_warps=_warps(tr * tc), **options
                )
            elif kind == "moments":
                K.factored_moments[(count,)](
                    work,
                    ints,
                    floats,
                    scratch,
                    RT=geom.moments_rows,
                    KT=geom.moments_tiles,
                    num_warps=4,
                    **options,
                )
            elif kind == "split_stats":
                K.split_stats[(count,)](
                    work,
                    ints,
                    floats,
                    scratch,
                    plan.parts0,
                    cb,
                    DT=_TL[key],
                    CHUNK=geom.chunk,
                    num_warps=_warps(geom.chunk),
                    **options,
                )
            elif kind == "split_blocks":
                K.split_blocks[(count,)](
                    work,
                    ints,
                    floats,
                    scratch,
                    plan.parts0,
                    plan.block_scratch0,
                    REDUCE=geom.reduce,
                    num_warps=4,
                    **options,
                )
            else:
                K.split_apply[(count,)](
                    work,
                    ints,
                    floats,
                    scratch,
                    plan.block_scratch0,
                    cb,
                    DT=_TL[key],
                    CHUNK=geom.chunk,
                    num_warps=_warps(geom.chunk),
                    **options,
                )


_TL = {
    torch.float32: K.tl.float32,
    torch.bfloat16: K.tl.bfloat16,
    torch.float16: K.tl.float16,
}

"""The training stack users run Gefen in (SPEC 4.3.14): a small transformer sharded by FSDP2's
``fully_shard``, trained under ``torch.autocast`` with a real ``torch.amp.GradScaler``,
``clip_grad_norm_`` over DTensor gradients and a warm-up-then-cosine ``LambdaLR``, saved and
resumed through the app-state pattern of torchtitan-like trainers::

    dcp.save({"model": ..., "optimizer": impl.dcp_state(opt), "lr_scheduler": ..., "train_state": ...})

Everything here runs inside a rank body on the current World (its default group and 1-D mesh,
SPEC 4.2.4). The token data come from a generator seeded by the step, and every step's global
batch is split evenly over the ranks, so a run's arithmetic is the same whatever world size it
resumes on, up to the order of FSDP2's reductions.

The model's shapes are chosen for the shards ``fully_shard`` makes of them (its ``Shard(0)`` with
torch.chunk's split): the 37-row vocabulary splits unevenly on 2, 3 and 4 ranks, the one-element
logit scale is empty on every rank but the first, and each block's per-head query and key norms
(5 elements) are empty on the last rank of 4.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch
from torch import nn

from gefen_conformance.harness import world

__all__ = [
    "STACK_CONFIGS",
    "StackConfig",
    "TinyLM",
    "refused_on_a_2d_mesh",
    "resume_and_train",
    "train_and_save",
    "train_with_the_default_flags",
]

VOCAB = 37
DIM = 20
HEADS = 4
HEAD_DIM = DIM // HEADS
HIDDEN = 42
BLOCKS = 2
SEQUENCE = 8
#: The global batch: divisible by every world size 1-4, so every rank holds the same number of rows.
BATCH = 12
LR = 1e-2
WEIGHT_DECAY = 0.1
MAX_GRAD_NORM = 1.0
INIT_SCALE = 2.0**12
WARMUP = 3
#: The step whose loss is made infinite (before the save in every configuration).
OVERFLOW_AT = 3
#: The schedule's last factor: the resumed steps keep a nonzero lr.
FLOOR = 0.1


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (x.float() * scale).to(x.dtype) * self.weight


class Block(nn.Module):
    """Pre-norm attention (causal, per-head query and key norms) and a SiLU MLP."""

    def __init__(self):
        super().__init__()
        self.attn_norm = RMSNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.q_norm = RMSNorm(HEAD_DIM)
        self.k_norm = RMSNorm(HEAD_DIM)
        self.proj = nn.Linear(DIM, DIM, bias=False)
        self.mlp_norm = RMSNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, HEADS, HEAD_DIM).unbind(2)
        q, k = self.q_norm(q), self.k_norm(k)
        a = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, DIM))
        return x + self.down(nn.functional.silu(self.up(self.mlp_norm(x))))


class TinyLM(nn.Module):
    """Embedding, ``BLOCKS`` blocks, a final norm, an output projection, tied to the embedding
    when ``tied`` (one parameter under two names: ``named_parameters`` yields it once), and a
    learned logit scale of one element."""

    def __init__(self, tied: bool):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.norm = RMSNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.out.weight = self.embed.weight
        self.logit_scale = nn.Parameter(torch.ones(1))

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x)) * self.logit_scale


@dataclass(frozen=True)
class StackConfig:
    """One run of the stack: ``tied`` output projection; ``mixed``: FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (fp32 sharded parameters, bf16
    compute); ``train`` steps before the save and ``resume`` after it; ``overflow_at``: the step
    whose loss is made infinite, so the scaler skips it and halves its scale."""

    tied: bool = False
    mixed: bool = False
    train: int = 4
    resume: int = 3
    overflow_at: int = OVERFLOW_AT

    @property
    def total(self) -> int:
        return self.train + self.resume

    def describe(self) -> str:
        return (
            f"{'tied' if self.tied else 'untied'} output projection, "
            f"{'bf16 MixedPrecisionPolicy' if self.mixed else 'fp32 compute'} under bf16 autocast, "
            f"{self.train} steps then {self.resume} after the resume, the scaler overflowing at step "
            f"{self.overflow_at}"
        )


#: The configurations of the suite's resume paths (SPEC 4.3.14).
STACK_CONFIGS = {
    "mixed": StackConfig(mixed=True),
    "tied": StackConfig(tied=True),
    "mixed-tied": StackConfig(mixed=True, tied=True),
    "plain": StackConfig(),
}


def schedule(step: int, total: int) -> float:
    """The lr factor after ``step`` scheduler steps: linear warm-up over :data:`WARMUP` steps,
    then a cosine down to :data:`FLOOR` at ``total``."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = min(step - WARMUP, total - WARMUP) / (total - WARMUP)
    return FLOOR + (1.0 - FLOOR) * 0.5 * (1.0 + math.cos(math.pi * progress))


def tokens(step: int, size: int = 1) -> torch.Tensor:
    """The global batch of ``step`` on a world of ``size`` ranks (``lcm(BATCH, size)`` x
    ``SEQUENCE + 1`` tokens, so that every rank holds as many rows: FSDP averages the ranks'
    gradients, which equals the global batch's only for equal shares), the same on every rank. Its
    first ``BATCH`` rows are the same on every world size, and the only ones up to 4 ranks."""
    generator = torch.Generator().manual_seed(0x6E6E + step)
    return torch.randint(0, VOCAB, (math.lcm(BATCH, size), SEQUENCE + 1), generator=generator)


def rank_batch(step: int) -> torch.Tensor:
    """This rank's equal share of :func:`tokens` of ``step``, on its device."""
    here = world.current()
    return tokens(step, here.size).chunk(here.size)[here.rank].to(here.device)


#: Held while a model draws its initial values from the process's global generator.
_INIT_LOCK = threading.Lock()


def _sharded_model(config: StackConfig, seed: int, mesh=None) -> TinyLM:
    """The model with values from ``seed``, sharded by ``fully_shard`` per block and at the root on
    ``mesh`` (default: the current World's 1-D mesh)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    here = world.current()
    # the global generator is one per process: ranks that are threads of one process take turns
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyLM(config.tied)
    model.to(here.device)
    options = {"mesh": here.mesh if mesh is None else mesh}
    if config.mixed:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


class _Trainer:
    """A model, the implementation's optimizer over its named parameters, a ``LambdaLR`` and a
    ``GradScaler``: the objects a trainer saves and restores."""

    def __init__(self, impl, config: StackConfig, seed: int, *, factored_v_2d: bool = False):
        self.config = config
        self.model = _sharded_model(config, seed)
        decay = [(n, p) for n, p in self.model.named_parameters() if p.ndim > 1]
        no_decay = [(n, p) for n, p in self.model.named_parameters() if p.ndim <= 1]
        self.optimizer = impl.make_optimizer(
            [
                {"params": decay, "lr": LR, "weight_decay": WEIGHT_DECAY},
                {"params": no_decay, "lr": LR, "weight_decay": 0.0},
            ],
            factored_v_2d=factored_v_2d,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: schedule(step, config.total)
        )
        self.scaler = torch.amp.GradScaler(world.current().device.type, init_scale=INIT_SCALE)
        self.step = 0

    def train(self, steps: int) -> list[float]:
        """``steps`` training steps; the global mean loss of each (inf at the overflow step)."""
        here = world.current()
        losses = []
        for _ in range(steps):
            self.step += 1
            batch = rank_batch(self.step)
            with torch.autocast(here.device.type, dtype=torch.bfloat16):
                logits = self.model(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            if self.step == self.config.overflow_at:
                loss = loss * math.inf
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            mean = loss.detach().reshape(1).clone()
            torch.distributed.all_reduce(mean, group=here.group)
            losses.append(float(mean) / here.size)
        return losses

    def app_state(self, impl) -> dict:
        """What a torchtitan-like trainer hands ``dcp.save`` and ``dcp.load``."""
        return {
            "model": _ModelState(self.model),
            "optimizer": impl.dcp_state(self.optimizer),
            "lr_scheduler": self.scheduler,  # a DCP Stateful as it is
            "train_state": _TrainState(self),
        }

    def report(self) -> dict:
        """Full parameters (a collective), the scaler's scale and the scheduler's state."""
        from torch.distributed.tensor import DTensor

        params = {
            n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True)
            for n, p in self.model.named_parameters()
        }
        scheduler = {k: v for k, v in self.scheduler.state_dict().items() if k != "lr_lambdas"}
        return {
            "params": params,
            "scale": float(self.scaler.get_scale()),
            "scheduler": scheduler,
            "lrs": [float(g["lr"]) for g in self.optimizer.param_groups],
            "step": self.step,
        }


class _ModelState:
    """The model through ``torch.distributed.checkpoint.state_dict``'s model helpers."""

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state)


class _TrainState:
    """The trainer's step and the scaler's state."""

    def __init__(self, trainer: _Trainer):
        self.trainer = trainer

    def state_dict(self):
        return {"step": self.trainer.step, "scaler": self.trainer.scaler.state_dict()}

    def load_state_dict(self, state):
        self.trainer.step = int(state["step"])
        self.trainer.scaler.load_state_dict(state["scaler"])


# --------------------------------------------------------------------------------- rank bodies


def _save(impl, trainer: _Trainer, path: str, writer=None) -> None:
    import torch.distributed.checkpoint as dcp

    target = {"storage_writer": writer} if writer is not None else {"checkpoint_id": path}
    dcp.save(trainer.app_state(impl), process_group=world.current().group, **target)


def train_and_save(impls: tuple, config: StackConfig, paths: tuple, writer_for=None) -> list:
    """For each implementation: train ``config.train`` steps from the same initial values and save
    to its path (collective). The losses of each, in order. ``writer_for(path)``, when given,
    makes the storage writer of each save."""
    out = []
    for impl, path in zip(impls, paths):
        trainer = _Trainer(impl, config, seed=1)
        losses = trainer.train(config.train)
        _save(impl, trainer, path, None if writer_for is None else writer_for(path))
        out.append(losses)
    return out


def resume_and_train(impls: tuple, config: StackConfig, paths: tuple) -> list:
    """For each implementation: a fresh model (other values), sharded again here, with a fresh
    optimizer, scheduler and scaler; ``dcp.load`` of its checkpoint through the app state; then
    ``config.resume`` steps (collective). Per implementation: ``(losses, report)``, or the load's
    error as ``("raised", type name, message)``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    out = []
    for impl, path in zip(impls, paths):
        trainer = _Trainer(impl, config, seed=2)
        try:
            dcp.load(trainer.app_state(impl), checkpoint_id=path, process_group=world.current().group)
        # the outcome is the result (DCP's CheckpointException is a BaseException)
        except (Exception, CheckpointException) as exc:
            out.append(("raised", type(exc).__name__, str(exc)))
            continue
        losses = trainer.train(config.resume)
        out.append((losses, trainer.report()))
    return out


def train_with_the_default_flags(impls: tuple, config: StackConfig) -> list:
    """For each implementation: the stack built with the optimizer's default ``factored_v_2d=True``
    (no checkpoint: DCP saves need False), trained ``config.train`` steps (collective). Per
    implementation: ``(losses, report, {name: sorted keys of optimizer.state[p]})``, the
    ``torch.optim.Optimizer`` state of each parameter (SPEC 1.9.1: a DTensor parameter takes the
    block path whatever the flag; a native state dict of DTensor parameters is refused, §1.12.11)."""
    out = []
    for impl in impls:
        trainer = _Trainer(impl, config, seed=1, factored_v_2d=True)
        losses = trainer.train(config.train)
        state = getattr(trainer.optimizer, "state", {})
        keys = {n: sorted(state.get(p, {})) for n, p in trainer.model.named_parameters()}
        out.append((losses, trainer.report(), keys))
    return out


def refused_on_a_2d_mesh(impl, path: str):
    """The model sharded by ``fully_shard`` on a 2-D (replicate x shard) mesh, HSDP, over the
    current World's ranks, trained one step; then ``impl.dcp_state(opt)`` and a ``dcp.save`` to
    ``path``. The error raised (type name, message), or None if both succeeded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.device_mesh import init_device_mesh

    here = world.current()
    mesh = init_device_mesh(here.device.type, (1, here.size), mesh_dim_names=("replicate", "shard"))
    model = _sharded_model(StackConfig(), seed=1, mesh=mesh)
    optimizer = impl.make_optimizer(
        [{"params": list(model.named_parameters()), "lr": LR}], factored_v_2d=False
    )
    batch = rank_batch(1)
    logits = model(batch[:, :-1])
    nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1)).backward()
    optimizer.step()
    try:
        dcp.save({"optimizer": impl.dcp_state(optimizer)}, checkpoint_id=path, process_group=here.group)
    except (Exception, CheckpointException) as exc:  # the outcome is the result
        return (type(exc).__name__, str(exc))
    return None

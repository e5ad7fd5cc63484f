"""Teacher and student residual networks of the toy experiment (paper §4 and App. C).

Both networks are stacks of residual MLP blocks on a width-32 stream::

    h_0 = RMSNorm(x),  x ~ N(0, I_32)
    h_{l+1} = h_l + W_down · ReLU(W_up · RMSNorm(h_l) + b_up)²      (W_up 128×32 + bias, W_down 32×128)
    output  = RMSNorm(h_ℓ);  logits = W_head · output  (/ T for the teacher)

RMSNorm has no gain and PyTorch's default eps (the dtype's machine epsilon).

The teacher (depth ℓ* = 128) has every W_down scaled by 1/√ℓ*. Its layers are drawn with a continuous
correlation ρ ∈ [0, 1] (an extension, paper App. C)::

    W_l = √ρ · W_shared + √(1−ρ) · W_l^indep

so the per-entry variance is unchanged and neighbouring layers are correlated by ρ. ρ = 0 is exactly the
paper's independent teacher (exp-9) and ρ = 1 exactly the tied teacher (exp-9-1: every layer holds the same
tensors). The raw draws W_shared and W_l^indep depend only on the teacher seed, so teachers of one replicate at
different ρ are one continuous family (common random numbers across the phase diagram).

Correlated layers add up coherently, so the total displacement ‖h_ℓ* − h_0‖ grows about tenfold from ρ = 0 to
ρ = 1 and a ρ sweep mixes "how smooth" with "how far". ``normalise=True`` rescales W_down of a teacher so its
mean displacement equals that of the ρ = 0 teacher of the same seed (an extension, not the paper's).

This file holds the *definitions*: weight containers, initialisation, the training variants, and plain
``nn.Module`` versions used as the one-student-at-a-time reference (tests, benchmark). The fast batched
trainer is :mod:`depthlib.toy.engine`.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from depthlib.errors import InputError


# ---- sizes and training variants ---------------------------------------------------------------------
@dataclass(frozen=True)
class ToyShape:
    """Network sizes (paper App. C). Defaults are the paper's; tests shrink them."""

    d_model: int = 32        # residual width m: the paper's toy uses 32
    d_mlp: int = 128         # MLP hidden width 4m
    vocab: int = 128         # output dimension of the KL head
    teacher_depth: int = 128  # ℓ*; 24 in exp-9-5


@dataclass(frozen=True)
class StudentTraining:
    """How students are trained (paper App. C). Build one with :func:`variant`."""

    loss: Literal["kl", "mse"] = "kl"                   # KL on tempered logits (exp-9/9-1/9-3) or MSE on RMSNorm(h_ℓ)
    head: Literal["trained", "fixed", "none"] = "trained"  # exp-9: own zero-init head; exp-9-3: teacher's fixed head
    block: Literal["euler", "rk2"] = "euler"           # exp-9-4 uses explicit-midpoint (RK2) blocks
    lr: float = 6e-4                                   # the paper's base learning rate
    lr_depth_factor: float | None = None               # lr = lr · factor/√ℓ (2 for MSE variants, 4 for exp-9-3)
    decay_frac: float = 0.0                            # final fraction of steps with a linear decay ...
    decay_to: float = 0.1                              # ... down to this fraction of the base lr
    betas: tuple[float, float] = (0.9, 0.999)          # Adam defaults, as the paper
    eps: float = 1e-8

    def base_lr(self, depth: int) -> float:
        if self.lr_depth_factor is None:
            return self.lr
        return self.lr * self.lr_depth_factor / math.sqrt(depth)

    def schedule(self, step: int, total_steps: int) -> float:
        """Multiplier of the base lr at 0-based ``step`` (paper App. C: constant, then linear decay to 10 %)."""
        if self.decay_frac <= 0:
            return 1.0
        n_decay = self.decay_frac * total_steps
        start = total_steps - n_decay
        if step < start:
            return 1.0
        return self.decay_to + (1 - self.decay_to) * (total_steps - step) / n_decay


#: The paper's variants (paper App. C). ``exp-9`` and ``exp-9-1`` differ only in the teacher's ρ.
VARIANTS: dict[str, StudentTraining] = {
    "exp-9": StudentTraining(loss="kl", head="trained"),
    "exp-9-decay": StudentTraining(loss="kl", head="trained", decay_frac=0.2),  # exp-9 + final decay (CPU budget)
    "exp-9-3": StudentTraining(loss="kl", head="fixed", lr_depth_factor=4.0, decay_frac=0.2),
    "exp-9-2": StudentTraining(loss="mse", head="none", lr_depth_factor=2.0, decay_frac=0.2),
    "exp-9-4": StudentTraining(loss="mse", head="none", block="rk2", lr_depth_factor=2.0, decay_frac=0.2),
}


def variant(name: str, **overrides) -> StudentTraining:
    if name not in VARIANTS:
        raise InputError(f"unknown toy variant {name!r} (have {', '.join(VARIANTS)})")
    return replace(VARIANTS[name], **overrides)


# ---- seeds -------------------------------------------------------------------------------------------
def derive_seed(base: int, *parts) -> int:
    """A 63-bit seed from a base seed and a path of labels, e.g. ``derive_seed(0, 'teacher', 2)``.

    Every random draw of a sweep has its own seed derived this way, so a student's initialisation and its
    data do not depend on which other students are trained alongside it (batched == alone).
    """
    blob = "/".join([str(int(base))] + [repr(p) for p in parts]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1


def _generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _uniform(shape, bound: float, g: torch.Generator) -> torch.Tensor:
    """U(−bound, bound), the distribution of PyTorch's default ``nn.Linear`` init (bound = 1/√fan_in)."""
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).mul_(bound).float()


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    """RMSNorm without gain, eps = machine epsilon of the dtype (PyTorch's default; paper App. C)."""
    return F.rms_norm(x, (x.shape[-1],))


# ---- teacher -----------------------------------------------------------------------------------------
@dataclass
class TeacherWeights:
    """One teacher in ``nn.Linear`` layout. Shapes: W_up (ℓ*, H, d), b_up (ℓ*, H), W_down (ℓ*, d, H),
    head (V, d) (default init, exp-9/9-1), fixed_head (V, d) (randn/√d buffer given to exp-9-3 students)."""

    rho: float
    W_up: torch.Tensor
    b_up: torch.Tensor
    W_down: torch.Tensor
    head: torch.Tensor
    fixed_head: torch.Tensor
    seed: int = 0
    scale: float = 1.0        # factor applied to W_down by displacement normalisation (1: the paper's teacher)

    @property
    def depth(self) -> int:
        return self.W_up.shape[0]

    def to(self, device) -> "TeacherWeights":
        return replace(self, **{k: getattr(self, k).to(device) for k in ("W_up", "b_up", "W_down", "head",
                                                                            "fixed_head")})


def make_teacher(rho: float, seed: int, shape: ToyShape = ToyShape(), *, normalise: bool = False) -> TeacherWeights:
    """The teacher with layer correlation ``rho`` (paper App. C + the ρ interpolation).

    The raw draws (shared and per-layer) depend only on ``seed``; ``rho`` only mixes them. At ρ = 0 the
    mix is exactly the independent draws, at ρ = 1 exactly the shared draw in every layer. W_down is then
    scaled by 1/√ℓ* (both teachers in the paper). With ``normalise`` it is scaled further so the teacher's
    mean displacement ‖h_ℓ* − h_0‖ equals the ρ = 0 teacher's (:func:`normalise_displacement`).
    """
    rho = float(rho)
    if not 0.0 <= rho <= 1.0 or math.isnan(rho):
        raise InputError(f"teacher correlation rho must be in [0, 1], got {rho}")
    d, H, V, L = shape.d_model, shape.d_mlp, shape.vocab, shape.teacher_depth
    g = _generator(seed)
    shared_up = _uniform((H, d), 1 / math.sqrt(d), g)
    shared_b = _uniform((H,), 1 / math.sqrt(d), g)
    shared_down = _uniform((d, H), 1 / math.sqrt(H), g)
    indep_up = _uniform((L, H, d), 1 / math.sqrt(d), g)
    indep_b = _uniform((L, H), 1 / math.sqrt(d), g)
    indep_down = _uniform((L, d, H), 1 / math.sqrt(H), g)
    head = _uniform((V, d), 1 / math.sqrt(d), g)
    fixed_head = torch.randn((V, d), generator=g) / math.sqrt(d)
    a, b = math.sqrt(rho), math.sqrt(1.0 - rho)

    def mix(shared, indep):
        if rho == 0.0:
            return indep.clone()
        if rho == 1.0:
            return shared.expand_as(indep).clone()
        return a * shared + b * indep

    W_down = mix(shared_down, indep_down) / math.sqrt(L)
    teacher = TeacherWeights(rho, mix(shared_up, indep_up), mix(shared_b, indep_b), W_down, head, fixed_head, seed)
    if normalise and rho > 0.0:
        target = displacement(make_teacher(0.0, seed, shape), displacement_inputs(shape))
        teacher = normalise_displacement(teacher, target, shape)
    return teacher


def displacement_inputs(shape: ToyShape = ToyShape(), n: int = 1024) -> torch.Tensor:
    """The fixed Gaussian inputs (n, d) on which teacher displacements are measured and matched."""
    return torch.randn((n, shape.d_model), generator=_generator(derive_seed(0, "displacement")))


def displacement(t: TeacherWeights, x: torch.Tensor, scale: float = 1.0) -> float:
    """Mean over inputs x (n, d) of ‖h_ℓ* − h_0‖, in float64, with W_down multiplied by ``scale``."""
    h0 = F.rms_norm(x.double(), (x.shape[-1],))
    h = h0
    for l in range(t.depth):
        z = F.relu(F.rms_norm(h, (h.shape[-1],)) @ t.W_up[l].double().T + t.b_up[l].double())
        h = h + scale * (z * z) @ t.W_down[l].double().T
    return float((h - h0).norm(dim=-1).mean())


def normalise_displacement(t: TeacherWeights, target: float, shape: ToyShape = ToyShape(),
                           iterations: int = 40) -> TeacherWeights:
    """``t`` with W_down scaled by the c in (0, 1] (bisection in log c) at which its mean displacement equals
    ``target``; the displacement grows monotonically with c for these teachers."""
    x = displacement_inputs(shape)
    if displacement(t, x) <= target:
        return t
    lo, hi = math.log(1e-4), 0.0
    if displacement(t, x, math.exp(lo)) > target:
        raise InputError(f"cannot shrink the rho={t.rho:g} teacher to displacement {target:.3g}")
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if displacement(t, x, math.exp(mid)) < target else (lo, mid)
    c = math.exp(0.5 * (lo + hi))
    return replace(t, W_down=t.W_down * c, scale=c)


# ---- students: initial weights -----------------------------------------------------------------------
@dataclass
class StudentWeights:
    """One student in ``nn.Linear`` layout: W_up (M, H, d), b_up (M, H), W_down (M, d, H), head (V, d) or None.

    M = depth for Euler blocks and 2·depth for RK2 blocks (two MLPs per block, MLP₁ then MLP₂).
    """

    W_up: torch.Tensor
    b_up: torch.Tensor
    W_down: torch.Tensor
    head: torch.Tensor | None


def init_student(depth: int, seed: int, train: StudentTraining, shape: ToyShape = ToyShape(),
                 fixed_head: torch.Tensor | None = None) -> StudentWeights:
    """Default init, then W_down = 0 (the student starts as the identity map) and, for exp-9/9-1, head = 0
    (uniform initial predictions). exp-9-3 students get the teacher's fixed head (paper App. C)."""
    d, H, V = shape.d_model, shape.d_mlp, shape.vocab
    M = depth * (2 if train.block == "rk2" else 1)
    g = _generator(seed)
    W_up = _uniform((M, H, d), 1 / math.sqrt(d), g)
    b_up = _uniform((M, H), 1 / math.sqrt(d), g)
    W_down = torch.zeros((M, d, H))
    if train.head == "trained":
        head = torch.zeros((V, d))
    elif train.head == "fixed":
        if fixed_head is None:
            raise InputError("the fixed-head variant needs the teacher's fixed head")
        head = fixed_head.clone()
    else:
        head = None
    return StudentWeights(W_up, b_up, W_down, head)


# ---- plain nn.Module versions (reference, one student at a time) ---------------------------------------
class MLP(nn.Module):
    def __init__(self, shape: ToyShape):
        super().__init__()
        self.up = nn.Linear(shape.d_model, shape.d_mlp)
        self.down = nn.Linear(shape.d_mlp, shape.d_model, bias=False)

    def forward(self, h):
        return self.down(F.relu(self.up(rms_norm(h))) ** 2)


class ResidualNet(nn.Module):
    """The toy network as the paper writes it (one model, autograd). Used as the reference and by the
    plain benchmark loop; the sweep uses :mod:`depthlib.toy.engine` instead."""

    def __init__(self, n_mlps: int, shape: ToyShape = ToyShape(), block: str = "euler", head: str = "trained"):
        super().__init__()
        self.block, self.head_kind = block, head
        self.mlps = nn.ModuleList(MLP(shape) for _ in range(n_mlps))
        if head == "trained":
            self.head = nn.Linear(shape.d_model, shape.vocab, bias=False)
        elif head == "fixed":
            self.register_buffer("head_w", torch.zeros(shape.vocab, shape.d_model))

    @classmethod
    def from_weights(cls, w, shape: ToyShape = ToyShape(), block: str = "euler", head: str = "trained"):
        net = cls(w.W_up.shape[0], shape, block, head)
        with torch.no_grad():
            for i, mlp in enumerate(net.mlps):
                mlp.up.weight.copy_(w.W_up[i])
                mlp.up.bias.copy_(w.b_up[i])
                mlp.down.weight.copy_(w.W_down[i])
            if head == "trained":
                net.head.weight.copy_(w.head)
            elif head == "fixed":
                net.head_w.copy_(w.head if isinstance(w, StudentWeights) else w.fixed_head)
        return net

    def hidden(self, x: torch.Tensor, all_states: bool = False):
        """Final normalised state (B, d), or with ``all_states`` the residual stream (depth+1, B, d)."""
        h = rms_norm(x)
        states = [h]
        if self.block == "rk2":
            for i in range(0, len(self.mlps), 2):
                mid = h + 0.5 * self.mlps[i](h)
                h = h + self.mlps[i + 1](mid)
                states.append(h)
        else:
            for mlp in self.mlps:
                h = h + mlp(h)
                states.append(h)
        return torch.stack(states) if all_states else rms_norm(h)

    def logits(self, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        y = self.hidden(x)
        if self.head_kind == "trained":
            return self.head(y)
        return y @ self.head_w.T / temperature


def teacher_module(t: TeacherWeights, shape: ToyShape = ToyShape(), head: str = "trained") -> ResidualNet:
    """The teacher as a :class:`ResidualNet` (head: its default-init head, or ``fixed`` for exp-9-3)."""
    net = ResidualNet.from_weights(t, replace(shape, teacher_depth=t.depth), "euler", head)
    return net.requires_grad_(False)


def teacher_targets(teacher: ResidualNet, x: torch.Tensor, temperature: float, loss: str) -> torch.Tensor:
    """Log-probabilities of the tempered teacher (KL) or its normalised final state (MSE)."""
    with torch.no_grad():
        if loss == "mse":
            return teacher.hidden(x)
        if teacher.head_kind == "trained":
            return F.log_softmax(teacher.head(teacher.hidden(x)) / temperature, -1)
        return F.log_softmax(teacher.logits(x, temperature), -1)


def student_loss(student: ResidualNet, x: torch.Tensor, target: torch.Tensor, temperature: float,
                 loss: str) -> torch.Tensor:
    """KL(p_teacher ‖ p_student), batch mean, log target (exp-9); or MSE on RMSNorm(h_ℓ) (exp-9-2)."""
    if loss == "mse":
        return F.mse_loss(student.hidden(x), target)
    logq = F.log_softmax(student.logits(x, temperature), -1)
    return F.kl_div(logq, target, reduction="batchmean", log_target=True)

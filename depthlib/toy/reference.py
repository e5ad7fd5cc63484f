"""The plain one-student-at-a-time training loop, written like the paper's ``exp-9.py`` step body.

Each step: fresh inputs → the student's own teacher forward (no grad) → student forward → loss →
autograd backward → ``torch.optim.Adam`` (per-tensor, for-loop implementation). It is the numerical
reference for the batched engine (tests) and the baseline of ``benchmarks/bench_toy.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from depthlib.toy.engine import StudentSpec
from depthlib.toy.models import (
    ResidualNet,
    StudentTraining,
    TeacherWeights,
    ToyShape,
    init_student,
    student_loss,
    teacher_module,
    teacher_targets,
)


@dataclass
class PlainStudent:
    """One student, its teacher module and its own optimiser: the paper's loop state."""

    net: ResidualNet
    teacher: ResidualNet
    opt: torch.optim.Optimizer
    spec: StudentSpec
    base_lr: float


def make_plain(teacher: TeacherWeights, spec: StudentSpec, train: StudentTraining,
               shape: ToyShape = ToyShape(), device: str = "cpu") -> PlainStudent:
    head = "none" if train.head == "none" else train.head
    w = init_student(spec.depth, spec.seed, train, shape,
                     fixed_head=teacher.fixed_head if train.head == "fixed" else None)
    net = ResidualNet.from_weights(w, shape, train.block, head).to(device)
    t_net = teacher_module(teacher, shape, "fixed" if train.head == "fixed" else "trained").to(device)
    base = train.base_lr(spec.depth)
    opt = torch.optim.Adam(net.parameters(), lr=base, betas=train.betas, eps=train.eps, foreach=False)
    return PlainStudent(net, t_net, opt, spec, base)


def plain_step(s: PlainStudent, x: torch.Tensor, train: StudentTraining, step: int, total_steps: int) -> float:
    """One training step of one student, teacher recomputed (as the paper does)."""
    for group in s.opt.param_groups:
        group["lr"] = s.base_lr * train.schedule(step, total_steps)
    target = teacher_targets(s.teacher, x, s.spec.temperature, train.loss)
    loss = student_loss(s.net, x, target, s.spec.temperature, train.loss)
    s.opt.zero_grad(set_to_none=True)
    loss.backward()
    s.opt.step()
    return loss.item()


def plain_test_loss(s: PlainStudent, x_test: torch.Tensor, train: StudentTraining) -> float:
    """Mean loss over held-out batches ``x_test`` (n_batches, B, d)."""
    with torch.no_grad():
        vals = [student_loss(s.net, x, teacher_targets(s.teacher, x, s.spec.temperature, train.loss),
                             s.spec.temperature, train.loss).item() for x in x_test]
    return sum(vals) / len(vals)


def train_alone(teacher: TeacherWeights, spec: StudentSpec, train: StudentTraining, steps: int, batch: int,
                data_seed: int, shape: ToyShape = ToyShape()) -> tuple[list[float], PlainStudent]:
    """Train one student with the plain loop on the data stream seeded ``data_seed`` (the engine's stream)."""
    s = make_plain(teacher, spec, train, shape)
    g = torch.Generator().manual_seed(int(data_seed))
    losses = []
    for t in range(steps):
        x = torch.randn((batch, shape.d_model), generator=g)
        losses.append(plain_step(s, x, train, t, steps))
    return losses, s

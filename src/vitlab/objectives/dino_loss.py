"""The arithmetic of DINO (Caron et al. 2021, Algorithm 1; facebookresearch/dino `DINOLoss`, `cosine_scheduler`
and the teacher's update in `train_one_epoch`), apart from the training loop so that each piece is checked alone:

    loss = mean over pairs (teacher view t, student view s), s != t, of
           mean over images of  - sum_k softmax((t_out - center) / teacher_temp)_k * log_softmax(s_out / student_temp)_k
    center <- m_c center + (1 - m_c) mean over the batch's teacher outputs     (every process's, under DDP)
    teacher <- m teacher + (1 - m) student,   m from momentum_teacher to 1 on a cosine over the run's steps
    teacher_temp: linear from its warm-up value over the warm-up epochs, then constant

and of iBOT's masked-patch term (Zhou et al. 2022, arXiv:2111.07832, Eq. 2; bytedance/ibot `iBOTLoss`,
facebookresearch/dinov2 `iBOTPatchLoss`), between a global view's patch tokens as the student sees them (masked)
and as the teacher does (whole), at the masked patches only:

    loss = mean over global views' images of
           mean over the image's masked patches p of
           - sum_k softmax((t_p - center') / teacher_temp')_k * log_softmax(s_p / student_temp)_k
    (an image left unmasked adds 0 and still counts in the mean, as in both references)
    center' <- m_c center' + (1 - m_c) mean over the teacher's patch outputs, every patch of every global view
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def dino_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    center: torch.Tensor,
    student_temp: float,
    teacher_temp: float,
    global_views: int = 2,
) -> torch.Tensor:
    """student_logits (V B, K) view-major (the global views first), teacher_logits (G B, K) of the G global views,
    center (1, K) -> the mean cross-entropy over every pair of different views (a scalar, float32)."""
    images = len(teacher_logits) // global_views
    student = F.log_softmax(student_logits.float() / student_temp, dim=-1).chunk(len(student_logits) // images)
    teacher = F.softmax((teacher_logits.float() - center) / teacher_temp, dim=-1).detach().chunk(global_views)
    total, terms = student_logits.new_zeros((), dtype=torch.float32), 0
    for teacher_view, targets in enumerate(teacher):
        for student_view, log_probs in enumerate(student):
            if student_view == teacher_view:  # a view is not asked to predict itself
                continue
            total = total + torch.sum(-targets * log_probs, dim=-1).mean()
            terms += 1
    return total / terms


def ibot_patch_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    masks: torch.Tensor,
    center: torch.Tensor,
    student_temp: float,
    teacher_temp: float,
) -> torch.Tensor:
    """student_logits (G B, P, K) of the masked global views, teacher_logits (G B, P, K) of the whole ones, masks
    (G B, P) bool, center (1, K) -> the cross-entropy at the masked patches, averaged per image over its masked
    patches, then over the images (a scalar, float32)."""
    log_probs = F.log_softmax(student_logits.float() / student_temp, dim=-1)
    targets = F.softmax((teacher_logits.float() - center) / teacher_temp, dim=-1).detach()
    per_patch = torch.sum(-targets * log_probs, dim=-1)  # (G B, P)
    per_patch = torch.where(masks, per_patch, 0.0)  # an unmasked patch adds nothing, whatever its logits
    return (per_patch.sum(dim=-1) / masks.sum(dim=-1).clamp(min=1)).mean()


def updated_center(center: torch.Tensor, batch_mean: torch.Tensor, momentum: float) -> torch.Tensor:
    """The center (1, K) after a step: its moving average with `batch_mean` (1, K), the mean teacher output over
    every global view (for iBOT's: every patch of every global view), micro-batch and process of the step."""
    return center * momentum + batch_mean * (1 - momentum)


def teacher_momentum(step: int, total_steps: int, base: float) -> float:
    """The teacher's momentum for the update after optimizer step `step` (0 for the first) of `total_steps`:
    base at the start, rising on a half cosine to 1 at the end."""
    return 1 + 0.5 * (base - 1) * (1 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))


def teacher_temperature(epoch: int, warmup_temp: float, temp: float, warmup_epochs: int) -> float:
    """The teacher's temperature in epoch `epoch` (0 for the first): np.linspace(warmup_temp, temp, warmup_epochs)
    over the warm-up epochs, then `temp`."""
    if epoch >= warmup_epochs:
        return temp
    if warmup_epochs == 1:
        return warmup_temp
    return warmup_temp + (temp - warmup_temp) * epoch / (warmup_epochs - 1)


@torch.no_grad()
def update_teacher(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """teacher <- momentum * teacher + (1 - momentum) * student, parameter by parameter (matched by name: the two
    are the same architecture). Written as the reference writes it, a multiply then an add, so a hand update in
    the same order gives the same bits."""
    students = dict(student.named_parameters())
    teachers = [(parameter, students[name]) for name, parameter in teacher.named_parameters()]
    mine: list[torch.Tensor] = [parameter for parameter, _ in teachers]
    theirs: list[torch.Tensor] = [source.detach() for _, source in teachers]
    torch._foreach_mul_(mine, momentum)
    torch._foreach_add_(mine, list(torch._foreach_mul(theirs, 1 - momentum)))

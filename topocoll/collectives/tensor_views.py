"""Byte views and packed copies of tensors: how the group moves any dtype and layout as bytes."""

from __future__ import annotations

from collections.abc import Sequence

import torch

def bytes_view(buffer: torch.Tensor) -> torch.Tensor:
    """Copy-only collectives move raw bytes: no per-dtype concerns, one schedule per size."""
    return buffer.view(-1).view(torch.uint8) if buffer.dtype != torch.bool else buffer.view(-1)


def same_numel_error(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> str | None:
    for i, t in enumerate(tensors):
        if t.numel() != like.numel() or t.dtype != like.dtype or t.device != like.device:
            return (
                f"tensor {i} has {t.numel()} {t.dtype} elements on {t.device}, "
                f"expected {like.numel()} {like.dtype} on {like.device}"
            )
    return None


def base_shape_error(large: torch.Tensor, small: torch.Tensor, size: int) -> str | None:
    if large.numel() != small.numel() * size:
        return f"the large tensor has {large.numel()} elements, expected {size} x {small.numel()}"
    if large.dtype != small.dtype or large.device != small.device:
        return f"dtype/device differ: {large.dtype} on {large.device} vs {small.dtype} on {small.device}"
    return None


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` as a flat uint8 tensor (a view when it is packed)."""
    return (tensor if is_packed(tensor) else packed_copy(tensor)).reshape(-1).view(torch.uint8)


def is_packed(tensor: torch.Tensor) -> bool:
    """Whether the elements of ``tensor`` lie next to each other with unit stride.

    torch calls a tensor of zero or one element contiguous whatever its strides, but a flat
    view of it keeps the stride, and a byte view (``view(torch.uint8)``), or a transport that
    reads memory, needs unit strides."""
    return tensor.is_contiguous() and (tensor.numel() > 1 or all(s == 1 for s in tensor.stride()))


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of ``a`` and ``b`` (first to last element) intersect."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a_end, b_end = a.data_ptr() + _span_bytes(a), b.data_ptr() + _span_bytes(b)
    return a.data_ptr() < b_end and b.data_ptr() < a_end


def _span_bytes(tensor: torch.Tensor) -> int:
    return (sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride())) + 1) * tensor.element_size()


def is_same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same packed elements of the same dtype (an in-place
    argument: copying one into the other would change nothing)."""
    return (
        a.device == b.device and a.dtype == b.dtype and a.numel() == b.numel()
        and a.data_ptr() == b.data_ptr() and is_packed(a) and is_packed(b)
    )


def packed_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with packed, unit-stride storage."""
    packed = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    packed.copy_(tensor)
    return packed


def copy_bytes_into(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    """Fill ``outputs`` in order from the raw bytes ``flat`` (each with its own dtype)."""
    offset = 0
    for out in outputs:
        nbytes = out.numel() * out.element_size()
        landing = out if is_packed(out) else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        landing.reshape(-1).view(torch.uint8).copy_(flat[offset : offset + nbytes])
        if landing is not out:
            out.copy_(landing)
        offset += nbytes


def scatter_copy(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for out in outputs:
        out.copy_(flat[offset : offset + out.numel()].view(out.shape))
        offset += out.numel()

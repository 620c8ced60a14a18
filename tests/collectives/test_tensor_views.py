"""Memory relations between tensors, which decide when a collective may work in its output."""

from __future__ import annotations

import torch

from topocoll.collectives.tensor_views import is_same_memory, overlaps


def test_overlaps_compares_the_spans_of_one_storage():
    big = torch.arange(24, dtype=torch.int32)
    first, second = big[0:8], big[8:16]
    assert overlaps(big, first) and overlaps(first, big)
    assert not overlaps(first, second)  # neighbours: the first ends where the second begins
    assert overlaps(big[4:12], second)  # half of one shard and half of the next
    assert not overlaps(first, torch.arange(8, dtype=torch.int32))  # another storage
    assert not overlaps(first, big[0:0])  # nothing to overlap
    # a strided view spans from its first element to its last
    columns = big.view(6, 4)[:, 0]  # elements 0, 4, ..., 20
    assert overlaps(columns, big[21:24]) is False and overlaps(columns, big[20:21])


def test_is_same_memory_only_for_the_same_packed_elements():
    big = torch.arange(24, dtype=torch.int32)
    shard = big[8:16]
    assert is_same_memory(shard, big[8:16])
    assert not is_same_memory(shard, big[8:15])  # fewer elements
    assert not is_same_memory(shard, big[9:17])  # shifted
    assert not is_same_memory(shard, shard.view(torch.float32))  # another dtype over the same bytes
    assert not is_same_memory(big.view(6, 4)[:, 0], big[0:6])  # strided: same first element only

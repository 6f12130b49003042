"""Nearest neighbours of frozen features: DINO's k-NN classifier (Caron et al. 2021, section 4.1 and its
`eval_knn.py`) and exact similarity search.

Both compare L2-normalised vectors by their dot product (cosine similarity), exactly: the similarities of a chunk
of queries against every stored vector are one matrix product, and the best k are kept per chunk, so memory stays
at chunk x N. torch does the product (a dependency already); faiss-cpu's exact index (IndexFlatIP) is the same
matrix product and selection, so it would add an install without adding speed, and its approximate indices trade
exactness for scale that a CPU collection of up to a few million vectors does not need.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

KNN_K = (10, 20)  # DINO reports k = 20 and finds 10-20 alike; both are shown
KNN_TEMPERATURE = 0.07
QUERY_CHUNK = 1024


def normalised(vectors: torch.Tensor) -> torch.Tensor:
    return F.normalize(vectors.float(), dim=1)


def nearest(
    bank: torch.Tensor, queries: torch.Tensor, k: int, chunk: int = QUERY_CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """(similarities (Q, k), indices (Q, k)) of each query's k most similar rows of `bank`, most similar first."""
    bank, k = normalised(bank), min(k, len(bank))
    scores, indices = [], []
    for rows in range(0, len(queries), chunk):
        similarity = normalised(queries[rows : rows + chunk]) @ bank.T
        best = similarity.topk(k, dim=1)
        scores.append(best.values)
        indices.append(best.indices)
    if not scores:
        return torch.zeros(0, k), torch.zeros(0, k, dtype=torch.long)
    return torch.cat(scores), torch.cat(indices)


def knn_votes(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    num_classes: int,
    k: int,
    temperature: float = KNN_TEMPERATURE,
) -> torch.Tensor:
    """(Q, num_classes) class scores: each of a query's k nearest stored vectors votes for its label with weight
    exp(similarity / temperature), as DINO's k-NN evaluation does."""
    similarity, indices = nearest(bank, queries, k)
    weights = (similarity / temperature).exp()
    votes = torch.zeros(len(queries), num_classes)
    votes.scatter_add_(1, bank_labels[indices], weights)
    return votes


def knn_accuracy(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    num_classes: int,
    ks: tuple[int, ...] = KNN_K,
    temperature: float = KNN_TEMPERATURE,
) -> dict[int, dict[str, float]]:
    """{k: {"top1", "top5"}} of the weighted k-NN classifier on the labelled queries."""
    results = {}
    for k in ks:
        votes = knn_votes(bank, bank_labels, queries, num_classes, k, temperature)
        ranked = votes.argsort(dim=1, descending=True)
        hits = ranked[:, : min(5, num_classes)] == query_labels[:, None]
        results[k] = {"top1": hits[:, 0].double().mean().item(), "top5": hits.any(dim=1).double().mean().item()}
    return results


def near_duplicates(
    vectors: torch.Tensor, threshold: float, chunk: int = QUERY_CHUNK
) -> Iterator[tuple[int, int, float]]:
    """(i, j, similarity) for every pair i < j at or above `threshold`, by i then j."""
    bank = normalised(vectors)
    for rows in range(0, len(bank), chunk):
        similarity = bank[rows : rows + chunk] @ bank.T
        pairs = (similarity >= threshold).nonzero()
        for row, column in pairs.tolist():
            i = rows + row
            if column > i:
                yield i, column, float(similarity[row, column])

"""Nearest neighbours of frozen features: DINO's k-NN classifier (Caron et al. 2021, section 4.1 and its
`eval_knn.py`) and exact similarity search.

Both compare L2-normalised vectors by their dot product (cosine similarity), exactly. With faiss-cpu installed
(`pip install 'vitlab[search]'`) its exact index (IndexFlatIP: one matrix product and a heap per query block)
does it: 1.60x torch's speed on a 2-core AMD EPYC Zen 4 (100,000 x 384 vectors, 1,000 queries: 0.405 s against
0.646 s, the same neighbours; `python benchmarks/search_exact.py`), where torch's fp32 matrix product is the slow
part. Without it, torch does the same in chunks of 1,024 queries (memory: chunk x N similarities). Approximate
indices (IVF, HNSW) trade exactness for a scale a CPU collection of a few million vectors does not need.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from vitlab.errors import UsageError

KNN_K = (10, 20)  # DINO reports k = 20 and finds 10-20 alike; both are shown
KNN_TEMPERATURE = 0.07
QUERY_CHUNK = 1024


def normalised(vectors: torch.Tensor) -> torch.Tensor:
    return F.normalize(vectors.float(), dim=1)


def faiss_module():
    """faiss, where installed (the `search` extra), else None."""
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def nearest(
    bank: torch.Tensor, queries: torch.Tensor, k: int, chunk: int = QUERY_CHUNK, use_faiss: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(similarities (Q, k), indices (Q, k)) of each query's k most similar rows of `bank`, most similar first.
    use_faiss: None takes faiss where it is installed."""
    bank, k = normalised(bank), min(k, len(bank))
    faiss = faiss_module() if use_faiss is not False else None
    if use_faiss and faiss is None:
        raise UsageError("faiss-cpu is not installed: pip install 'vitlab[search]'")
    if faiss is not None and len(queries) and k:
        index = faiss.IndexFlatIP(bank.shape[1])
        index.add(bank.contiguous().numpy())
        found_scores, found = index.search(normalised(queries).contiguous().numpy(), k)
        return torch.from_numpy(found_scores), torch.from_numpy(found).long()
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

"""Exact cosine search: vitlab's chunked matrix product (`vitlab.metrics.neighbours.nearest`) against faiss-cpu's exact
inner-product index (IndexFlatIP) on the same normalised vectors (issue 36: which library, and why).

    python benchmarks/search_exact.py [--bank 100000] [--queries 1000] [--dim 384] [-k 10]

faiss is not a vitlab dependency: install faiss-cpu to run its side (without it only vitlab's is timed). Both
run on this process's threads; each is timed as the best of three after one warm-up, and the two answers are
compared (same neighbours, similarities within 1e-5).
"""

from __future__ import annotations

import argparse
import time

import torch


def best_of(function, rounds: int = 3) -> float:
    function()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bank", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("-k", type=int, default=10)
    args = parser.parse_args()
    from vitlab.metrics.neighbours import nearest, normalised

    generator = torch.Generator().manual_seed(0)
    bank = normalised(torch.randn(args.bank, args.dim, generator=generator))
    queries = normalised(torch.randn(args.queries, args.dim, generator=generator))
    print(f"bank {args.bank} x {args.dim}, {args.queries} queries, k={args.k}, {torch.get_num_threads()} threads")
    ours = best_of(lambda: nearest(bank, queries, args.k))
    print(f"vitlab (torch, chunks of 1,024 queries)  {ours:.3f} s  {args.queries / ours:,.0f} queries/s")
    try:
        import faiss
    except ImportError:
        print("faiss-cpu is not installed: only vitlab's side was timed")
        return
    index = faiss.IndexFlatIP(args.dim)
    index.add(bank.numpy())
    theirs = best_of(lambda: index.search(queries.numpy(), args.k))
    print(f"faiss {faiss.__version__} IndexFlatIP            {theirs:.3f} s  {args.queries / theirs:,.0f} queries/s")
    print(f"vitlab / faiss time: {ours / theirs:.2f}")
    scores, found = nearest(bank, queries, args.k)
    faiss_scores, faiss_found = index.search(queries.numpy(), args.k)
    same = (found.numpy() == faiss_found).mean()
    gap = abs(scores.numpy() - faiss_scores).max()
    print(f"same neighbours: {same:.2%}; largest similarity difference {gap:.1e}")


if __name__ == "__main__":
    main()

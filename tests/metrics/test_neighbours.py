"""k-NN classification and similarity search on frozen features (`vitlab.metrics.neighbours`)."""

import math

import torch

from vitlab.metrics.neighbours import knn_accuracy, knn_votes, near_duplicates, nearest


def test_knn_votes_match_a_hand_computed_example():
    """Two classes, a query between them: its 3 nearest stored vectors vote exp(cos / T) for their labels."""
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 0])
    query = torch.tensor([[2.0, 1.0]])  # cosines: 0.894, 0.447, 0.949, -0.894
    cos = [2 / math.sqrt(5), 1 / math.sqrt(5), 3 / math.sqrt(10)]
    votes = knn_votes(bank, labels, query, num_classes=2, k=3, temperature=0.5)
    expected = torch.tensor([[math.exp(cos[0] / 0.5), math.exp(cos[1] / 0.5) + math.exp(cos[2] / 0.5)]])
    torch.testing.assert_close(votes, expected)
    # With k = 2 the vote is 0.949 (class 1) against 0.894 (class 0): class 1 by a hair; with k = 1 too.
    assert knn_votes(bank, labels, query, 2, k=2, temperature=0.5).argmax().item() == 1


def test_knn_accuracy_counts_top1_and_top5():
    torch.manual_seed(0)
    centres = torch.randn(6, 16) * 4
    labels = torch.arange(6).repeat(10)
    bank = centres[labels] + torch.randn(60, 16) * 0.1
    queries = centres[labels[:12]] + torch.randn(12, 16) * 0.1
    result = knn_accuracy(bank, labels, queries, labels[:12], num_classes=6, ks=(10, 20))
    assert result[10] == {"top1": 1.0, "top5": 1.0} and result[20]["top1"] == 1.0
    wrong = (labels[:12] + 1) % 6  # every query labelled as its neighbour class: top-1 none right
    assert knn_accuracy(bank, labels, queries, wrong, num_classes=6, ks=(10,))[10]["top1"] == 0.0


def test_nearest_finds_each_vector_itself_first_in_chunks():
    torch.manual_seed(1)
    bank = torch.randn(50, 8)
    scores, indices = nearest(bank, bank, k=3, chunk=7)
    assert torch.equal(indices[:, 0], torch.arange(50))
    torch.testing.assert_close(scores[:, 0], torch.ones(50))
    assert (scores[:, :-1] >= scores[:, 1:]).all()  # most similar first


def test_near_duplicates_lists_each_pair_once():
    bank = torch.tensor([[1.0, 0.0], [0.99, 0.01], [0.0, 1.0], [2.0, 0.0]])
    pairs = list(near_duplicates(bank, threshold=0.999, chunk=2))
    assert [(i, j) for i, j, _ in pairs] == [(0, 1), (0, 3), (1, 3)]
    assert all(score >= 0.999 for _, _, score in pairs)


def test_faiss_and_torch_find_the_same_neighbours():
    import pytest

    from vitlab.metrics.neighbours import faiss_module

    if faiss_module() is None:
        pytest.skip("faiss-cpu is not installed (pip install 'vitlab[search]')")
    torch.manual_seed(2)
    bank, queries = torch.randn(500, 24), torch.randn(40, 24)
    with_faiss = nearest(bank, queries, k=7, use_faiss=True)
    with_torch = nearest(bank, queries, k=7, chunk=16, use_faiss=False)
    assert torch.equal(with_faiss[1], with_torch[1])
    torch.testing.assert_close(with_faiss[0], with_torch[0], atol=1e-5, rtol=1e-5)
